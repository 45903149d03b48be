"""How fast the step engine is: the 1,024 ranks x 1,000 steps x 64 buckets target and its variants.

    python benchmarks/engine_bench.py [--steps 1000] [--ranks 1024]

Prints one line per scenario: wall time of ``simulate`` (one core), simulated steps per second,
StepMetrics rows produced and how many collective costs were evaluated (the rest came from the
cost cache). Target: the first scenario in <= 60 s.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from igpolicy.config import PolicyConfig
from igpolicy.plan import ComponentPlan, SyncPlan
from igpolicy.schedule import assign_phases
from igpolicy.vocab import ComponentClass, ComponentId
from igsim.net.topology import leaf_spine, star
from igsim.step.architectures import architecture_workload
from igsim.step.engine import simulate
from igsim.step.workload import Jitter, Workload


def synthetic_plan(workload: Workload, *, release_period: int) -> SyncPlan:
    """Attention, norms, embedding and head important; MLP projections low (a plausible split)."""
    sizes: dict[str, int] = {}
    for p in workload.params:
        sizes[p.component] = sizes.get(p.component, 0) + max(1, p.numel // 100) * 8
    low = {k: v for k, v in sizes.items() if ComponentId.from_key(k).kind.value.startswith("mlp")}
    phases = assign_phases(low, num_phases=release_period)
    comps = tuple(
        ComponentPlan(
            key=k,
            score=0.1 if k in low else 0.9,
            cls=ComponentClass.LOW if k in low else ComponentClass.IMPORTANT,
            phase=phases.get(k),
            expected_bytes=v,
        )
        for k, v in sorted(sizes.items())
    )
    return SyncPlan(release_period=release_period, components=comps)


def with_recorded_k(workload: Workload, *, num_steps: int, density: float, seed: int = 0) -> Workload:
    """The same workload with per-step k varying around nominal (as a trace would have)."""
    rng = np.random.default_rng(seed)
    numel = workload.numel
    k = np.clip(np.rint(density * numel[None, :] * rng.uniform(0.8, 1.2, (num_steps, len(numel)))), 1, numel)
    return Workload(
        name=workload.name + "+k",
        params=workload.params,
        ready_s=np.repeat(workload.ready_s, num_steps, axis=0),
        forward_s=np.repeat(workload.forward_s, num_steps),
        backward_s=np.repeat(workload.backward_s, num_steps),
        optimizer_s=np.repeat(workload.optimizer_s, num_steps),
        k=k,
        k_density=density,
    )


def run(name: str, **kw) -> tuple[str, float, int, int, int, float]:
    t0 = time.perf_counter()
    r = simulate(**kw)
    wall = time.perf_counter() - t0
    return (
        name,
        wall,
        r.num_steps,
        r.num_rows,
        r.settings["num_collective_evaluations"],
        r.summary()["step_s_mean"],
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--buckets", type=int, default=64)
    args = ap.parse_args()
    w = architecture_workload("llama-70b", accelerator="h100", tokens_per_step=4096)
    topo = star(num_ranks=args.ranks, bandwidth_bytes_per_s=400e9 / 8, latency_s=2.5e-6)
    R = 4
    plan = synthetic_plan(w, release_period=R)

    def cfg(policy: str, **extra) -> PolicyConfig:
        return PolicyConfig(policy=policy, num_buckets=args.buckets, release_period=R, packing="kk", **extra)

    common = {"topology": topo, "num_steps": args.steps, "plan": plan}
    rows = [
        run(f"llama-70b dense, {args.ranks} ranks", workload=w, config=cfg("dense"), **common),
        run(f"llama-70b topk 0.01 (auto), {args.ranks}", workload=w, config=cfg("topk"), **common),
        run(
            f"llama-70b topk 0.0005 sparse, {args.ranks}",
            workload=w,
            config=cfg("topk", density=0.0005, collective="sparse"),
            **common,
        ),
        run(
            f"llama-70b importance 0.0005, {args.ranks}",
            workload=w,
            config=cfg("importance", density=0.0005, collective="sparse"),
            **common,
        ),
        run(
            "  + after backward, per-step k (50 steps)",
            workload=with_recorded_k(w, num_steps=50, density=0.0005),
            config=cfg("importance", density=0.0005, collective="sparse"),
            integration="sync",
            **common,
        ),
        run(
            f"  + jitter cv 0.05 ({args.ranks} rows/step)",
            workload=w,
            config=cfg("importance", density=0.0005, collective="sparse"),
            jitter=Jitter(seed=1, compute_cv=0.05),
            **common,
        ),
    ]
    ls = leaf_spine(num_ranks=64, ranks_per_leaf=8, num_spines=2, bandwidth_bytes_per_s=100e9 / 8, latency_s=1e-6,
                    oversubscription=4.0)  # fmt: skip
    rows.append(
        run(
            "llama-7b dense, leaf-spine 64 (flow), 16 b",
            workload=architecture_workload("llama-7b"),
            config=PolicyConfig(policy="dense", num_buckets=16, packing="kk"),
            plan=None,
            topology=ls,
            num_steps=100,
            mode="flow",
        )
    )
    print(f"{'scenario':44s} {'wall s':>8s} {'steps/s':>9s} {'rows':>9s} {'evals':>7s} {'step time':>10s}")
    for name, wall, steps, nrows, evals, step_s in rows:
        print(f"{name:44s} {wall:8.2f} {steps / wall:9.0f} {nrows:9d} {evals:7d} {step_s:9.3f}s")


if __name__ == "__main__":
    main()
