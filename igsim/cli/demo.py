"""``igsim demo``: the whole pipeline on the shipped sample trace, in under a minute.

Profiles the MiniLM sample trace into a SyncPlan, then simulates dense all-reduce, Top-k with error
feedback and the importance policy across link rates of 1-400 Gbit/s and 8-1,024 ranks (star
topologies), and writes the plan, a CSV and a PNG into ``--out``. ``--trace DIR`` runs it on another
trace. Until the sample trace is recorded, it says so and exits with status 1.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from igpolicy.cli_outputs import LOCK_NAME, claim_output_dir
from igpolicy.config import PolicyConfig
from igpolicy.units import format_bandwidth, format_bytes, format_time
from igpolicy.vocab import ComponentClass

__all__ = ["add_arguments", "run"]

POLICIES = ("dense", "topk", "importance")
FULL = {"gbps": (1, 10, 25, 100, 400), "ranks": (8, 64, 256, 1024), "steps": 40}
DEFAULT_OUT = "igsim-demo"
QUICK = {"gbps": (1, 10, 100, 400), "ranks": (8, 64, 1024), "steps": 12}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--out",
        default=None,
        help=f"output directory (default ./{DEFAULT_OUT}, whose previous demo a rerun replaces)",
    )
    p.add_argument("--quick", action="store_true", help="fewer points and steps")
    p.add_argument("--trace", help="use this trace instead of the shipped MiniLM sample")
    p.add_argument("--sample", default="minilm", help="name of the shipped sample trace (default minilm)")
    p.add_argument("--workers", type=int, default=2, help="parallel simulations (default 2)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _find_trace(args: argparse.Namespace) -> Path | None:
    if args.trace:
        return Path(args.trace)
    from traces.samples import sample_trace_path
    from traces.schema import part_files

    try:
        path = sample_trace_path(args.sample)
        if not part_files(path, table="params"):
            raise ValueError(f"{path} has a manifest but no recorded rows (still being recorded?)")
        return path
    except ValueError as e:
        print(
            f"igsim demo: the sample trace {args.sample!r} is not available yet ({e}).\n"
            f"  Record one with:  igrt record --workload minilm --ranks 2 --steps 300 -o traces/samples/minilm\n"
            f"  or run the demo on any trace:  igsim demo --trace DIR",
            file=sys.stderr,
        )
        return None


def run(args: argparse.Namespace) -> int:
    from igsim.cli.options import check_workers, collective_footnote, format_plan_table
    from igsim.step.workload import Workload
    from igsim.studies.sweep import format_sweep_table, plot_sweep, run_sweep, write_sweep_csv
    from traces.profiling import profile_trace

    check_workers(args.workers)
    trace = _find_trace(args)
    if trace is None:
        return 1
    grid = QUICK if args.quick else FULL
    out = Path(args.out or DEFAULT_OUT)
    # the default folder is the demo's own: a rerun replaces the previous demo there (only a folder
    # an igsim/igrt command marked; anything else in it is still refused); a folder the user named
    # is kept unless --overwrite
    again = args.out is None and (out / LOCK_NAME).is_file()
    if again and any(p.name != LOCK_NAME for p in out.iterdir()):
        print(f"igsim demo: replacing the previous demo in {out}/", file=sys.stderr)
    claim_output_dir(out, overwrite=args.overwrite or again, flag="--out")  # locked until the command ends
    t0 = time.perf_counter()

    plan, scores, result = profile_trace(trace, release_period=4)
    plan.save(out / "plan.json")
    workload = Workload.from_trace(trace)
    n_low = len(plan.low)
    n_imp = sum(1 for c in plan.components if c.cls == ComponentClass.IMPORTANT)
    print(f"[1/2] profiled {trace} ({workload.num_recorded_steps} steps, {len(workload.params)} params)")
    print(
        f"      {n_imp} important, {n_low} low-importance of {len(plan.components)} components "
        f"(threshold {result.method} {result.threshold:.3f}); plan -> {out / 'plan.json'}"
    )
    if not args.quick:
        print("\n".join("      " + line for line in format_plan_table(plan, scores).splitlines()[:12]))

    config = PolicyConfig(policy="importance", density=float(workload.k_density or 0.01), release_period=4)
    bandwidths = [g * 1e9 / 8 for g in grid["gbps"]]
    print(
        f"[2/2] simulating {', '.join(POLICIES)} x {len(bandwidths)} link rates x {len(grid['ranks'])} world sizes, "
        f"{grid['steps']} steps each (density {config.density:g}, release period {config.release_period})"
    )
    rows = run_sweep(
        workload=workload,
        plan=plan,
        config=config,
        policies=POLICIES,
        bandwidths_bytes_per_s=bandwidths,
        world_sizes=grid["ranks"],
        num_steps=grid["steps"],
        max_workers=args.workers,
        progress=not args.no_progress,
    )
    print(format_sweep_table(rows))
    print(collective_footnote(config, grid["ranks"]))
    csv_path = write_sweep_csv(rows, out / "sweep.csv")
    png_path = plot_sweep(rows, out / "sweep.png", title=f"{workload.name}: dense vs Top-k+EF vs importance")
    _headline(rows)
    print(f"wrote {csv_path} and {png_path} in {time.perf_counter() - t0:.1f} s")
    return 0


def _headline(rows: list[dict]) -> None:
    """One line per world size at the slowest link: what each policy costs there."""
    for w in sorted({r["world_size"] for r in rows}):
        at = [r for r in rows if r["world_size"] == w]
        slowest = min(r["bandwidth_bytes_per_s"] for r in at)
        parts = [
            f"{r['policy']} {format_time(r['step_s_mean'])} ({format_bytes(r['wire_bytes'])}/step)"
            for r in at
            if r["bandwidth_bytes_per_s"] == slowest
        ]
        print(f"  {w} ranks at {format_bandwidth(slowest)}: " + ", ".join(parts))
