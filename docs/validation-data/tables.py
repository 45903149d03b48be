"""Print the collective tables of docs/validation.md from the recorded runs under this folder.

    python docs/validation-data/tables.py [RUNS_DIR]
    python docs/validation-data/tables.py --rewrite-steps   # after a model change: recompute steps/*/report.json

RUNS_DIR (default: ``runs/`` next to this file) holds ``igrt validate`` measurement folders named
``<round>-<testbed>-q<queue ms>`` (round A, B, C: three times; C under an extra busy loop). Prints
(1) the model/testbed changes, one row per testbed and step, errors over the collectives >= 256
KiB (sparse gathers included) of each run's validation cases, with the run's own fit; (2) the
transfer table: the calibration fitted on round A predicts every case of rounds B and C; and, from
``steps/<run>/report.json`` (``igrt validate --steps``), the step-level tables.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from igsim.studies import validation as v

TESTBEDS = ("star", "two-level", "hetero", "ring")


def _load(path: Path):
    tb, cases, raw = v.load_measurements(v.measurement_path(path))
    return tb, cases, raw, v.testbed_topology(tb)


def _load_avg(raw) -> str:
    m = raw.get("machine") or {}
    a, b = m.get("load_average_before"), m.get("load_average_after")
    return f"{a[0]:.1f}→{b[0]:.1f}" if a and b else "—"


def _cell(rep, key="collectives_large") -> str:
    d = rep[key]
    return f"{d['mape']:.1%} / {d['worst_error']:+.1%}"


def _own(path: Path, *, per_op: bool, statistic: str = "median", overflow: bool = False):
    """``path``'s own fit: by default the model as the tables of docs/validation.md were made, before
    the uplink's queue overflow (``overflow=True``: the current model, what ``igsim calibrate`` fits)."""
    tb, cases, raw, topo = _load(path)
    f = v.fit_testbed(cases, tb, per_op=per_op, statistic=statistic, overflow=overflow)
    return v.build_report(cases, topo, f, burst_s=tb.burst_s, statistic=statistic), raw, f


def model_table(runs: Path) -> str:
    steps = [
        ("100 ms tbf queue, one duplex factor (before)", "A-{t}-q100", False, "median"),
        ("100 ms tbf queue, all-gather factor", "A-{t}-q100", True, "median"),
        ("10 ms tbf queue, one duplex factor", "A-{t}-q10", False, "median"),
        ("10 ms tbf queue, all-gather factor (after)", "A-{t}-q10", True, "median"),
        ("10 ms queue, all-gather factor, fit and compare on min", "A-{t}-q10", True, "min"),
        ("30 ms tbf queue, all-gather factor", "A-{t}-q30", True, "median"),
        ("10 ms queue, all-gather factor, reps interleaved (round Ai)", "Ai-{t}-q10", True, "median"),
    ]
    head = "| testbed | step | load (1 min, before→after) | collectives ≥ 256 KiB: mean / worst | dense ≥ 256 KiB: mean / worst | worst case |"
    lines = [head, "|---|---|---|---:|---:|---|"]
    for t in TESTBEDS:
        for label, name, per_op, stat in steps:
            path = runs / name.format(t=t)
            if not (path / "measurements.json").exists():
                continue
            rep, raw, _ = _own(path, per_op=per_op, statistic=stat)
            lines.append(f"| {t} | {label} | {_load_avg(raw)} | {_cell(rep)} | {_cell(rep, 'dense_large')} | "
                         f"{rep['collectives_large']['worst_case']} |")  # fmt: skip
    return "\n".join(lines)


