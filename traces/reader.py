"""Reading and validating traces into numpy columns.

:func:`read_trace` checks the manifest, then every part file (name, Parquet footer, columns and
their types, ranks, parameter names, k within [0, numel]) and loads the rows into one numpy array per
column. Part footers are read first so every column is allocated once at its final size; each part
is then read with ``pyarrow.parquet`` and copied in. The ``param`` column is returned as int32 codes
into :attr:`Trace.param_names` (the manifest's registration order), identical across tables.

A bad part raises :class:`~traces.schema.TraceError` naming the file and the problem, or, with
``on_error="skip"``, is left out with a :class:`TraceWarning` and listed in :attr:`Trace.skipped`.
Leftover ``*.tmp`` files (a writer stopped mid-part) are never read; they are listed in ``skipped``.
The manifest itself cannot be skipped: without it nothing can be checked.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from traces.schema import (
    MANIFEST_NAME,
    TABLE_SCHEMAS,
    TABLES,
    Manifest,
    PartName,
    TraceError,
    parse_part_name,
)

__all__ = ["StepTimes", "Trace", "TraceWarning", "read_manifest", "read_trace"]


class TraceWarning(UserWarning):
    """Something in a trace was skipped or is missing, and reading went on."""


def read_manifest(directory: str | Path) -> Manifest:
    """Parse and validate ``directory/manifest.json``; raises TraceError naming the file."""
    path = Path(directory) / MANIFEST_NAME
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise TraceError(f"{path}: missing (is {directory} a trace directory?)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise TraceError(f"{path}: cannot be read ({e})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise TraceError(f"{path}: not valid JSON ({e})") from None
    return Manifest.from_json(data, where=str(path))


@dataclass(frozen=True, kw_only=True, eq=False)
class StepTimes:
    """Per-step phase times and loss, shape (num_steps, num_ranks); NaN where a rank has no row.

    Row i is step ``step[i]``; column j is rank ``ranks[j]``. Times are seconds.
    """

    step: np.ndarray
    ranks: tuple[int, ...]
    forward_s: np.ndarray
    backward_s: np.ndarray
    optimizer_s: np.ndarray
    loss: np.ndarray

    @property
    def compute_s(self) -> np.ndarray:
        """forward + backward + optimizer seconds per (step, rank)."""
        return self.forward_s + self.backward_s + self.optimizer_s


@dataclass(frozen=True, kw_only=True, eq=False)
class Trace:
    """A loaded trace: the manifest and one numpy array per column of each table.

    ``params``, ``steps`` and ``unions`` map column name -> 1-d array (dtypes as in
    :data:`~traces.schema.TABLE_SCHEMAS`, ``param`` as int32 codes into ``param_names``).
    ``skipped`` lists (path, reason) for every file in the directory that was not read.
    """

    directory: Path
    manifest: Manifest
    params: dict[str, np.ndarray]
    steps: dict[str, np.ndarray]
    unions: dict[str, np.ndarray]
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    parts: tuple[Path, ...] = ()

    @property
    def param_names(self) -> tuple[str, ...]:
        """Every parameter of the manifest, in registration order; ``param`` codes index this."""
        return self.manifest.param_names

    @cached_property
    def step_ids(self) -> np.ndarray:
        """Sorted distinct steps that have rows in any table (int64)."""
        return _unique_ints(np.concatenate([self.params["step"], self.steps["step"], self.unions["step"]]))

    @property
    def num_steps(self) -> int:
        return len(self.step_ids)

    @cached_property
    def ranks(self) -> tuple[int, ...]:
        """Sorted ranks that have rows in ``params`` or ``steps``."""
        both = np.concatenate([self.params["rank"], self.steps["rank"]]).astype(np.int64)
        return tuple(int(r) for r in _unique_ints(both))

    def param_strings(self, table: str = "params") -> np.ndarray:
        """The ``param`` column of ``table`` as an array of names (slower than the codes)."""
        return np.asarray(self.param_names, dtype=str)[self._table(table)["param"]]

    def per_param_series(self, column: str, *, table: str = "params") -> dict[str, np.ndarray]:
        """{param name: float64 array over ``step_ids``}: the mean over ranks of ``column``.

        NaN values are ignored in the mean; a step where a parameter has no non-NaN value is NaN.
        Only parameters with at least one row in ``table`` appear.
        """
        data = self._table(table)
        if column not in data or column in ("step", "rank", "param"):
            numeric = [c for c in data if c not in ("step", "rank", "param")]
            raise ValueError(
                f"trace table {table!r} has no value column {column!r} (columns: {', '.join(numeric)})"
            )
        num_params = len(self.param_names)
        codes = data["param"]
        flat = self._step_index(data["step"]) * num_params + codes
        values = data[column].astype(np.float64, copy=False)
        ok = ~np.isnan(values)
        size = self.num_steps * num_params
        sums = np.bincount(flat[ok], weights=values[ok], minlength=size)
        counts = np.bincount(flat[ok], minlength=size)
        with np.errstate(invalid="ignore", divide="ignore"):
            means = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan).reshape(
                self.num_steps, num_params
            )
        present = np.flatnonzero(np.bincount(codes, minlength=num_params))
        return {self.param_names[j]: means[:, j].copy() for j in present}

    def per_rank_matrix(self, column: str, names: tuple[str, ...] | list[str]) -> np.ndarray:
        """float64 array [step, rank, param] of ``column`` of the params table, aligned to
        ``step_ids``, ``ranks`` and ``names`` (NaN where a (step, rank, param) has no row)."""
        data = self.params
        if column not in data or column in ("step", "rank", "param"):
            raise ValueError(f"trace table 'params' has no value column {column!r}")
        code_of = {n: j for j, n in enumerate(self.param_names)}
        missing = [n for n in names if n not in code_of]
        if missing:
            raise ValueError(f"{self.directory}: parameters not in the trace: {missing[:5]}")
        col = np.full(len(self.param_names), -1, dtype=np.int64)
        col[[code_of[n] for n in names]] = np.arange(len(names))
        ranks = np.asarray(self.ranks, dtype=np.int64)
        out = np.full((self.num_steps, len(ranks), len(names)), np.nan)
        c = col[data["param"]]
        keep = c >= 0
        out[self._step_index(data["step"][keep]), np.searchsorted(ranks, data["rank"][keep]), c[keep]] = data[
            column
        ][keep]
        return out

    def union_k_series(self) -> dict[str, np.ndarray]:
        """{param name: union_k over ``step_ids``} (float64, NaN where not recorded).

        A single-rank trace needs no unions table: the union over one rank is its own ``k``.
        Raises TraceError for a multi-rank trace without union rows.
        """
        if len(self.unions["step"]):
            return self.per_param_series("union_k", table="unions")
        if self.manifest.world_size == 1:
            return self.per_param_series("k")
        raise TraceError(
            f"{self.directory}: a world_size={self.manifest.world_size} trace without 'unions' rows; "
            "union_k cannot be derived from per-rank k"
        )

    def step_times(self) -> StepTimes:
        """Phase times and loss per (step, rank), aligned to ``step_ids`` and ``ranks``."""
        s = self.steps
        ranks = self.ranks
        shape = (self.num_steps, len(ranks))
        rank_pos = np.searchsorted(np.asarray(ranks, dtype=np.int64), s["rank"]) if ranks else s["rank"]
        rows = self._step_index(s["step"])
        cols = {}
        for name in ("forward_s", "backward_s", "optimizer_s", "loss"):
            out = np.full(shape, np.nan)
            out[rows, rank_pos] = s[name]
            cols[name] = out
        return StepTimes(step=self.step_ids, ranks=ranks, **cols)

    # ------------------------------------------------------------------------------ workhorses
    def _table(self, table: str) -> dict[str, np.ndarray]:
        if table not in TABLE_SCHEMAS:
            raise ValueError(f"unknown trace table {table!r} (tables: {', '.join(TABLES)})")
        return getattr(self, table)

    def _step_index(self, step: np.ndarray) -> np.ndarray:
        """Position of each value of ``step`` in ``step_ids`` (every value is present)."""
        ids = self.step_ids
        if len(ids) == 0:
            return np.zeros(len(step), dtype=np.int64)
        lo, hi = int(ids[0]), int(ids[-1])
        if hi - lo < 4 * len(ids) + 1_000_000:
            lut = np.zeros(hi - lo + 1, dtype=np.int64)
            lut[ids - lo] = np.arange(len(ids))
            return lut[step - lo]
        return np.searchsorted(ids, step)


def read_trace(
    directory: str | Path, *, on_error: str = "raise", steps: tuple[int, int] | None = None
) -> Trace:
    """Read and validate the trace in ``directory``.

    ``on_error``: ``"raise"`` (a bad part raises TraceError) or ``"skip"`` (it is left out with a
    TraceWarning and listed in ``Trace.skipped``). ``steps``: keep only rows with
    ``start <= step < stop`` (parts whose step statistics lie outside are not read at all).
    Warns (TraceWarning) when a multi-rank trace lacks a rank's rows or a rank's parts have gaps.
    Raises TraceError for a missing directory or a missing or invalid manifest.
    """
    if on_error not in ("raise", "skip"):
        raise ValueError(f"read_trace: on_error must be 'raise' or 'skip', got {on_error!r}")
    if steps is not None and (
        len(steps) != 2 or not all(isinstance(s, (int, np.integer)) for s in steps) or steps[0] > steps[1]
    ):
        raise ValueError(
            f"read_trace: steps must be (start, stop) integers with start <= stop, got {steps!r}"
        )
    directory = Path(directory)
    if not directory.is_dir():
        raise TraceError(f"{directory}: no such trace directory")
    manifest = read_manifest(directory)
    skipped: list[tuple[Path, str]] = []
    notes: list[str] = []  # warnings, issued at the end so they point at the caller

    def bad(path: Path, reason: str) -> None:
        if on_error == "raise":
            raise TraceError(f"{path}: {reason}")
        notes.append(f"{path}: {reason}; skipped")
        skipped.append((path, reason))

    found: list[tuple[PartName, Path]] = []
    unfinished: list[PartName] = []
    for path in sorted(directory.iterdir()):
        name = path.name
        if name == MANIFEST_NAME:
            continue
        if name.endswith(".tmp"):
            skipped.append((path, "leftover temporary file (a writer stopped before finishing it); ignored"))
            tmp_part = parse_part_name(name[1:-4] if name.startswith(".") else name[:-4])
            if tmp_part is not None:
                unfinished.append(tmp_part)
        elif name.endswith(".parquet"):
            part = parse_part_name(name)
            if part is None:
                bad(path, "file name does not follow '{table}-r{rank:03d}-{seq:06d}.parquet'")
            elif part.table not in TABLE_SCHEMAS:
                bad(path, f"unknown table prefix {part.table!r} (tables: {', '.join(TABLES)})")
            elif part.rank >= manifest.world_size:
                bad(path, f"rank {part.rank} is outside the manifest's world_size={manifest.world_size}")
            else:
                found.append((part, path))
        else:
            skipped.append((path, "not a trace file; ignored"))
    found.sort()

    loader = _Loader(manifest=manifest, steps=steps, bad=bad)
    opened = [(part, path, meta) for part, path in found if (meta := loader.open(part, path)) is not None]
    tables: dict[str, dict[str, np.ndarray]] = {}
    read_parts: list[Path] = []
    for table in TABLES:
        mine = [(part, path, meta) for part, path, meta in opened if part.table == table]
        tables[table], paths = loader.load(table, mine)
        read_parts.extend(paths)
    notes.extend(_missing_rows(manifest, loader.ranks_with_rows, [part for part, _ in found] + unfinished))
    for note in notes:
        warnings.warn(note, TraceWarning, stacklevel=2)
    return Trace(
        directory=directory,
        manifest=manifest,
        params=tables["params"],
        steps=tables["steps"],
        unions=tables["unions"],
        skipped=skipped,
        parts=tuple(read_parts),
    )


@dataclass(frozen=True, kw_only=True)
class _PartMeta:
    num_rows: int
    step_min: int | None  # read only when a step window is asked for; None otherwise
    step_max: int | None


class _Loader:
    """Validates parts and copies their rows into preallocated numpy columns."""

    def __init__(self, *, manifest: Manifest, steps: tuple[int, int] | None, bad) -> None:
        self.manifest = manifest
        self.steps = steps
        self.bad = bad
        names = manifest.param_names
        self.code_of = {n: i for i, n in enumerate(names)}
        info = manifest.by_name
        self.numel_of = np.array([info[n].numel for n in names], dtype=np.int64)
        self.ranks_with_rows: dict[str, set[int]] = {t: set() for t in TABLES}

    def open(self, part: PartName, path: Path) -> _PartMeta | None:
        """Read the footer, check the schema; None (after ``bad``) when the part is unusable."""
        try:
            with pq.ParquetFile(path) as pf:
                schema = pf.schema_arrow
                meta = pf.metadata
        except (pa.ArrowException, OSError, UnicodeDecodeError) as e:
            self.bad(path, f"not a readable Parquet file (truncated or corrupt: {_one_line(e)})")
            return None
        problem = _schema_problem(part.table, schema)
        if problem:
            self.bad(path, problem)
            return None
        if meta.num_rows < 0:
            self.bad(path, f"corrupt Parquet footer (row count {meta.num_rows})")
            return None
        lo = hi = None
        if self.steps is not None:  # only a window needs the range; never from row-group metadata,
            # whose accessors abort the process on some corrupt footers (pyarrow 26)
            try:
                step = pq.read_table(path, columns=["step"]).column("step")
            except (pa.ArrowException, OSError, UnicodeDecodeError) as e:
                self.bad(path, f"not a readable Parquet file (truncated or corrupt: {_one_line(e)})")
                return None
            if len(step):
                lo, hi = int(pc.min(step).as_py()), int(pc.max(step).as_py())
        return _PartMeta(num_rows=meta.num_rows, step_min=lo, step_max=hi)

    def load(
        self, table: str, parts: list[tuple[PartName, Path, _PartMeta]]
    ) -> tuple[dict[str, np.ndarray], list[Path]]:
        schema = TABLE_SCHEMAS[table]
        if self.steps is not None:
            a, b = self.steps
            parts = [
                p for p in parts if p[2].step_min is None or not (p[2].step_max < a or p[2].step_min >= b)
            ]
        total = sum(m.num_rows for _, _, m in parts)
        out = {f.name: np.empty(total, dtype=_numpy_dtype(f.type)) for f in schema}
        filled = 0
        read: list[Path] = []
        for part, path, _ in parts:
            cols = self._read_part(part, path)
            if cols is None:
                continue
            n = len(cols["step"])
            for name, arr in cols.items():
                out[name][filled : filled + n] = arr
            filled += n
            read.append(path)
            if n:
                self.ranks_with_rows[table].add(part.rank)
        if filled < total:
            out = {name: arr[:filled].copy() for name, arr in out.items()}
        return out, read

    def _read_part(self, part: PartName, path: Path) -> dict[str, np.ndarray] | None:
        try:
            arrow = pq.read_table(path)
            if "param" in arrow.column_names:  # pyarrow checks neither dictionary indices nor UTF-8 on read
                for chunk in arrow.column("param").chunks:
                    chunk.validate(full=True)
        except (pa.ArrowException, OSError, UnicodeDecodeError, IndexError) as e:
            self.bad(path, f"not a readable Parquet file (truncated or corrupt: {_one_line(e)})")
            return None
        for name in arrow.column_names:
            if arrow.column(name).null_count:
                self.bad(path, f"column {name!r} has {arrow.column(name).null_count} null values")
                return None
        cols: dict[str, np.ndarray] = {}
        for name in arrow.column_names:
            if name == "param":
                codes = self._param_codes(arrow.column(name))
                if isinstance(codes, str):
                    self.bad(path, codes)
                    return None
                cols[name] = codes
            else:
                cols[name] = arrow.column(name).to_numpy()
        if self.steps is not None:
            keep = (cols["step"] >= self.steps[0]) & (cols["step"] < self.steps[1])
            if not keep.all():
                cols = {name: arr[keep] for name, arr in cols.items()}
        problem = self._rows_problem(part, cols)
        if problem:
            self.bad(path, problem)
            return None
        return cols

    def _param_codes(self, column: pa.ChunkedArray) -> np.ndarray | str:
        """int32 codes into the manifest's names, or a message naming an unknown parameter."""
        pieces = []
        for chunk in column.chunks:
            if not pa.types.is_dictionary(chunk.type):
                chunk = chunk.dictionary_encode()
            names = chunk.dictionary.to_pylist()
            unknown = [n for n in names if n not in self.code_of]
            if unknown:
                return f"param {unknown[0]!r} is not in the manifest's model summary"
            lut = np.array([self.code_of[n] for n in names], dtype=np.int32)
            pieces.append(lut[chunk.indices.to_numpy()] if len(names) else np.zeros(0, np.int32))
        return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int32)

    def _rows_problem(self, part: PartName, cols: dict[str, np.ndarray]) -> str | None:
        if not len(cols["step"]):
            return None
        if "rank" in cols and np.any(cols["rank"] != part.rank):
            other = int(cols["rank"][cols["rank"] != part.rank][0])
            return f"rank column holds {other}, but the file name says rank {part.rank}"
        if np.any(cols["step"] < 0):
            return "step column holds negative values"
        if part.table == "params":
            wrong = cols["numel"] != self.numel_of[cols["param"]]
            if np.any(wrong):
                i = int(np.flatnonzero(wrong)[0])
                name = self.manifest.param_names[cols["param"][i]]
                return f"numel={int(cols['numel'][i])} for param {name!r} differs from the manifest's {self.numel_of[cols['param'][i]]}"
            if np.any((cols["k"] < 0) | (cols["k"] > cols["numel"])):
                return "k outside [0, numel]"
        if part.table == "unions" and np.any(cols["union_k"] < 0):
            return "union_k holds negative values"
        return None


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


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


