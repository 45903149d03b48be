"""Measure real collectives on real processes: the runtime half of calibration and validation.

Run once per rank (``python -m igrt.testbed.netbench --cases C.json --out R.json``) with the usual
``MASTER_ADDR/PORT, RANK, WORLD_SIZE`` environment — inside the testbed's namespaces (see
:mod:`igrt.validate`) or on loopback. Each case is timed ``reps`` times after ``warmup`` runs, back
to back or, with ``--interleave``, in rounds over all cases (rep i of every case before rep i+1); every
rep starts after a barrier, and its time is the slowest rank's (a collective ends when its last rank ends).
Rank 0 writes the JSON result.

Case kinds (``op``):

- ``p2p``: ping-pong of ``size_bytes`` between ranks 0 and 1; one-way time = round trip / 2.
- ``all_reduce``, ``all_gather``, ``reduce_scatter``, ``broadcast``: gloo's own dense collectives on a
  float32 buffer of ``size_bytes`` (the full buffer n, as in the cost formulas).
- ``sparse_all_gather``: our wire path (:func:`igrt.sync.comm.sparse_all_gather`) with ``sizes_bytes[r]``
  bytes of (int32 index, fp32 value) pairs on rank r: counts first, then one padded gather.

A case with ``idle_s`` > 0 sleeps that long on every rank before each rep's barrier: a *cold* case,
timing what a training step's first collective meets after its compute (with Linux's
``tcp_slow_start_after_idle``, a connection idle longer than its retransmission timeout restarts
from the initial congestion window). On the namespace testbed cold and warm cases time the same
(``python -m experiments.cold_connections``; docs/validation.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from igrt.sync.comm import sparse_all_gather

__all__ = ["OPS", "run_cases", "time_case", "warm_up"]

OPS = ("p2p", "all_reduce", "all_gather", "reduce_scatter", "broadcast", "sparse_all_gather")


def _op_fn(case: Mapping[str, Any]):
    """A zero-argument callable that performs one instance of ``case`` on this rank."""
    rank, p = dist.get_rank(), dist.get_world_size()
    op = case["op"]
    n = int(case.get("size_bytes", 0))
    numel = max(n // 4, 1)
    if op == "p2p":
        buf = torch.zeros(numel)

        def ping() -> None:
            if rank == 0:
                dist.send(buf, 1)
                dist.recv(buf, 1)
            elif rank == 1:
                dist.recv(buf, 0)
                dist.send(buf, 0)

        return ping
    if op == "all_reduce":
        buf = torch.ones(numel)
        return lambda: dist.all_reduce(buf)
    if op == "broadcast":
        buf = torch.ones(numel)
        return lambda: dist.broadcast(buf, 0)
    if op == "all_gather":
        chunk = max(numel // p, 1)
        src, out = torch.ones(chunk), [torch.empty(chunk) for _ in range(p)]
        return lambda: dist.all_gather(out, src)
    if op == "reduce_scatter":
        chunk = max(numel // p, 1)
        inp, out = torch.ones(chunk * p), torch.empty(chunk)
        return lambda: dist.reduce_scatter_tensor(out, inp)
    if op == "sparse_all_gather":
        sizes = [int(s) for s in case["sizes_bytes"]]
        if len(sizes) != p:
            raise ValueError(f"case {case.get('name')!r}: sizes_bytes has {len(sizes)} entries for {p} ranks")
        k = sizes[rank] // 8
        gen = torch.Generator().manual_seed(rank)
        idx = torch.randperm(max(k * 4, 1), generator=gen)[:k].sort().values.to(torch.int32)
        val = torch.randn(k, generator=gen)
        return lambda: sparse_all_gather(idx, val)
    raise ValueError(f"case {case.get('name')!r}: unknown op {op!r} (known: {', '.join(OPS)})")


def time_case(
    case: Mapping[str, Any], *, reps: int, warmup: int, cpu: list[list[int]] | None = None
) -> list[list[float]]:
    """Per rep, every rank's time in seconds (:func:`_time_once`), identical on every rank;
    ``cpu``, where given, gets each rep's CPU ticks (:func:`cpu_ticks`; machine-wide, so every rank
    reads the same counters and rank 0's are the ones written)."""
    fn = _op_fn(case)
    for _ in range(warmup):
        fn()
    return [_time_once(case, fn, cpu) for _ in range(reps)]