def transfer_table(
    runs: Path, *, statistic: str = "median", rounds: tuple[str, ...] = ("A", "B", "C"), suffix: str = "-q10",
    overflow: bool = False,
) -> str:
    head = "| testbed | fitted on | α (ms) | factors AR / AG / one-way | predicted run | load | collectives ≥ 256 KiB: mean / worst | dense ≥ 256 KiB | worst case |"
    lines = [head, "|---|---|---:|---|---|---|---:|---:|---|"]
    for t in TESTBEDS:
        a = runs / f"{rounds[0]}-{t}{suffix}"
        if not (a / "measurements.json").exists():
            continue
        _, raw_a, f = _own(a, per_op=True, statistic=statistic, overflow=overflow)
        for rnd in rounds[1:]:
            b = runs / f"{rnd}-{t}{suffix}"
            if not (b / "measurements.json").exists():
                continue
            tb, cases, raw, topo = _load(b)
            rep = v.build_report(cases, topo, f, burst_s=tb.burst_s, statistic=statistic,
                                 roles=(v.CALIBRATION, v.VALIDATION))  # fmt: skip
            lines.append(
                f"| {t} | {rounds[0]} ({raw_a['date'][11:16]}) | {f.alpha_s * 1e3:.2f} | {f.duplex_factor:.3f} / "
                f"{f.gather_factor or f.duplex_factor:.3f} / {f.simplex_factor:.3f}"
                f"{f', share {f.downstream_share:.3f}' if f.downstream_share != 1.0 else ''}"
                f"{f', overflow {f.overflow_factor:.3f}' if f.overflow_queues else ''} | {rnd} ({raw['date'][11:16]}"
                f"{', busy loop' if rnd.startswith('C') else ''}) | {_load_avg(raw)} | {_cell(rep)} | "
                f"{_cell(rep, 'dense_large')} | {rep['collectives_large']['worst_case']} |"
            )
    return "\n".join(lines)