def _is_string(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _numpy_dtype(t: pa.DataType) -> np.dtype:
    return np.dtype(np.int32) if pa.types.is_dictionary(t) else np.dtype(t.to_pandas_dtype())


def _unique_ints(values: np.ndarray) -> np.ndarray:
    """Sorted distinct integers (int64); O(n) via bincount when the range is compact."""
    if not len(values):
        return np.zeros(0, dtype=np.int64)
    values = values.astype(np.int64, copy=False)
    lo, hi = int(values.min()), int(values.max())
    if hi - lo < 4 * len(values) + 1_000_000:
        return np.flatnonzero(np.bincount(values - lo, minlength=hi - lo + 1)) + lo
    return np.unique(values)


def _missing_rows(
    manifest: Manifest, ranks_with_rows: dict[str, set[int]], parts: list[PartName]
) -> list[str]:
    """Messages about ranks without rows and gaps in a rank's part sequence numbers.

    ``parts`` holds every part named in the directory, unfinished (``.tmp``) ones included: a
    number taken by a crashed writer is not a gap.
    """
    notes = []
    if manifest.world_size > 1:
        for table in ("params", "steps"):
            have = ranks_with_rows[table]
            if not have:
                continue
            absent = sorted(set(range(manifest.world_size)) - have)
            if absent:
                notes.append(
                    f"trace with world_size={manifest.world_size}: no {table!r} rows for rank(s) {absent}"
                )
    seqs: dict[tuple[str, int], list[int]] = {}
    for part in parts:
        seqs.setdefault((part.table, part.rank), []).append(part.seq)
    for (table, rank), got in sorted(seqs.items()):
        gaps = sorted(set(range(1, max(got) + 1)) - set(got))
        if gaps:
            notes.append(
                f"{table!r} parts of rank {rank}: sequence number(s) {gaps[:5]} missing (a part was deleted?)"
            )
    return notes
