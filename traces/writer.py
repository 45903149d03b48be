"""Writing traces: buffered rows, atomic part files committed at step boundaries, an atomic manifest.

One :class:`TraceWriter` per rank. Rows are buffered as numpy arrays and written as Parquet parts
only at a *commit*: every buffered row of every table at once, the ``params`` and ``unions`` parts
first and the ``steps`` part last, so a ``steps`` row on disk says that its step's other rows are on
disk too. A ``steps`` row ends a step; after it the writer commits when ``commit_every_steps``
steps or ``commit_every_s`` seconds have passed since the last commit, or a table holds
``rows_per_part`` rows — so a crash loses at most that interval, and never a part of a step
(:meth:`TraceWriter.commit`, :meth:`TraceWriter.close` commit too). A writer that is given no
``steps`` rows has no step boundaries and writes at ``commit``/``close`` only.

Parts go to ``DIR/parts/<table>/`` (one Parquet dataset per table). Each part is written under a
hidden temporary name in that folder, synced to disk and renamed into place with ``os.replace``; a
reader ignores (and reports) a leftover ``.tmp`` file. A writer opened on a directory that already
holds parts (in either layout, see :mod:`traces.schema`) continues their sequence numbers instead
of overwriting them.

Example::

    with TraceWriter(directory, rank=0) as w:
        w.add_param_rows(step=[0, 0], param=["a.weight", "b.weight"], numel=[6, 4], k=[1, 1], ...)
        w.add_step_row(step=0, forward_s=0.1, backward_s=0.2, optimizer_s=0.01, loss=2.3)
    write_manifest(directory, manifest)
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from traces.schema import MANIFEST_NAME, PARTS_DIR, TABLE_SCHEMAS, Manifest, PartName, parse_part_name

__all__ = ["TraceWriter", "write_manifest"]

_COMPRESSION = "zstd"
# a commit writes the steps part last: a steps row on disk means its step's other rows are there too
_COMMIT_ORDER = ("params", "unions", "steps")
assert sorted(_COMMIT_ORDER) == sorted(TABLE_SCHEMAS)


def write_manifest(directory: str | Path, manifest: Manifest) -> Path:
    """Write ``manifest.json`` into ``directory`` atomically (temporary file + rename); returns its path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / MANIFEST_NAME
    text = json.dumps(manifest.to_json(), indent=2, allow_nan=False) + "\n"
    _atomic_write(path, lambda f: f.write(text.encode()))
    return path


