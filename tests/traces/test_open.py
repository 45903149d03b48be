"""traces.open: the reader's validation, then one pyarrow dataset per table; and the parts/<table>/ layout.

Oracles: ``read_trace`` on the same directory and arguments (row counts and values per table), and
pandas / pyarrow reading a table folder directly.
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import traces
from traces import TABLES, TraceError, TraceWarning, TraceWriter, part_files, read_trace
from traces.samples import available_samples, sample_trace_path, write_synthetic_trace
from traces.schema import PARTS_DIR, TABLE_SCHEMAS

pd = pytest.importorskip("pandas")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("pristine")
    write_synthetic_trace(directory, num_steps=6, world_size=2, rows_per_part=40, seed=3)
    return directory


@pytest.fixture
def trace_dir(pristine, tmp_path) -> Path:
    return Path(shutil.copytree(pristine, tmp_path / "trace"))


def _sorted_frame(df: pd.DataFrame) -> pd.DataFrame:
    keys = [c for c in ("step", "rank", "param") if c in df.columns]
    df = df.assign(param=df["param"].astype(str)) if "param" in df.columns else df
    return df.sort_values(keys, kind="stable").reset_index(drop=True)


def _reader_frame(trace: traces.Trace, table: str) -> pd.DataFrame:
    cols = dict(getattr(trace, table))
    if "param" in cols:
        cols["param"] = trace.param_strings(table)
    return _sorted_frame(pd.DataFrame(cols))


def _assert_same_rows(opened: traces.TraceTables, trace: traces.Trace) -> None:
    for table in TABLES:
        got = _sorted_frame(opened.to_pandas(table))
        want = _reader_frame(trace, table)
        assert len(got) == len(want) == opened[table].count_rows()
        assert list(got.columns) == TABLE_SCHEMAS[table].names
        for column in want.columns:
            np.testing.assert_array_equal(got[column].to_numpy(), want[column].to_numpy(), err_msg=column)


def _flatten(directory: Path) -> None:
    """Move every part to the trace directory itself: the layout of traces written before parts/."""
    for path in part_files(directory):
        path.rename(directory / path.name)
    shutil.rmtree(directory / PARTS_DIR)


# ------------------------------------------------------------------------------ traces.open
def test_open_gives_the_readers_rows_per_table(pristine) -> None:
    opened = traces.open(pristine)
    trace = read_trace(pristine)
    assert opened.manifest == trace.manifest and opened.incomplete is None and opened.truncated_at is None
    assert all(opened[t].count_rows() > 0 for t in TABLES)
    _assert_same_rows(opened, trace)
    assert opened.to_pandas("params")["param"].dtype == "category"
    assert opened.steps is opened["steps"]
    table = opened.to_table("steps", columns=["step", "loss"])
    assert isinstance(table, pa.Table) and table.column_names == ["step", "loss"]


def test_a_table_folder_is_a_parquet_dataset_for_pandas_and_pyarrow(pristine) -> None:
    trace = read_trace(pristine)
    for table in TABLES:
        folder = pristine / PARTS_DIR / table
        df = pd.read_parquet(folder)
        assert len(df) == len(getattr(trace, table)["step"])
        assert list(df.columns) == TABLE_SCHEMAS[table].names
        assert pq.read_table(folder).num_rows == len(df)


def test_open_refuses_an_incomplete_trace_unless_complete_prefix(trace_dir) -> None:
    part_files(trace_dir, table="steps", rank=1)[-1].unlink()  # rank 1's last commit lost its steps part
    with pytest.raises(TraceError) as reader:
        read_trace(trace_dir)
    with pytest.raises(TraceError) as opener:
        traces.open(trace_dir)
    assert str(opener.value) == str(reader.value) and "incomplete trace" in str(opener.value)
    opened = traces.open(trace_dir, complete_prefix=True)
    trace = read_trace(trace_dir, complete_prefix=True)
    assert opened.truncated_at == trace.truncated_at is not None
    assert opened.to_pandas("params")["step"].max() < opened.truncated_at
    _assert_same_rows(opened, trace)


def test_open_refuses_a_symlinked_part_like_the_reader(trace_dir) -> None:
    first = part_files(trace_dir, table="params", rank=0)[0]
    link = first.with_name("params-r000-000099.parquet")
    link.symlink_to(first)
    with pytest.raises(TraceError, match="is a symbolic link") as info:
        traces.open(trace_dir)
    assert str(info.value).startswith(str(link))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_open_never_opens_a_fifo_named_as_a_part(trace_dir) -> None:
    fifo = trace_dir / PARTS_DIR / "steps" / "steps-r000-000099.parquet"
    os.mkfifo(fifo)
    with pytest.raises(TraceError, match="not a regular file"):
        traces.open(trace_dir)


def test_open_skips_what_the_reader_skips(trace_dir) -> None:
    bad = part_files(trace_dir, table="params", rank=1)[0]
    bad.write_bytes(b"PAR1 not really")
    with pytest.raises(TraceError, match="not a readable Parquet file"):
        traces.open(trace_dir)
    with pytest.warns(TraceWarning):
        opened = traces.open(trace_dir, on_error="skip")
    with pytest.warns(TraceWarning):
        trace = read_trace(trace_dir, on_error="skip")
    assert [p for p, _ in opened.skipped] == [bad] == [p for p, _ in trace.skipped]
    _assert_same_rows(opened, trace)
    assert all(str(bad) not in f for f in opened.params.files)


def test_open_with_a_step_window(pristine) -> None:
    opened = traces.open(pristine, steps=(2, 4))
    _assert_same_rows(opened, read_trace(pristine, steps=(2, 4)))
    assert set(opened.to_pandas("steps")["step"]) == {2, 3}


def test_open_names_an_unknown_table(pristine) -> None:
    with pytest.raises(ValueError, match=r"unknown trace table 'grads' \(tables: params, steps, unions\)"):
        traces.open(pristine)["grads"]


def test_open_on_the_shipped_samples() -> None:
    for name in available_samples():
        path = sample_trace_path(name)
        opened, trace = traces.open(path), read_trace(path)
        for table in TABLES:
            assert opened[table].count_rows() == len(getattr(trace, table)["step"]) > 0
            assert len(pd.read_parquet(path / PARTS_DIR / table)) == len(getattr(trace, table)["step"])


def test_the_documented_duckdb_query() -> None:
    duckdb = pytest.importorskip("duckdb")
    path = sample_trace_path("minilm")
    got = duckdb.sql(
        f"SELECT rank, count(*) AS n, avg(loss) AS loss FROM '{path}/parts/steps/*.parquet' GROUP BY rank ORDER BY rank"
    ).fetchall()
    steps = read_trace(path).steps
    assert [r for r, _, _ in got] == [0, 1]
    for rank, n, loss in got:
        mine = steps["loss"][steps["rank"] == rank]
        assert n == len(mine) and loss == pytest.approx(float(mine.mean()))


# ------------------------------------------------------------------------------ the two layouts
def test_a_trace_in_the_old_flat_layout_still_reads(trace_dir, pristine) -> None:
    _flatten(trace_dir)
    assert not (trace_dir / PARTS_DIR).exists() and len(part_files(trace_dir)) == len(part_files(pristine))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        old, new = read_trace(trace_dir), read_trace(pristine)
    assert old.skipped == []
    for table in TABLES:
        for column, arr in getattr(new, table).items():
            np.testing.assert_array_equal(getattr(old, table)[column], arr)
    _assert_same_rows(traces.open(trace_dir), new)


def test_a_shipped_sample_in_the_old_layout_reads_the_same(tmp_path) -> None:
    copy = Path(shutil.copytree(sample_trace_path("gpt"), tmp_path / "gpt"))
    _flatten(copy)
    old, new = read_trace(copy), read_trace(sample_trace_path("gpt"))
    for table in TABLES:
        for column, arr in getattr(new, table).items():
            np.testing.assert_array_equal(getattr(old, table)[column], arr)


def test_a_writer_on_an_old_layout_trace_continues_its_sequence_numbers(trace_dir) -> None:
    _flatten(trace_dir)
    last = max(int(p.name[-14:-8]) for p in part_files(trace_dir, table="steps", rank=1))
    with TraceWriter(trace_dir, rank=1) as w:
        w.add_step_row(step=6, forward_s=0.1, backward_s=0.1, optimizer_s=0.1, loss=1.0)
    assert w.parts_written == [trace_dir / PARTS_DIR / "steps" / f"steps-r001-{last + 1:06d}.parquet"]
    assert part_files(trace_dir, table="steps", rank=1)[-1] == w.parts_written[0]


def test_a_writer_puts_each_table_in_its_folder(pristine) -> None:
    for path in part_files(pristine):
        assert path.parent == pristine / PARTS_DIR / path.name.split("-")[0]
    assert sorted(p.name for p in pristine.iterdir()) == ["manifest.json", PARTS_DIR]


@pytest.mark.parametrize(
    ("make", "pattern"),
    [
        (lambda d: (d / PARTS_DIR / "grads").mkdir(), r"unknown table folder 'grads'"),
        (
            lambda d: (d / PARTS_DIR / "notes.txt").write_text("x"),
            r"is not a folder; parts/ holds one folder",
        ),
        (
            lambda d: shutil.copy(
                part_files(d, table="steps")[0], d / PARTS_DIR / "params" / "steps-r000-000099.parquet"
            ),
            r"a 'steps' part in the 'params' table folder",
        ),
    ],
)
def test_the_parts_folder_holds_table_folders_only(trace_dir, make, pattern) -> None:
    make(trace_dir)
    with pytest.raises(TraceError, match=pattern) as info:
        read_trace(trace_dir)
    assert str(info.value).startswith(str(trace_dir / PARTS_DIR)) and "\n" not in str(info.value)


def test_a_linked_table_folder_is_refused_not_followed(trace_dir, tmp_path) -> None:
    folder = trace_dir / PARTS_DIR / "unions"
    folder.rename(tmp_path / "unions-elsewhere")
    folder.symlink_to(tmp_path / "unions-elsewhere", target_is_directory=True)
    with pytest.raises(TraceError, match="is a symbolic link; trace folders must be real folders") as info:
        read_trace(trace_dir)
    assert str(info.value).startswith(str(folder))
