"""Where do the remaining collective misses come from? One case at a time, with every shaper's drops.

Two worst cases of the quiet validation rounds are measured slower than igsim predicts in every
round (docs/validation.md): the two-level testbed's broadcast of 4 MiB across the uplink and the
slow-NIC testbed's all-gather of 256 KiB. This script times those ops over a range of sizes on the
testbed that shows them, one case per measurement, and records for each case

- every rep's time of every rank (``rank_times_s``: which rank finishes when; a broadcast's
  children in order), and
- every tbf shaper's dropped packets during that case alone (``igrt.testbed.namespaces.shaper_counters``
  before and after), so a loss can be placed: a sender's own egress or a switch port.

    python -m experiments.shaper_queues [--testbed hetero|two-level] [--queue-ms 10 [30 ...]]
        [--reps 7] [--out docs/validation-data/shaper-queues]
    python -m experiments.shaper_queues --share-only [--out ...] [--fit-run RUN] [--predict RUN ...]

Root only (it builds and removes its own testbeds). Writes ``TESTBED-qMS/measurements.json`` (the
layout of ``igrt validate``, every case a validation case, so ``igsim validate-report FILE
--calibration CAL`` predicts it) and ``drops.json`` per setting, and prints one table.

``--share-only`` (no root): the downstream share out of sample. With alpha and the factors of
``--fit-run``'s own fit (an ``igrt validate`` run of the two-level testbed), it fits igsim's
``downstream_share`` on this script's two-level broadcasts (10 ms queues) and predicts the
broadcasts of the ``--predict`` runs, measured on another day, with plain max-min and with it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from experiments.common import REPO
from igpolicy.units import parse_bandwidth

KIB = 1024
SIZES = {
    "hetero": [("all_gather", s * KIB) for s in (64, 128, 192, 256, 384, 512, 1024)],
    "two-level": [("broadcast", s * KIB) for s in (256, 1024, 2048, 4096)] + [("all_gather", 1024 * KIB)],
}


def spec_for(testbed: str, *, rate: float, queue_s: float):
    from igrt.testbed import namespaces as tb

    if testbed == "hetero":
        return tb.TestbedSpec(num_ranks=4, rate_bytes_per_s=rate, slow_rank=3, slow_rate_bytes_per_s=rate / 4,
                              queue_s=queue_s, queue_min_bytes=0)  # fmt: skip
    if testbed == "two-level":
        return tb.TestbedSpec(num_ranks=4, rate_bytes_per_s=rate, two_level=True, uplink_rate_bytes_per_s=rate / 2,
                              queue_s=queue_s, queue_min_bytes=0)  # fmt: skip
    raise ValueError(f"unknown testbed {testbed!r} (known: {', '.join(SIZES)})")


def measure_setting(testbed: str, *, rate: float, queue_s: float, reps: int) -> tuple[dict, dict]:
    """(a measurement file's JSON, per case the drops of every shaper) for one testbed and queue."""
    from igrt.testbed import namespaces as tb
    from igrt.testbed.netmeasure import measure

    spec = spec_for(testbed, rate=rate, queue_s=queue_s)
    tb.setup(spec)
    cases, drops = [], {}
    t0 = time.time()
    try:
        load_before = list(os.getloadavg())
        for op, size in SIZES[testbed]:
            name = f"{op}-{size // KIB}KiB"
            print(f"  {name} ...", file=sys.stderr, flush=True)
            before = tb.shaper_counters(spec.run_id)
            r = measure([{"name": name, "op": op, "size_bytes": size}], spec=spec, reps=reps, warmup=1)["results"][0]
            after = tb.shaper_counters(spec.run_id)
            drops[name] = {k.split("-", 2)[-1]: after[k]["drops"] - before[k]["drops"] for k in after
                           if after[k]["drops"] - before[k]["drops"]}  # fmt: skip
            cases.append({"name": name, "op": op, "role": "validation", "size_bytes": size,
                          "times_s": r["times_s"], "median_s": r["median_s"], "rank_times_s": r["rank_times_s"],
                          "world_size": r["world_size"]})  # fmt: skip
        load_after = list(os.getloadavg())
    finally:
        tb.teardown(spec.run_id)
    meta = {"testbed": tb.describe(spec), "reps": reps, "warmup": 1, "interleaved": False,
            "date": time.strftime("%Y-%m-%d %H:%M:%S"), "wall_s": round(time.time() - t0, 1),
            "machine": {"cpu_count": os.cpu_count(), "load_average_before": load_before, "load_average_after": load_after},
            "command": "python -m experiments.shaper_queues " + " ".join(sys.argv[1:]), "cases": cases}  # fmt: skip
    return meta, drops


def share_transfer(out: Path, fit_run: Path, predict: Sequence[Path]) -> dict[str, Any]:
    """Fit the downstream share on ``out``'s two-level broadcasts (alpha and factors: ``fit_run``'s
    own fit), then predict every broadcast validation case of ``predict`` with and without it."""
    from dataclasses import replace

    from igsim.studies import validation as v

    tb_a, cases_a, _ = v.load_measurements(v.measurement_path(fit_run))
    topo = v.testbed_topology(tb_a)
    base = v.fit(cases_a, topo, burst_s=tb_a.burst_s)
    tb_x, cases_x, meta_x = v.load_measurements(out / "two-level-q10" / "measurements.json")
    used = [replace(c, role=v.CALIBRATION) for c in cases_x if c.op == "broadcast" and c.bytes >= 1 << 20]
    share = v.fit_share(used, v.testbed_topology(tb_x), base, tb_x.burst_s, "median")
    rows = []
    for run in predict:
        tb, cases, meta = v.load_measurements(v.measurement_path(run))
        t = v.testbed_topology(tb)
        for c in cases:
            if c.op != "broadcast" or c.role != v.VALIDATION or c.bytes < 256 * KIB:
                continue
            plain = v.predict_case(c, t, base, burst_s=tb.burst_s)
            shared = v.predict_case(c, t, replace(base, downstream_share=share), burst_s=tb.burst_s)
            rows.append({"run": Path(run).name, "date": meta.get("date"), "case": c.name,
                         "measured_ms": c.median_s * 1e3, "max_min_ms": plain * 1e3, "share_ms": shared * 1e3,
                         "max_min_error": plain / c.median_s - 1, "share_error": shared / c.median_s - 1})  # fmt: skip
    where = fit_run.resolve()
    return {"fit_run": str(where.relative_to(REPO) if where.is_relative_to(REPO) else where), "fitted_on": [c.name for c in used], "fitted_date": meta_x.get("date"),
            "downstream_share": share, "alpha_s": base.alpha_s, "simplex_factor": base.simplex_factor, "rows": rows}  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.shaper_queues", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--testbed", choices=sorted(SIZES), action="append", help="repeatable (default both)")
    ap.add_argument("--queue-ms", type=float, action="append", help="shaper queue, repeatable (default 10)")
    ap.add_argument("--bandwidth", default="100Mbit", help="rank link rate (default 100Mbit)")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--out", default=str(REPO / "docs" / "validation-data" / "shaper-queues"))
    ap.add_argument("--share-only", action="store_true", help="no measuring: the downstream share out of sample")
    runs = REPO / "docs" / "validation-data" / "runs"
    ap.add_argument("--fit-run", default=str(runs / "QA-two-level-q10"))
    ap.add_argument("--predict", action="append", help="runs to predict (default QA and QB two-level)")
    a = ap.parse_args(argv)
    if a.share_only:
        res = share_transfer(Path(a.out), Path(a.fit_run),
                             [Path(x) for x in a.predict or (runs / "QA-two-level-q10", runs / "QB-two-level-q10")])  # fmt: skip
        (Path(a.out) / "share.json").write_text(json.dumps(res, indent=1) + "\n")
        print(f"downstream share {res['downstream_share']:.3f}, fitted on {', '.join(res['fitted_on'])} "
              f"({res['fitted_date']}) with {Path(res['fit_run']).name}'s alpha {res['alpha_s'] * 1e3:.2f} ms "
              f"and one-way factor {res['simplex_factor']:.3f}")  # fmt: skip
        print(f"{'run':18} {'case':18} {'measured':>9} {'max-min':>9} {'error':>7} {'share':>9} {'error':>7}")
        for r in res["rows"]:
            print(f"{r['run']:18} {r['case']:18} {r['measured_ms']:9.1f} {r['max_min_ms']:9.1f} "
                  f"{100 * r['max_min_error']:+6.1f}% {r['share_ms']:9.1f} {100 * r['share_error']:+6.1f}%")  # fmt: skip
        return 0
    from igrt.testbed import namespaces as tb

    problem = tb.support_problem()
    if problem:
        print(f"shaper_queues: needs the namespace testbed: {problem}", file=sys.stderr)
        return 2
    if a.reps < 1:
        ap.error("--reps must be >= 1")
    rate = parse_bandwidth(a.bandwidth)
    out = Path(a.out)
    for testbed in a.testbed or sorted(SIZES):
        for q in a.queue_ms or [10.0]:
            print(f"[{time.strftime('%H:%M:%S')}] {testbed}, {q:g} ms queues", file=sys.stderr, flush=True)
            meta, drops = measure_setting(testbed, rate=rate, queue_s=q / 1e3, reps=a.reps)
            d = out / f"{testbed}-q{q:g}"
            d.mkdir(parents=True, exist_ok=True)
            (d / "measurements.json").write_text(json.dumps(meta, indent=1) + "\n")
            (d / "drops.json").write_text(json.dumps(drops, indent=1) + "\n")
            print(f"\n{testbed}, {q:g} ms queues (load {meta['machine']['load_average_before'][0]:.1f}"
                  f"->{meta['machine']['load_average_after'][0]:.1f}); per rank: median over reps, ms")  # fmt: skip
            for c in meta["cases"]:
                per_rank = [statistics.median(rt[i] for rt in c["rank_times_s"]) * 1e3 for i in range(4)]
                dropped = ", ".join(f"{k} {v}" for k, v in drops[c["name"]].items()) or "none"
                print(f"  {c['name']:18} median {c['median_s'] * 1e3:8.1f}  ranks "
                      + " ".join(f"{t:7.1f}" for t in per_rank) + f"  drops: {dropped}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