def case_table(path: Path) -> str:
    """Every case >= 256 KiB of one run with its own fit: measured median, spread, prediction."""
    rep, raw, f = _own(path, per_op=True)
    gather = f.gather_factor or f.duplex_factor
    lines = [
        f"`{raw.get('command', '')}` ({raw['date']}, load {_load_avg(raw)}, {raw['reps']} reps). Fit: α = "
        f"{f.alpha_s * 1e3:.2f} ms, bandwidth × {f.duplex_factor:.3f} all-reduce, × {gather:.3f} all-gather, "
        f"× {f.simplex_factor:.3f} one-way.",
        "",
        "| case | role | measured median (ms) | spread | predicted (ms) | error |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in rep["cases"]:
        if max([r["size_bytes"], *r["sizes_bytes"]]) < 256 * 1024:
            continue
        lines.append(f"| {r['name']} | {r['role'][:5]} | {r['measured_median_s'] * 1e3:.1f} | {r['spread']:.0%} | "
                     f"{r['predicted_s'] * 1e3:.1f} | {r['error']:+.1%} |")  # fmt: skip
    d = rep["collectives_large"]
    lines.append(f"\nValidation collectives ≥ 256 KiB: mean {d['mape']:.1%}, worst {d['worst_error']:+.1%} "
                 f"({d['worst_case']}); Kendall τ {rep['validation_kendall_tau']:.3f} over all validation cases.")  # fmt: skip
    return "\n".join(lines)


def cross_table(runs: Path, *, rounds: tuple[str, str, str] = ("A", "B", "C")) -> str:
    """The star's round-A calibration (the shipped default) on every testbed's rounds B and C."""
    _, _, f = _own(runs / f"{rounds[0]}-star-q10", per_op=True)
    lines = [
        "| predicted run | load | collectives ≥ 256 KiB: mean / worst | worst case |",
        "|---|---|---:|---|",
    ]
    for t in TESTBEDS:
        for rnd in rounds[1:]:
            b = runs / f"{rnd}-{t}-q10"
            if not (b / "measurements.json").exists():
                continue
            tb, cases, raw, topo = _load(b)
            rep = v.build_report(cases, topo, f, burst_s=tb.burst_s, roles=(v.CALIBRATION, v.VALIDATION))
            lines.append(
                f"| {rnd}-{t} | {_load_avg(raw)} | {_cell(rep)} | {rep['collectives_large']['worst_case']} |"
            )
    return "\n".join(lines)


def step_table(report_path: Path) -> str:
    """The step-level table of one ``igrt validate --steps`` run (its ``report.json``): per training
    run, communication of the last-arriving and of the mean rank and the step time (slowest rank),
    measured / predicted / error, and bytes per step and rank (real = sim)."""
    import json
    import math

    rep = json.loads(report_path.read_text())["steps"]
    out = [
        "| run | comm, last rank: measured ± s.e. / predicted (ms) | error | verdict | comm, mean rank: measured / predicted (ms) | error "
        "| step: measured / predicted (ms) | error | bytes/step/rank (real = sim) |",
        "|---|---:|---:|---|---:|---:|---:|---:|---|",
    ]
    for name, r in rep["policies"].items():
        same = math.isclose(r["measured_wire_bytes"], r["predicted_wire_bytes"], rel_tol=1e-9)
        out.append(
            f"| {name} | {r['measured_comm_min_over_ranks_s'] * 1e3:.1f} ± {r['measured_comm_min_over_ranks_se_s'] * 1e3:.1f} "
            f"/ {r['predicted_comm_min_over_ranks_s'] * 1e3:.1f} | {r['error_vs_min']:+.1%} | {_verdict(r)} "
            f"| {r['measured_comm_mean_over_ranks_s'] * 1e3:.1f} / {r['predicted_comm_s'] * 1e3:.1f} "
            f"| {r['error_vs_mean']:+.1%} | {r['measured_step_s'] * 1e3:.0f} / {r['predicted_step_s'] * 1e3:.0f} "
            f"| {r['step_error']:+.1%} | {r['measured_wire_bytes']:.0f} ({'yes' if same else 'NO'}) |"
        )
    out.append(
        f"\nOver {len(rep['policies'])} runs ({rep['means_over']}): mean |error| of comm per step "
        f"{rep['mean_abs_error_vs_min']:.1%} (last rank), {rep['mean_abs_error_vs_mean']:.1%} (mean rank), "
        f"step time {rep['mean_abs_step_error']:.1%}; Kendall τ by step time {rep['kendall_tau_step']:.3f}, "
        f"by communication time {rep['kendall_tau_comm']:.3f}. Last rank's comm within 10 %: "
        f"{rep['verdicts_vs_min']['met']} met, {rep['verdicts_vs_min']['missed']} missed, "
        f"{rep['verdicts_vs_min']['unresolved']} unresolved (outside 10 % but within 2 standard errors of the "
        "run's own mean over its steps)."
    )
    return "\n".join(out)


def _verdict(r) -> str:
    """A run's last-rank verdict (``compare_steps``); an unresolved one with the steps it would need."""
    if r["verdict_vs_min"] != "unresolved":
        return r["verdict_vs_min"]
    return f"unresolved (~{r['steps_to_resolve']} steps)"


TERMS = ("combine", "carry_skew", "finalize")


def _has_column(root: Path, name: str, file: str) -> bool:
    found = sorted((root / "steps").glob(f"real_*/{file}"))
    return any(name in p.read_text().split("\n", 1)[0] for p in found)


def _has_combine(root: Path) -> bool:
    return _has_column(root, "combine_s", "ops.csv")


def _has_finalize(root: Path) -> bool:
    return _has_column(root, "x_finalize_s", "metrics.csv")


def _switch_sets(root: Path) -> list[tuple[bool, bool, bool]]:
    """The (combine, carry_skew, finalize) settings a set's ablation shows: every pair of the first
    two; with DDP-hook finalize times, also each model without and then with them."""
    sets = [(c, k, False) for c in (False, True) for k in (False, True)]
    if _has_finalize(root):
        sets = [(False, False, False), (False, False, True), (True, True, False), (True, True, True)]
    return sets


def step_ablation(root: Path) -> dict[tuple[bool, bool, bool], dict]:
    """One ``igrt validate --steps`` set replayed with the replay model's run-derived terms switched
    off and on — ``combine`` (every rank's combine time per op, from the op log), ``carry_skew``
    (each rank starts a step when it finished its previous one) and ``finalize`` (a DDP-hook rank's
    time from its end of communication to backward's return, from its metrics): by (combine,
    carry_skew, finalize), :func:`igsim.studies.step_validation.compare_steps`'s summary."""
    from igsim.net.calibration import Calibration
    from igsim.studies import step_validation as sv

    tb, _cases, _raw = v.load_measurements(root / "measurements.json")
    topo, cal = v.testbed_topology(tb), Calibration.load(root / "calibration.json")
    out = {}
    for switches in _switch_sets(root):
        runs = sv.simulate_runs(root / "steps", topology=topo, calibration=cal, **dict(zip(TERMS, switches)))
        out[switches] = sv.compare_steps(runs, skip_steps=1)
    return out


def ablation_table(root: Path) -> str:
    """:func:`step_ablation` as a markdown table (runs outside 10 % counted per column)."""
    rows = [
        "| combine | carried skew | DDP finalize | comm, last rank: mean \\|error\\| (runs > 10 %) | comm, mean rank "
        "| step (runs > 10 %) | Kendall τ by step / by comm |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    yn = {True: "yes", False: "no"}
    for switches, g in step_ablation(root).items():
        pol = g["policies"].values()
        n_comm = sum(abs(r["error_vs_min"]) > 0.10 for r in pol)
        n_step = sum(abs(r["step_error"]) > 0.10 for r in pol)
        rows.append(
            f"| {' | '.join(yn[x] for x in switches)} | {g['mean_abs_error_vs_min']:.1%} ({n_comm}) "
            f"| {g['mean_abs_error_vs_mean']:.1%} | {g['mean_abs_step_error']:.1%} ({n_step}) "
            f"| {g['kendall_tau_step']:.3f} / {g['kendall_tau_comm']:.3f} |"
        )
    return "\n".join(rows)


def rewrite_steps() -> int:
    """Recompute the ``steps`` section of every committed ``steps/<run>/report.json`` with the
    current model (the run's own calibration and topology, as ``igsim validate-report --steps-dir``
    computed it), keeping the rest; what ``tests/igsim/test_step_validation_data.py`` then checks."""
    import json

    from igsim.net.calibration import Calibration
    from igsim.studies import step_validation as sv

    for path in sorted((Path(__file__).parent / "steps").glob("*/report.json")):
        root = path.parent
        tb, _cases, _raw = v.load_measurements(root / "measurements.json")
        cal = Calibration.load(root / "calibration.json")
        runs = sv.simulate_runs(root / "steps", topology=v.testbed_topology(tb), calibration=cal)
        rep = json.loads(path.read_text())
        skip = int(rep["steps"].get("skip_steps", 1))
        rep["steps"] = sv.compare_steps(runs, skip_steps=skip, flags=sv.run_flags(root / "steps"))
        path.write_text(json.dumps(rep, indent=1, allow_nan=False) + "\n")
        print(f"rewrote {path}")
    return 0


def shipped_table(
    runs: Path, rounds: tuple[str, ...], suffix: str = "-q10", *, host_queue_bytes: int | None = None
) -> str:
    """Each topology's shipped calibration on the runs of ``rounds``: the file of the testbed each run
    was measured on (``Calibration.testbed_default(kind, host_queue_bytes=...)`` with the run's NIC
    queue), or those of ``host_queue_bytes`` where it is given (0: the files of the 125 kB NIC queues)."""
    from igsim.net.calibration import Calibration

    lines = [
        "| predicted run | load | shipped calibration (its run) | collectives ≥ 256 KiB: mean / worst | dense ≥ 256 KiB | worst case |",
        "|---|---|---|---:|---:|---|",
    ]  # fmt: skip
    for t in TESTBEDS:
        for rnd in rounds:
            b = runs / f"{rnd}-{t}{suffix}"
            if not (b / "measurements.json").exists():
                continue
            tb, cases, raw, topo = _load(b)
            nic = tb.host_queue_bytes if host_queue_bytes is None else host_queue_bytes
            cal = Calibration.testbed_default(t, host_queue_bytes=nic)
            source = " + ".join(re.findall(r"docs/validation-data/runs/([^/]+)/", cal.source))  # every pooled run
            rep = v.build_report(cases, topo, v.Fit.from_calibration(cal), burst_s=tb.burst_s,
                                 roles=(v.CALIBRATION, v.VALIDATION))  # fmt: skip
            lines.append(f"| {rnd}-{t} ({raw['date'][:16]}) | {_load_avg(raw)} | {source} | {_cell(rep)} | "
                         f"{_cell(rep, 'dense_large')} | {rep['collectives_large']['worst_case']} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--rewrite-steps"]:
        return rewrite_steps()
    runs = Path(argv[0]) if argv else Path(__file__).parent / "runs"
    for rep in sorted((Path(__file__).parent / "steps").glob("*/report.json")):
        print(f"## training steps: {rep.parent.name}\n")
        print(step_table(rep) + "\n")
        if _has_combine(rep.parent):
            print(f"### {rep.parent.name}: the replay model's terms, off and on\n")
            print(ablation_table(rep.parent) + "\n")
    print("## model and testbed changes (each run's own fit, validation cases)\n")
    print(model_table(runs))
    print("\n## transfer (fit on round A, every case of B and C out of sample)\n")
    print(transfer_table(runs))
    print("\n## transfer on a quiet machine (fit on QA, predict QB; fit on QC, predict QD)\n")
    print(transfer_table(runs, rounds=("QA", "QB")))
    print(transfer_table(runs, rounds=("QC", "QD")).split("\n", 2)[2])
    print("\n## a later day (fit on QA, predict QE and QF; fit on QE, predict QF)\n")
    print(transfer_table(runs, rounds=("QA", "QE", "QF")))
    print("\n".join(transfer_table(runs, rounds=("QE", "QF")).splitlines()[2:]))
    print("\n## each topology's shipped calibration on the quiet rounds\n")
    print(shipped_table(runs, ("QB", "QD", "QE", "QF")))
    print("\n## set I (2026-12-06, 125 kB queues): fit on IA, predict IB; the shipped calibrations on both\n")
    print(transfer_table(runs, rounds=("IA", "IB"), suffix=""))
    print()
    print(shipped_table(runs, ("IA", "IB"), suffix=""))
    print("\n## set J (2026-12-07, a rank's NIC queue 4 MiB): fit on JA, predict JB; the 125 kB-NIC files "
          "(shipped when J was measured) on both, then the current files (fitted on J: in sample)\n")
    print(transfer_table(runs, rounds=("JA", "JB"), suffix=""))
    print()
    print(shipped_table(runs, ("JA", "JB"), suffix="", host_queue_bytes=0))
    print()
    print(shipped_table(runs, ("JA", "JB"), suffix=""))
    print("\n## set K (2026-12-07, after the set-J fits shipped): fit on KA, predict KB; the shipped files on both\n")
    print(transfer_table(runs, rounds=("KA", "KB"), suffix=""))
    print()
    print(shipped_table(runs, ("KA", "KB"), suffix=""))
    print("\n## sets J and K with the uplink's queue overflow (the current model): fit on one round, predict the other\n")
    print(transfer_table(runs, rounds=("JA", "JB"), suffix="", overflow=True))
    print("\n".join(transfer_table(runs, rounds=("KA", "KB"), suffix="", overflow=True).splitlines()[2:]))
    for name, what in (
        ("L", "after the overflow model shipped"),
        ("M", "40 minutes after set L"),
        ("N", "reps interleaved"),
        ("O", "back to back, each rep's CPU ticks recorded"),
    ):  # the blind suites on the current model: same-day transfer, then the shipped files
        a, b = f"{name}A", f"{name}B"
        print(f"\n## set {name} (2026-12-07, {what}): fit on {a}, predict {b}; the shipped files on both\n")
        print(transfer_table(runs, rounds=(a, b), suffix="", overflow=True))
        print()
        print(shipped_table(runs, (a, b), suffix=""))
    print("\n## transfer, reps interleaved (fit on Ai, predict Bi and Ci)\n")
    print(transfer_table(runs, rounds=("Ai", "Bi", "Ci")))
    print("\n## the star's calibration (the shipped default) on every testbed\n")
    print(cross_table(runs))
    for t in TESTBEDS:
        if (runs / f"A-{t}-q10" / "measurements.json").exists():
            print(f"\n### {t}\n")
            print(case_table(runs / f"A-{t}-q10"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
