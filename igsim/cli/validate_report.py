"""``igsim validate-report MEASUREMENTS.json [--out DIR]``: calibrate from a testbed measurement,
predict its validation cases, print the table.

The igsim half of ``igrt validate`` (which runs this as a subprocess, so neither package imports the
other). Writes ``DIR/calibration.json`` (an igsim Calibration: alpha and the duplex effective
bandwidth on every link class, for ``igsim simulate --calibration``) and ``DIR/report.json``
(every case with its role, measured median and spread, prediction and error; per family MAPE,
worst case and Kendall tau; the targets over dense and over all collectives >= 256 KiB). With
``--calibration FILE`` nothing is fitted: every case of the run, calibration cases too, is predicted
with that calibration (a transfer check; ``igsim calibrate`` writes such files). Runs as ``python
-m igsim.cli.validate_report`` too.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from igpolicy.cli_outputs import check_output_file
from igpolicy.cli_util import reading
from igsim.cli.options import add_model_arguments, fit_from_args
from igsim.net.calibration import Calibration
from igsim.studies import validation as v

__all__ = ["add_arguments", "format_report", "main", "measurement_flags", "run"]


def measurement_flags(raw: Mapping[str, Any]) -> list[str]:
    """Why a measurement lies outside the model's validated range, by the step report's rule
    (:func:`igsim.studies.step_validation.range_flags`: 2 ranks on gloo, more ranks than cores, a
    busy CPU when the timing ended); empty for files without the machine record."""
    from igsim.studies.step_validation import range_flags

    machine = raw.get("machine") or {}
    load = machine.get("load_average_after")
    summary = {
        "world_size": raw.get("testbed", {}).get("num_ranks", 0),
        "backend": "gloo",
        "machine": {"cpu_count": machine.get("cpu_count"), "load_average": load},
    }
    return range_flags(summary)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("measurements", help="measurement JSON written by igrt validate")
    p.add_argument("--out", default=None, help="directory for calibration.json and report.json")
    p.add_argument(
        "--small-max-bytes", type=int, default=16 * 1024, help="alpha is fitted on cases up to this size"
    )
    p.add_argument(
        "--large-min-bytes", type=int, default=512 * 1024, help="bandwidth is fitted on cases from here"
    )
    p.add_argument(
        "--calibration",
        default=None,
        metavar="FILE",
        help="predict with this calibration (igsim calibrate; 'default': the shipped calibration of the "
        "measured testbed's topology) instead of fitting one: every case is out of sample",
    )
    add_model_arguments(p)
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    p.add_argument("--steps-dir", default=None, help="training runs to replay (igrt validate --steps)")
    p.add_argument(
        "--skip-steps", type=int, default=1, help="leave out the first steps of each run (default 1)"
    )


def run(args: argparse.Namespace) -> int:
    if args.out:  # igrt validate's folder (which holds its lock) or one of its own: files are checked
        out = Path(args.out)
        if out.exists() and not out.is_dir():
            raise ValueError(f"--out {out}: exists and is not a folder")
        out.mkdir(parents=True, exist_ok=True)
        for name in ("calibration.json", "report.json"):
            check_output_file(out / name, flag="--out")
    with reading(args.measurements, "measurements"):
        tb, cases, raw = v.load_measurements(args.measurements)
    topo = v.testbed_topology(tb)
    roles: tuple[str, ...] = (v.VALIDATION,)
    cal = None
    if args.calibration == "default":
        cal = Calibration.testbed_default(v.testbed_kind(tb), host_queue_bytes=tb.host_queue_bytes)
    elif args.calibration:
        with reading(args.calibration, "calibration"):
            cal = Calibration.load(args.calibration)
    if cal is not None:
        fit = v.Fit.from_calibration(cal)
        roles = (v.CALIBRATION, v.VALIDATION)
    else:
        fit = fit_from_args(args, cases, topo, tb)
    report = v.build_report(cases, topo, fit, burst_s=tb.burst_s, statistic=args.statistic, roles=roles)
    report["testbed"] = raw["testbed"]
    report["measurements"] = str(args.measurements)
    if args.calibration:
        report["calibration"] = str(args.calibration)
    report["flags"] = measurement_flags(raw)
    for k in ("command", "reps", "warmup", "interleaved", "host", "date", "machine"):
        if k in raw:
            report[k] = raw[k]
    steps_text = ""
    if args.steps_dir:
        from igsim.studies import step_validation as sv

        runs = sv.simulate_runs(args.steps_dir, topology=topo, calibration=fit.calibration(topo))
        report["steps"] = sv.compare_steps(
            runs, skip_steps=args.skip_steps, flags=sv.run_flags(args.steps_dir)
        )
        steps_text = "\n\ntraining steps (comm_s per step, mean over steps):\n" + sv.format_steps(
            report["steps"]
        )
        if cal is None:  # this run's own fit: also the shipped file, fitted on other rounds (a transfer)
            shipped = Calibration.testbed_default(v.testbed_kind(tb), host_queue_bytes=tb.host_queue_bytes)
            runs = sv.simulate_runs(args.steps_dir, topology=topo, calibration=shipped)
            report["steps_shipped"] = {
                "calibration": shipped.source,
                **sv.compare_steps(runs, skip_steps=args.skip_steps, flags=sv.run_flags(args.steps_dir)),
            }
            steps_text += "\n" + sv.summary_line(report["steps_shipped"], what="with the shipped calibration")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        source = f"igrt validate: {raw.get('command', args.measurements)}"
        if cal is not None:
            cal.save(out / "calibration.json")
        else:
            fit.calibration(topo, source=source).save(out / "calibration.json")
        (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1) if args.json else format_report(report) + steps_text)
    return 0


def _fmt_bytes(n: float) -> str:
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k:
            return f"{n / k:g} {unit}"
    return f"{int(n)} B"


def format_report(report: Mapping[str, Any]) -> str:
    """The report as a plain-text table (times in ms, errors in %)."""
    f = report["fit"]
    gather = (
        f" (all-reduce), x{f['gather_factor']:.4f} (all-gather)" if f.get("gather_factor") else " (duplex)"
    )
    stat = report.get("statistic", "median")
    load = report.get("machine", {}).get("load_average_after")
    where = (
        f"calibration {report['calibration']} (not fitted on this run)" if "calibration" in report else "fit"
    )
    steal = any(math.isfinite(r.get("cpu_steal_share", math.nan)) for r in report["cases"])
    lines = [
        f"{where}: {v.describe_alpha(f['alpha_s'], f.get('message_alpha_s'))}, effective bandwidth x{f['duplex_factor']:.4f}"
        f"{gather}, x{f['simplex_factor']:.4f} (one-way)"
        + v.describe_extras(f.get("downstream_share", 1.0), f.get("overflow_factor", 1.0), f.get("overflow_queues")),
        f"errors against each case's {stat} of {report.get('reps', '?')} reps"
        + (f"; 1-min load average {load[0]:.2f} when timing ended" if load else ""),
        *(f"FLAGGED (outside the validated range): {f}" for f in report.get("flags", ())),
        "",
        f"{'case':30s} {'role':5s} {'size':>10s} {'measured ms':>12s} {'spread':>7s} {'predicted':>10s} {'error':>8s}"
        + ("  CPU stolen" if steal else ""),
    ]
    for r in report["cases"]:
        size = (
            _fmt_bytes(r["size_bytes"])
            if not r["sizes_bytes"]
            else "max " + _fmt_bytes(max(r["sizes_bytes"]))
        )
        lines.append(
            f"{r['name']:30s} {r['role'][:5]:5s} {size:>10s} {r.get('measured_s', r['measured_median_s']) * 1e3:12.3f} "
            f"{r['spread']:7.1%} {r['predicted_s'] * 1e3:10.3f} {r['error']:+8.1%}"
            + (f"  {r['cpu_steal_share']:9.1%}" + (" FLAGGED" if r["steal_flag"] else "") if steal else "")
        )
    scope = "all cases" if len(report.get("roles", ())) > 1 else "validation cases"
    lines += [
        "",
        f"{'family (' + scope + ')':30s} {'cases':>5s} {'MAPE':>7s} {'worst':>8s}  {'tau':>6s}  worst case",
    ]
    groups = dict(report["families"])
    groups.update({f"{k} >= 256 KiB": s for k, s in report.get("families_large", {}).items()})
    if "dense_large" in report:
        groups["dense >= 256 KiB"] = report["dense_large"]
    if "collectives_large" in report:
        groups["collectives >= 256 KiB"] = report["collectives_large"]
    for fam, s in groups.items():
        tau = s.get("kendall_tau", math.nan)
        lines.append(
            f"{fam:30s} {s['num_cases']:5d} {s['mape']:7.1%} {s['worst_error']:+8.1%}  {tau:6.3f}  {s['worst_case']}"
        )
    for key, label in (("dense_large", "dense"), ("collectives_large", "collectives (sparse included)")):
        if key in report:
            d, t = report[key], report["targets"]
            lines.append(
                f"target {label} >= 256 KiB: mean {d['mape']:.1%} (<= {t['dense_mean_error']:.0%}: "
                f"{'met' if d['meets_mean'] else 'MISSED'}), worst {abs(d['worst_error']):.1%} "
                f"(<= {t['dense_worst_error']:.0%}: {'met' if d['meets_worst'] else 'MISSED'})"
            )
        if key in report and report[key].get("steal_flagged"):
            d = report[key]
            rest = d.get("without_steal_flagged")
            lines.append(
                f"  {len(d['steal_flagged'])} case(s) FLAGGED: more than {v.STEAL_FLAG_SHARE:.0%} of the CPU time "
                f"stolen during their reps ({', '.join(d['steal_flagged'])})"
                + (f"; without them: mean {rest['mape']:.1%}, worst {rest['worst_error']:+.1%} ({rest['worst_case']})"
                   if rest else "")
            )
    if "validation_kendall_tau" in report:
        lines.append(f"Kendall tau, {scope} ranked by time: {report['validation_kendall_tau']:.3f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    from igpolicy.cli_util import dispatch

    argv = list(sys.argv[1:] if argv is None else argv)
    return dispatch(
        prog="igsim",
        description=__doc__ or "",
        commands={
            "validate-report": ("igsim.cli.validate_report", "calibrate from a testbed measurement, report")
        },
        argv=["validate-report", *argv],
    )


if __name__ == "__main__":
    sys.exit(main())
