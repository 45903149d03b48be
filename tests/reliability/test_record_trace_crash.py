"""kill -9 of a real ``igrt record`` run: the steps committed before the kill read back, complete.

``igrt record --workload gpt --tiny --nproc 2`` (2 gloo ranks, spawned) records with a commit every
3 steps; once every rank has committed at least 3 times, the test sends SIGKILL to the whole
process group (the launcher and both ranks, at once, wherever they are).

Oracle: ``read_trace(complete_prefix=True)`` holds steps 0..n-1 with every parameter's row on
every rank, a ``steps`` row per rank and the ``unions`` rows of every step, where n is the number
of steps every rank has committed (counted from the ``steps`` parts on disk): nothing committed is
lost, nothing half-written is read. Then the last commit of rank 1 is made half-done by hand (its
``steps`` part removed, as if the kill had landed between its params and steps parts): the reader
refuses the trace naming rank 1's params part, ``igsim profile`` refuses it (exit 2, one line), and
``igsim profile --complete-prefix`` profiles the n - 3 complete steps.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from igsim.cli import main as igsim_main
from traces.reader import read_trace
from traces.schema import TraceError

ROOT = Path(__file__).resolve().parents[2]
EVERY = 3  # --commit-every-steps
START_LIMIT_S = 240.0  # spawning 2 ranks and building the tiny model, on a loaded 2-core machine


def _steps_on_disk(directory: Path, rank: int) -> int:
    """Steps rows of ``rank`` in its committed (renamed into place) steps parts."""
    return sum(pq.read_metadata(p).num_rows for p in directory.glob(f"steps-r{rank:03d}-*.parquet"))


def _record_and_kill(out: Path, log: Path) -> None:
    command = [
        sys.executable, "-m", "igrt", "record", "--workload", "gpt", "--tiny", "--nproc", "2",
        "--backend", "gloo", "--steps", "100000", "--no-eval", "--no-progress",
        "--commit-every-steps", str(EVERY), "--commit-every-s", "0", "-o", str(out),
    ]  # fmt: skip
    with open(log, "wb") as sink:
        child = subprocess.Popen(
            command, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        end = time.monotonic() + START_LIMIT_S
        while not all(len(list(out.glob(f"steps-r{r:03d}-*.parquet"))) >= 3 for r in (0, 1)):
            assert child.poll() is None, (
                f"igrt record exited with {child.returncode}: {log.read_text()[-2000:]}"
            )
            assert time.monotonic() < end, (
                f"no 3 commits per rank after {START_LIMIT_S} s: {log.read_text()[-2000:]}"
            )
            time.sleep(0.05)
        os.killpg(child.pid, signal.SIGKILL)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL


def test_kill_9_of_igrt_record_keeps_every_committed_step(tmp_path, capsys) -> None:
    out = tmp_path / "trace"
    _record_and_kill(out, tmp_path / "record.log")
    time.sleep(0.5)  # the ranks die with the process group; let the kernel reap them
    committed = min(_steps_on_disk(out, r) for r in (0, 1))
    assert committed >= 3 * EVERY

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no gap, nothing skipped but a leftover .tmp
        trace = read_trace(out, complete_prefix=True)
    n = trace.num_steps
    manifest = trace.manifest
    num_params = len(manifest.params)
    assert manifest.world_size == 2 and num_params > 0
    assert n == committed, (n, committed)
    np.testing.assert_array_equal(trace.step_ids, np.arange(n))
    assert len(trace.params["step"]) == n * 2 * num_params
    assert len(trace.steps["step"]) == 2 * n and len(trace.unions["step"]) == n * num_params
    for r in (0, 1):
        mine = trace.params["rank"] == r
        np.testing.assert_array_equal(np.bincount(trace.params["step"][mine], minlength=n), num_params)
        assert np.all(np.isfinite(trace.steps["forward_s"])) and np.all(trace.steps["backward_s"] > 0)
    if trace.truncated_at is None:  # the kill fell where every rank had committed the same steps
        assert read_trace(out).num_steps == n
    else:
        with pytest.raises(TraceError, match="incomplete trace"):
            read_trace(out)

    # rank 1's last commit half done: its params part is on disk, its steps part is not
    last_steps = sorted(out.glob("steps-r001-*.parquet"))[-1]
    lost = pq.read_metadata(last_steps).num_rows
    last_steps.unlink()
    with pytest.raises(TraceError) as info:
        read_trace(out)
    message = str(info.value)
    assert message.startswith(str(out / "params-r001-")) and "has params rows but no steps row" in message
    assert "\n" not in message

    plan_path = tmp_path / "plan.json"
    assert igsim_main(["profile", str(out), "-o", str(plan_path), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("igsim profile: error: ") and "incomplete trace" in err and err.count("\n") == 1
    assert not plan_path.exists()
    assert igsim_main(["profile", str(out), "-o", str(plan_path), "--quiet", "--complete-prefix"]) == 0
    assert "profiled its complete prefix" in capsys.readouterr().out
    source = json.loads(plan_path.read_text())["source"]
    assert source["num_steps"] == n - lost and source["truncated_at"] == n - lost
