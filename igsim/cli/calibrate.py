"""``igsim calibrate RUN [RUN ...] [-o calibration.json] [--check RUN2 ...]``: refit the testbed calibration.

RUN is an ``igrt validate`` output folder (its ``measurements.json``) or a measurement file; several
RUNs of one testbed are pooled (every run's measurement of a case counts as a case of its own: a
slow rep in one round weighs half; the shipped defaults are pooled fits). The
fit reads the *calibration* cases only (:func:`igsim.studies.validation.fit`: alpha per message,
the all-reduce and all-gather duplex bandwidth factors, the one-way factor) and writes an igsim
Calibration (``igsim simulate --calibration``, ``igsim validate-report --calibration``). Each
``--check`` run, measured at another time or under another load, is then predicted with it, every
case out of sample, and the targets (collectives >= 256 KiB: mean |error| <= 5 %, worst <= 10 %)
are reported per run. Takes seconds: the fit costs a few hundred gloo simulations.

    igsim calibrate validate-out -o calibration.json
    igsim calibrate runA --check runB --check runC --statistic min
    igsim calibrate roundA roundB -o igsim/data/testbed_calibration-hetero.json   # pooled
"""

from __future__ import annotations

import argparse
import sys
import time

from igpolicy.cli_outputs import check_output_file
from igpolicy.cli_util import reading
from igsim.cli.options import add_model_arguments, fit_from_args
from igsim.studies import validation as v

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "run",
        nargs="+",
        metavar="RUN",
        help="igrt validate output folder, or its measurements.json; several runs of one testbed are pooled",
    )
    p.add_argument(
        "-o",
        "--out",
        default="calibration.json",
        metavar="FILE",
        help="calibration to write (default calibration.json)",
    )
    p.add_argument(
        "--check",
        action="append",
        default=[],
        metavar="RUN",
        help="another run (folder or measurements.json) to predict with the new calibration; repeatable",
    )
    p.add_argument(
        "--small-max-bytes",
        type=int,
        default=16 * 1024,
        help="alpha is fitted on cases up to this size (bytes)",
    )
    p.add_argument(
        "--large-min-bytes",
        type=int,
        default=512 * 1024,
        help="bandwidth is fitted on cases from this size (bytes)",
    )
    add_model_arguments(p)


def _say(msg: str) -> None:
    print(f"igsim calibrate {time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    out = check_output_file(args.out, flag="--out")
    paths = [v.measurement_path(r) for r in args.run]
    checks = [v.measurement_path(c) for c in args.check]  # every input named before the work
    with reading(", ".join(map(str, paths)), "measurements"):
        tb, cases, raws = v.pool_measurements(paths)
    topo = v.testbed_topology(tb)
    num_cal = sum(c.role == v.CALIBRATION for c in cases)
    dates = ", ".join(raw.get("date", "no date") for raw in raws)
    _say(f"fitting on {num_cal} calibration cases of {' + '.join(map(str, paths))} ({tb.num_ranks} ranks, {dates})")
    fit = fit_from_args(args, cases, topo, tb)
    source = "igsim calibrate " + " + ".join(
        f"{p} ({raw.get('date', '')}; {raw.get('command', 'igrt validate')})" for p, raw in zip(paths, raws)
    )
    fit.calibration(topo, source=source).save(out)
    gather = f", x{fit.gather_factor:.4f} all-gather" if fit.gather_factor else ""
    print(
        f"fit ({args.statistic} of each case's reps): {v.describe_alpha(fit.alpha_s, fit.message_alpha_s)}; effective "
        f"bandwidth x{fit.duplex_factor:.4f} all-reduce{gather}, x{fit.simplex_factor:.4f} one-way"
        f"{v.describe_extras(fit.downstream_share, fit.overflow_factor, fit.overflow_queues)} -> {out}"
    )
    status = 0
    for other in checks:
        _say(f"predicting every case of {other}")
        with reading(other, "measurements"):
            tb2, cases2, raw2 = v.load_measurements(other)
        topo2 = v.testbed_topology(tb2)
        rep = v.build_report(cases2, topo2, fit, burst_s=tb2.burst_s, statistic=args.statistic,
                             roles=(v.CALIBRATION, v.VALIDATION))  # fmt: skip
        load = raw2.get("machine", {}).get("load_average_after")
        print(f"check {other} ({raw2.get('date', 'no date')}"
              + (f", load {load[0]:.2f}" if load else "") + "):")  # fmt: skip
        for key, label in (
            ("collectives_large", "collectives >= 256 KiB"),
            ("dense_large", "dense >= 256 KiB"),
        ):
            d = rep.get(key)
            if d is None:
                continue
            met = d["meets_mean"] and d["meets_worst"]
            status |= 0 if met or key != "collectives_large" else 1
            print(
                f"  {label}: {d['num_cases']} cases, mean |error| {d['mape']:.1%}, worst {d['worst_error']:+.1%} "
                f"({d['worst_case']}) -> {'met' if met else 'MISSED'}"
            )
    print(f"done in {time.monotonic() - t0:.1f} s")
    return status
