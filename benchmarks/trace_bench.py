"""Trace format speed: write and read a synthetic trace of ~10 million ``params`` rows.

    /work/venv/bin/python benchmarks/trace_bench.py                   # 10M rows under /tmp
    /work/venv/bin/python benchmarks/trace_bench.py --rows 1000000 --rows-per-part 100000

Prints one table row per run: rows, parts, write s, read s, rows/s (read), on-disk MB, plus the
time of the first ``per_param_series`` call (what the profiler does next). The values are random
draws; only the sizes matter. The directory is deleted afterwards unless ``--keep``.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from igpolicy.vocab import ParamInfo
from traces.reader import read_trace
from traces.schema import Manifest
from traces.writer import TraceWriter, write_manifest


def write_bench_trace(
    directory: Path, *, rows: int, world_size: int, num_params: int, rows_per_part: int, seed: int = 0
) -> tuple[int, float]:
    """Write ~``rows`` params rows (plus steps rows); returns (rows written, seconds)."""
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
            k = rng.integers(1, 4096, n)
            w.add_param_rows(
                step=step,
                param=np.tile(names, batch),
                numel=np.full(n, 4096),
                k=k,
                grad_norm=rng.random(n),
                sel_norm=rng.random(n),
                sel_max_abs=rng.random(n),
                overlap=rng.random(n),
                ready_s=rng.random(n),
            )
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--world-size", type=int, default=4)
    ap.add_argument("--num-params", type=int, default=1000)
    ap.add_argument("--rows-per-part", type=int, default=200_000)
    ap.add_argument(
        "--dir", type=Path, default=None, help="where to write (default: a new folder under /tmp)"
    )
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    directory = args.dir or Path(tempfile.mkdtemp(prefix="trace_bench_", dir="/tmp"))
    directory.mkdir(parents=True, exist_ok=True)
    try:
        rows, write_s = write_bench_trace(
            directory,
            rows=args.rows,
            world_size=args.world_size,
            num_params=args.num_params,
            rows_per_part=args.rows_per_part,
        )
        start = time.perf_counter()
        trace = read_trace(directory)
        read_s = time.perf_counter() - start
        assert len(trace.params["k"]) == rows
        start = time.perf_counter()
        trace.per_param_series("k")
        series_s = time.perf_counter() - start
        disk_mb = sum(p.stat().st_size for p in directory.iterdir()) / 1e6
        print(
            f"{'rows':>11s} {'parts':>6s} {'write s':>8s} {'read s':>7s} {'rows/s':>11s} {'MB':>8s} {'series s':>9s}"
        )
        print(
            f"{rows:11d} {len(trace.parts):6d} {write_s:8.2f} {read_s:7.2f} {rows / read_s:11.3g} {disk_mb:8.1f} {series_s:9.2f}"
        )
    finally:
        if not args.keep:
            shutil.rmtree(directory, ignore_errors=True)
        else:
            print(f"kept {directory}")


if __name__ == "__main__":
    main()
