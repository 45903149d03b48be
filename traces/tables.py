"""A validated trace as one pyarrow dataset per table, for pandas, pyarrow, DuckDB and friends.

:func:`open_trace` (``traces.open``) runs every check of :func:`traces.read_trace` on the directory —
the same refusals (links, FIFOs, bad parts, duplicates, incomplete steps unless
``complete_prefix=True``) and the same ``on_error="skip"`` — then returns :class:`TraceTables`: a
``pyarrow.dataset.Dataset`` per table over exactly the part files the reader accepted, filtered to
the rows it kept (the step window, the complete prefix). Nothing is loaded until a dataset is
scanned; ``param`` comes back as a dictionary column (a pandas ``category`` of parameter names).

Example::

    t = traces.open("traces/samples/minilm")
    t.steps.to_table(columns=["step", "rank", "loss"])      # a pyarrow.Table
    df = t.to_pandas("params")                               # a pandas.DataFrame (needs pandas)
    t["unions"].count_rows()

Opening reads the trace once to validate it (as fast as :func:`traces.read_trace`; the loaded
columns are then dropped), so a scan afterwards reads the files a second time.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds

from traces.reader import read_trace
from traces.schema import TABLE_SCHEMAS, TABLES, Manifest, TraceError, parse_part_name

__all__ = ["TraceTables", "open_trace"]


@dataclass(frozen=True, kw_only=True, eq=False)
class TraceTables:
    """The tables of a validated trace: ``params``, ``steps``, ``unions`` (``pyarrow.dataset.Dataset``).

    ``t.steps`` and ``t["steps"]`` are the same dataset; :meth:`to_pandas` reads one into a
    DataFrame. ``skipped``, ``incomplete`` and ``truncated_at`` are the reader's
    (:class:`traces.Trace`): the files left out, why the trace is incomplete (None when it is
    complete), and the first step left out by ``complete_prefix=True``.
    """

    directory: Path
    manifest: Manifest
    params: ds.Dataset
    steps: ds.Dataset
    unions: ds.Dataset
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    incomplete: str | None = None
    truncated_at: int | None = None

    def __getitem__(self, table: str) -> ds.Dataset:
        if table not in TABLE_SCHEMAS:
            raise ValueError(f"unknown trace table {table!r} (tables: {', '.join(TABLES)})")
        return getattr(self, table)

    def to_table(self, table: str, *, columns: list[str] | None = None) -> pa.Table:
        """Table ``table`` (or only ``columns`` of it) as one ``pyarrow.Table``."""
        return self[table].to_table(columns=columns)

    def to_pandas(self, table: str, *, columns: list[str] | None = None) -> Any:
        """Table ``table`` (or only ``columns`` of it) as a ``pandas.DataFrame``; needs pandas."""
        dataset = self[table]
        if importlib.util.find_spec("pandas") is None:
            raise ModuleNotFoundError("TraceTables.to_pandas needs pandas (pip install pandas)")
        return dataset.to_table(columns=columns).to_pandas()


def open_trace(
    directory: str | Path,
    *,
    on_error: str = "raise",
    steps: tuple[int, int] | None = None,
    complete_prefix: bool = False,
) -> TraceTables:
    """Validate the trace in ``directory`` and return its tables as pyarrow datasets.

    The arguments, the checks and the errors (TraceError naming the file, TraceWarning under
    ``on_error="skip"``) are those of :func:`traces.read_trace`, which this calls. Each dataset
    holds exactly the rows ``read_trace`` returns for the same arguments.
    """
    trace = read_trace(directory, on_error=on_error, steps=steps, complete_prefix=complete_prefix)
    files: dict[str, list[str]] = {t: [] for t in TABLES}
    for path in trace.parts:
        files[parse_part_name(path.name).table].append(str(path))
    keep = _row_filter(steps, trace.truncated_at)
    datasets = {}
    for table in TABLES:
        dataset = ds.dataset(files[table], schema=TABLE_SCHEMAS[table], format="parquet")
        if keep is not None:
            dataset = dataset.filter(keep)
        expected = len(getattr(trace, table)["step"])
        if dataset.count_rows() != expected:  # a part changed between the checks and now
            raise TraceError(
                f"{trace.directory}: the {table!r} parts hold {dataset.count_rows()} rows now but "
                f"{expected} when they were checked (is the trace still being written?)"
            )
        datasets[table] = dataset
    return TraceTables(
        directory=trace.directory,
        manifest=trace.manifest,
        **datasets,
        skipped=trace.skipped,
        incomplete=trace.incomplete,
        truncated_at=trace.truncated_at,
    )


def _row_filter(steps: tuple[int, int] | None, truncated_at: int | None) -> ds.Expression | None:
    """The rows ``read_trace`` kept: ``start <= step < stop`` and ``step < truncated_at``."""
    step = ds.field("step")
    terms = []
    if steps is not None:
        terms += [step >= int(steps[0]), step < int(steps[1])]
    if truncated_at is not None:
        terms.append(step < int(truncated_at))
    if not terms:
        return None
    keep = terms[0]
    for term in terms[1:]:
        keep = keep & term
    return keep
