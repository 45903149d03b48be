"""Simulator speed: the flow-level network and collective schedules on one core.

    /work/venv/bin/python benchmarks/sim_bench.py [--quick]

Prints a table: wall time, simpy events processed, events/s, messages/s and rate recomputations
for (1) raw simpy timeouts (the ceiling), (2) contention-free ring all-reduces on a star, and
(3) a 256-rank leaf-spine ring all-reduce, once in rank order (only leaf-boundary hops cross the
spines) and once with ranks interleaved across leaves (every hop crosses an oversubscribed spine
layer: heavy contention, large connected flow sets). Then the peak Python memory (tracemalloc) of
the 256-rank contended run. Targets: >= 250k events/s in flow mode; raw simpy ~1.5M/s here.
"""

from __future__ import annotations

import argparse
import time
import tracemalloc

import simpy

from igsim.collectives.predict import CollectiveSpec, run_collective
from igsim.net.network import Network
from igsim.net.topology import leaf_spine, star


class CountingEnvironment(simpy.Environment):
    """Counts processed events (used only here; the counting costs a few percent)."""

    def __init__(self) -> None:
        super().__init__()
        self.num_events = 0

    def step(self) -> None:
        self.num_events += 1
        super().step()


def raw_simpy(num_events: int) -> dict:
    env = CountingEnvironment()

    def ticker(env):
        for _ in range(num_events):
            yield env.timeout(1e-6)

    env.process(ticker(env))
    t = time.perf_counter()
    env.run()
    wall = time.perf_counter() - t
    return {
        "case": "raw simpy timeouts",
        "wall_s": wall,
        "events": env.num_events,
        "messages": 0,
        "sim_s": env.now,
    }


def collective_case(label: str, topo, spec: CollectiveSpec, *, ranks=None, repeat: int = 1) -> dict:
    env = CountingEnvironment()
    net = Network(env, topo)
    t = time.perf_counter()
    sim = 0.0
    for _ in range(repeat):
        proc = run_collective(net, spec, ranks=ranks)
        env.run(proc)
        sim = proc.value.time_s
    wall = time.perf_counter() - t
    return {
        "case": label,
        "wall_s": wall,
        "events": env.num_events,
        "messages": net.num_messages,
        "sim_s": sim,
        "recomputes": net.num_recomputes,
        "rate_updates": net.num_rate_updates,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="smaller cases")
    args = ap.parse_args()
    big = 64 if args.quick else 256
    rows = [raw_simpy(200_000 if args.quick else 1_000_000)]
    s64 = star(num_ranks=64, bandwidth_bytes_per_s=12.5e9, latency_s=2.5e-6)
    ar = CollectiveSpec(op="all_reduce", algorithm="ring", size_bytes=100e6)
    rows.append(collective_case("star-64 ring all-reduce x5", s64, ar, repeat=2 if args.quick else 5))
    rows.append(
        collective_case(
            "star-64 tree all-reduce, 16 chunks x5",
            s64,
            CollectiveSpec(op="all_reduce", algorithm="tree", size_bytes=100e6, num_chunks=16),
            repeat=2 if args.quick else 5,
        )
    )
    ls = leaf_spine(
        num_ranks=big, ranks_per_leaf=16, num_spines=4, bandwidth_bytes_per_s=12.5e9, latency_s=1e-6,
        oversubscription=2.0,
    )  # fmt: skip
    rows.append(collective_case(f"leaf-spine-{big} ring, rank order", ls, ar))
    leaves = big // 16
    interleaved = [ls.ranks[(i % leaves) * 16 + i // leaves] for i in range(big)]
    rows.append(collective_case(f"leaf-spine-{big} ring, interleaved", ls, ar, ranks=interleaved))

    print(f"{'case':40s} {'wall s':>8s} {'events':>10s} {'events/s':>10s} {'msgs/s':>9s} "
          f"{'sim time':>10s} {'recomputes':>10s} {'rate upd':>9s}")  # fmt: skip
    for r in rows:
        print(
            f"{r['case']:40s} {r['wall_s']:8.3f} {r['events']:10d} {r['events'] / r['wall_s']:10.0f} "
            f"{r['messages'] / r['wall_s']:9.0f} {r['sim_s'] * 1e3:8.3f}ms {r.get('recomputes', 0):10d} "
            f"{r.get('rate_updates', 0):9d}"
        )
    tracemalloc.start()
    collective_case("mem", ls, ar, ranks=interleaved)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(
        f"peak Python memory, leaf-spine-{big} interleaved ring all-reduce: {peak / 2**20:.1f} MiB (tracemalloc)"
    )


if __name__ == "__main__":
    main()
