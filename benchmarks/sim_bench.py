"""Simulator speed: the flow-level network and collective schedules against raw simpy, one core.

    python benchmarks/sim_bench.py [--rounds 3] [--quick]

Each round runs raw simpy (a process yielding timeouts: simpy's ceiling on this machine at this
moment) and then every flow case, each in a fresh environment and network; a case's *ratio* is
its events per CPU second over that round's raw simpy rate (paired, so the machine's load cancels).
The table gives min / median over rounds. Paths are the topology's (computed once, cached on the
topology) and are warmed before the first round; each network builds its routes from them once.
Cases:

- star-64 (one switch, 100 Gbit/s): ring all-reduce, 16-chunk pipelined tree all-reduce and
  halving-doubling all-reduce of 100 MB (contention-free), repeated in one network;
- leaf-spine-256 (16 ranks per leaf, 4 spines, 2:1): ring all-reduce in rank order (only leaf-
  boundary hops cross the spines) and with ranks interleaved across leaves (every hop crosses an
  oversubscribed uplink: heavy contention, a max-min recomputation for most events).

Then the peak Python memory (tracemalloc) of the contended 256-rank run. Goal (issue 16): every
case >= 50 % of raw simpy in the same run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import tracemalloc

import simpy

from igsim.collectives.predict import CollectiveSpec, run_collective
from igsim.net.network import Network
from igsim.net.topology import Topology, leaf_spine, star


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
    t = time.process_time()
    env.run()
    return {"cpu_s": time.process_time() - t, "events": env.num_events, "messages": 0}


def collective_case(topo: Topology, spec: CollectiveSpec, *, ranks=None, repeat: int = 1) -> dict:
    """``repeat`` collectives one after another in one fresh environment and network (the
    network builds each route once: its first collective pays for them)."""
    env = CountingEnvironment()
    net = Network(env, topo)
    t = time.process_time()
    for _ in range(repeat):
        proc = run_collective(net, spec, ranks=ranks)
        env.run(proc)
    cpu = time.process_time() - t
    return {"cpu_s": cpu, "events": env.num_events, "messages": net.num_messages,
            "recomputes": net.num_recomputes, "sim_s": proc.value.time_s}  # fmt: skip


def cases(quick: bool) -> list[tuple[str, Topology, CollectiveSpec, list | None, int]]:
    big = 64 if quick else 256
    s64 = star(num_ranks=64, bandwidth_bytes_per_s=12.5e9, latency_s=2.5e-6)
    ls = leaf_spine(num_ranks=big, ranks_per_leaf=16, num_spines=4, bandwidth_bytes_per_s=12.5e9, latency_s=1e-6,
                    oversubscription=2.0)  # fmt: skip
    leaves = big // 16
    interleaved = [ls.ranks[(i % leaves) * 16 + i // leaves] for i in range(big)]
    ar = CollectiveSpec(op="all_reduce", algorithm="ring", size_bytes=100e6)
    rep = 2 if quick else 5
    return [
        ("star-64 ring all-reduce", s64, ar, None, rep),
        ("star-64 tree all-reduce, 16 chunks", s64,
         CollectiveSpec(op="all_reduce", algorithm="tree", size_bytes=100e6, num_chunks=16), None, rep),
        ("star-64 halving-doubling all-reduce", s64,
         CollectiveSpec(op="all_reduce", algorithm="halving_doubling", size_bytes=100e6), None, 4 * rep),
        (f"leaf-spine-{big} ring, rank order", ls, ar, None, 1),
        (f"leaf-spine-{big} ring, interleaved", ls, ar, interleaved, 1),
    ]  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="paired rounds (default 3)")
    ap.add_argument("--quick", action="store_true", help="smaller cases")
    args = ap.parse_args()
    todo = cases(args.quick)
    for _, topo, spec, ranks, _ in todo:  # warm the topologies' route caches
        collective_case(
            topo, CollectiveSpec(op="all_reduce", algorithm=spec.algorithm, size_bytes=1.0), ranks=ranks
        )
    raw_n = 200_000 if args.quick else 1_000_000
    raw_rates, rates, ratios, last = [], {n: [] for n, *_ in todo}, {n: [] for n, *_ in todo}, {}
    for _ in range(args.rounds):
        raw = raw_simpy(raw_n)
        raw_rate = raw["events"] / raw["cpu_s"]
        raw_rates.append(raw_rate)
        for name, topo, spec, ranks, repeat in todo:
            r = last[name] = collective_case(topo, spec, ranks=ranks, repeat=repeat)
            rates[name].append(r["events"] / r["cpu_s"])
            ratios[name].append(r["events"] / r["cpu_s"] / raw_rate)
    print(
        f"{args.rounds} paired rounds, CPU time, min / median; python {sys.version.split()[0]}, simpy {simpy.__version__}"
    )
    print()
    print("| case | events | messages | recomputes | events/s | x raw simpy | messages/s (median) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    print(f"| raw simpy timeouts | {raw_n:,} | 0 | 0 | {min(raw_rates) / 1e3:.0f}k / "
          f"{statistics.median(raw_rates) / 1e3:.0f}k | 1 | - |")  # fmt: skip
    for name, *_ in todo:
        r = last[name]
        msg_rate = statistics.median(rates[name]) * r["messages"] / r["events"]
        print(
            f"| {name} | {r['events']:,} | {r['messages']:,} | {r['recomputes']:,} | "
            f"{min(rates[name]) / 1e3:.0f}k / {statistics.median(rates[name]) / 1e3:.0f}k | "
            f"{min(ratios[name]):.0%} / {statistics.median(ratios[name]):.0%} | {msg_rate / 1e3:.0f}k |"
        )
    name, topo, spec, ranks, _ = todo[-1]
    tracemalloc.start()
    collective_case(topo, spec, ranks=ranks)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print()
    print(f"peak Python memory, {name} all-reduce: {peak / 2**20:.1f} MiB (tracemalloc)")


if __name__ == "__main__":
    main()
