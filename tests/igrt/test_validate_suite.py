"""``igrt validate --suite`` (the whole validation in one command) and the step runs it trains.

The suite smoke (``--quick``, the ring only, two rounds) skips cleanly without a namespace testbed;
the step-run names are checked everywhere.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from igrt.cli.validate import StepRun, parse_step_runs
from igrt.testbed import namespaces as testbed
from tests.igrt.test_validate_smoke import _testbed_or_skip


def test_step_runs_cross_policies_and_integrations():
    runs = parse_step_runs("dense,adtopk,importance-R4", "sync,ddp-hook")
    assert [r.label for r in runs] == [
        "dense", "adtopk", "importance-R4", "dense-ddp-hook", "adtopk-ddp-hook", "importance-R4-ddp-hook",
    ]  # fmt: skip
    assert StepRun("importance", "ddp-hook", 8).train_args() == [
        "--policy", "importance", "--integration", "ddp-hook", "--release-period", "8",
    ]  # fmt: skip
    assert StepRun("topk").train_args() == ["--policy", "topk", "--integration", "sync"]


@pytest.mark.parametrize(
    ("policies", "integrations", "match"),
    [
        ("dense,magic", "sync", "'magic' is not among"),
        ("topk-R2", "sync", "'topk-R2' is not among"),
        ("importance-R0", "sync", "release period must be >= 1"),
        ("importance-Rx", "sync", "is not among"),
        ("dense", "sync,deepspeed", "--integrations"),
        ("dense,dense", "sync", "named twice"),
        ("", "sync", "at least one"),
    ],
)
def test_bad_step_runs_are_refused(policies, integrations, match):
    with pytest.raises(ValueError, match=match):
        parse_step_runs(policies, integrations)


def test_suite_quick_on_the_ring_in_two_rounds(tmp_path):
    _testbed_or_skip()
    out = tmp_path / "suite"
    cmd = [sys.executable, "-m", "igrt", "validate", "--suite", "--quick", "--testbeds", "ring", "--rounds", "2",
           "--out", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert not testbed.leftovers(), "igrt validate --suite left namespaces behind"
    suite = json.loads((out / "suite.json").read_text())
    rows = [(r["run"], r["predicted_with"]) for r in suite["collectives"]]
    assert rows == [
        ("A-ring", "its own fit"), ("B-ring", "its own fit"), ("B-ring", "A's fit"), ("B-ring", "the shipped default"),
    ]  # fmt: skip
    for r in suite["collectives"]:
        assert r["cases"] >= 1 and 0 <= r["mean"] < 1.0 and isinstance(r["meets_mean"], bool)
    # B's cases predicted with A's calibration file: the same file the transfer report names
    transfer = json.loads((out / "B-ring" / "transfer" / "report.json").read_text())
    assert transfer["calibration"] == str(out / "A-ring" / "calibration.json")
    assert "collectives >= 256 KiB" in proc.stdout and "the shipped default" in proc.stdout
