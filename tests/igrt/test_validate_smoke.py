"""``igrt validate`` smoke: 3 ranks on the namespace testbed (star and ring), a few sizes, igsim's report.

The testbed part skips cleanly where namespaces cannot be made (no root, no iproute2, a sandbox
that forbids ``ip netns add``); the case plan is checked everywhere.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from igrt.cli.validate import plan_cases
from igrt.testbed import namespaces as testbed


def _key(c):
    return (c["op"], c.get("size_bytes"), tuple(c.get("sizes_bytes", ())))


@pytest.mark.parametrize("quick", [False, True])
@pytest.mark.parametrize("p", [3, 4])
def test_plan_is_disjoint_labelled_and_capped(p, quick):
    max_bytes = 5 * 1024 * 1024
    cases = plan_cases(p, max_bytes=max_bytes, quick=quick)
    cal = {_key(c) for c in cases if c["role"] == "calibration"}
    val = [c for c in cases if c["role"] == "validation"]
    assert {c["role"] for c in cases} == {"calibration", "validation"}
    assert not cal & {_key(c) for c in val}, "a validation case repeats a calibration case"
    assert len({c["name"] for c in cases}) == len(cases)
    for c in cases:
        assert c.get("size_bytes", 0) <= max_bytes and max(c.get("sizes_bytes", [0])) <= max_bytes
        if c["op"] in ("all_gather", "reduce_scatter"):
            assert c["size_bytes"] % (4 * p) == 0  # whole fp32 blocks per rank
        if c["op"] == "sparse_all_gather":
            assert len(c["sizes_bytes"]) == p and all(s % 8 == 0 for s in c["sizes_bytes"])
    ops = {c["op"] for c in val}
    assert {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "sparse_all_gather"} <= ops
    assert any(c.get("size_bytes", 0) <= 16 * 1024 for c in cases if c["role"] == "calibration")
    assert any(c.get("size_bytes", 0) >= 512 * 1024 for c in cases if c["role"] == "calibration")


def _testbed_or_skip() -> None:
    try:
        testbed.check_support()
    except testbed.TestbedError as e:
        pytest.skip(f"no namespace testbed here: {e}")
    if testbed.leftovers():
        pytest.skip(f"another testbed is up ({' '.join(testbed.leftovers())}); not disturbing it")


@pytest.mark.parametrize("variant", [[], ["--ring"]], ids=["star", "ring"])
def test_validate_quick_on_three_ranks(tmp_path, variant):
    _testbed_or_skip()
    out = tmp_path / "v"
    cmd = [
        sys.executable,
        "-m",
        "igrt",
        "validate",
        "--ranks",
        "3",
        "--bandwidth",
        "100Mbit",
        "--quick",
        *variant,
        "--out",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert not testbed.leftovers(), "igrt validate left namespaces behind"
    assert "dense >= 256 KiB" in proc.stdout
    meas = json.loads((out / "measurements.json").read_text())
    assert meas["testbed"]["num_ranks"] == 3 and meas["testbed"]["burst_s"] > 0
    assert meas["testbed"]["ring"] is bool(variant) and meas["testbed"]["queue_s"] == testbed.DEFAULT_QUEUE_S
    assert len(meas["machine"]["load_average_after"]) == 3
    report = json.loads((out / "report.json").read_text())
    rows = report["cases"]
    assert {r["role"] for r in rows} == {"calibration", "validation"}
    assert all(math.isfinite(r["predicted_s"]) and r["predicted_s"] > 0 for r in rows)
    assert all(r["measured_median_s"] > 0 and r["reps"] == 3 for r in rows)
    # loose: the smoke run is short and the machine is shared; the full run is in docs/validation.md
    assert report["dense_large"]["mape"] < 0.3, report["dense_large"]
    assert (
        report["collectives_large"]["num_cases"] >= report["dense_large"]["num_cases"] + 1
    )  # the sparse one
    assert (out / "calibration.json").exists()


def test_max_case_s_sets_the_largest_case():
    """``--max-case-s``: at 25 Mbit/s the default 0.8 s of line rate stops at 2 MiB; 3.5 s adds the
    4 and 8 MiB validation cases, and the calibration's large cases stay the same."""
    rate = 25e6 / 8
    small = plan_cases(4, max_bytes=int(rate * 0.8))
    large = plan_cases(4, max_bytes=int(rate * 3.5))
    names = {c["name"] for c in large} - {c["name"] for c in small}
    assert {"all_reduce-4MiB", "all_reduce-8MiB", "all_gather-8MiB"} <= names
    assert all(c["role"] == "validation" for c in large if c["name"] in names)
    cal = lambda cases: [c["name"] for c in cases if c["role"] == "calibration"]  # noqa: E731
    assert cal(small) == cal(large)


@pytest.mark.parametrize("value", ["0", "-1"])
def test_max_case_s_must_be_positive(value):
    proc = subprocess.run(
        [sys.executable, "-m", "igrt", "validate", "--max-case-s", value, "--out", "/nonexistent/x"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode != 0
    assert f"--max-case-s {float(value):g} must be > 0" in proc.stdout + proc.stderr
