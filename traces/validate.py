"""What a trace's rows must satisfy beyond their types: plausible values, no duplicates, completeness.

The reader (:mod:`traces.reader`) calls these on numpy columns; each problem is a one-line message
that starts with the offending file's path (see :class:`~traces.schema.TraceError`).

- :func:`part_problem` — one part's rows: ``step >= 0``; ``rank`` as in the file name; ``numel``
  as in the manifest; ``0 <= k <= numel``; norms >= 0 with ``sel_max_abs <= sel_norm <= grad_norm``
  up to a relative :data:`~traces.schema.NORM_RTOL` (NaN norms pass: a diverged step is real data);
  ``overlap`` in [0, 1] or NaN; ``ready_s`` finite and >= 0 or NaN; phase times finite and >= 0;
  ``0 <= union_k <= numel``.
- :func:`duplicate_rows` — a (step, rank, param) row of ``params``, (step, rank) of ``steps`` or
  (step, param) of ``unions`` that appears twice (a copied part, a hard link, a re-run writer).
- :func:`completeness` — the steps that are not complete on every rank and table: a step is
  complete when every rank of ``world_size`` has ``params`` rows and a ``steps`` row of it, and it
  has ``unions`` rows when the trace has any. A crash leaves incomplete steps at the end (ranks
  with different step counts; ``params`` rows whose ``steps`` row was never committed).

Parts summarised by :func:`summarize` (rows sorted by (step, param) within a part, as every writer
here writes them) are checked for duplicates without sorting anything; other parts are sorted.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from traces.schema import NORM_RTOL

__all__ = ["Completeness", "Span", "completeness", "duplicate_rows", "part_problem", "summarize"]

_CODE_SPAN = 2**31  # param codes are int32: (step, code) as step * _CODE_SPAN + code
_MAX_FAST_STEP = 2**31  # above this, step * _CODE_SPAN may overflow: the sortedness shortcut is skipped


# ------------------------------------------------------------------------------ one part's values
def part_problem(
    table: str, cols: dict[str, np.ndarray], *, rank: int, numel_of: np.ndarray, names: Sequence[str]
) -> str | None:
    """``"row i: ... (step s, param p)"`` for the first implausible row of one part, else None.

    Fast when every row is plausible: one or two reductions per check; rows are looked up only
    once a check fails.
    """
    step = cols["step"]
    if not len(step):
        return None

    def row(mask: np.ndarray, why: Callable[[int], str]) -> str:
        i = int(np.flatnonzero(mask)[0])
        where = f"step {int(step[i])}" + (f", param {names[cols['param'][i]]!r}" if "param" in cols else "")
        return f"row {i}: {why(i)} ({where})"

    if step.min() < 0:
        return row(step < 0, lambda i: "step is negative")
    r = cols.get("rank")
    if r is not None and (r.min() != rank or r.max() != rank):
        return row(r != rank, lambda i: f"rank column holds {int(r[i])}, but the file name says rank {rank}")
    if table == "steps":
        for name in ("forward_s", "backward_s", "optimizer_s"):
            x = cols[name]
            if not (x.min() >= 0.0 and x.max() < np.inf):  # NaN fails both
                return row(~((x >= 0.0) & (x < np.inf)), _value(name, x, "is not a time (finite, >= 0)"))
        return None
    numel = numel_of[cols["param"]]  # the manifest's
    if table == "unions":
        u = cols["union_k"]
        if u.min() < 0 or np.any(u > numel):
            return row(
                (u < 0) | (u > numel), lambda i: f"union_k={int(u[i])} outside [0, numel={int(numel[i])}]"
            )
        return None
    return _params_problem(cols, numel=numel, row=row)


def _params_problem(cols: dict[str, np.ndarray], *, numel: np.ndarray, row) -> str | None:
    got, k = cols["numel"], cols["k"]
    if np.any(got != numel):
        return row(got != numel, lambda i: f"numel={int(got[i])} differs from the manifest's {int(numel[i])}")
    if k.min() < 0 or np.any(k > numel):
        return row((k < 0) | (k > numel), lambda i: f"k={int(k[i])} outside [0, numel={int(numel[i])}]")
    for name in ("grad_norm", "sel_norm", "sel_max_abs"):  # NaN passes: a diverged step is real data
        x = cols[name]
        if np.fmin.reduce(x) < 0.0:
            return row(x < 0.0, _value(name, x, "is negative"))
    for small, big in (("sel_norm", "grad_norm"), ("sel_max_abs", "sel_norm")):
        limit = cols[big] * (1.0 + NORM_RTOL)
        if np.any(cols[small] > limit):
            return row(cols[small] > limit, _value(small, cols[small], "exceeds", big, cols[big]))
    x = cols["overlap"]
    if np.fmin.reduce(x) < 0.0 or np.fmax.reduce(x) > 1.0:
        return row((x < 0.0) | (x > 1.0), _value("overlap", x, "outside [0, 1]"))
    x = cols["ready_s"]
    if np.fmin.reduce(x) < 0.0 or np.fmax.reduce(x) == np.inf:
        return row((x < 0.0) | (x == np.inf), _value("ready_s", x, "is not a time (finite, >= 0, or NaN)"))
    return None


def _value(name: str, x: np.ndarray, what: str, other: str = "", y: np.ndarray | None = None):
    """``i -> "name=x[i] what[ other=y[i]]"``."""
    return lambda i: f"{name}={float(x[i])!r} {what}" + (f" {other}={float(y[i])!r}" if y is not None else "")


# ------------------------------------------------------------------------------ part summaries
@dataclass(frozen=True, kw_only=True, eq=False)
class Span:
    """Rows ``[start, stop)`` of a table's loaded arrays came from the part at ``path``.

    ``rows``: each loaded row's row number in the file (None: every row, in order). ``ordered``:
    (step, param) strictly increasing; ``first`` / ``last``: (step, param code) of the first and
    last row; ``steps``: the distinct steps of the rows, sorted.
    """

    path: Path
    rank: int
    start: int
    stop: int
    rows: np.ndarray | None
    ordered: bool
    first: tuple[int, int]
    last: tuple[int, int]
    steps: np.ndarray

    def file_row(self, i: int) -> int:
        """The row number in the file of loaded row ``i`` (an index into the table's arrays)."""
        return int(self.rows[i - self.start]) if self.rows is not None else i - self.start


def summarize(
    cols: dict[str, np.ndarray], *, path: Path, rank: int, start: int, rows: np.ndarray | None
) -> Span:
    """The :class:`Span` of one part's (windowed) rows, loaded at ``start``."""
    step = cols["step"]
    code = cols.get("param")
    n = len(step)
    if n == 0:
        empty = np.zeros(0, dtype=np.int64)
        return Span(path=path, rank=rank, start=start, stop=start, rows=rows, ordered=True,
                    first=(0, 0), last=(0, 0), steps=empty)  # fmt: skip
    ds = np.diff(step)
    lowest = ds.min() if n > 1 else 1
    monotone = lowest >= 0
    if not monotone:
        ordered = False
    elif code is None:
        ordered = lowest > 0
    elif n < 2 or step[-1] > _MAX_FAST_STEP:
        ordered = n < 2
    else:  # (step, code) as one key; codes are < len(names) <= 2**31
        key = step * _CODE_SPAN
        key += code
        ordered = np.diff(key).min() > 0
    steps = step[np.concatenate(([0], np.flatnonzero(ds) + 1))] if monotone else np.unique(step)
    c0, c1 = (int(code[0]), int(code[-1])) if code is not None else (0, 0)
    return Span(path=path, rank=rank, start=start, stop=start + n, rows=rows, ordered=bool(ordered),
                first=(int(step[0]), c0), last=(int(step[-1]), c1), steps=steps.astype(np.int64))  # fmt: skip


# ------------------------------------------------------------------------------ duplicates
def duplicate_rows(
    table: str, cols: dict[str, np.ndarray], spans: list[Span], *, names: Sequence[str]
) -> list[tuple[int, str]]:
    """``[(span index, message)]``: every span holding a row that an earlier row already holds.

    A row's identity is (step, rank, param) in ``params``, (step, rank) in ``steps`` and
    (step, param) in ``unions``; "earlier" is the load order (parts sorted by rank, then sequence
    number), so a copy is blamed, not its original. The message names the first such row.
    """
    per_rank = table != "unions"
    filled = [s for s in spans if s.stop > s.start]
    if all(s.ordered for s in filled) and all(
        (per_rank and a.rank != b.rank) or b.first > a.last for a, b in itertools.pairwise(filled)
    ):
        return []
    step = cols["step"]
    if not len(step):
        return []
    ids, inverse = np.unique(step, return_inverse=True)
    key = inverse.astype(np.int64)
    if per_rank:
        key = cols["rank"].astype(np.int64) * len(ids) + key
    if "param" in cols:
        key = key * max(len(names), 1) + cols["param"]
    order = np.argsort(key, kind="stable")
    ordered_keys = key[order]
    repeat = np.flatnonzero(ordered_keys[1:] == ordered_keys[:-1]) + 1
    if not len(repeat):
        return []
    run_start = np.flatnonzero(np.concatenate(([True], ordered_keys[1:] != ordered_keys[:-1])))
    first_of = order[run_start[np.searchsorted(run_start, repeat, side="right") - 1]]
    later = order[repeat]
    starts = np.array([s.start for s in spans])
    span_of = np.searchsorted(starts, later, side="right") - 1
    out: dict[int, str] = {}
    for j in np.argsort(later, kind="stable"):
        si = int(span_of[j])
        if si in out:
            continue
        i, i0 = int(later[j]), int(first_of[j])
        s0 = spans[int(np.searchsorted(starts, i0, side="right") - 1)]
        what = f"step {int(step[i])}" + (f", rank {spans[si].rank}" if per_rank else "")
        if "param" in cols:
            what += f", param {names[cols['param'][i]]!r}"
        out[si] = (
            f"{spans[si].path}: row {spans[si].file_row(i)}: duplicates row {s0.file_row(i0)} of "
            f"{s0.path.name} ({what}; a copied part?)"
        )
    return sorted(out.items())


# ------------------------------------------------------------------------------ completeness
@dataclass(frozen=True, kw_only=True)
class Completeness:
    """``step_ids``: every step with rows in any table, sorted. ``stop``: the first step that is
    not complete (None: all are); the complete prefix is ``step_ids < stop``. ``problem``: a
    one-line message (None when complete)."""

    step_ids: np.ndarray
    stop: int | None = None
    problem: str | None = None


def completeness(
    tables: dict[str, dict[str, np.ndarray]],
    spans: dict[str, list[Span]],
    *,
    world_size: int,
    directory: Path,
) -> Completeness:
    """Which steps are complete on every rank and table (see the module docstring).

    The message describes the *latest* incomplete step (a corrupt step number is larger than the
    real ones more often than not, so the file it names is the damaged one) and states the
    complete prefix. Per rank: a ``steps`` row without ``params`` rows, ``params`` rows without a
    ``steps`` row (each naming its part and row), no rows at all for a step other ranks have
    (naming the directory); ``unions`` rows of a step no rank has, or a step without ``unions``.
    """
    pairs = {t: _pairs(spans[t]) for t in ("params", "steps", "unions")}

    def locate(table: str, step: int, rank: int | None) -> str:
        return _locate(tables[table]["step"], spans[table], step, rank)

    ids = np.unique(np.concatenate([pairs[t][0] for t in pairs]))
    if not len(ids):
        return Completeness(step_ids=ids)
    W = world_size
    have: dict[str, np.ndarray] = {}
    for t in ("params", "steps"):
        step, rank = pairs[t]
        m = np.zeros((len(ids), W), dtype=bool)
        m[np.searchsorted(ids, step), rank] = True
        have[t] = m
    has_unions = np.zeros(len(ids), dtype=bool)
    has_unions[np.searchsorted(ids, pairs["unions"][0])] = True
    any_unions = bool(has_unions.any())
    ok = have["params"].all(axis=1) & have["steps"].all(axis=1) & (has_unions | (not any_unions))
    if ok.all():
        return Completeness(step_ids=ids)
    bad = np.flatnonzero(~ok)
    first, i = int(ids[bad[0]]), int(bad[-1])
    s = int(ids[i])
    p, t = have["params"][i], have["steps"][i]
    if np.any(t & ~p):
        r = int(np.flatnonzero(t & ~p)[0])
        what = f"{locate('steps', s, r)}: step {s} of rank {r} has a steps row but no params rows"
    elif np.any(p & ~t):
        r = int(np.flatnonzero(p & ~t)[0])
        none = "" if have["steps"].any() else " (the trace has no 'steps' rows at all)"
        what = f"{locate('params', s, r)}: step {s} of rank {r} has params rows but no steps row{none}"
    elif has_unions[i] and not (p.any() or t.any()):
        what = f"{locate('unions', s, None)}: step {s} has unions rows but no rank has rows of it"
    elif not p.all():
        missing = np.flatnonzero(~p).tolist()
        what = f"{directory}: rank(s) {missing} have no rows of step {s} (world_size={W})"
    else:
        what = f"{directory}: step {s} has no unions rows (other steps have)"
    counts = ", ".join(str(int(have["steps"][:, r].sum())) for r in range(W))
    prefix = ids[ids < first]
    if len(prefix):
        kept = (
            f"its complete prefix, steps {int(prefix[0])}..{int(prefix[-1])} ({len(prefix)} steps), is read by "
            "complete_prefix=True (igsim profile/simulate --complete-prefix)"
        )
    else:
        kept = f"it has no complete prefix (its first step, {first}, is incomplete)"
    problem = (
        f"{what}; incomplete trace: {len(bad)} of {len(ids)} steps are not complete on every rank and "
        f"table (steps rows per rank: {counts}); {kept}"
    )
    return Completeness(step_ids=ids, stop=first, problem=problem)


def _pairs(spans: list[Span]) -> tuple[np.ndarray, np.ndarray]:
    """(step, rank) of every distinct (step, rank) the spans hold."""
    if not spans:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    step = np.concatenate([s.steps for s in spans])
    rank = np.concatenate([np.full(len(s.steps), s.rank, dtype=np.int64) for s in spans])
    return step, rank


def _locate(step_column: np.ndarray, spans: list[Span], step: int, rank: int | None) -> str:
    """``"PATH: row i"`` of the first row of ``step`` (on ``rank``) among ``spans``."""
    for s in spans:
        if rank is not None and s.rank != rank:
            continue
        hit = np.flatnonzero(step_column[s.start : s.stop] == step)
        if len(hit):
            return f"{s.path}: row {s.file_row(s.start + int(hit[0]))}"
    raise AssertionError(f"step {step} of rank {rank} is in no span")
