"""``igrt bench``: the synchronizer's overhead table on a reference workload, real gloo ranks.

    igrt bench --workload minilm --steps 12 --nproc 2

Every policy (dense, topk + error feedback, adtopk + error feedback, importance) trains the same
model from the same initial weights on the same data for ``--steps`` steps through
:func:`igrt.train.loop.train_on_rank`; the first step is left out of the times. The importance plan is
profiled with :mod:`igpolicy.profile` from ``--trace``, else from the shipped sample trace of the
workload (when it has recorded parts), else from a short recording made here with
:class:`igrt.trace.recorder.TraceRecorder` (``--record-steps``). Columns (means per rank and step):

- step: wall time of a whole step (slowest rank); sparsifier: the ``select`` phase (u = g + e,
  selection by magnitude, residual update); overhead: the synchronizer's own work on top of the
  sparsifier and the wire (decide, hold, pack, scatter = sync − select − comm), as % of the step;
- bytes/step: values + indices + dense + metadata handed to collectives; × topk: ratio to topk+EF;
  peak/median: the largest step's bytes over the median step's; imbalance: max/mean bucket bytes.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from igpolicy.config import PACKINGS
from igrt.workloads import WORKLOADS
from traces.profiling import profile_trace

__all__ = [
    "BENCH_POLICIES",
    "TARGETS",
    "add_arguments",
    "best_imbalance",
    "format_table",
    "policy_statistics",
    "run",
    "target_report",
]

BENCH_POLICIES = ("dense", "topk", "adtopk", "importance")
# (statistic, limit, label): every one is "at most"
TARGETS = (
    ("overhead_pct", 10.0, "synchronizer overhead on top of the sparsifier <= 10 % of step time"),
    ("ratio_to_topk", 0.25, "bytes per step <= 0.25 x topk+EF at equal density"),
    ("peak_to_median", 1.5, "peak step bytes <= 1.5 x median step bytes"),
    ("imbalance_max", 1.1, "bucket imbalance (max/mean bytes) <= 1.1"),
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--workload", choices=WORKLOADS, default="minilm", help="reference workload (default minilm)"
    )
    p.add_argument("--steps", type=int, default=12, help="steps per policy, the first untimed (default 12)")
    p.add_argument("--nproc", type=int, default=2, help="ranks (default 2)")
    p.add_argument("--backend", choices=("gloo", "nccl", "auto"), default="gloo", help="default gloo")
    p.add_argument("--tiny", action="store_true", help="tiny random-init model (smoke runs)")
    p.add_argument("--batch-size", type=int, default=8, help="examples per rank per step (default 8)")
    p.add_argument(
        "--density", type=float, default=0.01, help="sparsifier density, all policies (default 0.01)"
    )
    p.add_argument("--release-period", type=int, default=4, help="importance release period R (default 4)")
    p.add_argument("--num-buckets", type=int, default=4, help="buckets per step (default 4)")
    p.add_argument("--packing", choices=PACKINGS, default="kk", help="bucket packing (default kk)")
    p.add_argument("--threshold", default="knee", help="profiling threshold method (default knee)")
    p.add_argument("--trace", type=Path, default=None, help="trace to profile the plan from")
    p.add_argument("--record-steps", type=int, default=8, help="steps to record when no trace (default 8)")
    p.add_argument("--seed", type=int, default=0, help="model, data and sparsifier seed (default 0)")
    p.add_argument("--policies", default=",".join(BENCH_POLICIES), help="comma-separated subset")
    p.add_argument("--timeout", type=float, default=1800.0, help="collective timeout, seconds")


# --------------------------------------------------------------------------- the plan
def _shipped_trace(workload: str, tiny: bool) -> Path | None:
    """The shipped sample trace of ``workload`` when it holds recorded parts (never for --tiny)."""
    if tiny:
        return None
    from traces.samples import sample_trace_path

    try:
        path = sample_trace_path(workload)
    except ValueError:
        return None
    return path if any(path.rglob("*.parquet")) else None


def _record(ctx, w, opts: dict[str, Any]) -> None:
    """Record ``record_steps`` topk steps of plain data-parallel training (dense average)."""
    import torch
    import torch.distributed as dist

    from igrt.trace.recorder import TraceRecorder
    from igrt.train.loop import rank_seed

    torch.manual_seed(rank_seed(opts["seed"], ctx.rank))
    model = w.model.to(ctx.device)
    optimizer = w.optimizer(model)
    batches = w.train_batches(ctx.rank, ctx.world_size, opts["batch_size"])
    params = [p for p in model.parameters() if p.requires_grad]
    recorder = TraceRecorder(
        model,
        directory=opts["record_dir"],
        density=opts["density"],
        seed=opts["seed"],
        workload=opts["workload"],
        command="igrt bench (recording)",
    )
    with recorder as rec:
        for _ in range(opts["record_steps"]):
            loss = w.loss(model, next(batches))
            rec.begin_backward()
            loss.backward()
            rec.end_backward()
            for p in params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                if ctx.world_size > 1:
                    dist.all_reduce(p.grad)
                p.grad /= ctx.world_size
            rec.begin_optimizer()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            rec.end_step(loss=float(loss.detach()))
    if ctx.world_size > 1:
        dist.barrier()


def _policy_config(policy: str, opts: dict[str, Any]):
    from igpolicy.config import PolicyConfig

    return PolicyConfig(
        policy=policy,
        density=opts["density"],
        release_period=opts["release_period"],
        num_buckets=opts["num_buckets"],
        packing=opts["packing"],
        seed=opts["seed"],
    )


def _bench_rank(ctx, opts: dict[str, Any]) -> dict[str, Any]:
    """One rank: (record,) profile, then every policy from the same initial weights."""
    import torch

    from igrt.sync.synchronizer import build_param_infos, named_parameters
    from igrt.train.loop import TrainOptions, train_on_rank
    from igrt.workloads import make_workload

    w = make_workload(opts["workload"], tiny=opts["tiny"], seed=opts["seed"])
    initial = {k: v.detach().clone() for k, v in w.model.state_dict().items()}
    plan, plan_from = opts["plan"], opts["trace"]
    if plan is None and "importance" in opts["policies"]:
        _record(ctx, w, opts)
        plan_from = f"a {opts['record_steps']}-step recording"
        plan, _, _ = profile_trace(
            opts["record_dir"],
            release_period=opts["release_period"],
            density=opts["density"],
            method=opts["threshold"],
        )
    rows: dict[str, Any] = {}
    for policy in opts["policies"]:
        with torch.no_grad():
            w.model.load_state_dict(initial)
        options = TrainOptions(
            workload=opts["workload"],
            config=_policy_config(policy, opts),
            steps=opts["steps"],
            plan=plan if policy == "importance" else None,
            batch_size=opts["batch_size"],
            tiny=opts["tiny"],
            seed=opts["seed"],
            evaluate=False,
            out=None,
            progress=ctx.rank == 0,
        )
        rows[policy] = train_on_rank(ctx, options, workload=w).rows
    infos = build_param_infos(named_parameters(w.model))
    return {"rows": rows, "plan": plan, "plan_from": plan_from, "infos": infos}


# --------------------------------------------------------------------------- the table
def best_imbalance(*, infos, config, plan, steps: int, world_size: int) -> float:
    """The smallest max/mean bucket bytes any packing of the decided blocks reaches, worst step:
    max(total / buckets, largest block) / mean bucket (blocks are never split)."""
    from igpolicy.decide import decide_step, release_phases

    phases = release_phases(plan=plan, config=config, component_keys=[i.component for i in infos])
    worst = 1.0
    for t in range(steps):
        packing = decide_step(
            step=t, config=config, params=infos, world_size=world_size, phases=phases
        ).packing
        if packing.buckets and packing.total_bytes:
            worst = max(worst, packing.lower_bound_bytes * len(packing.buckets) / packing.total_bytes)
    return worst


def policy_statistics(rows) -> dict[str, float]:
    """The bench's figures for one policy's rows (see the module docstring)."""
    from igrt.train.loop import step_statistics

    s = step_statistics(rows, warmup_steps=1)
    overhead_s = max(0.0, s["sync_s_mean"] - s["sparsifier_s_mean"] - s["comm_s_mean"])
    return {
        "step_ms": 1e3 * s["step_s_mean"],
        "sparsifier_ms": 1e3 * s["sparsifier_s_mean"],
        "overhead_ms": 1e3 * overhead_s,
        "overhead_pct": 100.0 * overhead_s / s["step_s_mean"],
        "comm_ms": 1e3 * s["comm_s_mean"],
        "bytes_per_step": s["bytes_per_step"]["wire_bytes"],
        "peak_to_median": s["peak_to_median"] if s["peak_to_median"] is not None else float("inf"),
        "imbalance_mean": s["bucket_imbalance_mean"],
        "imbalance_max": s["bucket_imbalance_max"],
    }


def format_table(stats: dict[str, dict[str, float]]) -> str:
    """The overhead table, one row per policy (NaN where topk or the packing bound is missing)."""
    head = (
        f"{'policy':10s} {'step ms':>8s} {'sparsif ms':>10s} {'overhead ms':>11s} {'% step':>6s} "
        f"{'comm ms':>8s} {'kB/step':>9s} {'x topk':>6s} {'peak/med':>8s} {'imbal mean/max':>14s} "
        f"{'best':>5s}"
    )
    lines = [head, "-" * len(head)]
    nan = float("nan")
    for policy, s in stats.items():
        lines.append(
            f"{policy:10s} {s['step_ms']:8.1f} {s['sparsifier_ms']:10.1f} {s['overhead_ms']:11.1f} "
            f"{s['overhead_pct']:6.1f} {s['comm_ms']:8.1f} {s['bytes_per_step'] / 1e3:9.1f} "
            f"{s.get('ratio_to_topk', nan):6.3f} {s['peak_to_median']:8.2f} "
            f"{s['imbalance_mean']:6.3f}/{s['imbalance_max']:.3f} {s.get('imbalance_best', nan):5.3f}"
        )
    return "\n".join(lines)


def target_report(stats: dict[str, dict[str, float]]) -> list[str]:
    """One line per target, judged on the importance policy (overhead on every sparse policy)."""
    lines = []
    for key, limit, label in TARGETS:
        policies = ["topk", "adtopk", "importance"] if key == "overhead_pct" else ["importance"]
        for policy in (p for p in policies if p in stats and key in stats[p]):
            value = stats[policy][key]
            verdict = "met" if value <= limit else f"MISSED by {100 * (value / limit - 1):.0f} %"
            if key == "imbalance_max" and "imbalance_best" in stats[policy]:
                verdict += f" (best possible without splitting blocks: {stats[policy]['imbalance_best']:.3g})"
            lines.append(f"  {policy:10s} {label}: {value:.3g} -> {verdict}")
    return lines


def run(args: argparse.Namespace) -> int:
    from igrt.train.launch import launch
    from igrt.workloads import prepare_workload

    policies = tuple(p for p in args.policies.split(",") if p)
    unknown = sorted(set(policies) - set(BENCH_POLICIES))
    if unknown or not policies:
        raise ValueError(f"--policies: {unknown or 'none'} not among {', '.join(BENCH_POLICIES)}")
    for name in ("steps", "nproc", "batch_size", "release_period", "num_buckets", "record_steps"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    print(f"igrt bench: {prepare_workload(args.workload, tiny=args.tiny, seed=args.seed)}", file=sys.stderr)
    trace = args.trace or _shipped_trace(args.workload, args.tiny)
    plan = None
    if trace is not None and "importance" in policies:
        plan, _, _ = profile_trace(
            trace, release_period=args.release_period, density=args.density, method=args.threshold
        )
    with tempfile.TemporaryDirectory(prefix="igrt-bench-") as tmp:
        keys = ("workload", "tiny", "seed", "steps", "batch_size", "density", "release_period")
        keys += ("num_buckets", "packing", "record_steps", "threshold")
        opts = {k: getattr(args, k) for k in keys}
        opts.update(
            policies=policies,
            plan=plan,
            trace=str(trace) if trace else None,
            record_dir=str(Path(tmp) / "trace"),
        )
        t0 = time.perf_counter()
        results = launch(
            _bench_rank, nproc=args.nproc, backend=args.backend, args=(opts,), timeout_s=args.timeout
        )
        wall_s = time.perf_counter() - t0
    if 0 not in results:
        return 0
    first = results[0]
    world_size = len({r.rank for rows in first["rows"].values() for r in rows})
    stats = {p: policy_statistics(first["rows"][p]) for p in policies}
    for p, s in stats.items():
        s["imbalance_best"] = best_imbalance(
            infos=first["infos"],
            config=_policy_config(p, opts),
            plan=first["plan"] if p == "importance" else None,
            steps=args.steps,
            world_size=world_size,
        )
        if "topk" in stats:
            s["ratio_to_topk"] = s["bytes_per_step"] / stats["topk"]["bytes_per_step"]
    print(
        f"{args.workload}{' (tiny)' if args.tiny else ''}, {world_size} {args.backend} ranks, batch "
        f"{args.batch_size}, {args.steps} steps per policy (first untimed), density {args.density:g}, "
        f"R={args.release_period}, {args.num_buckets} buckets ({args.packing}); wall {wall_s:.0f} s"
    )
    if first["plan"] is not None:
        plan = first["plan"]
        low_bytes = sum(c.expected_bytes for c in plan.components if c.key in plan.low)
        total = sum(c.expected_bytes for c in plan.components) or 1
        print(
            f"plan {plan.fingerprint}: profiled ({args.threshold}) from {first['plan_from']}: "
            f"{len(plan.low)} of {len(plan.components)} components low ({low_bytes / total:.0%} of the bytes)"
        )
    print(format_table(stats))
    print("targets:")
    print("\n".join(target_report(stats)))
    return 0
