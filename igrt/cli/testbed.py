"""``igrt testbed up|down|status``: the network-namespace testbed (needs root).

    igrt testbed up --ranks 4 --bandwidth 100Mbit       # prints the run id, e.g. 3f9c01ab
    igrt testbed down --run-id 3f9c01ab            # removes that testbed only
    igrt testbed down --all                        # removes every testbed (explicitly)

Each testbed's namespaces carry its run id (:mod:`igrt.testbed.namespaces`), so ``down`` removes
only the testbed it names: another run's (``igrt validate``, a study) is never touched by accident.
"""

from __future__ import annotations

import argparse

from igpolicy.units import format_bandwidth
from igrt.cli.options import add_testbed_arguments, spec_from_args
from igrt.testbed import namespaces as testbed


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "action", choices=("up", "down", "status"), help="up: build a testbed, down: remove one, status: list them"
    )
    p.add_argument("--ranks", type=int, default=4, help="number of rank namespaces (default 4)")
    add_testbed_arguments(p)
    p.add_argument("--run-id", default=None, help="down: the testbed to remove (printed by up); up: its id")
    p.add_argument("--all", action="store_true", help="down: remove every testbed of every run")


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
