"""``igrt bench``: the synchronizer against PyTorch's DDP and its comm hooks, one table, real ranks.

    igrt bench --workload minilm --steps 12 --ranks 2

Every method trains the same model from the same initial weights on the same data for ``--steps``
steps, one after another in the same ``--ranks`` processes (one process set, one table); the first
``--warmup`` steps (default 2) are left out of the times and bytes. The methods:

- PyTorch's own (:data:`PEERS`): ``ddp`` (``DistributedDataParallel``, its built-in all-reduce),
  ``allreduce`` and ``fp16`` (DDP with the ``allreduce_hook`` / ``fp16_compress_hook`` comm hooks),
  ``powersgd1`` .. ``powersgd4`` (``powerSGD_hook`` of that rank, error feedback and warm start as
  PyTorch's defaults, ``start_powerSGD_iter=2``: the warm-up steps are its vanilla all-reduce).
  DDP's default buckets, except for PowerSGD: one bucket (``bucket_cap_mb`` above the model). With
  several buckets the hook issues its P and Q all-reduces from future callbacks while DDP's
  autograd thread issues the next bucket's, so the collective order differs between ranks and gloo
  aborts on the first mismatch (``op.preamble.length <= op.nbytes``; see docs/benchmarks.md).
- ours (:data:`BENCH_POLICIES`, through :func:`igrt.train.loop.train_on_rank`, after backward):
  ``topk`` and ``adtopk`` with error feedback, ``importance``, and ``dense`` (the Synchronizer's
  plain average). The importance plan is profiled with :mod:`igpolicy.profile` from ``--trace``,
  else from the shipped sample trace of the workload (when it has recorded parts), else from a
  short recording made here with :class:`igrt.trace.recorder.TraceRecorder` (``--record-steps``).

Columns (means per rank and timed step):

- bytes/step: what the rank hands to collectives, before any algorithm's replication. Ours:
  values + indices + dense + metadata (the Synchronizer's counters). PyTorch's hooks: the bytes of
  every tensor passed to ``torch.distributed.all_reduce`` while the method runs (counted by a
  wrapper around that function, the only collective the hooks call). ``ddp``: its gradient buckets
  (every trainable parameter's gradient), as its C++ reducer all-reduces them.
- step: wall time of a whole step (slowest rank); own: the method's own work, no wire. Ours: the
  Synchronizer's ``sync − comm`` (selection, packing, bookkeeping); hooks: the time from each
  hook call to the end of its future chain, less the time its all-reduces were in flight
  (compression, decompression, copies); ``ddp``: none (its reducer's copies are not separable).
- × DDP CPU: process CPU time per timed step (every thread of the rank: gloo's included) over
  ``ddp``'s. Ours is measured as the difference of a ``--steps`` run and a ``--warmup`` run.
- sparsifier / overhead / peak/median / imbalance for ours, as before: the ``select`` phase, the
  rest of ``own`` (as % of the step), the largest step's bytes over the median's, max/mean bucket
  bytes and the best any packing could reach.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from igpolicy.cli_util import add_deprecated_alias
from igpolicy.config import PACKINGS
from igpolicy.limits import check_count
from igrt.integrations.peers import CollectiveMeter, register_peer
from igrt.workloads import WORKLOADS
from traces.profiling import profile_trace

__all__ = [
    "BENCH_POLICIES",
    "DEFAULT_METHODS",
    "PEERS",
    "TARGETS",
    "CollectiveMeter",
    "add_arguments",
    "best_imbalance",
    "format_table",
    "peer_statistics",
    "policy_statistics",
    "run",
    "target_report",
]

BENCH_POLICIES = ("dense", "topk", "adtopk", "importance")
PEERS = ("ddp", "allreduce", "fp16", "powersgd1", "powersgd2", "powersgd3", "powersgd4")
DEFAULT_METHODS = (*PEERS, "topk", "adtopk", "importance")
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
    p.add_argument("--steps", type=int, default=12, help="steps per method (default 12)")
    p.add_argument(
        "--warmup", type=int, default=2, help="first steps left out of times and bytes (default 2)"
    )
    ranks = p.add_argument("--ranks", dest="nproc", type=int, default=2, metavar="N", help="ranks to spawn (default 2)")
    add_deprecated_alias(p, "--nproc", ranks)
    p.add_argument(
        "--rounds", type=int, default=1, help="rounds over every method, paired; medians shown (default 1)"
    )
    p.add_argument(
        "--backend", choices=("gloo", "nccl", "auto"), default="gloo", help="auto: nccl with CUDA, else gloo (default gloo)"
    )
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
    p.add_argument(
        "--plot",
        type=Path,
        default=Path("bench.png"),
        metavar="PNG",
        help="write the table as bar charts to this PNG (default bench.png; checked before the work)",
    )
    p.add_argument("--no-plot", action="store_true", help="write no PNG")
    p.add_argument(
        "--policies",
        default=",".join(DEFAULT_METHODS),
        help=f"comma-separated methods among {', '.join(PEERS + BENCH_POLICIES)} (default: all but dense)",
    )
    timeout = p.add_argument(
        "--timeout-s",
        dest="timeout",
        type=float,
        default=1800.0,
        metavar="S",
        help="collective timeout in seconds (default 1800)",
    )
    add_deprecated_alias(p, "--timeout", timeout)


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
    """One rank: (record,) profile, then every method from the same initial weights, in order."""
    import torch

    from igrt.sync.synchronizer import build_param_infos, named_parameters
    from igrt.train.launch import status_line, status_phase
    from igrt.workloads import make_workload

    with status_phase("igrt bench", f"{ctx.world_size} {ctx.backend} rank(s) up; loading {opts['workload']}", rank=ctx.rank):
        w = make_workload(opts["workload"], tiny=opts["tiny"], seed=opts["seed"])
    initial = {k: v.detach().clone() for k, v in w.model.state_dict().items()}
    plan, plan_from = opts["plan"], opts["trace"]
    if plan is None and "importance" in opts["policies"]:
        status_line("igrt bench", f"recording {opts['record_steps']} steps to profile the plan", rank=ctx.rank)
        _record(ctx, w, opts)
        plan_from = f"a {opts['record_steps']}-step recording"
        plan, _, _ = profile_trace(
            opts["record_dir"],
            release_period=opts["release_period"],
            density=opts["density"],
            method=opts["threshold"],
        )
    # per method, one entry per round (the rounds go over every method in turn: paired)
    rows: dict[str, list[Any]] = {}
    peers: dict[str, list[list[dict[str, float]]]] = {}
    cpu: dict[str, list[float]] = {}
    total = opts["rounds"] * len(opts["policies"])
    for k in range(opts["rounds"]):
        for j, method in enumerate(opts["policies"]):
            status_line("igrt bench", f"[{k * len(opts['policies']) + j + 1}/{total}] round {k + 1}: {method}, "
                        f"{opts['steps']} steps", rank=ctx.rank)  # fmt: skip
            with torch.no_grad():
                w.model.load_state_dict(initial)
            if method in PEERS:
                peers.setdefault(method, []).append(_gather_rows(ctx, _run_peer(ctx, w, method, opts)))
                continue
            cpu_s = []
            for steps in (opts["steps"], opts["warmup"]):  # CPU of the timed steps: the difference
                with torch.no_grad():
                    w.model.load_state_dict(initial)
                c0 = time.process_time()
                outcome = _train(ctx, w, method, opts, plan=plan, steps=steps)
                cpu_s.append(time.process_time() - c0)
                if steps == opts["steps"]:
                    rows.setdefault(method, []).append(outcome.rows)
            cpu.setdefault(method, []).append((cpu_s[0] - cpu_s[1]) / (opts["steps"] - opts["warmup"]))
    infos = build_param_infos(named_parameters(w.model))
    return {"rows": rows, "peers": peers, "cpu": cpu, "plan": plan, "plan_from": plan_from, "infos": infos}


def _train(ctx, w, policy: str, opts: dict[str, Any], *, plan, steps: int):
    from igrt.train.loop import TrainOptions, train_on_rank

    options = TrainOptions(
        workload=opts["workload"],
        config=_policy_config(policy, opts),
        steps=steps,
        plan=plan if policy == "importance" else None,
        batch_size=opts["batch_size"],
        tiny=opts["tiny"],
        seed=opts["seed"],
        evaluate=False,
        out=None,
        progress=ctx.rank == 0 and steps == opts["steps"],
        flush=False,  # speed only: the model is thrown away
    )
    return train_on_rank(ctx, options, workload=w)


def _gather_rows(ctx, rows: list[dict[str, float]]) -> list[dict[str, float]]:
    """Every rank's rows on rank 0 (empty elsewhere)."""
    import torch.distributed as dist

    if ctx.world_size == 1:
        return rows
    got: list[Any] = [None] * ctx.world_size if ctx.rank == 0 else None  # type: ignore[assignment]
    dist.gather_object(rows, got, dst=0)
    return [r for part in got for r in part] if ctx.rank == 0 else []


