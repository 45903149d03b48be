"""Do idle connections cost a training step time? Warm and cold collectives on the namespace testbed.

A training step leaves gloo's connections idle during its compute (0.3-0.5 s on GPT), longer than
TCP's retransmission timeout; with Linux's ``net.ipv4.tcp_slow_start_after_idle = 1`` the next send
restarts from the initial congestion window. The step validation found 100 Mbit/s steps measured up
to 30 % slower than igsim predicts with the setting on, and within a few percent with it off
(docs/validation.md). This script asks where that comes from: it times the same cases warm (back
to back, as calibration does) and cold (``idle_s`` before every rep, as a step's first collective),
with the setting on and off, on a quiet CPU and with ``--busy`` processes spinning beside the ranks
(as the ranks' own compute does in training: 4 ranks on this machine's 2 cores).

    python -m experiments.cold_connections [--ranks 4] [--bandwidth 100Mbit] [--reps 7] [--idle-s 0.4]
        [--busy 2] [--out docs/validation-data/cold-connections]

Root only (it builds and removes its own testbeds). Prints one table and writes ``cold.json``
(every rep's time, and every shaper's dropped packets per setting) and ``cold.csv``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from experiments.common import REPO, write_csv
from igpolicy.units import parse_bandwidth

SPIN = "while True: pass"


def cases(idle_s: float, sparse_bytes: int, ranks: int) -> list[dict[str, Any]]:
    """Each case warm and cold: p2p 64 KiB-1 MiB, a 1 MiB all-gather and a Top-k-sized sparse gather."""
    base = [
        {"op": "p2p", "size_bytes": 65536},
        {"op": "p2p", "size_bytes": 262144},
        {"op": "p2p", "size_bytes": 1048576},
        {"op": "all_gather", "size_bytes": 1048576},
        {"op": "sparse_all_gather", "sizes_bytes": [sparse_bytes] * ranks},
    ]
    out = []
    for idle in (0.0, idle_s):
        for c in base:
            size = c.get("size_bytes", sparse_bytes)
            out.append({**c, "name": f"{c['op']} {size} B {'cold' if idle else 'warm'}", "idle_s": idle})
    return out


def _spinners(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(n)]


def measure_setting(*, ranks: int, rate: float, slow_start: bool, busy: int, todo, reps: int) -> tuple[list, dict]:
    """The cases' records and the shapers' drop counts over the whole measurement."""
    from igrt.testbed import namespaces as tb
    from igrt.testbed.netmeasure import measure

    spec = tb.TestbedSpec(num_ranks=ranks, rate_bytes_per_s=rate, slow_start_after_idle=slow_start)
    tb.setup(spec)
    spin = _spinners(busy)
    try:
        before = tb.shaper_counters(spec.run_id)
        results = measure(todo, spec=spec, reps=reps, warmup=1, interleave=True)["results"]
        after = tb.shaper_counters(spec.run_id)
        drops = {k: after[k]["drops"] - before[k]["drops"] for k in after}
        packets = sum(after[k]["packets"] - before[k]["packets"] for k in after)
        return results, {"dropped_packets": sum(drops.values()), "shaped_packets": packets, "drops": drops}
    finally:
        for p in spin:
            p.kill()
            p.wait()
        tb.teardown(spec.run_id)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.cold_connections", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--bandwidth", default="100Mbit", help="rank link rate with a unit (default 100Mbit)")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--idle-s", type=float, default=0.4, help="idle before each cold rep (default 0.4 s)")
    ap.add_argument("--busy", type=int, default=2, help="spinning processes in the busy setting (default 2)")
    ap.add_argument("--sparse-bytes", type=int, default=260_872, help="per-rank sparse gather (GPT Top-k)")
    ap.add_argument("--out", default=str(REPO / "docs" / "validation-data" / "cold-connections"))
    a = ap.parse_args(argv)
    from igrt.testbed import namespaces as tb

    problem = tb.support_problem()
    if problem:
        print(f"cold_connections: needs the namespace testbed: {problem}", file=sys.stderr)
        return 2
    if a.idle_s <= 0 or a.reps < 1 or a.busy < 0:
        ap.error("--idle-s must be > 0, --reps >= 1, --busy >= 0")
    rate = parse_bandwidth(a.bandwidth)
    todo = cases(a.idle_s, a.sparse_bytes, a.ranks)
    rows, raw, t0 = [], [], time.monotonic()
    settings = [(ss, busy) for ss in (True, False) for busy in (0, a.busy)]
    for i, (ss, busy) in enumerate(settings, 1):
        print(f"[{time.monotonic() - t0:5.0f} s] setting {i}/{len(settings)}: slow start after idle "
              f"{int(ss)}, {busy} spinning process(es)", file=sys.stderr, flush=True)  # fmt: skip
        results, shapers = measure_setting(ranks=a.ranks, rate=rate, slow_start=ss, busy=busy, todo=todo,
                                           reps=a.reps)  # fmt: skip
        raw.append({"slow_start_after_idle": ss, "busy": busy, "results": results, "shapers": shapers})
        print(f"        shapers: {shapers['dropped_packets']} of {shapers['shaped_packets']} packets dropped",
              file=sys.stderr, flush=True)  # fmt: skip
        half = len(results) // 2
        for warm, cold in zip(results[:half], results[half:]):
            w, c = statistics.median(warm["times_s"]), statistics.median(cold["times_s"])
            rows.append({"slow_start_after_idle": int(ss), "busy": busy, "case": warm["name"][: -len(" warm")],
                         "warm_ms": round(w * 1e3, 2), "cold_ms": round(c * 1e3, 2),
                         "cold_minus_warm_ms": round((c - w) * 1e3, 2),
                         "cold_vs_warm_pct": round(100 * (c / w - 1), 1)})  # fmt: skip
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"command": "python -m experiments.cold_connections " + " ".join(argv or sys.argv[1:]),
            "date": time.strftime("%Y-%m-%d %H:%M:%S"), "ranks": a.ranks, "bandwidth": a.bandwidth,
            "idle_s": a.idle_s, "reps": a.reps, "wall_s": round(time.monotonic() - t0, 1), "settings": raw}  # fmt: skip
    (out / "cold.json").write_text(json.dumps(meta, indent=1) + "\n")
    write_csv(rows, out / "cold.csv")
    print(f"{'slow start':>10} {'busy':>4}  {'case':34} {'warm ms':>8} {'cold ms':>8} {'cold-warm':>9} {'%':>6}")
    for r in rows:
        print(f"{r['slow_start_after_idle']:>10} {r['busy']:>4}  {r['case']:34} {r['warm_ms']:8.2f} "
              f"{r['cold_ms']:8.2f} {r['cold_minus_warm_ms']:9.2f} {r['cold_vs_warm_pct']:6.1f}")  # fmt: skip
    for x in raw:
        sh = x["shapers"]
        print(f"slow start {int(x['slow_start_after_idle'])}, busy {x['busy']}: shapers dropped "
              f"{sh['dropped_packets']} of {sh['shaped_packets']} packets")  # fmt: skip
    print(f"wrote {out / 'cold.csv'} and cold.json ({meta['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
