"""Reading one table's part files into numpy columns, checked, in worker threads.

:func:`load_table` first reads every part's footer (schema and row count; with a step window, its
step range), allocates each column once at its final size, then reads, checks and copies the parts
into place in a small thread pool: pyarrow and numpy release the GIL, so one part decodes while
another is checked and copied. Results are taken in file order, so the first bad part (in that
order) is the one reported. Only the footer's schema and row count are read before the data —
never row-group metadata, whose accessors abort the process on some corrupt footers (pyarrow 26).

A worker never raises for a bad file; it returns the reason, and the caller's ``bad(path, reason)``
decides (raise, or skip the part). Rows of skipped parts and rows outside the window are squeezed
out at the end.
"""

from __future__ import annotations

import concurrent.futures
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from traces import validate
from traces.schema import TABLE_SCHEMAS, Manifest, PartName

__all__ = ["load_table", "worker_pool"]


def worker_pool() -> concurrent.futures.ThreadPoolExecutor:
    """The threads that read parts: one per usable CPU, 2 to 4."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return concurrent.futures.ThreadPoolExecutor(max_workers=max(2, min(4, cpus)), thread_name_prefix="trace")


@dataclass(frozen=True, kw_only=True)
class _Footer:
    num_rows: int
    in_window: bool


@dataclass(frozen=True, kw_only=True, eq=False)
class _Loaded:
    num_rows: int  # rows copied into place (those in the step window)
    span: validate.Span


def load_table(
    table: str,
    parts: list[tuple[PartName, Path]],
    *,
    manifest: Manifest,
    steps: tuple[int, int] | None,
    bad: Callable[[Path, str], None],
    pool: concurrent.futures.Executor,
) -> tuple[dict[str, np.ndarray], list[validate.Span]]:
    """Every usable part's checked rows in one array per column, and where each part's rows are."""
    reader = _TableReader(table, manifest=manifest, steps=steps)
    footers = []
    for (part, path), got in zip(parts, pool.map(reader.footer, [path for _, path in parts])):
        if isinstance(got, str):
            bad(path, got)
        elif got.in_window:
            footers.append((part, path, got.num_rows))
    offsets = np.concatenate(([0], np.cumsum([n for *_, n in footers], dtype=np.int64)))
    reader.allocate(int(offsets[-1]))
    jobs = [(part, path, int(offset), n) for (part, path, n), offset in zip(footers, offsets)]
    spans: list[validate.Span] = []
    holes = False
    for (_, path, _, n), got in zip(jobs, pool.map(reader.load, jobs)):
        if isinstance(got, str):
            bad(path, got)  # may raise: jobs not started yet are cancelled by the caller's pool
            holes = True
            continue
        spans.append(got.span)
        holes = holes or got.num_rows < n
    if not holes:
        return reader.out, spans
    keep = np.zeros(int(offsets[-1]), dtype=bool)
    start, squeezed = 0, []
    for s in spans:  # every kept part's rows, in order, closed up
        keep[s.start : s.stop] = True
        squeezed.append(replace(s, start=start, stop=start + s.stop - s.start))
        start += s.stop - s.start
    return {name: arr[keep] for name, arr in reader.out.items()}, squeezed


class _TableReader:
    """What the worker threads share: the table, the manifest's lookups, the output arrays."""

    def __init__(self, table: str, *, manifest: Manifest, steps: tuple[int, int] | None) -> None:
        self.table = table
        self.schema = TABLE_SCHEMAS[table]
        self.steps = steps
        self.names = manifest.param_names
        self.code_of = {n: i for i, n in enumerate(self.names)}
        info = manifest.by_name
        self.numel_of = np.array([info[n].numel for n in self.names], dtype=np.int64)
        self.out: dict[str, np.ndarray] = {}

    def allocate(self, num_rows: int) -> None:
        self.out = {f.name: np.empty(num_rows, dtype=_numpy_dtype(f.type)) for f in self.schema}

    def footer(self, path: Path) -> _Footer | str:
        """The part's row count (and whether any row is in the step window), or why it is unusable."""
        try:
            with pq.ParquetFile(path) as pf:
                problem = _schema_problem(self.table, pf.schema_arrow)
                if problem:
                    return problem
                num_rows = pf.metadata.num_rows
                if num_rows < 0:
                    return f"corrupt Parquet footer (row count {num_rows})"
                if self.steps is None:
                    return _Footer(num_rows=num_rows, in_window=True)
                step = pf.read(columns=["step"]).column("step")
        except (pa.ArrowException, OSError, UnicodeDecodeError) as e:
            return _unreadable(e)
        if not len(step) or step.null_count:  # nulls: reported when the part is read
            return _Footer(num_rows=num_rows, in_window=bool(step.null_count))
        lo, hi = int(pc.min(step).as_py()), int(pc.max(step).as_py())
        return _Footer(num_rows=num_rows, in_window=not (hi < self.steps[0] or lo >= self.steps[1]))

    def load(self, job: tuple[PartName, Path, int, int]) -> _Loaded | str:
        """Read, check and copy one part into ``out[offset:]``; or why it is unusable."""
        part, path, offset, expected = job
        try:
            with pq.ParquetFile(path) as pf:
                problem = _schema_problem(self.table, pf.schema_arrow)
                if problem:
                    return problem
                arrow = pf.read()
        except (pa.ArrowException, OSError, UnicodeDecodeError) as e:
            return _unreadable(e)
        if arrow.num_rows != expected:
            return f"holds {arrow.num_rows} rows, but its footer said {expected} (did it change while being read?)"
        cols = self._columns(arrow)
        del arrow
        if isinstance(cols, str):
            return cols
        problem = validate.part_problem(
            self.table, cols, rank=part.rank, numel_of=self.numel_of, names=self.names
        )
        if problem:
            return problem
        rows = None
        if self.steps is not None:
            keep = (cols["step"] >= self.steps[0]) & (cols["step"] < self.steps[1])
            if not keep.all():
                rows = np.flatnonzero(keep)
                cols = {name: arr[rows] for name, arr in cols.items()}
        n = len(cols["step"])
        placed = {}
        for name, arr in cols.items():
            placed[name] = target = self.out[name][offset : offset + n]
            target[...] = arr
        span = validate.summarize(placed, path=path, rank=part.rank, start=offset, rows=rows)
        return _Loaded(num_rows=n, span=span)

    def _columns(self, arrow: pa.Table) -> dict[str, np.ndarray] | str:
        """numpy views of the columns (``param`` as codes into the manifest's names), or a problem."""
        cols: dict[str, np.ndarray] = {}
        for name in arrow.column_names:
            column = arrow.column(name)
            if column.null_count:
                return f"column {name!r} has {column.null_count} null values"
            if name == "param":
                codes = self._param_codes(column)
                if isinstance(codes, str):
                    return codes
                cols[name] = codes
            else:
                cols[name] = column.to_numpy()
        return cols

    def _param_codes(self, column: pa.ChunkedArray) -> np.ndarray | str:
        """int32 codes into the manifest's names, or a message naming an unknown parameter or a
        corrupt dictionary (pyarrow checks neither dictionary indices nor UTF-8 on read)."""
        pieces = []
        for chunk in column.chunks:
            if not pa.types.is_dictionary(chunk.type):
                chunk = chunk.dictionary_encode()
            try:
                chunk.dictionary.validate(full=True)
            except pa.ArrowException as e:
                return _unreadable(e)
            names = chunk.dictionary.to_pylist()
            unknown = [n for n in names if n not in self.code_of]
            if unknown:
                return f"param {unknown[0]!r} is not in the manifest's model summary"
            indices = chunk.indices.to_numpy()
            if len(indices) and (indices.min() < 0 or indices.max() >= len(names)):
                return _unreadable(f"dictionary index outside [0, {len(names)}) in column 'param'")
            lut = np.array([self.code_of[n] for n in names], dtype=np.int32)
            if np.array_equal(lut, np.arange(len(lut))):  # the writer's dictionary is in manifest order
                pieces.append(indices.astype(np.int32, copy=False))
            else:
                pieces.append(lut[indices] if len(indices) else np.zeros(0, np.int32))
        if len(pieces) == 1:
            return pieces[0]
        return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int32)


def _schema_problem(table: str, schema: pa.Schema) -> str | None:
    expected = TABLE_SCHEMAS[table]
    missing = [n for n in expected.names if n not in schema.names]
    if missing:
        return f"missing column(s) {missing} for table {table!r}"
    unknown = [n for n in schema.names if n not in expected.names]
    if unknown:
        return f"unknown column(s) {unknown} for table {table!r}"
    for f in expected:
        got = schema.field(f.name).type
        if pa.types.is_dictionary(f.type):
            ok = (pa.types.is_dictionary(got) and _is_string(got.value_type)) or _is_string(got)
        else:
            ok = got == f.type
        if not ok:
            return f"column {f.name!r} has type {got}, expected {f.type}"
    return None


def _unreadable(e: BaseException | str) -> str:
    return f"not a readable Parquet file (truncated or corrupt: {' '.join(str(e).split())})"


def _is_string(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _numpy_dtype(t: pa.DataType) -> np.dtype:
    return np.dtype(np.int32) if pa.types.is_dictionary(t) else np.dtype(t.to_pandas_dtype())
