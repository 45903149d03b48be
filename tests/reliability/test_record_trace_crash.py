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
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from igsim.cli import main as igsim_main
from traces.reader import read_trace
from traces.schema import TraceError, part_files

ROOT = Path(__file__).resolve().parents[2]
EVERY = 3  # --commit-every-steps
START_LIMIT_S = 240.0  # spawning 2 ranks and building the tiny model, on a loaded 2-core machine


def _steps_on_disk(directory: Path, rank: int) -> int:
    """Steps rows of ``rank`` in its committed (renamed into place) steps parts."""
    return sum(pq.read_metadata(p).num_rows for p in part_files(directory, table="steps", rank=rank))


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
        while not all(len(part_files(out, table="steps", rank=r)) >= 3 for r in (0, 1)):
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
    last_steps = part_files(out, table="steps", rank=1)[-1]
    lost = pq.read_metadata(last_steps).num_rows
    last_steps.unlink()
    with pytest.raises(TraceError) as info:
        read_trace(out)
    message = str(info.value)
    assert message.startswith(str(out / "parts" / "params" / "params-r001-")), message
    assert "has params rows but no steps row" in message
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


# ----------------------------------------------------------------------------- igsim replay --complete-prefix
RUN_STEPS = 8
KEPT = 5  # steps rank 1's trace keeps: as if it was killed before committing steps 5..7


def _keep_steps_below(part: Path, stop: int) -> None:
    table = pq.read_table(part)
    table = table.filter(pc.less(table["step"], stop))
    pq.write_table(table, part)


def test_igsim_replay_complete_prefix_of_a_truncated_run_trace(tmp_path, capsys) -> None:
    """A finished ``igrt train --record-trace`` run whose rank 1 trace stops after step 4: ``igsim
    replay`` refuses it in one line; ``--complete-prefix`` replays steps 0..4, bytes and ops exact,
    with the same rows as the replay of the whole trace. A run killed before its end (no
    summary.json) is one line saying so."""
    run = tmp_path / "run"
    command = [
        sys.executable, "-m", "igrt", "train", "--workload", "gpt", "--tiny", "--policy", "topk",
        "--density", "0.1", "--steps", str(RUN_STEPS), "--record-trace", "--nproc", "2", "--backend", "gloo",
        "--no-eval", "--quiet", "--out", str(run),
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=START_LIMIT_S)
    assert done.returncode == 0, done.stderr[-2000:]
    assert igsim_main(["replay", str(run), "--out", str(tmp_path / "whole")]) == 0
    whole = list(csv.DictReader((tmp_path / "whole" / "replay.csv").open()))
    assert len(whole) == RUN_STEPS
    capsys.readouterr()

    for part in part_files(run / "trace", rank=1):
        _keep_steps_below(part, KEPT)
    assert igsim_main(["replay", str(run), "--out", str(tmp_path / "refused")]) == 2
    err = capsys.readouterr().err
    assert "incomplete trace" in err and "--complete-prefix" in err and err.count("\n") == 1, err

    assert igsim_main(["replay", str(run), "--out", str(tmp_path / "prefix"), "--complete-prefix"]) == 0
    assert f"replaying its complete prefix, the {KEPT} steps before step {KEPT}" in capsys.readouterr().out
    summary = json.loads((tmp_path / "prefix" / "replay.json").read_text())
    assert summary["steps"] == KEPT and summary["truncated_at"] == KEPT
    assert summary["bytes_exact"] and summary["ops_exact"]
    prefix = list(csv.DictReader((tmp_path / "prefix" / "replay.csv").open()))
    fields = [f for f in prefix[0] if f.endswith(("_bytes", "_collectives")) or f == "step"]
    assert [{f: r[f] for f in fields} for r in prefix] == [{f: r[f] for f in fields} for r in whole[:KEPT]]

    killed = tmp_path / "killed"
    killed.mkdir()
    shutil.copytree(run / "trace", killed / "trace")
    assert igsim_main(["replay", str(killed), "--complete-prefix"]) == 2
    err = capsys.readouterr().err
    assert "did not finish" in err and err.count("\n") == 1, err
