"""Does a sender lose packets at its own NIC? The same collectives with a rank's egress queue like a
switch port's (``host_queue_bytes=0``, the testbed before 2026-12-07) and as a host's (4 MiB, TCP's
own backpressure limits it), with every shaper's drops per case.

    python -m experiments.host_queue [--testbed star|two-level|ring] [--reps 9]
        [--out docs/validation-data/host-queue]

Root only (it builds and removes its own testbeds, 100 Mbit/s links). Writes ``out-TESTBED.json``:
per ``SETTING/CASE`` every rep's time (ms, the slowest rank's), the drops of every shaper that
dropped and the packets all shapers passed; prints one row per case and setting.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

from experiments.common import REPO

KIB = 1024
RATE = 100e6 / 8
CASES = {
    "star": [("all_gather", 1024), ("all_reduce", 1024), ("all_gather", 256), ("all_gather", 4096)],
    "two-level": [("reduce_scatter", 1024), ("all_gather", 1024), ("all_reduce", 1024)],
    "ring": [("all_gather", 1024), ("all_reduce", 1024), ("reduce_scatter", 1024)],
}
SETTINGS = {"nic-125kB": 0, "nic-4MiB": 4 * 2**20}  # setting name: host_queue_bytes (0: 125 kB, like a switch port)


def spec_for(testbed: str, host_queue_bytes: int):
    from igrt.testbed import namespaces as tb

    kw = {"host_queue_bytes": host_queue_bytes}
    if testbed == "star":
        return tb.TestbedSpec(num_ranks=4, rate_bytes_per_s=RATE, **kw)
    if testbed == "two-level":
        return tb.TestbedSpec(num_ranks=4, rate_bytes_per_s=RATE, two_level=True, uplink_rate_bytes_per_s=RATE / 2,
                              **kw)  # fmt: skip
    return tb.TestbedSpec(num_ranks=3, rate_bytes_per_s=RATE, ring=True, **kw)


def measure(testbed: str, reps: int) -> dict[str, dict]:
    from igrt.testbed import namespaces as tb
    from igrt.testbed.netmeasure import measure as time_cases

    res: dict[str, dict] = {}
    for setting, host_queue in SETTINGS.items():
        spec = spec_for(testbed, host_queue)
        with tb.Testbed(spec):
            for op, kib in CASES[testbed]:
                name = f"{op}-{kib}KiB"
                before = tb.shaper_counters(spec.run_id)
                r = time_cases([{"name": name, "op": op, "size_bytes": kib * KIB}], spec=spec, reps=reps,
                               warmup=1)["results"][0]  # fmt: skip
                after = tb.shaper_counters(spec.run_id)
                drops = {k.split("-", 2)[-1]: after[k]["drops"] - before[k]["drops"] for k in after
                         if after[k]["drops"] > before[k]["drops"]}  # fmt: skip
                res[f"{setting}/{name}"] = {"times_ms": [t * 1e3 for t in r["times_s"]], "drops": drops,
                                            "packets": sum(after[k]["packets"] - before[k]["packets"] for k in after)}  # fmt: skip
    return res


def table(testbed: str, res: dict[str, dict]) -> str:
    lines = [f"{testbed}: {'setting/case':30} {'median':>7} {'min':>7} {'max':>7}  drops / packets"]  # times in ms
    for key, r in res.items():
        t = r["times_ms"]
        lines.append(f"{'':{len(testbed) + 2}}{key:30} {statistics.median(t):7.1f} {min(t):7.1f} {max(t):7.1f}  "
                     f"{sum(r['drops'].values())} / {r['packets']}")  # fmt: skip
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.host_queue", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--testbed", choices=sorted(CASES), action="append", help="repeatable (default all)")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--out", default=str(REPO / "docs" / "validation-data" / "host-queue"))
    ap.add_argument("--print-only", action="store_true", help="no measuring: the tables of the files in --out")
    a = ap.parse_args(argv)
    out = Path(a.out)
    for testbed in a.testbed or list(CASES):
        path = out / f"out-{testbed}.json"
        if a.print_only:
            print(table(testbed, json.loads(path.read_text())))
            continue
        from igrt.testbed import namespaces as tb

        problem = tb.support_problem()
        if problem:
            print(f"host_queue: needs the namespace testbed: {problem}", file=sys.stderr)
            return 2
        res = measure(testbed, a.reps)
        out.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(res, indent=1) + "\n")
        print(table(testbed, res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
