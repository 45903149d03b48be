"""``igsim simulate``: one policy, one workload, one cluster; prints a summary, writes rows on request.

    igsim simulate --trace DIR | --model NAME  [--plan plan.json]
                   --topology FILE | --ranks N --bandwidth 100Gbps --latency 5us
                   --policy dense|topk|adtopk|importance|periodic --density 0.01 --release-period 4
                   --packing kk --steps N --seed S [--csv F] [--json F] [--chrome-trace F]

Units are parsed by :mod:`igpolicy.units` ("100Gbps", "5us", "25MiB"); a bad unit is an error.
With ``--model`` and a plan profiled on another model, the plan is carried over by component kind
and relative depth (:func:`igsim.architectures.transfer_plan`), and a note says so.
"""

from __future__ import annotations

import argparse
from typing import Any

from igpolicy.config import PACKINGS, POLICIES, SPARSIFIERS, PolicyConfig
from igpolicy.plan import SyncPlan, compare_plans
from igpolicy.units import format_bandwidth, format_time, parse_bandwidth, parse_size, parse_time
from igsim.engine import MODES, simulate
from igsim.workload import Jitter, Workload

__all__ = ["add_arguments", "make_config", "make_topology", "make_workload", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--trace", help="trace directory to replay")
    src.add_argument("--model", help="built-in architecture (e.g. llama-7b, opt-1.3b, pythia-1b)")
    p.add_argument("--window", default=None, metavar="A:B", help="replay recorded steps A <= step < B only")
    p.add_argument("--accelerator", default="h100", help="--model: a100, h100 or h200")
    p.add_argument("--utilisation", type=float, default=0.4, help="--model: fraction of peak FLOP/s")
    p.add_argument("--tokens-per-step", type=int, default=4096, help="--model: tokens per rank per step")
    p.add_argument("--plan", help="SyncPlan JSON (needed by --policy importance)")
    p.add_argument("--topology", help="topology file (JSON or YAML); else a star of --ranks")
    p.add_argument("--calibration", help="calibration JSON (per link class alpha, effective bandwidth)")
    p.add_argument("--ranks", type=int, default=8, help="star topology: number of ranks (default 8)")
    p.add_argument(
        "--bandwidth", default="100Gbps", help="star topology: per-rank link rate (default 100Gbps)"
    )
    p.add_argument("--latency", default="5us", help="star topology: per-link latency (default 5us)")
    add_policy_arguments(p)
    p.add_argument("--steps", type=int, default=100, help="steps to simulate (default 100)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mode", default="auto", choices=MODES, help="collective costing (default auto)")
    p.add_argument(
        "--integration",
        default="ddp-hook",
        choices=("ddp-hook", "sync", "deepspeed"),
        help="whose step plan to cost: ddp-hook (DDP's buckets, overlapped with backward; default), "
        "sync or deepspeed (after backward)",
    )
    p.add_argument("--no-overlap", action="store_true", help="same as --integration sync")
    p.add_argument(
        "--compute-cv", type=float, default=0.0, help="per-rank compute jitter (coefficient of variation)"
    )
    p.add_argument("--straggler-rank", type=int, default=None)
    p.add_argument("--straggler-slowdown", type=float, default=1.0)
    p.add_argument("--csv", help="write StepMetrics rows as CSV")
    p.add_argument("--json", help="write summary, settings and rows as JSON")
    p.add_argument("--chrome-trace", help="write a Chrome/Perfetto trace of the first 200 steps")


def add_policy_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", default="importance", choices=POLICIES)
    p.add_argument(
        "--sparsifier",
        default=None,
        choices=SPARSIFIERS,
        help="default: adtopk for --policy adtopk, else topk",
    )
    p.add_argument(
        "--density",
        type=float,
        default=None,
        help="sparsifier density in (0, 1] (default: the trace's, else 0.01)",
    )
    p.add_argument("--release-period", type=int, default=4)
    p.add_argument(
        "--no-stagger", action="store_true", help="release every low component on one step (burst)"
    )
    p.add_argument("--packing", default="kk", choices=PACKINGS)
    p.add_argument("--num-buckets", type=int, default=None, help="bucket count (default: from --bucket-cap)")
    p.add_argument("--bucket-cap", default="25MiB", help="bucket size cap when --num-buckets is not given")
    p.add_argument("--collective", default="auto", choices=("auto", "sparse", "dense"))
    p.add_argument("--value-bytes", type=int, default=4, choices=(2, 4))


def make_config(
    args: argparse.Namespace, *, policy: str | None = None, workload: Workload | None = None
) -> PolicyConfig:
    """A PolicyConfig from the policy flags (``policy`` overrides ``--policy``); without
    ``--density``, the density the workload's trace was recorded at (else 0.01)."""
    policy = policy or args.policy
    density = args.density
    if density is None:
        density = workload.k_density if workload is not None and workload.k_density is not None else 0.01
    return PolicyConfig(
        policy=policy,
        sparsifier=getattr(args, "sparsifier", None) or ("adtopk" if policy == "adtopk" else "topk"),
        density=density,
        release_period=args.release_period,
        staggered=not args.no_stagger,
        packing=args.packing,
        num_buckets=args.num_buckets,
        bucket_cap_bytes=max(1, parse_size(args.bucket_cap)),
        collective=args.collective,
        value_bytes=args.value_bytes,
        seed=getattr(args, "seed", 0),
    )


def make_topology(args: argparse.Namespace) -> Any:
    """``--topology FILE`` or a star of ``--ranks`` at ``--bandwidth`` / ``--latency``."""
    from igsim import topology as topo

    if args.topology:
        return topo.load_topology(args.topology)
    if args.ranks < 1:
        raise ValueError(f"--ranks {args.ranks}: must be >= 1")
    return topo.star(
        num_ranks=args.ranks,
        bandwidth_bytes_per_s=parse_bandwidth(args.bandwidth),
        latency_s=parse_time(args.latency),
    )


def load_calibration(path: str | None) -> Any:
    if not path:
        return None
    from igsim.calibration import Calibration

    return Calibration.load(path)


def make_workload(args: argparse.Namespace) -> Workload:
    """The workload of ``--trace`` (with ``--window``) or ``--model`` (roofline)."""
    if args.trace:
        from igsim.cmd_profile import parse_window

        return Workload.from_trace(args.trace, window=parse_window(args.window))
    from igsim.architectures import architecture_workload

    return architecture_workload(
        args.model,
        accelerator=args.accelerator,
        utilisation=args.utilisation,
        tokens_per_step=args.tokens_per_step,
    )


def plan_for(workload: Workload, plan: SyncPlan | None, *, policy: str) -> tuple[SyncPlan | None, str | None]:
    """The plan to use for ``workload``; carried over when it was profiled on another model.

    Returns (plan, note) where note says what was done (None when nothing was).
    """
    if plan is None or policy != "importance":
        return plan, None
    missing, extra = compare_plans(plan, [p.component for p in workload.params])
    if not missing and not extra:
        return plan, None
    from igsim.architectures import transfer_plan

    moved = transfer_plan(plan, None, workload.params)
    note = (
        f"note: plan {plan.fingerprint} was profiled on another model ({len(missing)} components missing, "
        f"{len(extra)} extra); carried over by component kind and relative depth -> {moved.fingerprint}"
    )
    if moved.source.get("unmatched"):
        note += f"; pinned without a counterpart: {', '.join(moved.source['unmatched'][:8])}"
    return moved, note


def run(args: argparse.Namespace) -> int:
    if args.steps < 1:
        raise ValueError(f"--steps {args.steps}: must be >= 1")
    workload = make_workload(args)
    config = make_config(args, workload=workload)
    plan = SyncPlan.load(args.plan) if args.plan else None
    if config.policy == "importance" and plan is None:
        raise ValueError(
            "--policy importance needs --plan plan.json (make one with: igsim profile TRACE -o plan.json)"
        )
    plan, note = plan_for(workload, plan, policy=config.policy)
    if note:
        print(note)
    topology = make_topology(args)
    jitter = None
    if args.compute_cv or args.straggler_rank is not None:
        jitter = Jitter(
            seed=args.seed,
            compute_cv=args.compute_cv,
            straggler_rank=args.straggler_rank,
            straggler_slowdown=args.straggler_slowdown,
        )
    result = simulate(
        workload=workload,
        config=config,
        plan=plan,
        topology=topology,
        calibration=load_calibration(args.calibration),
        num_steps=args.steps,
        seed=args.seed,
        mode=args.mode,
        jitter=jitter,
        integration="sync" if args.no_overlap else args.integration,
    )
    where = (
        f"topology {args.topology}"
        if args.topology
        else (
            f"star of {args.ranks} ranks at {format_bandwidth(parse_bandwidth(args.bandwidth))}, "
            f"latency {format_time(parse_time(args.latency))}"
        )
    )
    print(
        f"workload {workload.name} ({len(workload.params)} params), {where}, k from {result.settings['k_source']}"
    )
    print(result.format_summary())
    for flag, method in (
        ("csv", result.to_csv),
        ("json", result.to_json),
        ("chrome_trace", result.to_chrome_trace),
    ):
        path = getattr(args, flag)
        if path:
            print(f"wrote {method(path)}")
    return 0
