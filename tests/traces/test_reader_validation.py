"""Physically impossible traces are refused: duplicated parts or rows, links and special files,
impossible values — each a one-line TraceError that starts with the file and names the row."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from traces.reader import TraceWarning, read_trace
from traces.samples import synthetic_params, write_synthetic_trace
from traces.schema import MANIFEST_NAME, NORM_RTOL, RUN_TRACE_K, Manifest, TraceError, part_files
from traces.writer import TraceWriter, write_manifest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("pristine")
    write_synthetic_trace(directory, num_steps=4, world_size=2, rows_per_part=30, seed=5)
    return directory


@pytest.fixture
def trace_dir(pristine, tmp_path) -> Path:
    return Path(shutil.copytree(pristine, tmp_path / "trace"))


def _parts(directory: Path, table: str, rank: int = 0) -> list[Path]:
    return part_files(directory, table=table, rank=rank)


def _next_name(directory: Path, table: str, rank: int = 0) -> Path:
    seq = 1 + max(int(p.name[-14:-8]) for p in _parts(directory, table, rank))
    return directory / "parts" / table / f"{table}-r{rank:03d}-{seq:06d}.parquet"


def _set(path: Path, column: str, row: int, value) -> None:
    """Rewrite one value of a part (bypassing the writer's checks)."""
    table = pq.read_table(path)
    values = table.column(column).to_numpy().copy()
    values[row] = value
    i = table.schema.get_field_index(column)
    pq.write_table(table.set_column(i, column, pa.array(values, type=table.schema.field(column).type)), path)


def _error(directory: Path, **kwargs) -> str:
    with pytest.raises(TraceError) as info:
        read_trace(directory, **kwargs)
    message = str(info.value)
    assert "\n" not in message, message
    return message


def _same_rows(a, b) -> bool:
    return all(
        np.array_equal(getattr(a, t)[c], getattr(b, t)[c], equal_nan=True)
        for t in ("params", "steps", "unions")
        for c in getattr(b, t)
    )


# ------------------------------------------------------------------------------ duplicates
@pytest.mark.parametrize("table", ["params", "steps", "unions"])
def test_a_copied_part_is_refused_naming_the_copy(trace_dir, pristine, table) -> None:
    original = _parts(trace_dir, table)[0]
    copy = _next_name(trace_dir, table)
    shutil.copy(original, copy)
    message = _error(trace_dir)
    assert message.startswith(f"{copy}: row 0: duplicates row 0 of {original.name} (step 0"), message
    with pytest.warns(TraceWarning, match=re.escape(str(copy))):
        trace = read_trace(trace_dir, on_error="skip")
    assert [p for p, _ in trace.skipped] == [copy] and copy not in trace.parts
    assert _same_rows(trace, read_trace(pristine)) and trace.incomplete is None


def test_a_hard_link_is_a_duplicate_too(trace_dir) -> None:
    original = _parts(trace_dir, "params", rank=1)[1]
    link = _next_name(trace_dir, "params", rank=1)
    os.link(original, link)
    assert _error(trace_dir).startswith(f"{link}: row 0: duplicates row 0 of {original.name}")


def test_a_row_repeated_inside_a_part(trace_dir) -> None:
    part = _parts(trace_dir, "params")[0]
    table = pq.read_table(part)
    pq.write_table(pa.concat_tables([table, table.slice(3, 1)]), part)
    message = _error(trace_dir)
    assert message.startswith(
        f"{part}: row {len(table)}: duplicates row 3 of {part.name} (step 0, rank 0, param "
    )


def test_rows_out_of_order_are_read_and_still_checked(trace_dir, pristine) -> None:
    part = _parts(trace_dir, "params")[0]
    table = pq.read_table(part)
    pq.write_table(table.take(np.arange(len(table))[::-1]), part)  # unsorted: the slow path
    trace = read_trace(trace_dir)
    assert len(trace.params["step"]) == len(read_trace(pristine).params["step"])
    pq.write_table(pa.concat_tables([table.take(np.arange(len(table))[::-1]), table.slice(0, 1)]), part)
    assert _error(trace_dir).startswith(f"{part}: row {len(table)}: duplicates row {len(table) - 1} of")


# ------------------------------------------------------------------------------ links and special files
def test_a_symlinked_part_is_refused_and_never_followed(trace_dir, pristine) -> None:
    link = _next_name(trace_dir, "params")
    link.symlink_to(_parts(trace_dir, "params")[0])
    message = _error(trace_dir)
    assert message.startswith(f"{link}: is a symbolic link"), message
    with pytest.warns(TraceWarning, match="symbolic link"):
        trace = read_trace(trace_dir, on_error="skip")
    assert [p for p, _ in trace.skipped] == [link] and _same_rows(trace, read_trace(pristine))


def test_a_dangling_symlink_and_a_directory_named_as_parts(trace_dir) -> None:
    dangling = _next_name(trace_dir, "steps")
    dangling.symlink_to(trace_dir / "nowhere.parquet")
    assert _error(trace_dir).startswith(f"{dangling}: is a symbolic link")
    dangling.unlink()
    folder = _next_name(trace_dir, "unions")
    folder.mkdir()
    assert _error(trace_dir).startswith(f"{folder}: is not a regular file")


def _read_in_subprocess(directory: Path, timeout_s: float = 60.0) -> str:
    """Read in a child with a time limit (a reader that opens a FIFO blocks forever)."""
    code = (
        "import sys; from traces.reader import read_trace; from traces.schema import TraceError\n"
        f"try:\n    read_trace({str(directory)!r})\nexcept TraceError as e:\n    print(e)\nelse:\n    print('read')"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        return "blocked"
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_a_fifo_named_as_a_part_or_manifest_does_not_block(trace_dir) -> None:
    fifo = _next_name(trace_dir, "params", rank=1)
    os.mkfifo(fifo)
    got = _read_in_subprocess(trace_dir)
    assert got.startswith(f"{fifo}: is not a regular file"), got
    fifo.unlink()
    manifest = trace_dir / MANIFEST_NAME
    manifest.unlink()
    os.mkfifo(manifest)
    got = _read_in_subprocess(trace_dir)
    assert got.startswith(f"{manifest}: is not a regular file"), got


def test_a_symlinked_manifest_is_refused(trace_dir, tmp_path) -> None:
    manifest = trace_dir / MANIFEST_NAME
    elsewhere = tmp_path / "manifest-elsewhere.json"
    shutil.move(manifest, elsewhere)
    manifest.symlink_to(elsewhere)
    assert _error(trace_dir).startswith(f"{manifest}: is a symbolic link")
    with pytest.raises(TraceError, match="symbolic link"):  # a manifest cannot be skipped
        read_trace(trace_dir, on_error="skip")


# ------------------------------------------------------------------------------ impossible values
BAD_VALUES = [
    ("steps", "forward_s", -0.5, r"forward_s=-0.5 is not a time \(finite, >= 0\)"),
    ("steps", "backward_s", np.nan, r"backward_s=nan is not a time"),
    ("steps", "optimizer_s", np.inf, r"optimizer_s=inf is not a time"),
    ("params", "ready_s", -1e-3, r"ready_s=-0.001 is not a time"),
    ("params", "ready_s", np.inf, r"ready_s=inf is not a time"),
    ("params", "grad_norm", -1.0, r"grad_norm=-1.0 is negative"),
    ("params", "sel_norm", "grad_norm*1.01", r"sel_norm=.* exceeds grad_norm="),
    ("params", "sel_max_abs", "sel_norm*1.01", r"sel_max_abs=.* exceeds sel_norm="),
    ("params", "overlap", 1.5, r"overlap=1.5 outside \[0, 1\]"),
    ("params", "k", "numel+1", r"k=\d+ outside \[0, numel=\d+\]"),
    ("params", "k", -1, r"k=-1 outside \[0, numel=\d+\]"),
    ("unions", "union_k", "numel+1", r"union_k=\d+ outside \[0, numel=\d+\]"),
    ("params", "step", -3, r"step is negative"),
]


@pytest.mark.parametrize(("table", "column", "value", "pattern"), BAD_VALUES)
def test_an_impossible_value_names_the_file_and_row(
    trace_dir, pristine, table, column, value, pattern
) -> None:
    part = _parts(trace_dir, table)[1 if table == "params" else 0]
    row = 1 if pq.read_metadata(part).num_rows > 1 else 0
    if isinstance(value, str):  # relative to another column of the same row
        other, op = re.match(r"(\w+)([*+].*)", value).groups()
        base = pq.read_table(part).column(other if other != "numel" else "param").to_pylist()[row]
        if other == "numel":  # the manifest's numel of the row's parameter
            numel = (
                Manifest.from_json(json.loads((trace_dir / MANIFEST_NAME).read_text())).by_name[base].numel
            )
            value = numel + 1
        else:
            value = eval(f"{base}{op}")
    _set(part, column, row, value)
    message = _error(trace_dir)
    assert message.startswith(f"{part}: row {row}: "), message
    assert re.search(pattern, message), message
    assert re.search(r"\(step -?\d+(, param '[^']+')?\)$", message), message
    with pytest.warns(TraceWarning):
        trace = read_trace(trace_dir, on_error="skip")
    assert [p for p, _ in trace.skipped] == [part]


def test_norms_within_the_rounding_slack_and_nan_values_are_accepted(trace_dir) -> None:
    part = _parts(trace_dir, "params")[0]
    table = pq.read_table(part)
    grad = table.column("grad_norm").to_numpy()
    _set(part, "sel_norm", 0, grad[0] * (1 + NORM_RTOL / 2))  # rounding, not physics
    _set(part, "sel_max_abs", 0, grad[0] * (1 + NORM_RTOL / 2))
    for column in ("ready_s", "overlap", "grad_norm"):  # never ready / no previous set / a NaN gradient
        _set(part, column, 2, np.nan)
    _set(_parts(trace_dir, "steps")[0], "loss", 0, np.nan)  # no loss output that step
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trace = read_trace(trace_dir)
    assert np.isnan(trace.steps["loss"]).sum() == 1


def test_a_run_trace_with_zero_norms_and_nan_overlap_is_valid(tmp_path) -> None:
    """What ``igrt train --record-trace`` writes: norms 0, overlap NaN, k sent (0 where held)."""
    params = synthetic_params(num_layers=1, hidden=8, vocab=10)
    names = [p.name for p in params]
    numel = np.array([p.numel for p in params])
    n = len(params)
    for rank in (0, 1):
        with TraceWriter(tmp_path, rank=rank, rows_per_part=50_000) as w:
            for step in range(3):
                w.add_param_rows(step=np.full(n, step), param=names, numel=numel,
                                 k=np.where(np.arange(n) % 2 == step % 2, numel, 0),
                                 grad_norm=np.zeros(n), sel_norm=np.zeros(n), sel_max_abs=np.zeros(n),
                                 overlap=np.full(n, np.nan), ready_s=np.linspace(0, 0.01, n))  # fmt: skip
                w.add_step_row(step=step, forward_s=0.01, backward_s=0.02, optimizer_s=0.003, loss=2.0)
    write_manifest(tmp_path, Manifest(workload="run", params=params, world_size=2, extra={"k": RUN_TRACE_K}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trace = read_trace(tmp_path)
    assert trace.num_steps == 3 and trace.ranks == (0, 1) and trace.incomplete is None