# --------------------------------------------------------------------------- PyTorch's peers
def _run_peer(ctx, w, method: str, opts: dict[str, Any]) -> list[dict[str, float]]:
    """``--steps`` steps of DDP (with ``method``'s hook) on this rank; one row per step."""
    import gc

    import torch
    from torch.nn.parallel import DistributedDataParallel

    from igrt.train.loop import rank_seed

    torch.manual_seed(rank_seed(opts["seed"], ctx.rank))
    model = w.model.to(ctx.device)
    grads = [p for p in model.parameters() if p.requires_grad]
    grad_bytes = sum(p.numel() * p.element_size() for p in grads)
    caps = {}
    if method.startswith("powersgd"):  # one bucket: the only order gloo can follow (module docstring)
        caps["bucket_cap_mb"] = 2 * grad_bytes / 2**20 + 1
    ddp = DistributedDataParallel(
        model, device_ids=[ctx.device] if ctx.device.type == "cuda" else None, **caps
    )
    meter = CollectiveMeter()
    register_peer(ddp, method, meter)
    optimizer = w.optimizer(model)
    batches = w.train_batches(ctx.rank, ctx.world_size, opts["batch_size"])
    sync = torch.cuda.synchronize if ctx.device.type == "cuda" else (lambda: None)
    rows = []
    from tqdm import tqdm

    bar = tqdm(total=opts["steps"], desc=f"bench {method}", disable=ctx.rank != 0, leave=False, file=sys.stderr)
    with meter.counting(), bar:
        for step in range(opts["steps"]):
            meter.reset()
            sync()
            t0, c0 = time.perf_counter(), time.process_time()
            loss = w.loss(ddp, next(batches))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            sync()
            rows.append({
                "step": step, "rank": ctx.rank, "step_s": time.perf_counter() - t0,
                "cpu_s": time.process_time() - c0, "own_s": meter.own_s,
                "bytes": meter.bytes if method != "ddp" else grad_bytes,
                "num_collectives": meter.num_collectives, "loss": float(loss.detach()),
            })  # fmt: skip
            bar.update(1)
    del ddp, optimizer
    gc.collect()
    return rows


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


