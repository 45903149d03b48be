"""kill -9 of a process recording a trace: its complete prefix reads back, and the rest is reported.

A child process writes a trace with :class:`traces.writer.TraceWriter` the way the recorder does (the
manifest first, then per step every parameter's ``params`` row and the step's ``steps`` row, one
commit per step: a params part, then a steps part) and prints a line after each commit. The test
sends it SIGKILL:

- at an arbitrary moment after a few commits (wherever the child happens to be);
- while it is half-way through writing the steps part of a commit (the child parks inside
  ``pq.write_table`` after half the bytes, so a ``.tmp`` file is certainly left behind and the
  step's params part is on disk without its steps row).

Oracle: ``read_trace(complete_prefix=True)`` returns exactly the rows of steps 0..m-1 for some m >=
the number of commits the child reported, row for row equal to what it wrote (a part is all or
nothing), with no warning; without ``complete_prefix`` the reader either returns the same rows (the
kill fell between commits) or raises a TraceError that names the step whose steps row is missing.
A leftover ``.tmp`` is listed in ``Trace.skipped``; a writer reopened on the directory continues
after it, and nothing is reported missing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from igpolicy.vocab import ParamInfo
from traces.reader import read_trace
from traces.schema import Manifest, TraceError
from traces.writer import TraceWriter, write_manifest

ROOT = Path(__file__).resolve().parents[2]
PARAMS = tuple(
    ParamInfo(name=f"model.layers.{i // 2}.mlp.{'up' if i % 2 else 'down'}_proj.weight", shape=(64, 32),
              dtype="float32", component=f"{i // 2}.{'mlp_up' if i % 2 else 'mlp_down'}", order=i)
    for i in range(8)
)  # fmt: skip
HARD_LIMIT_S = 60.0


def _rows(step: int) -> dict[str, np.ndarray]:
    """The params rows of ``step``: a pure function of the step, so the test can recompute them."""
    n = len(PARAMS)
    rng = np.random.default_rng(step)
    numel = np.array([p.numel for p in PARAMS], dtype=np.int64)
    return {
        "step": np.full(n, step, dtype=np.int64),
        "param": np.array([p.name for p in PARAMS]),
        "numel": numel,
        "k": (numel // 100) + step % 3,
        "grad_norm": rng.uniform(1, 2, n),
        "sel_norm": rng.uniform(0.5, 1, n),
        "sel_max_abs": rng.uniform(0, 0.5, n),
        "overlap": np.full(n, np.nan) if step == 0 else rng.uniform(0, 1, n),
        "ready_s": rng.uniform(0, 0.01, n),
    }


def _step_row(step: int) -> dict[str, float]:
    return {
        "step": step,
        "forward_s": 0.01,
        "backward_s": 0.02,
        "optimizer_s": 0.001,
        "loss": 1.0 / (step + 1),
    }


def record(directory: str, park_after_steps: int) -> None:
    """The child: record forever, one commit per step; with ``park_after_steps`` > 0, park half-way
    through the steps part of the next step after that many (the test kills it there)."""
    directory_path = Path(directory)
    write_manifest(directory_path, Manifest(workload="crash-test", params=PARAMS, world_size=1))
    writer = TraceWriter(directory_path, rank=0, commit_every_steps=1)
    if park_after_steps:
        import traces.writer

        original = traces.writer.pq.write_table

        def write_table(table, where, **kwargs):
            if len(writer.parts_written) == 2 * park_after_steps + 1:  # this step's params part is in place
                sink = pa.BufferOutputStream()
                original(table, sink, **kwargs)
                data = sink.getvalue().to_pybytes()
                where.write(data[: len(data) // 2])
                where.flush()
                print("parked", flush=True)
                time.sleep(3600)
            return original(table, where, **kwargs)

        traces.writer.pq.write_table = write_table
    step = 0
    while True:
        writer.add_param_rows(**_rows(step))
        writer.add_step_row(**_step_row(step))  # ends the step: params part, then steps part, now
        print(f"step {step}", flush=True)
        step += 1


def _run_child(directory: Path, *, park_after_steps: int, kill_after_steps: int) -> int:
    """Start the recorder, SIGKILL it (after ``kill_after_steps`` commits, or once parked); returns
    how many steps it reported committed."""
    code = f"from tests.reliability.test_trace_crash import record; record({str(directory)!r}, {park_after_steps})"
    child = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    done = 0
    end = time.monotonic() + HARD_LIMIT_S
    try:
        for line in child.stdout:
            if line.startswith("step "):
                done += 1
            if (park_after_steps and line.strip() == "parked") or (
                not park_after_steps and done >= kill_after_steps
            ):
                break
            assert time.monotonic() < end, "the recorder never reached the fault"
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait(timeout=10)
    assert child.returncode == -signal.SIGKILL
    return done


def _assert_complete_prefix(directory: Path, at_least: int) -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to warn about: no gaps, no skipped parts
        trace = read_trace(directory, on_error="raise", complete_prefix=True)
    steps = trace.params["step"]
    num_steps = len(steps) // len(PARAMS)
    assert num_steps >= at_least and len(steps) == num_steps * len(PARAMS)
    assert trace.num_steps == num_steps and trace.truncated_at in (None, num_steps)
    for step in range(num_steps):
        got = {c: a[step * len(PARAMS) : (step + 1) * len(PARAMS)] for c, a in trace.params.items()}
        want = _rows(step)
        for column, values in want.items():
            if column == "param":
                values = np.array([trace.manifest.param_names.index(n) for n in values], dtype=np.int32)
            np.testing.assert_array_equal(got[column], values, err_msg=f"step {step}, column {column}")
    np.testing.assert_array_equal(trace.steps["step"], np.arange(num_steps))
    np.testing.assert_array_equal(trace.steps["loss"], [_step_row(s)["loss"] for s in range(num_steps)])
    if trace.truncated_at is None:  # the kill fell between two commits: the trace is complete
        read_trace(directory)
    else:
        with pytest.raises(TraceError, match=f"step {num_steps} of rank 0 has params rows but no steps row"):
            read_trace(directory)
    return num_steps


def test_kill_at_an_arbitrary_moment_loses_at_most_the_step_in_progress(tmp_path) -> None:
    done = _run_child(tmp_path, park_after_steps=0, kill_after_steps=5)
    _assert_complete_prefix(tmp_path, at_least=done)  # it may have written more before the signal landed


def test_kill_mid_commit_leaves_a_tmp_and_an_incomplete_step_that_are_reported(tmp_path) -> None:
    done = _run_child(tmp_path, park_after_steps=4, kill_after_steps=0)
    assert done == 4
    leftovers = sorted(p.name for p in tmp_path.rglob(".*.tmp"))
    assert leftovers == [".steps-r000-000005.parquet.tmp"]
    # step 4's params, without its steps row
    assert (tmp_path / "parts/params/params-r000-000005.parquet").is_file()
    assert _assert_complete_prefix(tmp_path, at_least=4) == 4
    trace = read_trace(tmp_path, complete_prefix=True)
    assert trace.truncated_at == 4 and "step 4 of rank 0 has params rows but no steps row" in trace.incomplete
    assert [(p.name, "leftover temporary file" in why) for p, why in trace.skipped] == [(leftovers[0], True)]
    # a recorder restarted on the directory continues after the unfinished number; nothing is missing
    with TraceWriter(tmp_path, rank=0, commit_every_steps=1) as writer:
        writer.add_step_row(**_step_row(4))
        writer.add_param_rows(**_rows(5))
        writer.add_step_row(**_step_row(5))
    assert [p.name for p in writer.parts_written] == [
        "steps-r000-000006.parquet",
        "params-r000-000006.parquet",
        "steps-r000-000007.parquet",
    ]
    assert _assert_complete_prefix(tmp_path, at_least=6) == 6
    assert read_trace(tmp_path).incomplete is None
