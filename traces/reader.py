"""Reading and validating traces into numpy columns.

:func:`read_trace` checks the manifest, then every part file (in ``parts/<table>/``, or beside the
manifest in traces written before that layout; a regular file, never a link; name,
Parquet footer, columns and their types, ranks, parameter names) and every row (plausible values,
see :mod:`traces.validate`), loads the rows into one numpy array per column, and checks the rows
across parts: no row twice, every step complete on every rank and table. Part footers are read
first so every column is allocated once at its final size; the parts are then read with
``pyarrow.parquet``, checked and copied in by a few worker threads (:mod:`traces.parts`). The
``param`` column is returned as int32 codes into
:attr:`Trace.param_names` (the manifest's registration order), identical across tables.

A bad part raises :class:`~traces.schema.TraceError` naming the file (and row) and the problem, or,
with ``on_error="skip"``, is left out with a :class:`TraceWarning` and listed in
:attr:`Trace.skipped`. Leftover ``*.tmp`` files (a writer stopped mid-part) are never read; they
are listed in ``skipped``. The manifest itself cannot be skipped: without it nothing can be checked.
An incomplete trace (a recording that crashed) raises, or warns under ``on_error="skip"``, unless
``complete_prefix=True`` asks for the steps before the first incomplete one.
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import warnings
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from traces import validate
from traces.parts import load_table, worker_pool
from traces.schema import (
    MANIFEST_NAME,
    PARTS_DIR,
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
        kind = _not_a_regular_file(os.lstat(path))
    except FileNotFoundError:
        raise TraceError(f"{path}: missing (is {directory} a trace directory?)") from None
    except OSError as e:
        raise TraceError(f"{path}: cannot be read ({e})") from None
    if kind:
        raise TraceError(f"{path}: {kind}")
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
    ``incomplete``: why the steps on disk are not complete on every rank and table (None when they
    are); ``truncated_at``: with ``complete_prefix=True``, the first incomplete step — its rows and
    every later step's were left out (None when nothing was).
    """

    directory: Path
    manifest: Manifest
    params: dict[str, np.ndarray]
    steps: dict[str, np.ndarray]
    unions: dict[str, np.ndarray]
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    parts: tuple[Path, ...] = ()
    incomplete: str | None = None
    truncated_at: int | None = None

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
    directory: str | Path,
    *,
    on_error: str = "raise",
    steps: tuple[int, int] | None = None,
    complete_prefix: bool = False,
) -> Trace:
    """Read and validate the trace in ``directory``.

    ``on_error``: ``"raise"`` (a bad part raises TraceError) or ``"skip"`` (it is left out with a
    TraceWarning and listed in ``Trace.skipped``). ``steps``: keep only rows with
    ``start <= step < stop`` (parts whose step statistics lie outside are not read at all).
    An incomplete trace — a step that lacks a rank's ``params`` rows or ``steps`` row, or its
    ``unions`` rows — raises TraceError (a TraceWarning under ``"skip"``; ``Trace.incomplete`` says
    why); ``complete_prefix=True`` instead keeps the steps before the first incomplete one
    (``Trace.truncated_at``). Warns (TraceWarning) when a rank's parts have gaps.
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
    if not isinstance(complete_prefix, bool):
        raise ValueError(f"read_trace: complete_prefix must be True or False, got {complete_prefix!r}")
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

    found, unfinished = _scan(directory, manifest, skipped, bad)
    tables: dict[str, dict[str, np.ndarray]] = {}
    spans: dict[str, list[validate.Span]] = {}
    pool = worker_pool()
    try:
        for table in TABLES:
            mine = [(part, path) for part, path in found if part.table == table]
            tables[table], spans[table] = load_table(
                table, mine, manifest=manifest, steps=steps, bad=bad, pool=pool
            )
            doubled = validate.duplicate_rows(table, tables[table], spans[table], names=manifest.param_names)
            for i, message in doubled:
                bad(spans[table][i].path, message.removeprefix(f"{spans[table][i].path}: "))
            if doubled:
                tables[table], spans[table] = _drop_spans(
                    tables[table], spans[table], {i for i, _ in doubled}
                )
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    state = validate.completeness(tables, spans, world_size=manifest.world_size, directory=directory)
    step_ids, truncated_at = state.step_ids, None
    if state.problem is not None:
        if complete_prefix:
            truncated_at = state.stop
            step_ids = step_ids[step_ids < truncated_at]
            tables = {t: _rows_before(cols, truncated_at) for t, cols in tables.items()}
        elif on_error == "raise":
            raise TraceError(state.problem)
        else:
            notes.append(state.problem)
    notes.extend(_sequence_gaps([part for part, _ in found] + unfinished))
    for note in notes:
        warnings.warn(note, TraceWarning, stacklevel=2)
    trace = Trace(
        directory=directory,
        manifest=manifest,
        params=tables["params"],
        steps=tables["steps"],
        unions=tables["unions"],
        skipped=skipped,
        parts=tuple(s.path for t in TABLES for s in spans[t]),
        incomplete=state.problem,
        truncated_at=truncated_at,
    )
    trace.__dict__["step_ids"] = step_ids  # the cached_property's value, known already
    return trace


def _scan(directory: Path, manifest: Manifest, skipped: list, bad) -> tuple[list, list]:
    """The part files to read, sorted, and the parts named by leftover ``.tmp`` files.

    Parts are read from ``parts/<table>/`` and, for traces written before that layout, from the
    directory itself. Only regular files and real folders are ever opened: a link (which would read
    a part twice) or a FIFO, socket or device named like a part is ``bad``, and so is a link in
    place of a folder; anything else that is not a part is listed in ``skipped``.
    """
    found: list[tuple[PartName, Path]] = []
    unfinished: list[PartName] = []
    for name in sorted(os.listdir(directory)):
        path = directory / name
        if name == MANIFEST_NAME:
            continue
        if name == PARTS_DIR:
            for table, folder in _table_folders(path, bad):
                for entry in sorted(os.listdir(folder)):
                    _scan_file(folder / entry, table, manifest, found, unfinished, skipped, bad)
            continue
        _scan_file(path, None, manifest, found, unfinished, skipped, bad)
    found.sort()
    return found, unfinished


def _table_folders(parts: Path, bad) -> list[tuple[str, Path]]:
    """(table, folder) of every table folder under ``parts/``; anything else there is ``bad``."""
    kind = _not_a_folder(parts)
    if kind:
        bad(parts, kind)
        return []
    folders = []
    for name in sorted(os.listdir(parts)):
        path = parts / name
        kind = _not_a_folder(path)
        if kind:
            bad(path, kind if name in TABLE_SCHEMAS else f"{kind}; {PARTS_DIR}/ holds one folder per table")
        elif name not in TABLE_SCHEMAS:
            bad(path, f"unknown table folder {name!r} (tables: {', '.join(TABLES)})")
        else:
            folders.append((name, path))
    return folders


def _scan_file(
    path: Path, table: str | None, manifest: Manifest, found: list, unfinished: list, skipped: list, bad
) -> None:
    """Sort one directory entry into ``found``, ``unfinished``, ``skipped`` or ``bad``.

    ``table``: the table folder it is in (None: the trace directory itself, the old layout).
    """
    name = path.name
    if name.endswith(".tmp"):
        skipped.append((path, "leftover temporary file (a writer stopped before finishing it); ignored"))
        tmp_part = parse_part_name(name[1:-4] if name.startswith(".") else name[:-4])
        if tmp_part is not None:
            unfinished.append(tmp_part)
    elif name.endswith(".parquet"):
        part = parse_part_name(name)
        try:
            kind = _not_a_regular_file(os.lstat(path))
        except OSError as e:
            kind = f"cannot be read ({e})"
        if kind:
            bad(path, kind)
        elif part is None:
            bad(path, "file name does not follow '{table}-r{rank:03d}-{seq:06d}.parquet'")
        elif part.table not in TABLE_SCHEMAS:
            bad(path, f"unknown table prefix {part.table!r} (tables: {', '.join(TABLES)})")
        elif table is not None and part.table != table:
            bad(path, f"a {part.table!r} part in the {table!r} table folder")
        elif part.rank >= manifest.world_size:
            bad(path, f"rank {part.rank} is outside the manifest's world_size={manifest.world_size}")
        else:
            found.append((part, path))
    else:
        skipped.append((path, "not a trace file; ignored"))


def _not_a_folder(path: Path) -> str | None:
    try:
        st = os.lstat(path)
    except OSError as e:
        return f"cannot be read ({e})"
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link; trace folders must be real folders (a linked folder could be read twice)"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a folder"
    return None


def _not_a_regular_file(st: os.stat_result) -> str | None:
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link; trace files must be regular files (a linked part would be read twice)"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file (a directory, FIFO, socket or device); it was not opened"
    return None


def _drop_spans(
    cols: dict[str, np.ndarray], spans: list[validate.Span], drop: set[int]
) -> tuple[dict[str, np.ndarray], list[validate.Span]]:
    """The rows of every span but those in ``drop``, with the spans renumbered."""
    keep = np.ones(len(cols["step"]), dtype=bool)
    kept: list[validate.Span] = []
    start = 0
    for i, s in enumerate(spans):
        if i in drop:
            keep[s.start : s.stop] = False
            continue
        kept.append(dataclasses.replace(s, start=start, stop=start + s.stop - s.start))
        start += s.stop - s.start
    return {c: a[keep] for c, a in cols.items()}, kept


def _rows_before(cols: dict[str, np.ndarray], stop: int) -> dict[str, np.ndarray]:
    keep = cols["step"] < stop
    return cols if keep.all() else {c: a[keep] for c, a in cols.items()}


def _unique_ints(values: np.ndarray) -> np.ndarray:
    """Sorted distinct integers (int64); O(n) via bincount when the range is compact."""
    if not len(values):
        return np.zeros(0, dtype=np.int64)
    values = values.astype(np.int64, copy=False)
    lo, hi = int(values.min()), int(values.max())
    if hi - lo < 4 * len(values) + 1_000_000:
        return np.flatnonzero(np.bincount(values - lo, minlength=hi - lo + 1)) + lo
    return np.unique(values)


def _sequence_gaps(parts: list[PartName]) -> list[str]:
    """Messages about gaps in a rank's part sequence numbers.

    ``parts`` holds every part named in the directory, unfinished (``.tmp``) ones included: a
    number taken by a crashed writer is not a gap.
    """
    notes = []
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