def policy_statistics(rows, *, warmup_steps: int = 1) -> dict[str, float]:
    """The bench's figures for one of our policies' rows (see the module docstring)."""
    from igrt.train.loop import step_statistics

    s = step_statistics(rows, warmup_steps=warmup_steps)
    timed = {r.step for r in rows} - set(sorted({r.step for r in rows})[:warmup_steps])
    wire = [r.wire_bytes for r in rows if r.step in timed] or [r.wire_bytes for r in rows]
    overhead_s = max(0.0, s["sync_s_mean"] - s["sparsifier_s_mean"] - s["comm_s_mean"])
    own_s = max(0.0, s["sync_s_mean"] - s["comm_s_mean"])
    return {
        "step_ms": 1e3 * s["step_s_mean"],
        "own_ms": 1e3 * own_s,
        "own_pct": 100.0 * own_s / s["step_s_mean"],
        "sparsifier_ms": 1e3 * s["sparsifier_s_mean"],
        "overhead_ms": 1e3 * overhead_s,
        "overhead_pct": 100.0 * overhead_s / s["step_s_mean"],
        "comm_ms": 1e3 * s["comm_s_mean"],
        "bytes_per_step": sum(wire) / len(wire),
        "peak_to_median": s["peak_to_median"] if s["peak_to_median"] is not None else float("inf"),
        "imbalance_mean": s["bucket_imbalance_mean"],
        "imbalance_max": s["bucket_imbalance_max"],
    }


