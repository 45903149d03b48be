"""The step-level tables of docs/validation.md are what the code computes from the committed runs.

``docs/validation-data/steps/<name>/`` holds one ``igrt validate --steps`` run on the namespace
testbed: its measurements and fitted calibration, and every training run's summary, metrics, op log
and own trace (no model or checkpoint). Replaying them must give the committed report's step table,
with bytes and ops exact; a change to the model that moves a number fails here until the data and
the doc are regenerated (``python docs/validation-data/tables.py``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from igsim.net.calibration import Calibration
from igsim.studies import step_validation as sv
from igsim.studies import validation as v

DATA = Path(__file__).resolve().parents[2] / "docs" / "validation-data" / "steps"
RUNS = sorted(p.name for p in DATA.glob("*") if (p / "report.json").exists())


def test_there_are_committed_step_runs():
    assert len(RUNS) >= 2, RUNS


@pytest.mark.parametrize("name", RUNS)
def test_replaying_the_committed_runs_gives_the_committed_table(name):
    root = DATA / name
    tb, _cases, _raw = v.load_measurements(root / "measurements.json")
    topo = v.testbed_topology(tb)
    runs = sv.simulate_runs(root / "steps", topology=topo, calibration=Calibration.load(root / "calibration.json"))
    got = sv.compare_steps(runs, skip_steps=1, flags=sv.run_flags(root / "steps"))
    want = json.loads((root / "report.json").read_text())["steps"]
    assert set(got["policies"]) == set(want["policies"])
    assert len(got["policies"]) >= 10  # 5 or 6 policies x 2 integrations
    for label, row in want["policies"].items():
        for key, value in row.items():
            if isinstance(value, float):
                assert math.isclose(got["policies"][label][key], value, rel_tol=1e-9), (label, key)
            elif isinstance(value, (str, int)) and not isinstance(value, bool):  # verdicts, steps to resolve
                assert got["policies"][label][key] == value, (label, key)
        assert row["measured_wire_bytes"] == row["predicted_wire_bytes"]  # bytes exact
    for key in ("mean_abs_error_vs_min", "mean_abs_error_vs_mean", "mean_abs_step_error", "kendall_tau_step"):
        assert math.isclose(got[key], want[key], rel_tol=1e-9), key
    assert got["verdicts_vs_min"] == want["verdicts_vs_min"]


def _with_column(name: str, column: str, file: str) -> bool:
    return any(column in p.read_text().split("\n", 1)[0] for p in (DATA / name / "steps").glob(f"real_*/{file}"))


# Where replaying with the combine times moves a per-run error further from the measurement, with
# the numbers: at 25 Mbit/s (set I on the 125 kB queues, 2026-12-06; set J with 4 MiB NIC queues;
# set F; set R, 2026-12-07) the sparse runs' communication is predicted long already without them, since the replay
# applies the calibration's all-gather factor (Calibration.for_op) and the ring collectives' own
# alpha (split_alpha), so adding them overshoots it. Their own 25 Mbit/s fit is what predicts long:
# replayed with the shipped file the combine times bring them closer (tests/igsim/test_large_cases_25mbit.py).
COMBINE_FARTHER = {
    ("F-star-25Mbit", "mean_abs_error_vs_min"):
        "last rank 4.8 % without the combine times, 5.1 % with (mean rank 6.0 -> 5.1 %, step 2.7 -> 2.2 %)",
    ("I-star-25Mbit", "mean_abs_error_vs_min"): "last rank 8.8 % without the combine times, 11.2 % with",
    ("I-star-25Mbit", "mean_abs_error_vs_mean"): "mean rank 4.7 % without the combine times, 5.6 % with",
    ("I-star-25Mbit", "mean_abs_step_error"): "step 1.96 % without the combine times, 2.00 % with",
    ("J-star-25Mbit", "mean_abs_error_vs_min"):
        "last rank 6.1 % without the combine times, 8.7 % with (step 1.38 -> 1.35 %)",
    ("J-star-25Mbit", "mean_abs_error_vs_mean"): "mean rank 2.6 % without the combine times, 4.1 % with",
    ("R-star-25Mbit", "mean_abs_error_vs_min"): "last rank 5.6 % without the combine times, 9.4 % with",
    ("R-star-25Mbit", "mean_abs_error_vs_mean"): "mean rank 1.6 % without the combine times, 3.5 % with",
    ("R-star-25Mbit", "mean_abs_step_error"): "step 0.91 % without the combine times, 1.07 % with",
}
COMBINE_SETS = [n for n in RUNS if _with_column(n, "combine_s", "ops.csv")]


@pytest.mark.parametrize(
    ("name", "key"),
    [
        pytest.param(n, k, marks=pytest.mark.xfail(strict=True, reason=COMBINE_FARTHER[(n, k)]))
        if (n, k) in COMBINE_FARTHER else (n, k)
        for n in COMBINE_SETS
        for k in ("mean_abs_error_vs_min", "mean_abs_error_vs_mean", "mean_abs_step_error")
    ],
)  # fmt: skip
def test_the_combine_times_bring_the_replayed_communication_closer(name, key):
    """The sets recorded with every rank's combine time per op (C-* on): replaying them with it
    predicts each run's communication (last and mean rank) and step time closer to the measurement
    than without it (the doc's ablation table), and the runs' bytes stay exact either way."""
    root = DATA / name
    tb, _cases, _raw = v.load_measurements(root / "measurements.json")
    topo, cal = v.testbed_topology(tb), Calibration.load(root / "calibration.json")
    got = {
        combine: sv.compare_steps(sv.simulate_runs(root / "steps", topology=topo, calibration=cal, combine=combine))
        for combine in (False, True)
    }
    sparse = [p for p in got[True]["policies"] if not p.startswith("dense")]
    assert all(  # without it every sparse run is predicted further below its measured communication
        got[False]["policies"][p]["predicted_comm_s"] < got[True]["policies"][p]["predicted_comm_s"] for p in sparse
    )
    assert got[True][key] < got[False][key], key


@pytest.mark.parametrize("name", [n for n in RUNS if _with_column(n, "x_finalize_s", "metrics.csv")])
def test_the_ddp_finalize_times_bring_the_ddp_hook_steps_closer(name):
    """The sets recorded with every DDP-hook rank's finalize time (E-* on): replaying them with it
    predicts the DDP-hook runs' step times closer in the mean than without it, never shorter than
    without it, and leaves the Synchronizer's runs as they were (they have no finalize)."""
    root = DATA / name
    tb, _cases, _raw = v.load_measurements(root / "measurements.json")
    topo, cal = v.testbed_topology(tb), Calibration.load(root / "calibration.json")
    got = {
        fin: sv.compare_steps(sv.simulate_runs(root / "steps", topology=topo, calibration=cal, finalize=fin))["policies"]
        for fin in (False, True)
    }
    hook = [p for p in got[True] if p.endswith("-ddp-hook")]
    assert len(hook) >= 5
    err = {fin: sum(abs(got[fin][p]["step_error"]) for p in hook) / len(hook) for fin in (False, True)}
    assert err[True] < err[False]
    assert all(got[True][p]["predicted_step_s"] >= got[False][p]["predicted_step_s"] - 1e-12 for p in hook)
    for p in got[True]:
        if not p.endswith("-ddp-hook"):
            assert got[True][p]["predicted_step_s"] == got[False][p]["predicted_step_s"], p