def cpu_ticks() -> list[int] | None:
    """The machine's CPU time so far, in clock ticks summed over its CPUs: ``[stolen, idle, total]``
    (``/proc/stat``'s first line: steal; idle + iowait; every field but guest time, which user time
    already counts), or None where there is no ``/proc/stat``. Stolen time is what the hypervisor
    ran elsewhere while this machine's CPUs had work: the ranks' processes, their softirqs and the
    shaper's timers all wait through it, so a rep with much of it measures the host, not the link."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    fields += [0] * (10 - len(fields))
    return [fields[7], fields[3] + fields[4], sum(fields[:8])]


def _time_once(case: Mapping[str, Any], fn, cpu: list[list[int]] | None = None) -> list[float]:
    """One rep of ``case``: after a barrier, each rank's time until it is done (p2p: one way, the
    same for both ends); the rep's time is the slowest rank's (the maximum). A case with ``idle_s``
    first leaves every connection idle that long (a training step's compute), so the rep starts on
    connections that TCP may have sent back to slow start. ``cpu``: gets the rep's CPU ticks
    (:func:`cpu_ticks`, from the barrier to the end of the gather of the ranks' times, which is
    when the slowest rank is done; machine-wide, so read by whichever rank passes a list)."""
    idle = float(case.get("idle_s", 0.0))
    if idle > 0:
        time.sleep(idle)
    dist.barrier()
    c0 = cpu_ticks() if cpu is not None else None
    t0 = time.perf_counter()
    fn()
    mine = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    every = [torch.empty(1, dtype=torch.float64) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    ts = [float(t.item()) for t in every]
    if c0 is not None and (c1 := cpu_ticks()) is not None:
        cpu.append([b - a for a, b in zip(c0, c1)])
    if case["op"] == "p2p":  # a ping-pong between ranks 0 and 1: half of rank 0's round trip
        ts = [ts[0] / 2] * len(ts)
    return ts


def warm_up(size_bytes: int = 256 * 1024) -> None:
    """Move some traffic over every connection, both ways, before anything is timed (the first
    messages on a fresh connection pay for TCP slow start and lazy set-up)."""
    buf = torch.ones(max(size_bytes // 4, 1))
    p = dist.get_world_size()
    chunk = max(buf.numel() // p, 1)
    outs = [torch.empty(chunk) for _ in range(p)]
    for _ in range(2):
        dist.all_reduce(buf)
        dist.all_gather(outs, buf[:chunk].clone())
    dist.barrier()


def run_cases(
    cases: Sequence[Mapping[str, Any]], *, reps: int = 5, warmup: int = 1, interleave: bool = False
) -> list[dict[str, Any]]:
    """Time every case; returns one record per case with times, median and spread (seconds).

    Runs :func:`warm_up` first when ``warmup`` > 0. ``interleave``: rep i of every case runs before
    rep i+1 of any (rounds over the whole list), so a burst of CPU load from outside lands on a rep
    of several cases rather than on every rep of one, and the median filters it out; otherwise each
    case's reps run back to back."""
    if warmup > 0:
        warm_up()
    if not interleave:
        out = []
        for i, c in enumerate(cases):
            cpu: list[list[int]] = []
            out.append(_record(c, _timed(c, reps=reps, warmup=warmup, index=i, total=len(cases), cpu=cpu), cpu))
        return out
    fns = [_op_fn(c) for c in cases]
    for fn in fns:
        for _ in range(warmup):
            fn()
    times: list[list[list[float]]] = [[] for _ in cases]
    cpus: list[list[list[int]]] = [[] for _ in cases]
    t0 = time.monotonic()
    for rep in range(reps):
        if dist.get_rank() == 0:  # igrt validate shows rank 0's output as it comes
            print(f"netbench {time.strftime('%H:%M:%S')} round {rep + 1}/{reps} over {len(cases)} cases "
                  f"({time.monotonic() - t0:.0f} s so far)", file=sys.stderr, flush=True)  # fmt: skip
        for i, (case, fn) in enumerate(zip(cases, fns)):
            times[i].append(_time_once(case, fn, cpus[i]))
    return [_record(c, t, u) for c, t, u in zip(cases, times, cpus)]


def _timed(
    case: Mapping[str, Any], *, reps: int, warmup: int, index: int, total: int, cpu: list[list[int]]
) -> list[list[float]]:
    if dist.get_rank() == 0:
        print(f"netbench {time.strftime('%H:%M:%S')} case {index + 1}/{total} {case.get('name', case['op'])}",
              file=sys.stderr, flush=True)  # fmt: skip
    return time_case(case, reps=reps, warmup=warmup, cpu=cpu)


def _record(
    case: Mapping[str, Any], rank_times: list[list[float]], cpu: list[list[int]] | None = None
) -> dict[str, Any]:
    """``times_s``: per rep, the slowest rank's time; ``rank_times_s``: per rep, every rank's
    (which rank finishes last, e.g. a broadcast's farthest child); ``cpu_ticks``: per rep, the
    machine's ``[stolen, idle, total]`` CPU ticks over it (:func:`cpu_ticks`; absent without
    ``/proc/stat``)."""
    times = [max(ts) for ts in rank_times]
    extra = {"cpu_ticks": cpu} if cpu and len(cpu) == len(times) else {}
    return {
        **dict(case),
        "world_size": dist.get_world_size(),
        "times_s": times,
        "rank_times_s": rank_times,
        **extra,
        "median_s": statistics.median(times),
        "min_s": min(times),
        "max_s": max(times),
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m igrt.testbed.netbench", description=__doc__)
    ap.add_argument("--cases", required=True, help="JSON list of cases")
    ap.add_argument("--out", required=True, help="result JSON (written by rank 0)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--timeout-s", type=float, default=300.0)
    ap.add_argument("--interleave", action="store_true", help="reps in rounds over all cases")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    with open(args.cases) as f:
        cases = json.load(f)
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout_s))
    try:
        results = run_cases(cases, reps=args.reps, warmup=args.warmup, interleave=args.interleave)
        if dist.get_rank() == 0:
            tmp = args.out + ".tmp"
            with open(tmp, "w") as f:
                json.dump(
                    {"world_size": dist.get_world_size(), "host": os.uname().nodename, "results": results},
                    f,
                    indent=1,
                )
            os.replace(tmp, args.out)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
