"""Broken traces: every problem is a TraceError naming the file, or a skipped part with a warning."""

from __future__ import annotations

import json
import re
import shutil
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from traces.cli import main as traces_main
from traces.reader import TraceWarning, read_trace
from traces.samples import write_synthetic_trace
from traces.schema import MANIFEST_NAME, TraceError, part_files


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("pristine")
    write_synthetic_trace(directory, num_steps=4, world_size=2, rows_per_part=30, seed=1)
    return directory


@pytest.fixture
def trace_dir(pristine, tmp_path) -> Path:
    """A fresh copy of a valid 2-rank trace with several parts per rank, to break."""
    return Path(shutil.copytree(pristine, tmp_path / "trace"))


def _first_part(directory: Path, table: str = "params") -> Path:
    return part_files(directory, table=table, rank=0)[0]


def _rewrite(path: Path, change) -> None:
    """Rewrite a part with ``change(table) -> table`` (bypassing the writer's checks)."""
    pq.write_table(change(pq.read_table(path)), path)


def _next_seq(directory: Path, table: str, rank: int) -> int:
    return 1 + max(int(p.name[-14:-8]) for p in part_files(directory, table=table, rank=rank))


def _raises_naming(directory: Path, path: Path, pattern: str) -> TraceError:
    with pytest.raises(TraceError) as info:
        read_trace(directory)
    message = str(info.value)
    assert message.startswith(str(path)), message
    assert re.search(pattern, message), message
    return info.value


def test_leftover_tmp_part_is_ignored_and_reported(trace_dir, pristine) -> None:
    tmp = trace_dir / "parts" / "params" / f".params-r000-{_next_seq(trace_dir, 'params', 0):06d}.parquet.tmp"
    tmp.write_bytes(b"PAR1 half a part")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trace = read_trace(trace_dir)
    assert [(p.name, "leftover" in why) for p, why in trace.skipped] == [(tmp.name, True)]
    reference = read_trace(pristine)
    for c, arr in reference.params.items():
        np.testing.assert_array_equal(trace.params[c], arr)


def test_a_writer_after_a_crash_neither_reuses_nor_reads_the_tmp_name(trace_dir) -> None:
    from traces.writer import TraceWriter

    seq = _next_seq(trace_dir, "steps", 1)
    (trace_dir / "parts" / "steps" / f".steps-r001-{seq:06d}.parquet.tmp").write_bytes(b"")
    with TraceWriter(trace_dir, rank=1) as w:
        w.add_step_row(step=99, forward_s=0.1, backward_s=0.1, optimizer_s=0.1, loss=1.0)
    assert w.parts_written[0].name == f"steps-r001-{seq + 1:06d}.parquet"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        warnings.filterwarnings(
            "error", message=".*sequence number"
        )  # the crashed part's number is not a gap
        trace = read_trace(trace_dir, on_error="skip")  # step 99 has no params rows: incomplete
    assert 99 in trace.steps["step"].tolist()
    assert "step 99 of rank 1 has a steps row but no params rows" in trace.incomplete


