"""What does recording a trace cost? Step time of a reference workload with and without the recorder.

One process, ``--threads`` torch threads (default 1, like one rank of ``igrt record``). For each
workload: ``--steps`` plain steps, then ``--steps`` recorded steps (a fresh TraceRecorder into a
temporary directory), then ``--steps`` plain steps again; medians are reported, so a noisy machine
moves them less than means. Recording = sparsifier selection on every parameter, norms, Jaccard
overlap and buffering the rows (no union all-gather: one rank).

    python benchmarks/recorder_bench.py                  # real MiniLM and GPT (GPT pre-training is cached)
    python benchmarks/recorder_bench.py --tiny --steps 5
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from igrt.trace.recorder import TraceRecorder
from igrt.workloads import WORKLOADS, make_workload


def _steps(
    workload, model, optimizer, batches, num_steps: int, recorder: TraceRecorder | None
) -> list[float]:
    times = []
    for _ in range(num_steps):
        t0 = time.perf_counter()
        if recorder is not None:
            recorder.begin_step()
        loss = workload.loss(model, next(batches))
        if recorder is not None:
            recorder.begin_backward()
        loss.backward()
        if recorder is not None:
            recorder.end_backward()
            recorder.begin_optimizer()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if recorder is not None:
            recorder.end_step(loss=float(loss.detach()))
        times.append(time.perf_counter() - t0)
    return times


def bench(name: str, *, tiny: bool, steps: int, batch_size: int, density: float, sparsifier: str) -> dict:
    workload = make_workload(name, tiny=tiny, seed=0)
    model = workload.model
    optimizer = workload.optimizer(model)
    batches = workload.train_batches(0, 1, batch_size)
    _steps(workload, model, optimizer, batches, 2, None)  # warm-up
    plain = _steps(workload, model, optimizer, batches, steps, None)
    with tempfile.TemporaryDirectory() as tmp:
        rec = TraceRecorder(model, directory=tmp, sparsifier=sparsifier, density=density, workload=name)
        recorded = _steps(workload, model, optimizer, batches, steps, rec)
        rec.close()
        record_s = statistics.median(rec.record_s)
        disk_bytes = sum(p.stat().st_size for p in Path(tmp).rglob("*.parquet"))
    plain += _steps(workload, model, optimizer, batches, steps, None)
    without, with_ = statistics.median(plain), statistics.median(recorded)
    return {
        "workload": name + (" (tiny)" if tiny else ""),
        "params": sum(p.numel() for p in model.parameters()),
        "without_s": without,
        "with_s": with_,
        "record_s": record_s,
        "overhead": with_ / without - 1.0,
        "bytes_per_step": disk_bytes / steps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=(*WORKLOADS, "all"), default="all")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--density", type=float, default=0.01)
    parser.add_argument("--sparsifier", default="topk")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    names = WORKLOADS if args.workload == "all" else (args.workload,)
    print(
        f"recorder overhead: {args.sparsifier} at density {args.density:g}, batch {args.batch_size}, "
        f"{args.threads} thread(s), median of {args.steps} steps (plain: {2 * args.steps})"
    )
    header = f"{'workload':<14} {'params':>11} {'plain step':>11} {'recorded':>10} {'recording':>10} {'overhead':>9} {'trace/step':>11}"
    print(header)
    print("-" * len(header))
    for name in names:
        r = bench(
            name,
            tiny=args.tiny,
            steps=args.steps,
            batch_size=args.batch_size,
            density=args.density,
            sparsifier=args.sparsifier,
        )
        print(
            f"{r['workload']:<14} {r['params']:>11,} {r['without_s'] * 1e3:>9.0f}ms {r['with_s'] * 1e3:>8.0f}ms "
            f"{r['record_s'] * 1e3:>8.0f}ms {r['overhead'] * 100:>8.1f}% {r['bytes_per_step'] / 1024:>8.1f}KiB"
        )


if __name__ == "__main__":
    main()
