"""``igsim sweep``: bandwidths x world sizes x policies on star topologies, in parallel.

    igsim sweep --trace DIR | --model NAME [--plan plan.json]
                --policies dense,topk,importance --bandwidths 1Gbps,10Gbps,100Gbps --ranks 8,64,512
                [--steps 20] [--workers 2] [--executor process|ray [--address auto]]
                [--png sweep.png] [--csv sweep.csv]

With ``--trace`` and no ``--plan``, the importance policy uses a plan profiled from the same trace
(knee threshold), and a note says so. ``--executor ray`` runs the points as Ray tasks (the
optional extra ``pip install -e '.[ray]'``): on a local cluster of ``--workers`` CPUs, or on the
cluster at ``--address`` (``auto``: the one ``ray start`` made on this machine). The rows are the
same as the local pool's. ``--workers`` is capped at the CPUs available (a note says so).
"""

from __future__ import annotations

import argparse

from igpolicy.config import POLICIES
from igpolicy.limits import check_count
from igpolicy.units import parse_bandwidth, parse_time
from igsim.cli.options import (
    add_policy_arguments,
    check_output_files,
    check_sim_steps,
    check_workers,
    collective_footnote,
    load_plan,
    make_config,
    make_workload,
    plan_for,
)
from igsim.step.engine import MODES
from igsim.studies.sweep import (
    EXECUTORS,
    available_cpus,
    format_sweep_table,
    plot_sweep,
    run_sweep,
    write_sweep_csv,
)

__all__ = ["add_arguments", "parse_list", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--trace", help="trace directory to replay")
    src.add_argument("--model", help="built-in architecture (e.g. llama-7b)")
    p.add_argument("--window", default=None, metavar="A:B", help="--trace: recorded steps A <= step < B only")
    p.add_argument("--accelerator", default="h100", help="--model: a100, h100 or h200 (default h100)")
    p.add_argument("--utilisation", type=float, default=0.4, help="--model: fraction of peak FLOP/s (default 0.4)")
    p.add_argument(
        "--tokens-per-step", type=int, default=4096, help="--model: tokens per rank per step (default 4096)"
    )
    p.add_argument("--plan", help="SyncPlan JSON for the importance policy")
    p.add_argument("--policies", default="dense,topk,importance", help="comma-separated policies")
    p.add_argument(
        "--bandwidths",
        default="1Gbps,10Gbps,100Gbps,400Gbps",
        help="comma-separated link rates, each with a unit (default 1Gbps,10Gbps,100Gbps,400Gbps)",
    )
    p.add_argument("--ranks", default="8,64,256", help="comma-separated world sizes (default 8,64,256)")
    p.add_argument("--latency", default="5us", help="per-link latency with a unit, e.g. 5us, 2ms (default 5us)")
    add_policy_arguments(p, policy=False)
    p.add_argument("--steps", type=int, default=20, help="steps to simulate per point (default 20)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sparsifier draws (default 0)")
    p.add_argument("--mode", default="auto", choices=MODES, help="collective costing (default auto)")
    p.add_argument(
        "--workers", type=int, default=2, help="parallel runs, at most the CPUs available (default 2)"
    )
    p.add_argument("--executor", default="process", choices=EXECUTORS,
                   help="process: a local pool (default); ray: Ray tasks (pip install -e '.[ray]')")  # fmt: skip
    p.add_argument("--address", default=None,
                   help="with --executor ray: the cluster to join (e.g. auto); default: start a local one")  # fmt: skip
    p.add_argument("--png", help="write the plot here")
    p.add_argument("--csv", help="write one line per point here")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def parse_list(text: str, what: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise ValueError(f"--{what} {text!r}: expected a comma-separated list")
    return items


def run(args: argparse.Namespace) -> int:
    policies = parse_list(args.policies, "policies")
    for pol in policies:
        if pol not in POLICIES:
            raise ValueError(f"--policies: {pol!r} is not one of {', '.join(POLICIES)}")
    bandwidths = [parse_bandwidth(b, flag="--bandwidths") for b in parse_list(args.bandwidths, "bandwidths")]
    try:
        sizes = [int(w) for w in parse_list(args.ranks, "ranks")]
    except ValueError:
        raise ValueError(f"--ranks {args.ranks!r}: expected integers, e.g. 8,64,512") from None
    for w in sizes:
        check_count(w, what="--ranks: world size", limit="MAX_RANKS")
    check_sim_steps(args.steps)
    check_workers(args.workers)  # also Ray's local cluster: a process per CPU it is given
    check_output_files(args, "csv", "png")  # before the work, not after it
    if args.address is not None and args.executor != "ray":
        raise ValueError("--address needs --executor ray")
    if args.executor == "process" and args.workers > available_cpus():
        print(
            f"note: --workers {args.workers} > the {available_cpus()} CPUs available here: using {available_cpus()}"
        )
    workload = make_workload(args)
    config = make_config(args, policy=policies[0], workload=workload)
    plan = load_plan(args.plan)
    if "importance" in policies and plan is None:
        if not args.trace:
            raise ValueError("--policies importance with --model needs --plan plan.json")
        from igsim.cli.options import parse_window
        from traces.profiling import profile_trace

        plan, _, _ = profile_trace(
            args.trace, release_period=config.release_period, window=parse_window(args.window)
        )
        print(f"note: no --plan given; profiled {args.trace} (knee threshold) -> plan {plan.fingerprint}")
    plan, note = plan_for(workload, plan, policy="importance" if "importance" in policies else "")
    if note:
        print(note)
    rows = run_sweep(
        workload=workload,
        plan=plan,
        config=config,
        policies=policies,
        bandwidths_bytes_per_s=bandwidths,
        world_sizes=sizes,
        latency_s=parse_time(args.latency, flag="--latency"),
        num_steps=args.steps,
        seed=args.seed,
        mode=args.mode,
        max_workers=args.workers,
        progress=not args.no_progress,
        executor=args.executor,
        address=args.address,
    )
    print(f"workload {workload.name}: {len(rows)} runs of {args.steps} steps ({args.executor})")
    print(format_sweep_table(rows))
    print(collective_footnote(config, sizes))
    if args.csv:
        print(f"wrote {write_sweep_csv(rows, args.csv)}")
    if args.png:
        print(f"wrote {plot_sweep(rows, args.png, title=f'{workload.name}: step time and traffic')}")
    return 0