def test_truncated_part_raises_naming_it(trace_dir) -> None:
    part = _first_part(trace_dir)
    data = part.read_bytes()
    part.write_bytes(data[: len(data) // 2])
    _raises_naming(trace_dir, part, r"not a readable Parquet file \(truncated or corrupt")


def test_truncated_part_is_skipped_with_a_warning(trace_dir, pristine) -> None:
    part = _first_part(trace_dir)
    lost = len(pq.read_table(part))
    part.write_bytes(part.read_bytes()[:100])
    with pytest.warns(TraceWarning, match=re.escape(str(part))):
        trace = read_trace(trace_dir, on_error="skip")
    assert [p for p, _ in trace.skipped] == [part]
    assert part not in trace.parts
    assert len(trace.params["k"]) == len(read_trace(pristine).params["k"]) - lost


def test_corrupt_data_pages_are_caught(trace_dir) -> None:
    part = _first_part(trace_dir)
    data = bytearray(part.read_bytes())
    data[4:200] = b"\xff" * 196  # footer intact, column data garbage
    part.write_bytes(bytes(data))
    _raises_naming(trace_dir, part, "not a readable Parquet file")


def test_missing_column(trace_dir) -> None:
    part = _first_part(trace_dir)
    _rewrite(part, lambda t: t.drop_columns(["sel_norm"]))
    _raises_naming(trace_dir, part, r"missing column\(s\) \['sel_norm'\]")


def test_unknown_column(trace_dir) -> None:
    part = _first_part(trace_dir, "steps")
    _rewrite(part, lambda t: t.append_column("mystery", pa.array(np.zeros(len(t)))))
    _raises_naming(trace_dir, part, r"unknown column\(s\) \['mystery'\]")


def test_wrong_dtype(trace_dir) -> None:
    part = _first_part(trace_dir)
    _rewrite(
        part, lambda t: t.set_column(t.schema.get_field_index("k"), "k", t.column("k").cast(pa.float64()))
    )
    _raises_naming(trace_dir, part, "column 'k' has type double, expected int64")


def test_plain_string_param_column_is_accepted(trace_dir, pristine) -> None:
    part = _first_part(trace_dir)
    i = pq.read_table(part).schema.get_field_index("param")
    _rewrite(part, lambda t: t.set_column(i, "param", t.column("param").cast(pa.string())))
    np.testing.assert_array_equal(read_trace(trace_dir).params["param"], read_trace(pristine).params["param"])


def test_rows_that_contradict_the_manifest_or_file_name(trace_dir) -> None:
    part = _first_part(trace_dir)
    original = part.read_bytes()
    cases = [
        (
            "rank",
            lambda t: pa.array(np.ones(len(t), dtype=np.int32)),
            "rank column holds 1, but the file name says rank 0",
        ),
        (
            "numel",
            lambda t: pa.compute.add(t.column("numel"), 1),
            r"row 0: numel=\d+ differs from the manifest's \d+ \(step 0, param '.+'\)",
        ),
        ("k", lambda t: pa.compute.multiply(t.column("numel"), 2), r"row 0: k=\d+ outside \[0, numel=\d+\]"),
        (
            "param",
            lambda t: pa.array(["ghost.weight"] * len(t)).dictionary_encode(),
            "'ghost.weight' is not in the manifest",
        ),
        (
            "grad_norm",
            lambda t: pa.array([None] * len(t), pa.float64()),
            "column 'grad_norm' has .* null values",
        ),
    ]
    for column, values, pattern in cases:
        part.write_bytes(original)
        _rewrite(part, lambda t, c=column, v=values: t.set_column(t.schema.get_field_index(c), c, v(t)))
        _raises_naming(trace_dir, part, pattern)


def test_bad_file_names(trace_dir) -> None:
    src = _first_part(trace_dir)
    for name, pattern in (
        ("grads-r000-000001.parquet", "unknown table prefix 'grads'"),
        ("params-r002-000001.parquet", "rank 2 is outside the manifest's world_size=2"),
        ("params.parquet", "file name does not follow"),
    ):
        bad = trace_dir / name
        shutil.copy(src, bad)
        _raises_naming(trace_dir, bad, pattern)
        with pytest.warns(TraceWarning, match="skipped"):
            trace = read_trace(trace_dir, on_error="skip")
        assert (bad, next(why for p, why in trace.skipped if p == bad)) in trace.skipped
        bad.unlink()


def test_other_files_are_listed_not_read(trace_dir) -> None:
    (trace_dir / "NOTES.txt").write_text("hello")
    trace = read_trace(trace_dir)
    assert [(p.name, why) for p, why in trace.skipped] == [("NOTES.txt", "not a trace file; ignored")]


def test_deleted_part_warns_about_the_gap(trace_dir) -> None:
    part_files(trace_dir, table="params", rank=1)[1].unlink()
    with pytest.warns(TraceWarning, match=r"'params' parts of rank 1: sequence number\(s\) \[2\] missing"):
        read_trace(trace_dir)


def _edit_manifest(directory: Path, change) -> Path:
    path = directory / MANIFEST_NAME
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
    return path


def test_bad_schema_version(trace_dir) -> None:
    path = _edit_manifest(trace_dir, lambda d: d.update(schema_version=99))
    _raises_naming(trace_dir, path, "schema_version 99 is not supported by this reader")


def test_manifest_unknown_and_missing_keys(trace_dir) -> None:
    path = _edit_manifest(trace_dir, lambda d: d.update(surprise=1))
    _raises_naming(trace_dir, path, "unknown key 'surprise'")
    path = _edit_manifest(trace_dir, lambda d: (d.pop("surprise"), d.pop("workload")))
    _raises_naming(trace_dir, path, "missing required key 'workload'")


def test_manifest_bad_values(trace_dir) -> None:
    path = _edit_manifest(trace_dir, lambda d: d.update(density=3))
    _raises_naming(trace_dir, path, r"density=3 must be a number in \(0, 1\]")
    path = _edit_manifest(trace_dir, lambda d: d.update(density=0.1, params=[{"name": "x"}]))
    _raises_naming(trace_dir, path, r"params\[0\]: missing required key")


def test_corrupt_manifest(trace_dir) -> None:
    path = trace_dir / MANIFEST_NAME
    path.write_text(path.read_text()[:50])
    _raises_naming(trace_dir, path, "not valid JSON")
    with pytest.raises(TraceError):  # a manifest cannot be skipped
        read_trace(trace_dir, on_error="skip")


def test_missing_manifest_and_directory(trace_dir, tmp_path) -> None:
    path = trace_dir / MANIFEST_NAME
    path.unlink()
    _raises_naming(trace_dir, path, "missing")
    with pytest.raises(TraceError, match="no such trace directory"):
        read_trace(tmp_path / "nowhere")


def test_bad_arguments(trace_dir) -> None:
    with pytest.raises(ValueError, match="on_error"):
        read_trace(trace_dir, on_error="ignore")
    with pytest.raises(ValueError, match="steps"):
        read_trace(trace_dir, steps=(5, 2))


def test_inspect_exits_2_with_the_message(trace_dir, capsys) -> None:
    part = _first_part(trace_dir)
    part.write_bytes(part.read_bytes()[:64])
    assert traces_main(["inspect", str(trace_dir)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("traces inspect: error: ") and str(part) in err and "truncated or corrupt" in err
    assert traces_main(["inspect", str(trace_dir), "--skip-bad"]) == 0
    captured = capsys.readouterr()
    assert "traces inspect: warning:" in captured.err and str(part) in captured.out
    (trace_dir / MANIFEST_NAME).unlink()
    assert traces_main(["inspect", str(trace_dir), "--skip-bad"]) == 2
    assert "manifest.json: missing" in capsys.readouterr().err
