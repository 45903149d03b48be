"""Trace format speed: write a synthetic trace, then read it with ``read_trace`` and with pyarrow alone.

    /work/venv/bin/python benchmarks/trace_bench.py                   # 10M params rows under /tmp, 5 pairs
    /work/venv/bin/python benchmarks/trace_bench.py --rows 1000000 --rows-per-part 100000 --repeats 3

The trace: ``--world-size`` ranks x ``--num-params`` parameters, ``--rows`` params rows in all, the
writer's defaults otherwise (zstd, parts of ``--rows-per-part`` rows, commits at step boundaries).
The values are random draws that obey the format's rules; only the sizes matter.

Reading is timed in pairs, side by side in one process, the order alternating: ``read_trace`` (every
check: part names and types, plausible values, no duplicated rows, every step complete; numpy
columns out) against ``pyarrow.parquet.read_table`` of each of the same part files (Arrow tables
out, nothing checked). Prints the min and median wall time of each over the pairs, its median
process CPU time (all threads), the speed ratio ``pyarrow s / read_trace s`` (1.0 = as fast as
pyarrow; by the minima, by the medians, and the median of the per-pair ratios), each pair, the load
average while it ran, and the time of the first ``per_param_series`` call (what the profiler does
next). ``read_trace`` reads the parts in 2-4 threads. The directory is deleted afterwards unless
``--keep`` (``--dir`` of a kept trace reads it again without writing).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from igpolicy.vocab import ParamInfo
from traces.reader import read_trace
from traces.schema import Manifest, part_files
from traces.writer import TraceWriter, write_manifest


def write_bench_trace(
    directory: Path, *, rows: int, world_size: int, num_params: int, rows_per_part: int, seed: int = 0
) -> tuple[int, float]:
    """Write ~``rows`` params rows (plus steps and unions rows); returns (rows written, seconds)."""
    rng = np.random.default_rng(seed)
    params = tuple(
        ParamInfo(
            name=f"layers.{i // 8}.p{i % 8}.weight",
            shape=(64, 64),
            dtype="float32",
            component=f"{i // 8}.mlp_up",
            order=i,
        )
        for i in range(num_params)
    )
    names = np.array([p.name for p in params])
    num_steps = max(1, rows // (world_size * num_params))
    steps_per_call = max(1, 200_000 // num_params)
    start = time.perf_counter()
    written = 0
    writers = [TraceWriter(directory, rank=r, rows_per_part=rows_per_part) for r in range(world_size)]
    for first in range(0, num_steps, steps_per_call):
        batch = min(steps_per_call, num_steps - first)
        n = batch * num_params
        step = np.repeat(np.arange(first, first + batch), num_params)
        for w in writers:
            grad_norm = rng.random(n) + 0.5
            sel_norm = grad_norm * rng.random(n)
            w.add_param_rows(
                step=step,
                param=np.tile(names, batch),
                numel=np.full(n, 4096),
                k=rng.integers(1, 4096, n),
                grad_norm=grad_norm,
                sel_norm=sel_norm,
                sel_max_abs=sel_norm * rng.random(n),
                overlap=rng.random(n),
                ready_s=rng.random(n),
            )
            if w.rank == 0 and world_size > 1:
                w.add_union_rows(step=step, param=np.tile(names, batch), union_k=rng.integers(1, 4096, n))
            w.add_step_rows(
                step=np.arange(first, first + batch),
                forward_s=rng.random(batch),
                backward_s=rng.random(batch),
                optimizer_s=rng.random(batch),
                loss=rng.random(batch),
            )
            written += n
    for w in writers:
        w.close()
    write_manifest(
        directory, Manifest(workload="bench", params=params, world_size=world_size, command="trace_bench")
    )
    return written, time.perf_counter() - start


def time_reads(directory: Path, *, repeats: int) -> tuple[dict[str, list[tuple[float, float]]], int]:
    """``repeats`` pairs of reads, alternating which goes first: {"ours" | "pyarrow": [(wall s,
    process CPU s)]}; and the rows read_trace returned."""
    parts = part_files(directory)
    times: dict[str, list[tuple[float, float]]] = {"ours": [], "pyarrow": []}
    rows = 0
    for i in range(repeats):
        for which in ("ours", "pyarrow") if i % 2 == 0 else ("pyarrow", "ours"):
            wall, cpu = time.perf_counter(), time.process_time()
            if which == "ours":
                result = read_trace(directory)
                rows = len(result.params["step"])
            else:
                result = [pq.read_table(p) for p in parts]
            times[which].append((time.perf_counter() - wall, time.process_time() - cpu))
            del result
    return times, rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--world-size", type=int, default=4)
    ap.add_argument("--num-params", type=int, default=1000)
    ap.add_argument("--rows-per-part", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=5, help="paired reads (>= 3)")
    ap.add_argument(
        "--dir", type=Path, default=None, help="where to write (default: a new folder under /tmp)"
    )
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    if args.repeats < 3:
        ap.error("--repeats must be >= 3")
    directory = args.dir or Path(tempfile.mkdtemp(prefix="trace_bench_", dir="/tmp"))
    directory.mkdir(parents=True, exist_ok=True)
    try:
        if not (directory / "manifest.json").exists():
            rows, write_s = write_bench_trace(
                directory,
                rows=args.rows,
                world_size=args.world_size,
                num_params=args.num_params,
                rows_per_part=args.rows_per_part,
            )
        else:  # --dir of an earlier --keep run: read it again
            rows, write_s = len(read_trace(directory).params["step"]), float("nan")
        parts = part_files(directory)
        disk_mb = sum(p.stat().st_size for p in parts) / 1e6
        times, read_rows = time_reads(directory, repeats=args.repeats)
        assert read_rows == rows, (read_rows, rows)
        trace = read_trace(directory)
        start = time.perf_counter()
        trace.per_param_series("k")
        series_s = time.perf_counter() - start
        print(
            f"{rows:,} params rows, {len(parts)} parts, {disk_mb:.1f} MB; write {write_s:.2f} s; first "
            f"per_param_series {series_s:.2f} s; {args.repeats} paired reads; load average "
            + " ".join(f"{x:.1f}" for x in os.getloadavg())
        )
        print(
            f"{'read':<28s} {'min s':>7s} {'median s':>9s} {'rows/s (median)':>16s} {'CPU s (median)':>15s}"
        )
        for name, key in (("pyarrow.parquet.read_table", "pyarrow"), ("traces.read_trace", "ours")):
            wall = [w for w, _ in times[key]]
            cpu = statistics.median(c for _, c in times[key])
            med = statistics.median(wall)
            print(f"{name:<28s} {min(wall):7.3f} {med:9.3f} {rows / med:16.3g} {cpu:15.3f}")
        theirs, ours = ([w for w, _ in times[k]] for k in ("pyarrow", "ours"))
        ratio_min = min(theirs) / min(ours)
        ratio_med = statistics.median(theirs) / statistics.median(ours)
        pair = statistics.median(t / o for t, o in zip(theirs, ours))
        print(
            f"{'speed vs pyarrow':<28s} {ratio_min:6.2f}x {ratio_med:8.2f}x   (median of per-pair ratios {pair:.2f}x)"
        )
        print(
            "pairs (pyarrow s / read_trace s): " + ", ".join(f"{t:.2f}/{o:.2f}" for t, o in zip(theirs, ours))
        )
    finally:
        if not args.keep:
            shutil.rmtree(directory, ignore_errors=True)
        else:
            print(f"kept {directory}")


if __name__ == "__main__":
    main()
