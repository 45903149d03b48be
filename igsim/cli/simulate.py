"""``igsim simulate``: one policy, one workload, one cluster; prints a summary, writes rows on request.

    igsim simulate --trace DIR | --model NAME  [--plan plan.json]
                   --topology FILE | --ranks N --bandwidth 100Gbps --latency 5us
                   --policy dense|topk|adtopk|importance|periodic --density 0.01 --release-period 4
                   --packing kk --steps N --seed S [--csv F] [--json F] [--chrome-trace F]

Units are parsed by :mod:`igpolicy.units` ("100Gbps", "5us", "25MiB"); a bad unit is an error.
An incomplete trace (a recording that stopped mid-way) is refused; ``--complete-prefix`` replays
the steps before its first incomplete one.
With ``--model`` and a plan profiled on another model, the plan is carried over by component kind
and relative depth (:func:`igsim.step.architectures.transfer_plan`), and a note says so.
"""

from __future__ import annotations

import argparse

from igpolicy.units import format_bandwidth, format_time, parse_bandwidth, parse_time
from igsim.cli.options import (
    add_policy_arguments,
    check_output_files,
    check_sim_steps,
    collective_footnote,
    load_calibration,
    load_plan,
    make_config,
    make_topology,
    make_workload,
    parse_window,
    plan_for,
)
from igsim.step.engine import MODES, simulate
from igsim.step.workload import Jitter

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--trace", help="trace directory to replay")
    src.add_argument("--model", help="built-in architecture (e.g. llama-7b, opt-1.3b, pythia-1b)")
    p.add_argument("--window", default=None, metavar="A:B", help="replay recorded steps A <= step < B only")
    p.add_argument(
        "--complete-prefix",
        action="store_true",
        help="--trace: replay an incomplete trace (a recording that stopped mid-way) up to its first "
        "incomplete step",
    )
    p.add_argument("--accelerator", default="h100", help="--model: a100, h100 or h200")
    p.add_argument("--utilisation", type=float, default=0.4, help="--model: fraction of peak FLOP/s")
    p.add_argument("--tokens-per-step", type=int, default=4096, help="--model: tokens per rank per step")
    p.add_argument("--plan", help="SyncPlan JSON (needed by --policy importance)")
    p.add_argument("--topology", help="topology file (JSON or YAML); else a star of --ranks")
    p.add_argument("--calibration", help="calibration JSON (per link class alpha, effective bandwidth)")
    p.add_argument("--ranks", type=int, default=8, help="star topology: number of ranks (default 8)")
    p.add_argument(
        "--bandwidth",
        default="100Gbps",
        help="star topology: per-rank link rate with a unit, e.g. 100Gbps, 10Gbit/s, 12.5GB/s (default 100Gbps)",
    )
    p.add_argument(
        "--latency", default="5us", help="star topology: per-link latency with a unit, e.g. 5us, 2ms (default 5us)"
    )
    add_policy_arguments(p)
    p.add_argument("--steps", type=int, default=100, help="steps to simulate (default 100)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sparsifier draws and jitter (default 0)")
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
    p.add_argument("--straggler-rank", type=int, default=None, help="this rank's compute is slowed down")
    p.add_argument(
        "--straggler-slowdown", type=float, default=1.0, help="compute-time factor of --straggler-rank (default 1)"
    )
    p.add_argument("--csv", help="write StepMetrics rows as CSV")
    p.add_argument("--json", help="write summary, settings and rows as JSON")
    p.add_argument("--chrome-trace", help="write a Chrome/Perfetto trace of the first 200 steps")


def run(args: argparse.Namespace) -> int:
    check_sim_steps(args.steps)
    check_output_files(args, "csv", "json", "chrome_trace")  # before the work, not after it
    if args.complete_prefix and args.trace:
        args = _complete_prefix_window(args)
    workload = make_workload(args)
    config = make_config(args, workload=workload)
    plan = load_plan(args.plan)
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
            f"star of {args.ranks} ranks at {format_bandwidth(parse_bandwidth(args.bandwidth, flag='--bandwidth'))}, "
            f"latency {format_time(parse_time(args.latency, flag='--latency'))}"
        )
    )
    print(
        f"workload {workload.name} ({len(workload.params)} params), {where}, k from {result.settings['k_source']}"
    )
    print(result.format_summary())
    print(collective_footnote(config, [result.world_size]))
    for flag, method in (
        ("csv", result.to_csv),
        ("json", result.to_json),
        ("chrome_trace", result.to_chrome_trace),
    ):
        path = getattr(args, flag)
        if path:
            print(f"wrote {method(path)}")
    return 0


def _complete_prefix_window(args: argparse.Namespace) -> argparse.Namespace:
    """``args`` with ``--window`` narrowed to the trace's complete prefix (a note says so)."""
    from traces.reader import read_trace  # as in Workload.from_trace: only a trace needs pyarrow

    window = parse_window(args.window)
    trace = read_trace(args.trace, steps=window, complete_prefix=True)
    if trace.truncated_at is None:
        return args
    start = window[0] if window else 0
    if trace.num_steps == 0 or trace.truncated_at <= start:
        raise ValueError(f"--complete-prefix: no step is complete on every rank ({trace.incomplete})")
    print(
        f"note: the trace is incomplete; replaying its complete prefix, {trace.num_steps} recorded steps "
        f"before step {trace.truncated_at}"
    )
    return argparse.Namespace(**{**vars(args), "window": f"{start}:{trace.truncated_at}"})
