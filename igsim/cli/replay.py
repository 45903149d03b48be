"""``igsim replay RUN_DIR``: replay an ``igrt train --record-trace`` run and compare step by step.

    igrt train --workload gpt --tiny --policy topk --steps 20 --record-trace --out runs/topk
    igsim replay runs/topk --out runs/topk/replay          # replay.csv, replay.json
    igsim replay runs/topk --topology testbed.yaml --calibration calib.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

from igpolicy.cli_outputs import claim_output_dir
from igpolicy.cli_util import reading
from igpolicy.units import parse_bandwidth, parse_time

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", type=Path, help="an igrt train output folder recorded with --record-trace")
    p.add_argument("--topology", default=None, help="topology file (YAML/JSON) with the run's world size")
    p.add_argument("--calibration", default=None, help="calibration JSON (igsim validate-report / igrt validate)")
    p.add_argument(
        "--bandwidth", default=None, help="without --topology: star link rate with a unit, e.g. 10Gbps (default 10Gbps)"
    )
    p.add_argument(
        "--latency", default=None, help="without --topology: rank-to-rank latency with a unit, e.g. 50us (default 50us)"
    )
    p.add_argument("--mode", default="auto", choices=("auto", "flow", "analytic"), help="collective costing")
    p.add_argument("--out", type=Path, default=None, help="where replay.csv / replay.json go (default RUN_DIR/replay)")
    p.add_argument("--rows", type=int, default=12, help="steps to print (default 12; all are in replay.csv)")
    p.add_argument(
        "--complete-prefix",
        action="store_true",
        help="replay an incomplete trace (a recording that stopped mid-way) up to its first incomplete step",
    )


def run(args: argparse.Namespace) -> int:
    from igsim.cli.options import collective_footnote, load_calibration
    from igsim.net.topology import load_topology, star
    from igsim.studies.replay import format_replay, load_run, replay_run

    with reading(args.run_dir, "run folder"):
        inputs = load_run(args.run_dir)  # checks the folder before anything else
    topology = None  # replay_run's nominal star
    if args.topology:
        with reading(args.topology, "--topology"):
            topology = load_topology(args.topology)
    elif args.bandwidth or args.latency:
        topology = star(
            num_ranks=inputs.world_size,
            bandwidth_bytes_per_s=parse_bandwidth(args.bandwidth or "10Gbps", flag="--bandwidth"),
            latency_s=parse_time(args.latency or "50us", flag="--latency") / 2,
        )
    calibration = load_calibration(args.calibration)
    out = args.out if args.out is not None else Path(args.run_dir) / "replay"
    claim_output_dir(out, overwrite=args.overwrite, flag="--out")  # before the work; locked until the end
    rep = replay_run(
        args.run_dir, topology=topology, calibration=calibration, mode=args.mode, complete_prefix=args.complete_prefix
    )
    if rep.summary.get("truncated_at") is not None:
        print(f"note: the trace is incomplete; replaying its complete prefix, the {rep.summary['steps']} steps "
              f"before step {rep.summary['truncated_at']}")  # fmt: skip
    paths = rep.write(out)
    print(format_replay(rep, max_rows=args.rows))
    print(collective_footnote(inputs.config, [inputs.world_size]))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0 if rep.summary["bytes_exact"] and rep.summary["ops_exact"] else 1
