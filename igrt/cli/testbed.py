"""``igrt testbed up|down|status``: the network-namespace testbed (needs root).

    igrt testbed up --ranks 4 --bandwidth 100Mbit       # prints the run id, e.g. 3f9c01ab
    igrt testbed down --run-id 3f9c01ab            # removes that testbed only
    igrt testbed down --all                        # removes every testbed (explicitly)

Each testbed's namespaces carry its run id (:mod:`igrt.testbed.namespaces`), so ``down`` removes
only the testbed it names: another run's (``igrt validate``, a study) is never touched by accident.
"""

from __future__ import annotations

import argparse

from igpolicy.cli_util import add_deprecated_alias
from igpolicy.units import format_bandwidth, parse_bandwidth
from igrt.testbed import namespaces as testbed


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "action", choices=("up", "down", "status"), help="up: build a testbed, down: remove one, status: list them"
    )
    p.add_argument("--ranks", type=int, default=4, help="number of rank namespaces (default 4)")
    rate = p.add_argument(
        "--bandwidth",
        dest="rate",
        metavar="RATE",
        default="100Mbit",
        help="per-rank link rate with a unit, both directions, e.g. 100Mbit, 1Gbit/s (default 100Mbit)",
    )
    p.add_argument("--two-level", action="store_true", help="two bridges joined by one shaped uplink")
    uplink = p.add_argument(
        "--uplink-bandwidth",
        dest="uplink_rate",
        metavar="RATE",
        default=None,
        help="rate of the inter-bridge link, with a unit (default: --bandwidth)",
    )
    p.add_argument("--hetero", action="store_true", help="make the last rank's NIC slower")
    slow = p.add_argument(
        "--slow-bandwidth",
        dest="slow_rate",
        metavar="RATE",
        default=None,
        help="rate of the slow NIC with --hetero, with a unit (default: --bandwidth / 4)",
    )
    for old, new in (("--rate", rate), ("--uplink-rate", uplink), ("--slow-rate", slow)):
        add_deprecated_alias(p, old, new)
    p.add_argument("--run-id", default=None, help="down: the testbed to remove (printed by up); up: its id")
    p.add_argument("--all", action="store_true", help="down: remove every testbed of every run")


def spec_from_args(args: argparse.Namespace) -> testbed.TestbedSpec:
    rate = parse_bandwidth(args.rate, flag="--bandwidth")
    ids = {"run_id": args.run_id} if getattr(args, "run_id", None) else {}
    return testbed.TestbedSpec(
        **ids,
        num_ranks=args.ranks,
        rate_bytes_per_s=rate,
        two_level=args.two_level,
        uplink_rate_bytes_per_s=parse_bandwidth(args.uplink_rate, flag="--uplink-bandwidth") if args.uplink_rate else None,
        slow_rank=args.ranks - 1 if args.hetero else None,
        slow_rate_bytes_per_s=(parse_bandwidth(args.slow_rate, flag="--slow-bandwidth") if args.slow_rate else rate / 4)
        if args.hetero
        else None,
    )


def run(args: argparse.Namespace) -> int:
    try:
        if args.action == "down":
            if args.all == (args.run_id is not None):
                raise ValueError("down: give --run-id RUN (printed by `igrt testbed up`) or --all")
            removed = testbed.teardown_all() if args.all else testbed.teardown(args.run_id)
            print(f"removed {len(removed)} namespaces" + (f": {' '.join(removed)}" if removed else ""))
        elif args.action == "status":
            found = testbed.leftovers()
            print("testbed namespaces: " + (" ".join(found) if found else "none"))
            for run in testbed.run_ids():
                print(f"  run {run}: {' '.join(testbed.leftovers(run))}")
        else:
            spec = spec_from_args(args)
            testbed.setup(spec)
            print(
                f"testbed up: {spec.num_ranks} ranks at {format_bandwidth(spec.rate_bytes_per_s)} each way"
                + (f", two-level uplink {format_bandwidth(spec.uplink_rate)}" if spec.two_level else "")
                + (
                    f", rank {spec.slow_rank} at {format_bandwidth(spec.rank_rate(spec.slow_rank))}"
                    if spec.slow_rank is not None
                    else ""
                )
            )
            for r in range(spec.num_ranks):
                print(f"  rank {r}: namespace {spec.rank_ns(r)}  address {spec.rank_addr(r)}")
            print(f"run id {spec.run_id}; tear down with: igrt testbed down --run-id {spec.run_id}")
    except testbed.TestbedError as e:
        raise ValueError(str(e)) from None
    return 0