def peer_statistics(rows: list[dict[str, float]], *, warmup_steps: int) -> dict[str, float]:
    """The figures of one PyTorch method's rows (every rank's; see the module docstring)."""
    steps = sorted({r["step"] for r in rows})
    timed = set(steps[warmup_steps:] if len(steps) > warmup_steps else steps)
    kept = [r for r in rows if r["step"] in timed]
    step_s = sum(max(r["step_s"] for r in kept if r["step"] == t) for t in timed) / len(timed)

    def mean(key: str) -> float:
        return sum(r[key] for r in kept) / len(kept)

    return {
        "step_ms": 1e3 * step_s,
        "own_ms": 1e3 * mean("own_s"),
        "own_pct": 100.0 * mean("own_s") / step_s,
        "bytes_per_step": mean("bytes"),
        "cpu_ms": 1e3 * mean("cpu_s"),
        "collectives_per_step": mean("num_collectives"),
    }


def format_methods_table(stats: dict[str, dict[str, float]]) -> str:
    """Every method, one row: bytes per step, step time, own time, CPU against plain DDP's."""
    head = (
        f"{'method':11s} {'kB/step':>10s} {'x DDP B':>8s} {'step ms':>8s} {'own ms':>8s} {'% step':>6s} "
        f"{'CPU ms':>8s} {'x DDP CPU':>9s}"
    )
    nan = float("nan")
    lines = [head, "-" * len(head)]
    for method, s in stats.items():
        own = f"{s['own_ms']:8.1f} {s['own_pct']:6.1f}" if method != "ddp" else f"{'-':>8s} {'-':>6s}"
        lines.append(
            f"{method:11s} {s['bytes_per_step'] / 1e3:10.1f} {s.get('bytes_vs_ddp', nan):8.4f} "
            f"{s['step_ms']:8.1f} {own} {s['cpu_ms']:8.1f} {s.get('cpu_vs_ddp', nan):9.2f}"
        )
    return "\n".join(lines)


def _medians(per_round: list[dict[str, float]]) -> dict[str, float]:
    """Each statistic's median over rounds."""
    return {k: statistics.median(r[k] for r in per_round) for k in per_round[0]}


def format_rounds_table(rounds: list[dict[str, dict[str, float]]]) -> str:
    """min / median over rounds of the times and of the CPU against DDP's, one row per method."""
    keys = ("step_ms", "own_ms", "cpu_ms", "cpu_vs_ddp")
    head = f"{'method':11s} " + " ".join(f"{k:>15s}" for k in keys)
    lines = [head, "-" * len(head)]
    for method in rounds[0]:
        cells = []
        for k in keys:
            xs = [r[method].get(k, float("nan")) for r in rounds]
            cells.append(f"{min(xs):7.2f}/{statistics.median(xs):7.2f}")
        lines.append(f"{method:11s} " + " ".join(f"{c:>15s}" for c in cells))
    return "\n".join(lines)