class TraceWriter:
    """Buffers one rank's rows and commits them as atomic Parquet parts at step boundaries.

    ``add_*_rows`` take one keyword per column (numpy arrays or lists of equal length);
    ``add_*_row`` take one scalar per column. The ``rank`` column is optional and defaults to the
    writer's rank; when given it must equal it. ``param`` values are strings (parameter names).
    Bad input (unknown or missing column, unequal lengths, wrong dtype, k outside [0, numel]) raises
    ValueError naming the table and column, before anything is buffered.

    - ``rows_per_part``: at most this many rows per part; a commit splits a longer table.
    - ``commit_every_steps`` / ``commit_every_s``: commit after a ``steps`` row once that many
      steps rows / seconds have passed since the last commit (None: no such trigger). A commit is
      also due once a table holds ``rows_per_part`` rows.
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        rank: int,
        rows_per_part: int = 200_000,
        commit_every_steps: int | None = 100,
        commit_every_s: float | None = 30.0,
    ) -> None:
        if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
            raise ValueError(f"TraceWriter: rank must be an integer >= 0, got {rank!r}")
        if not isinstance(rows_per_part, int) or rows_per_part < 1:
            raise ValueError(f"TraceWriter: rows_per_part must be an integer >= 1, got {rows_per_part!r}")
        if commit_every_steps is not None and (
            not isinstance(commit_every_steps, int)
            or isinstance(commit_every_steps, bool)
            or commit_every_steps < 1
        ):
            raise ValueError(
                f"TraceWriter: commit_every_steps must be an integer >= 1 or None, got {commit_every_steps!r}"
            )
        if commit_every_s is not None and not (
            isinstance(commit_every_s, (int, float)) and math.isfinite(commit_every_s) and commit_every_s > 0
        ):
            raise ValueError(
                f"TraceWriter: commit_every_s must be a number > 0 or None, got {commit_every_s!r}"
            )
        self.directory = Path(directory)
        self.rank = rank
        self.rows_per_part = rows_per_part
        self.commit_every_steps = commit_every_steps
        self.commit_every_s = None if commit_every_s is None else float(commit_every_s)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.parts_written: list[Path] = []
        self._closed = False
        self._chunks: dict[str, list[dict[str, np.ndarray]]] = {t: [] for t in TABLE_SCHEMAS}
        self._num_buffered: dict[str, int] = dict.fromkeys(TABLE_SCHEMAS, 0)
        self._next_seq: dict[str, int] = dict.fromkeys(TABLE_SCHEMAS, 1)
        self._steps_since_commit = 0
        self._last_commit_s = time.monotonic()
        for name in _names_taken(self.directory):
            if name.startswith(".") and name.endswith(".tmp"):
                name = name[1:-4]
            part = parse_part_name(name)
            if part is not None and part.rank == rank and part.table in self._next_seq:
                self._next_seq[part.table] = max(self._next_seq[part.table], part.seq + 1)

    # ------------------------------------------------------------------------------- adding rows
    def add_param_rows(self, **columns: Any) -> None:
        """Buffer rows of the ``params`` table (see :mod:`traces.schema` for the columns)."""
        self._add("params", columns)

    def add_param_row(self, **values: Any) -> None:
        self._add("params", {k: [v] for k, v in values.items()})

    def add_step_rows(self, **columns: Any) -> None:
        """Buffer rows of the ``steps`` table; they end their steps (a commit may follow)."""
        self._add("steps", columns)

    def add_step_row(self, **values: Any) -> None:
        self._add("steps", {k: [v] for k, v in values.items()})

    def add_union_rows(self, **columns: Any) -> None:
        """Buffer rows of the ``unions`` table (one writer per trace writes them, usually rank 0)."""
        self._add("unions", columns)

    def add_union_row(self, **values: Any) -> None:
        self._add("unions", {k: [v] for k, v in values.items()})

    # ---------------------------------------------------------------------------------- writing
    def commit(self) -> list[Path]:
        """Write every buffered row now (params and unions parts, then steps); returns the parts written."""
        self._check_open()
        written = []
        for table in _COMMIT_ORDER:
            while self._num_buffered[table]:
                n = min(self.rows_per_part, self._num_buffered[table])
                written.append(self._write_part(table, self._take(table, n)))
        self._steps_since_commit = 0
        self._last_commit_s = time.monotonic()
        return written

    def flush(self) -> list[Path]:
        """The same as :meth:`commit`."""
        return self.commit()

    def close(self) -> None:
        """Commit and close; further calls to add rows raise ValueError. Closing twice is a no-op."""
        if not self._closed:
            self.commit()
            self._closed = True

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        # Rows added before an exception are complete rows: keep them.
        self.close()

    # ------------------------------------------------------------------------------ workhorses
    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"TraceWriter for {self.directory} (rank {self.rank}) is closed")

    def _add(self, table: str, columns: Mapping[str, Any]) -> None:
        self._check_open()
        chunk = _coerce_columns(table, columns, rank=self.rank)
        n = len(chunk["step"])
        if n == 0:
            return
        self._chunks[table].append(chunk)
        self._num_buffered[table] += n
        if table == "steps":
            self._steps_since_commit += n
            if self._commit_due():
                self.commit()

    def _commit_due(self) -> bool:
        """At a step boundary: has the commit interval passed, or does a table fill a part?"""
        if self.commit_every_steps is not None and self._steps_since_commit >= self.commit_every_steps:
            return True
        if self.commit_every_s is not None and time.monotonic() - self._last_commit_s >= self.commit_every_s:
            return True
        return any(n >= self.rows_per_part for n in self._num_buffered.values())

    def _take(self, table: str, n: int) -> dict[str, np.ndarray]:
        """Remove and return the first ``n`` buffered rows of ``table`` as one column dict."""
        chunks = self._chunks[table]
        names = chunks[0].keys()
        merged = {
            c: np.concatenate([ch[c] for ch in chunks]) if len(chunks) > 1 else chunks[0][c] for c in names
        }
        total = self._num_buffered[table]
        self._chunks[table] = [] if n == total else [{c: a[n:] for c, a in merged.items()}]
        self._num_buffered[table] = total - n
        return {c: a[:n] for c, a in merged.items()}

    def _write_part(self, table: str, columns: dict[str, np.ndarray]) -> Path:
        schema = TABLE_SCHEMAS[table]
        arrays = []
        for f in schema:
            values = columns[f.name]
            if pa.types.is_dictionary(f.type):
                arrays.append(pa.array(values, type=pa.string()).dictionary_encode())
            else:
                arrays.append(pa.array(values, type=f.type))
        arrow_table = pa.Table.from_arrays(arrays, schema=schema)
        part = PartName(table=table, rank=self.rank, seq=self._next_seq[table])
        self._next_seq[table] += 1
        path = part.path_in(self.directory)
        path.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write(
            path, lambda f: pq.write_table(arrow_table, f, compression=_COMPRESSION), tmp_name=part.tmp_name
        )
        self.parts_written.append(path)
        return path


def _names_taken(directory: Path) -> list[str]:
    """File names in ``directory`` and in its ``parts/<table>/`` folders (the old and new layouts)."""
    names = [entry.name for entry in directory.iterdir()]
    for table in TABLE_SCHEMAS:
        folder = directory / PARTS_DIR / table
        if folder.is_dir():
            names.extend(entry.name for entry in folder.iterdir())
    return names


def _coerce_columns(table: str, columns: Mapping[str, Any], *, rank: int) -> dict[str, np.ndarray]:
    """Validate one batch of rows and convert each column to its numpy dtype."""
    schema = TABLE_SCHEMAS[table]
    expected = set(schema.names)
    unknown = sorted(set(columns) - expected)
    if unknown:
        raise ValueError(
            f"trace table {table!r}: unknown column(s) {unknown} (columns: {', '.join(schema.names)})"
        )
    missing = sorted(expected - set(columns) - {"rank"})
    if missing:
        raise ValueError(f"trace table {table!r}: missing column(s) {missing}")
    out: dict[str, np.ndarray] = {}
    for f in schema:
        if f.name not in columns:
            continue
        out[f.name] = _coerce(table, f.name, f.type, columns[f.name])
    lengths = {c: len(a) for c, a in out.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"trace table {table!r}: columns have different lengths {lengths}")
    n = next(iter(lengths.values()))
    if "rank" in expected:
        if "rank" in out and n and np.any(out["rank"] != rank):
            bad = int(out["rank"][out["rank"] != rank][0])
            raise ValueError(
                f"trace table {table!r}: rank column holds {bad}, but this writer is rank {rank}"
            )
        out["rank"] = np.full(n, rank, dtype=np.int32)
    if n and np.any(out["step"] < 0):
        raise ValueError(f"trace table {table!r}: step must be >= 0")
    if table == "params" and n:
        if np.any(out["numel"] < 0):
            raise ValueError("trace table 'params': numel must be >= 0")
        bad_k = (out["k"] < 0) | (out["k"] > out["numel"])
        if np.any(bad_k):
            i = int(np.flatnonzero(bad_k)[0])
            raise ValueError(
                f"trace table 'params': k={int(out['k'][i])} is outside [0, numel={int(out['numel'][i])}] "
                f"for param {out['param'][i]!r} at step {int(out['step'][i])}"
            )
    if table == "unions" and n and np.any(out["union_k"] < 0):
        raise ValueError("trace table 'unions': union_k must be >= 0")
    return out


def _coerce(table: str, column: str, arrow_type: pa.DataType, values: Any) -> np.ndarray:
    where = f"trace table {table!r}, column {column!r}"
    if pa.types.is_dictionary(arrow_type):
        arr = np.asarray(values)
        if arr.ndim != 1:
            raise ValueError(f"{where}: expected a 1-d sequence of strings, got shape {arr.shape}")
        if arr.dtype.kind == "O" and all(isinstance(v, str) for v in arr):
            return arr.astype(str)
        if arr.dtype.kind != "U" and arr.size:
            raise ValueError(f"{where}: expected parameter names (str), got dtype {arr.dtype}")
        return arr.astype(str)
    target = np.dtype(arrow_type.to_pandas_dtype())
    try:
        arr = np.asarray(values)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: cannot convert to an array ({e})") from None
    if arr.ndim != 1:
        raise ValueError(f"{where}: expected a 1-d sequence, got shape {arr.shape}")
    allowed = "biu" if target.kind == "i" else "biuf"
    if arr.size and arr.dtype.kind not in allowed:
        raise ValueError(f"{where}: expected {target} values, got dtype {arr.dtype}")
    if target.kind == "i" and arr.size and arr.dtype.kind == "u" and int(arr.max()) > np.iinfo(target).max:
        raise ValueError(f"{where}: values overflow {target}")
    if target.kind == "i" and arr.size and arr.dtype.kind == "i" and arr.dtype.itemsize > target.itemsize:
        info = np.iinfo(target)
        if int(arr.min()) < info.min or int(arr.max()) > info.max:
            raise ValueError(f"{where}: values overflow {target}")
    return arr.astype(target, copy=False)


def _atomic_write(path: Path, write: Any, *, tmp_name: str | None = None) -> None:
    """Write via ``write(binary_file)`` to a hidden temporary sibling, fsync, then rename onto ``path``."""
    tmp = path.with_name(tmp_name or f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
