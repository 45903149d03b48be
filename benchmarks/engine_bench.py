"""How fast the step engine is: the issue's goals at 1,024 ranks, and how the cost grows.

    python benchmarks/engine_bench.py [--rounds 3] [--quick] [--no-growth]

Every run is one ``simulate`` call in a fresh Python process (so its peak resident memory is its
own), timed in CPU seconds (``time.process_time``) and wall seconds; the process's start-up and
imports are not counted, building the workload and plan is. Runs go round-robin over the
scenarios, ``--rounds`` times (paired: every scenario sees the same load in each round), and the
table gives min / median over rounds. Scenarios (LLaMA-70B = 723 parameters, kk packing, release
period 4):

- ``star ...``: 400 Gbit/s star, closed forms (``auto``), 1,024 ranks x 1,000 steps x 64 buckets.
- ``leaf-spine ...``: 2:1 leaf-spine (16 ranks per leaf, 4 spines, 400 Gbit/s NICs, 1 us per
  link), ``mode="flow"``: every collective is what the flow mode says (the ring closed form only
  after its check against a flow run, see igsim.collectives.rings).
- ``replay ...``: the Synchronizer path (``integration="sync"``) with per-step k from a recorded
  trace (1,000 recorded steps, k within +-20 % of nominal), leaf-spine, flow mode: a new gather
  size in every bucket of every step.
- growth: the leaf-spine importance run over ranks (128..1,024), steps (250..2,000) and buckets
  (16..128), each with the other two at 1,024 / 1,000 / 64; the exponent is the least-squares
  slope of log(median CPU s) on log(x) (and of log(peak RSS)).

Goals (issue 16): leaf-spine 1,024 x 1,000 x 64 in <= 10 s and <= 1 GB, growth <= p^1.3; the replay
in <= 60 s.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import statistics
import subprocess
import sys
import time

import numpy as np

from igpolicy.config import PolicyConfig
from igpolicy.plan import ComponentPlan, SyncPlan
from igpolicy.schedule import assign_phases
from igpolicy.vocab import ComponentClass, ComponentId
from igsim.step.workload import Jitter, Workload

RELEASE_PERIOD = 4


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


# -- scenarios: name -> keyword arguments of one run -------------------------------------------


def scenario(kind: str, *, ranks: int = 1024, steps: int = 1000, buckets: int = 64) -> dict:
    return {"kind": kind, "ranks": ranks, "steps": steps, "buckets": buckets}


MAIN = {
    "star dense": scenario("star-dense"),
    "star importance 0.0005": scenario("star-importance"),
    "star importance, per-step k (sync)": scenario("star-replay"),
    "star importance, jitter (1,024 rows/step)": scenario("star-jitter"),
    "leaf-spine 2:1 dense (flow)": scenario("ls-dense"),
    "leaf-spine 2:1 importance 0.0005 (flow)": scenario("ls-importance"),
    "replay: per-step k, sync, leaf-spine (flow)": scenario("ls-replay"),
}
GROWTH = {
    "ranks": [scenario("ls-importance", ranks=p) for p in (128, 256, 512, 1024)],
    "steps": [scenario("ls-importance", steps=t) for t in (250, 500, 1000, 2000)],
    "buckets": [scenario("ls-importance", buckets=b) for b in (16, 32, 64, 128)],
}


def run_one(s: dict) -> dict:
    """One simulate call as the scenario ``s`` says; CPU s, wall s and the run's figures."""
    from igsim.net.topology import leaf_spine, star
    from igsim.step.architectures import architecture_workload
    from igsim.step.engine import simulate

    t0, w0 = time.process_time(), time.perf_counter()
    kind, p = s["kind"], s["ranks"]
    w = architecture_workload("llama-70b", accelerator="h100", tokens_per_step=4096)
    plan = synthetic_plan(w, release_period=RELEASE_PERIOD)
    sparse = {"density": 0.0005, "collective": "sparse"}
    policy = "dense" if kind.endswith("dense") else "importance"
    cfg = PolicyConfig(policy=policy, num_buckets=s["buckets"], release_period=RELEASE_PERIOD, packing="kk",
                       **({} if policy == "dense" else sparse))  # fmt: skip
    kw: dict = {
        "config": cfg,
        "plan": plan if policy == "importance" else None,
        "num_steps": s["steps"],
        "workload": w,
    }
    if kind.startswith("star"):
        kw["topology"] = star(num_ranks=p, bandwidth_bytes_per_s=400e9 / 8, latency_s=2.5e-6)
    else:
        kw["topology"] = leaf_spine(num_ranks=p, ranks_per_leaf=16, num_spines=4, bandwidth_bytes_per_s=400e9 / 8,
                                    latency_s=1e-6, oversubscription=2.0)  # fmt: skip
        kw["mode"] = "flow"
    if kind.endswith("replay"):
        kw["workload"] = with_recorded_k(w, num_steps=s["steps"], density=0.0005)
        kw["integration"] = "sync"
    if kind.endswith("jitter"):
        kw["jitter"] = Jitter(seed=1, compute_cv=0.05)
    r = simulate(**kw)
    return {
        "cpu_s": time.process_time() - t0,
        "wall_s": time.perf_counter() - w0,
        "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rows": r.num_rows,
        "evaluations": r.settings["num_collective_evaluations"],
        "costs": r.settings.get("collective_costs", {}),  # (absent before the ring form: 'before' runs)
        "k_source": r.settings["k_source"],
        "step_s": r.summary()["step_s_mean"],
    }