def format_table(stats: dict[str, dict[str, float]]) -> str:
    """Our policies' details, one row each (NaN where topk or the packing bound is missing)."""
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
    """One line per target, judged on the importance policy (overhead on every sparse policy),
    and the importance policy against PowerSGD rank 1: fewer bytes at no more CPU."""
    lines = []
    ours, peer = stats.get("importance"), stats.get("powersgd1")
    if ours is not None and peer is not None and "cpu_vs_ddp" in ours and "cpu_vs_ddp" in peer:
        fewer = ours["bytes_per_step"] < peer["bytes_per_step"]
        cheaper = ours["cpu_vs_ddp"] <= peer["cpu_vs_ddp"]
        verdict = "met" if fewer and cheaper else "MISSED"
        lines.append(
            f"  importance fewer bytes than powersgd1 at <= its CPU: {ours['bytes_per_step'] / 1e3:.1f} vs "
            f"{peer['bytes_per_step'] / 1e3:.1f} kB/step, {ours['cpu_vs_ddp']:.2f} vs {peer['cpu_vs_ddp']:.2f} "
            f"x DDP CPU -> {verdict}"
        )
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
    from igrt.train.launch import launch, status_line, status_phase
    from igrt.workloads import prepare_workload

    methods = tuple(dict.fromkeys(p for p in args.policies.split(",") if p))
    known = PEERS + BENCH_POLICIES
    unknown = sorted(set(methods) - set(known))
    if unknown or not methods:
        raise ValueError(f"--policies: {unknown or 'none'} not among {', '.join(known)}")
    for name in ("batch_size", "num_buckets", "rounds"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    for name, limit in (("steps", "MAX_TRAIN_STEPS"), ("record_steps", "MAX_TRAIN_STEPS"),
                        ("nproc", "MAX_LOCAL_RANKS"), ("release_period", "MAX_RELEASE_PERIOD")):  # fmt: skip
        flag = "ranks" if name == "nproc" else name.replace("_", "-")
        check_count(getattr(args, name), what=f"--{flag}", limit=limit)
    if not 1 <= args.warmup < args.steps:
        raise ValueError(f"--warmup {args.warmup}: must be >= 1 and below --steps {args.steps}")
    if not args.no_plot:
        from igpolicy.cli_outputs import check_output_file

        check_output_file(args.plot, flag="--plot")  # before the work, not after it
    print(f"igrt bench: {prepare_workload(args.workload, tiny=args.tiny, seed=args.seed)}", file=sys.stderr)
    trace = args.trace or _shipped_trace(args.workload, args.tiny)
    plan = None
    if trace is not None and "importance" in methods:
        with status_phase("igrt bench", f"profiling the importance plan from {trace}"):
            plan, _, _ = profile_trace(
                trace, release_period=args.release_period, density=args.density, method=args.threshold
            )
    with tempfile.TemporaryDirectory(prefix="igrt-bench-") as tmp:
        keys = (
            "workload",
            "tiny",
            "seed",
            "steps",
            "warmup",
            "rounds",
            "batch_size",
            "density",
            "release_period",
        )
        keys += ("num_buckets", "packing", "record_steps", "threshold")
        opts = {k: getattr(args, k) for k in keys}
        opts.update(
            policies=methods,
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
    world_size = len(results)
    rounds = []
    for k in range(args.rounds):  # every statistic per round, ratios against the same round's ddp
        ours = {p: policy_statistics(first["rows"][p][k], warmup_steps=args.warmup) for p in first["rows"]}
        for p, s in ours.items():
            s["cpu_ms"] = 1e3 * sum(r["cpu"][p][k] for r in results.values()) / world_size
            if "topk" in ours:
                s["ratio_to_topk"] = s["bytes_per_step"] / ours["topk"]["bytes_per_step"]
        peers = {m: peer_statistics(first["peers"][m][k], warmup_steps=args.warmup) for m in first["peers"]}
        every = {m: (peers.get(m) or ours[m]) for m in methods}
        if "ddp" in every:
            for s in every.values():
                s["cpu_vs_ddp"] = s["cpu_ms"] / every["ddp"]["cpu_ms"]
                s["bytes_vs_ddp"] = s["bytes_per_step"] / every["ddp"]["bytes_per_step"]
        rounds.append(every)
    every = {m: _medians([r[m] for r in rounds]) for m in methods}
    ours = {p: every[p] for p in methods if p in first["rows"]}
    status_line("igrt bench", "computing the table (the best packing of every step, per policy)")
    for p, s in ours.items():
        s["imbalance_best"] = best_imbalance(
            infos=first["infos"],
            config=_policy_config(p, opts),
            plan=first["plan"] if p == "importance" else None,
            steps=args.steps,
            world_size=world_size,
        )
    print(
        f"{args.workload}{' (tiny)' if args.tiny else ''}, {world_size} {args.backend} ranks, batch "
        f"{args.batch_size}, {args.steps} steps per method ({args.warmup} untimed), {args.rounds} round(s) "
        f"(medians), density {args.density:g}, "
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
    print(format_methods_table(every))
    if not args.no_plot:
        from igplot import plot_bench

        title = f"igrt bench: {args.workload}{' (tiny)' if args.tiny else ''}, {world_size} {args.backend} ranks, {args.steps} steps"
        print(f"wrote {plot_bench(every, args.plot, title=title)}")
    if args.rounds > 1:
        print(f"over the {args.rounds} rounds, min / median:")
        print(format_rounds_table(rounds))
    if ours:
        print("our policies in detail:")
        print(format_table(ours))
    lines = target_report(every)
    if lines:
        print("targets:")
        print("\n".join(lines))
    return 0
