"""What one training step costs before any communication: parameters, readiness, compute phases.

A :class:`Workload` holds, per recorded step ``t`` and parameter ``i``, when the gradient became ready
(``ready_s[t, i]``, seconds since backward start) and how many entries the sparsifier selected
(``k[t, i]``, or ``k is None`` for nominal sizes), plus the forward / backward / optimizer times of the
step. Simulated step ``s`` uses recorded step ``s % num_recorded_steps`` (the recording cycles).

Workloads come from a recorded trace (:meth:`Workload.from_trace`, means over ranks) or from a model
architecture (:func:`igsim.step.architectures.architecture_workload`). :class:`Jitter` makes ranks differ:
each rank's compute times are scaled by a seeded per-(step, rank) factor.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from igpolicy.vocab import ParamInfo

__all__ = ["Jitter", "Workload"]


@dataclass(frozen=True, kw_only=True, eq=False)
class Workload:
    """Per-step compute and gradient readiness of one model, without communication.

    - ``params``: the model's parameters in registration order (their ``order`` fields).
    - ``ready_s``: float array [T, P], seconds since backward start at which parameter i's gradient
      is ready in recorded step t (clipped to ``[0, backward_s[t]]`` when used).
    - ``k``: int array [T, P] of entries the sparsifier selected (mean over ranks, rounded), or None
      to use nominal sizes. ``k_density`` is the density those counts were recorded at; the engine
      uses them only when the simulated density equals it.
    - ``k_by_rank``: int array [T, R, P] of the entries each rank *sent* in a run of its own
      (``igrt train --record-trace``; 0 where a parameter held), or None. The engine uses them,
      one row per rank, when it simulates R ranks: a replay of that run.
    - ``forward_s`` / ``backward_s`` / ``optimizer_s``: float arrays [T], seconds (summed over the
      step's micro-batches).
    - ``phases_by_rank``: float array [T, R, 3] of each rank's own forward / backward / optimizer
      seconds in a run of its own, or None. With ``k_by_rank`` (a replay) the engine runs every rank
      on its own times: the ranks reach each collective when they do, the last one gates it, and
      the early ones wait (as they did in the run).
    - ``local_s_by_rank``: float array [T, R] of each rank's CPU work around its collectives that is
      neither compute nor communication (the Synchronizer's selection, packing, decisions and
      scatter: the runtime's ``sync_s - comm_s``; under ``ddp-hook`` the hooks' selection), or None
      (0). An input like compute: a replay takes it from the run's metrics. The engine puts it
      between backward and the first collective (``ddp-hook``: each bucket's share before its launch).
    - ``combine_s_by_rank``: float array [T, R, J] of each rank's CPU seconds after its i-th issued
      collective of step t ended, turning what arrived into the averaged gradient (the runtime's
      ``combine_s`` per op in ``ops.csv``: decode, index-add of every rank's pairs, divide; 0-padded
      to the most ops of any step), or None (0). Also an input: the engine adds it, rank by rank,
      after each op's network time (the next op's wire time is not delayed: it is already in flight).
    - ``finalize_s_by_rank``: float array [T, R] of each rank's seconds after its communication
      and backward's own work both ended until its backward returned (``ddp-hook``: DDP writing
      the buckets back into the gradients and waking, plus any wait for a core; the runtime's
      ``finalize_s``), or None (0). An input too: the engine adds it before the optimizer.
    - ``grad_accum_steps``: A micro-batches per step; ``ready_s`` is then measured from the start of
      the last backward pass, the only one that communicates (see :meth:`ready_since_backward`).
    - ``source``: where it came from (informational).
    """

    name: str
    params: tuple[ParamInfo, ...]
    ready_s: np.ndarray
    forward_s: np.ndarray
    backward_s: np.ndarray
    optimizer_s: np.ndarray
    k: np.ndarray | None = None
    k_density: float | None = None
    k_by_rank: np.ndarray | None = None
    phases_by_rank: np.ndarray | None = None
    local_s_by_rank: np.ndarray | None = None
    combine_s_by_rank: np.ndarray | None = None
    finalize_s_by_rank: np.ndarray | None = None
    grad_accum_steps: int = 1
    source: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        P = len(self.params)
        if P == 0:
            raise ValueError(f"workload {self.name!r}: no parameters")
        ready = np.asarray(self.ready_s, dtype=np.float64)
        if ready.ndim != 2 or ready.shape[1] != P or ready.shape[0] < 1:
            raise ValueError(
                f"workload {self.name!r}: ready_s must have shape [T>=1, {P}], got {ready.shape}"
            )
        T = ready.shape[0]
        object.__setattr__(self, "ready_s", ready)
        for name in ("forward_s", "backward_s", "optimizer_s"):
            arr = np.asarray(getattr(self, name), dtype=np.float64).reshape(-1)
            if arr.shape != (T,):
                raise ValueError(f"workload {self.name!r}: {name} must have shape [{T}], got {arr.shape}")
            if not np.all(np.isfinite(arr)) or np.any(arr < 0):
                raise ValueError(f"workload {self.name!r}: {name} must be finite and >= 0")
            object.__setattr__(self, name, arr)
        if not np.all(np.isfinite(ready)) or np.any(ready < 0):
            raise ValueError(f"workload {self.name!r}: ready_s must be finite and >= 0")
        if self.k is not None:
            k = np.asarray(self.k)
            if k.shape != (T, P):
                raise ValueError(f"workload {self.name!r}: k must have shape [{T}, {P}], got {k.shape}")
            if not np.all(np.isfinite(k)) or np.any(k < 0):
                raise ValueError(f"workload {self.name!r}: k must be finite and >= 0")
            numel = np.array([p.numel for p in self.params], dtype=np.int64)
            object.__setattr__(self, "k", np.minimum(np.rint(k).astype(np.int64), numel[None, :]))
        if self.k_by_rank is not None:
            kr = np.asarray(self.k_by_rank)
            if kr.ndim != 3 or kr.shape[0] != T or kr.shape[2] != P or np.any(kr < 0):
                raise ValueError(f"workload {self.name!r}: k_by_rank must be [{T}, R, {P}] counts >= 0, got {kr.shape}")
            object.__setattr__(self, "k_by_rank", kr.astype(np.int64))
        for name, tail in (("phases_by_rank", (3,)), ("local_s_by_rank", ()), ("finalize_s_by_rank", ()),
                          ("combine_s_by_rank", None)):  # fmt: skip
            arr = getattr(self, name)
            if arr is None:
                continue
            arr = np.asarray(arr, dtype=np.float64)
            if tail is None:  # [T, R, J]: any number of ops
                tail = arr.shape[2:] if arr.ndim == 3 else ("J",)
            if arr.ndim != 2 + len(tail) or arr.shape[0] != T or arr.shape[2:] != tail:
                shape = ", ".join([str(T), "R", *map(str, tail)])
                raise ValueError(f"workload {self.name!r}: {name} must have shape [{shape}], got {arr.shape}")
            if not np.all(np.isfinite(arr)) or np.any(arr < 0):
                raise ValueError(f"workload {self.name!r}: {name} must be finite and >= 0")
            object.__setattr__(self, name, arr)
        if int(self.grad_accum_steps) < 1:
            raise ValueError(f"workload {self.name!r}: grad_accum_steps must be >= 1")
        names = [p.name for p in self.params]
        if len(set(names)) != P:
            raise ValueError(f"workload {self.name!r}: duplicate parameter names")

    @property
    def num_recorded_steps(self) -> int:
        return int(self.ready_s.shape[0])

    @property
    def num_params(self) -> int:
        return len(self.params)

    @property
    def numel(self) -> np.ndarray:
        """Elements per parameter, int64 [P]."""
        return np.array([p.numel for p in self.params], dtype=np.int64)

    def ready_since_backward(self, rec: int) -> np.ndarray:
        """Readiness of recorded step ``rec``, seconds since the step's backward phase began, [P].

        With A micro-batches of equal cost the last backward pass starts ``b · (A-1)/A`` into the
        backward phase and lasts ``b / A``; ``ready_s`` is clipped to that pass.
        """
        b = float(self.backward_s[rec])
        last = b / int(self.grad_accum_steps)
        return (b - last) + np.minimum(self.ready_s[rec], last)

    def recorded_index(self, step: int) -> int:
        """The recorded step that simulated ``step`` replays (the recording cycles)."""
        return int(step) % self.num_recorded_steps

    @classmethod
    def from_trace(
        cls,
        directory: str | Path,
        *,
        window: tuple[int, int] | None = None,
        name: str | None = None,
        per_rank_k: bool = False,
        complete_prefix: bool = False,
    ) -> Workload:
        """Read a recorded trace: means over ranks of ``ready_s``, ``k`` and the phase times.

        A training run's own trace (``igrt train --record-trace``, ``manifest.extra["k"] == "sent"``)
        holds what each rank sent, 0 where a parameter held: its ``k`` is not a selection at the
        recorded density, so ``k`` is left None (nominal sizes) unless ``per_rank_k``, which puts
        each rank's counts in ``k_by_rank`` and each rank's own phase times in ``phases_by_rank``
        (a replay of that run).

        ``window=(a, b)`` keeps recorded steps a <= step < b. Steps where a parameter has no row
        (NaN mean) take that parameter's mean over the other steps; parameters with no row at all
        (never had a gradient) are left out and listed in ``source["params_without_rows"]``.
        An incomplete trace (a recording that stopped mid-way) is refused unless ``complete_prefix``:
        then the steps before its first incomplete one are read (``source["truncated_at"]`` is that
        step; None for a complete trace), as ``traces.reader.read_trace(complete_prefix=True)``.
        Raises ValueError (the reader's TraceError) for a missing or malformed trace.
        """
        from traces.reader import read_trace  # imported here so igsim starts fast
        from traces.schema import RUN_TRACE_K

        if window is not None and (len(window) != 2 or window[0] >= window[1]):
            raise ValueError(f"{directory}: window must be (start, stop) with start < stop, got {window!r}")
        steps = None if window is None else (int(window[0]), int(window[1]))
        trace = read_trace(directory, steps=steps, complete_prefix=complete_prefix)
        if trace.num_steps == 0 and trace.truncated_at is not None:
            raise ValueError(f"{directory}: no step is complete on every rank ({trace.incomplete})")
        if trace.num_steps == 0:
            raise ValueError(
                f"{directory}: the trace holds no steps" + (f" in window {window}" if window else "")
            )
        manifest = trace.manifest
        ready_series = trace.per_param_series("ready_s")
        every = sorted(manifest.params, key=lambda p: p.order)
        params = tuple(p for p in every if p.name in ready_series)
        if not params:
            raise ValueError(f"{directory}: the trace has no parameter rows")
        dropped = [p.name for p in every if p.name not in ready_series]
        names = [p.name for p in params]
        ready = _series_matrix(ready_series, names, what="ready_s", where=directory)
        sent = manifest.extra.get("k") == RUN_TRACE_K
        k = None if sent else _series_matrix(trace.per_param_series("k"), names, what="k", where=directory)
        k_by_rank = np.nan_to_num(trace.per_rank_matrix("k", names), nan=0.0) if per_rank_k else None
        times = trace.step_times()
        fwd, bwd, opt = _phase_times(times, ready.shape[0])
        phases = _phases_by_rank(times, (fwd, bwd, opt)) if per_rank_k else None
        return cls(
            name=name or manifest.workload or Path(directory).name,
            params=params,
            ready_s=ready,
            k=k,
            k_density=None if sent else float(manifest.density),
            k_by_rank=k_by_rank,
            phases_by_rank=phases,
            grad_accum_steps=int(manifest.grad_accum_steps),
            forward_s=fwd,
            backward_s=bwd,
            optimizer_s=opt,
            source={
                "trace": str(directory),
                "sparsifier": manifest.sparsifier,
                "recorded_world_size": manifest.world_size,
                "recorded_steps": [int(trace.step_ids[0]), int(trace.step_ids[-1])],
                "window": list(window) if window else None,
                "params_without_rows": dropped,
                "truncated_at": trace.truncated_at,
            },
        )


def _series_matrix(series: dict, names: Sequence[str], *, what: str, where: object) -> np.ndarray:
    """Stack {param: array[T]} into [T, P] in ``names`` order; NaN steps take the column mean."""
    missing = [n for n in names if n not in series]
    if missing:
        raise ValueError(f"{where}: trace has no {what!r} rows for parameters {missing[:5]}")
    mat = np.stack([np.asarray(series[n], dtype=np.float64) for n in names], axis=1)
    if np.isnan(mat).any():
        col_mean = np.nanmean(np.where(np.isnan(mat).all(axis=0, keepdims=True), 0.0, mat), axis=0)
        mat = np.where(np.isnan(mat), col_mean[None, :], mat)
    return mat


def _phase_times(times: Any, T: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Forward / backward / optimizer seconds per recorded step (means over ranks), each [T].

    Steps without a ``steps`` row take the mean of the other steps (0 when there is none).
    """
    out = []
    for col in ("forward_s", "backward_s", "optimizer_s"):
        arr = np.asarray(getattr(times, col), dtype=np.float64)
        if arr.ndim == 2:
            with np.errstate(all="ignore"):
                arr = np.nanmean(arr, axis=1) if arr.shape[1] else np.full(arr.shape[0], np.nan)
        if arr.shape[0] != T:
            raise ValueError(f"trace: {col} covers {arr.shape[0]} steps, the params table {T}")
        fill = float(np.nanmean(arr)) if np.isfinite(arr).any() else 0.0
        out.append(np.maximum(np.where(np.isfinite(arr), arr, fill), 0.0))
    return out[0], out[1], out[2]


def _phases_by_rank(times: Any, means: tuple[np.ndarray, ...]) -> np.ndarray:
    """[T, R, 3] forward / backward / optimizer seconds per rank; a missing value takes the step's
    mean over ranks (``means``)."""
    cols = []
    for col, mean in zip(("forward_s", "backward_s", "optimizer_s"), means):
        arr = np.asarray(getattr(times, col), dtype=np.float64)
        arr = arr.reshape(arr.shape[0], -1)
        cols.append(np.maximum(np.where(np.isfinite(arr), arr, mean[:, None]), 0.0))
    return np.stack(cols, axis=2)


@dataclass(frozen=True, kw_only=True)
class Jitter:
    """Per-rank compute variation, seeded: rank r's compute in step t is scaled by ``factor[t, r]``.

    ``factor = noise · (straggler_slowdown if r == straggler_rank else 1)``, where ``noise`` is
    lognormal with mean 1 and coefficient of variation ``compute_cv`` (1 when 0). The draws for step
    t depend only on (``seed``, t), so results do not depend on how many steps are simulated.
    """

    seed: int = 0
    compute_cv: float = 0.0
    straggler_rank: int | None = None
    straggler_slowdown: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.compute_cv) and self.compute_cv >= 0):
            raise ValueError(f"jitter: compute_cv={self.compute_cv!r} must be finite and >= 0")
        if not (math.isfinite(self.straggler_slowdown) and self.straggler_slowdown > 0):
            raise ValueError(f"jitter: straggler_slowdown={self.straggler_slowdown!r} must be > 0")
        if self.straggler_rank is not None and self.straggler_rank < 0:
            raise ValueError(f"jitter: straggler_rank={self.straggler_rank!r} must be >= 0")

    @property
    def is_identity(self) -> bool:
        """True when every rank computes exactly the nominal times (ranks stay symmetric)."""
        return self.compute_cv == 0 and (self.straggler_rank is None or self.straggler_slowdown == 1.0)

    def factors(self, *, step: int, num_ranks: int) -> np.ndarray:
        """Compute-time scale per rank for ``step``: float64 [num_ranks], all > 0."""
        out = np.ones(num_ranks, dtype=np.float64)
        if self.compute_cv > 0:
            sigma2 = math.log1p(self.compute_cv**2)
            rng = np.random.default_rng([int(self.seed), int(step)])
            out = rng.lognormal(mean=-sigma2 / 2, sigma=math.sqrt(sigma2), size=num_ranks)
        if self.straggler_rank is not None:
            if self.straggler_rank >= num_ranks:
                raise ValueError(f"jitter: straggler_rank={self.straggler_rank} but only {num_ranks} ranks")
            out[self.straggler_rank] *= self.straggler_slowdown
        return out