def _spawn(s: dict) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--one", json.dumps(s)], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise RuntimeError(f"scenario {s} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _minmed(xs: list[float]) -> str:
    return f"{min(xs):.2f} / {statistics.median(xs):.2f}"


def _slope(xs: list[float], ys: list[float]) -> float:
    return float(np.polyfit(np.log(xs), np.log(ys), 1)[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="paired rounds (default 3)")
    ap.add_argument("--quick", action="store_true", help="256 ranks, 200 steps: a smoke run")
    ap.add_argument("--no-growth", action="store_true", help="skip the growth series")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one scenario, print JSON
    args = ap.parse_args()
    if args.one:
        print(json.dumps(run_one(json.loads(args.one))))
        return
    main_runs = dict(MAIN)
    growth = {} if args.no_growth else dict(GROWTH)
    if args.quick:  # everything at 256 ranks x 200 steps, two points per growth axis
        main_runs = {k: {**v, "ranks": 256, "steps": 200} for k, v in main_runs.items()}
        small = {"ranks": (128, 256), "steps": (100, 200), "buckets": (16, 32)}
        growth = {
            axis: [{**scenario("ls-importance", ranks=256, steps=200), axis: v} for v in small[axis]]
            for axis in growth
        }
    todo = [(name, s) for name, s in main_runs.items()]
    todo += [(f"{axis}={s[axis]}", s) for axis, series in growth.items() for s in series]
    results: dict[str, list[dict]] = {name: [] for name, _ in todo}
    for r in range(args.rounds):
        for name, s in todo:
            results[name].append(_spawn(s))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    print(
        f"{args.rounds} paired rounds; CPU s and wall s as min / median; peak RSS median; python {sys.version.split()[0]}"
    )
    print()
    print(
        "| scenario | ranks x steps x buckets | CPU s | wall s | peak RSS MiB | rows | evaluations | costs |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for name, s in main_runs.items():
        rs = results[name]
        costs = "; ".join(f"{op}: {m.split(' (')[0]}" for op, m in sorted(rs[0]["costs"].items()))
        print(
            f"| {name} | {s['ranks']:,} x {s['steps']:,} x {s['buckets']} | {_minmed([x['cpu_s'] for x in rs])} | "
            f"{_minmed([x['wall_s'] for x in rs])} | {statistics.median(x['rss_mib'] for x in rs):.0f} | "
            f"{rs[0]['rows']:,} | {rs[0]['evaluations']} | {costs} |"
        )
    if growth:
        print()
        print("| growth in | points | CPU s (median) | exponent (CPU) | peak RSS MiB | exponent (RSS) |")
        print("|---|---|---|---:|---|---:|")
        for axis, series in growth.items():
            xs = [s[axis] for s in series]
            cpu = [statistics.median(x["cpu_s"] for x in results[f"{axis}={v}"]) for v in xs]
            rss = [statistics.median(x["rss_mib"] for x in results[f"{axis}={v}"]) for v in xs]
            print(
                f"| {axis} | {', '.join(f'{v:,}' for v in xs)} | {', '.join(f'{c:.2f}' for c in cpu)} | "
                f"{_slope(xs, cpu):.2f} | {', '.join(f'{m:.0f}' for m in rss)} | {_slope(xs, rss):.2f} |"
            )
            if len(xs) > 2:
                local = [
                    math.log(cpu[i + 1] / cpu[i]) / math.log(xs[i + 1] / xs[i]) for i in range(len(xs) - 1)
                ]
                print(f"|  (pairwise) | | | {', '.join(f'{e:.2f}' for e in local)} | | |")


if __name__ == "__main__":
    main()
