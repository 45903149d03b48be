"""Collectives up to 8 MiB at 25 Mbit/s, and what their fit does to the 25 Mbit/s step replays.

``docs/validation-data/runs/T-star-25Mbit-large`` is one ``igrt validate --ranks 4 --bandwidth
25Mbit`` round (2026-12-08, load 0.1-0.3) with the size cap at 3.5 s of line rate (what
``--max-case-s 3.5`` now sets; measured with the same cap edited in place), so it holds the 4 and
8 MiB all-reduce and all-gather that the default 0.8 s cap leaves out at that rate. The step sets'
25 Mbit/s training runs move 1-13 MB per op, above the 2 MiB the default calibration reaches.
docs/validation.md (*Model and testbed changes*) has the numbers.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from igsim.net.calibration import Calibration
from igsim.studies import step_validation as sv
from igsim.studies import validation as v
from tests.igsim.test_step_validation_data import _with_column

DOCS = Path(__file__).resolve().parents[2] / "docs" / "validation-data"
LARGE = DOCS / "runs" / "T-star-25Mbit-large"
STEPS = DOCS / "steps"
STEP_SETS_25 = ("I-star-25Mbit", "J-star-25Mbit", "R-star-25Mbit")


def test_the_large_cases_meet_both_targets_at_25_mbit():
    """The round's own fit (from the 2 MiB and smaller calibration cases) predicts its 4 and 8 MiB
    collectives within 5 %, and all its cases >= 256 KiB within both targets."""
    tb, cases, _ = v.load_measurements(v.measurement_path(LARGE))
    fit = v.fit_testbed(cases, tb)
    rep = v.build_report(cases, v.testbed_topology(tb), fit, burst_s=tb.burst_s, roles=(v.CALIBRATION, v.VALIDATION))
    big = [c for c in rep["cases"] if c["name"] in ("all_reduce-4MiB", "all_reduce-8MiB", "all_gather-4MiB",
                                                    "all_gather-8MiB")]  # fmt: skip
    assert len(big) == 4 and all(c["role"] == "validation" for c in big)
    assert all(abs(c["error"]) < 0.05 for c in big), [(c["name"], c["error"]) for c in big]
    assert rep["collectives_large"]["mape"] <= 0.05
    assert rep["collectives_large"]["meets_mean"] and rep["collectives_large"]["meets_worst"]
    assert abs(rep["collectives_large"]["worst_error"]) <= 0.10


def _replay(name: str, cal: Calibration | None = None, **model: bool) -> dict:
    """Step set ``name`` replayed with ``cal`` (default: its testbed's shipped star file) and the
    ``model`` switches: :func:`igsim.studies.step_validation.compare_steps`'s report."""
    root = STEPS / name
    tb, _cases, _raw = v.load_measurements(root / "measurements.json")
    cal = cal or Calibration.testbed_default("star", host_queue_bytes=tb.host_queue_bytes)
    runs = sv.simulate_runs(root / "steps", topology=v.testbed_topology(tb), calibration=cal, **model)
    return sv.compare_steps(runs, flags=sv.run_flags(root / "steps"))


def _own(name: str) -> Calibration:
    return Calibration.load(STEPS / name / "calibration.json")


@pytest.mark.parametrize("name", STEP_SETS_25)
def test_a_later_rounds_fit_replays_the_25_mbit_step_sets_closer_than_their_own(name):
    """The 25 Mbit/s step sets' own single-round fits put the all-gather factor at 0.77-0.80; this
    round's fit (0.82), measured hours to days later, replays each set's training runs with a
    smaller mean last-rank error than the set's own calibration: the over-prediction there is
    (at least partly) the noise of one round's gather factor, not a missing size term."""
    later = Calibration.load(LARGE / "calibration.json")
    assert _replay(name, later)["mean_abs_error_vs_min"] < _replay(name, _own(name))["mean_abs_error_vs_min"]


ALL_25 = sorted(p.name for p in STEPS.glob("*-25Mbit") if (p / "report.json").exists())


def test_the_shipped_100_mbit_calibration_replays_the_25_mbit_step_sets_better_than_their_own_fits():
    """Over every committed 25 Mbit/s step set, the shipped star calibration of its testbed (its NIC
    queue's file, ``Calibration.testbed_default``; both fitted on 100 Mbit/s rounds) replays the
    training runs' last-rank communication closer than each set's own 25 Mbit/s fit: mean |error| lower and more runs within 10 %. The 25
    Mbit/s calibration cases (512 KiB and 2 MiB) run at a lower bandwidth share than the same
    testbed's training ops do, so a fit on them over-predicts the runs."""
    assert len(ALL_25) >= 8, ALL_25
    reps = {"own": [_replay(n, _own(n)) for n in ALL_25], "shipped": [_replay(n) for n in ALL_25]}
    got = {k: [(r["mean_abs_error_vs_min"], r["verdicts_vs_min"].get("met", 0)) for r in rs] for k, rs in reps.items()}
    mean = {k: sum(e for e, _ in rows) / len(rows) for k, rows in got.items()}
    met = {k: sum(m for _, m in rows) for k, rows in got.items()}
    assert mean["shipped"] < mean["own"], mean
    assert met["shipped"] > met["own"], met


COMBINE_25 = [n for n in ALL_25 if _with_column(n, "combine_s", "ops.csv")]


@pytest.mark.parametrize("name", COMBINE_25)
def test_with_the_shipped_calibration_the_combine_times_bring_the_25_mbit_runs_closer(name):
    """The 25 Mbit/s sets' combine-time xfails (test_step_validation_data.COMBINE_FARTHER) come from
    their own fit predicting the network long: replayed with the shipped file, the combine times
    bring the mean rank's communication and the step time closer in every set that recorded them."""
    got = {c: _replay(name, combine=c) for c in (False, True)}
    for key in ("mean_abs_error_vs_mean", "mean_abs_step_error"):
        assert got[True][key] < got[False][key], key


def test_the_step_report_also_replays_with_the_shipped_calibration(tmp_path):
    """``igsim validate-report --steps-dir`` (what ``igrt validate --steps`` runs) replays the runs
    with the round's own fit and, as a transfer, with the shipped file of the testbed: both in the
    report, one summary line each, the shipped one equal to replaying with it directly."""
    import json
    import subprocess
    import sys

    root = STEPS / "R-star-25Mbit"
    out = tmp_path / "rep"
    proc = subprocess.run(
        [sys.executable, "-m", "igsim.cli.validate_report", str(root / "measurements.json"),
         "--steps-dir", str(root / "steps"), "--out", str(out)],
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "with the shipped calibration (igsim calibrate docs/validation-data/runs/JB-star" in proc.stdout
    rep = json.loads((out / "report.json").read_text())
    tb, _cases, _raw = v.load_measurements(root / "measurements.json")
    cal = Calibration.testbed_default("star", host_queue_bytes=tb.host_queue_bytes)
    direct = _replay("R-star-25Mbit")
    assert rep["steps_shipped"]["mean_abs_error_vs_min"] == pytest.approx(direct["mean_abs_error_vs_min"], rel=1e-12)
    assert rep["steps_shipped"]["calibration"] == cal.source
    assert rep["steps"]["mean_abs_error_vs_min"] != rep["steps_shipped"]["mean_abs_error_vs_min"]
