"""Online profiling: a sparse run profiles itself over a sliding window and re-plans, every rank alike.

Offline, ``igrt record`` writes a dense trace and ``igsim profile`` turns it into a SyncPlan. Online,
each rank measures the same per-parameter statistics on its raw local gradient at the steps of a
sliding window (:meth:`OnlineSchedule.observes`), sums them per component (:func:`component_rows`,
the aggregation rule of :func:`igpolicy.importance.component_stats_from_params`), and every
``every`` steps the ranks all-reduce one flat float64 vector of those rows (:meth:`StatsWindow.vector`,
:func:`stats_vector_bytes` bytes per rank). The new plan is :func:`online_plan` of the reduced vector
alone: the project's own scoring and threshold (:func:`igpolicy.profile.profile`), so it is the
same on every rank; it applies from the next step.

The schedule, with window W and period P: the re-plan boundaries are the steps ``b`` with
``b % P == 0`` and ``b >= W``; the plan of boundary ``b`` is profiled on steps ``b - W .. b - 1`` and
used from step ``b`` on. Before the first boundary the run follows the start plan: the given offline
plan, or :func:`start_plan` (every component pinned: every component sends every step, a warm-up).

Per component and window step, the row holds five sums over the component's parameters on one rank
(:data:`STAT_FIELDS`): squared selected norms, squared gradient norms, selected entries, and the
numerator and denominator of the k-weighted Jaccard overlap. Reduced over ranks and divided by the
world size: ``sel_norm = sqrt(mean_r Σ_p sel²)`` (the offline profile takes the mean over ranks of
each parameter's norm first; the two agree when ranks agree), ``selected = mean_r Σ_p k``,
``overlap = Σ_r Σ_p k·J / Σ_r Σ_p k`` (NaN where no parameter's Jaccard is defined).

A row is marked observed by a trailing count: a window with a step that some rank did not observe
(a resume at another world size) reduces to a non-zero missing count, and every rank skips that
re-plan alike (:func:`window_complete`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from igpolicy.importance import ComponentStats, ImportanceConfig, ImportanceScores
from igpolicy.limits import MAX_RELEASE_PERIOD
from igpolicy.plan import ComponentPlan, SyncPlan
from igpolicy.profile import profile
from igpolicy.step_plan import OpBytes
from igpolicy.thresholds import ThresholdResult
from igpolicy.vocab import ComponentClass

__all__ = [
    "AGREE_PARTS",
    "AGREE_WIDTH",
    "STAT_FIELDS",
    "STAT_VALUE_BYTES",
    "OnlineSchedule",
    "StatsWindow",
    "component_rows",
    "important_jaccard",
    "important_set",
    "online_plan",
    "replan_op_bytes",
    "start_plan",
    "stats_from_vector",
    "stats_vector_bytes",
    "window_complete",
]

STAT_FIELDS = ("sel_sq", "grad_sq", "selected", "overlap_num", "overlap_den")
STAT_VALUE_BYTES = 8  # the reduced vector is float64
MAX_ONLINE_WINDOW = MAX_RELEASE_PERIOD  # a window longer than this is a typo, not a plan
_F = len(STAT_FIELDS)


def stats_vector_bytes(*, num_components: int, window: int) -> int:
    """Bytes per rank of one re-plan's all-reduce: W rows × C components × 5 float64, plus the
    float64 count of missing rows. The runtime counts them as the step's metadata bytes.

    >>> stats_vector_bytes(num_components=10, window=4)
    1608
    """
    return STAT_VALUE_BYTES * (int(window) * int(num_components) * _F + 1)


#: the agreement check after a re-plan: these parts, each padded to AGREE_WIDTH characters, all-gathered
AGREE_PARTS = ("online_plan", "online_step")
AGREE_WIDTH = 16


def replan_op_bytes(*, num_components: int, window: int, world_size: int) -> tuple[OpBytes, ...]:
    """The collectives of one re-plan, per rank, in order: the window vector's all-reduce
    (:func:`stats_vector_bytes`), then — on more than one rank — the agreement check's all-gather of
    :data:`AGREE_PARTS` (skipped, with the re-plan, when the window was incomplete). Counted as
    metadata; the runtime's tally and the simulator both add exactly these.

    >>> [b.wire_size_bytes for b in replan_op_bytes(num_components=10, window=4, world_size=2)]
    [1608, 32]
    """
    n = stats_vector_bytes(num_components=num_components, window=window)
    out = [OpBytes(metadata_bytes=n, wire_size_bytes=n)]
    if world_size > 1:
        a = AGREE_WIDTH * len(AGREE_PARTS)
        out.append(OpBytes(metadata_bytes=a, wire_size_bytes=a))
    return tuple(out)


@dataclass(frozen=True, kw_only=True)
class OnlineSchedule:
    """When a run observes statistics and re-plans: window W >= 1 steps, period P >= 1 steps."""

    window: int
    every: int

    def __post_init__(self) -> None:
        for name in ("window", "every"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"online schedule: {name}={v!r} must be an integer >= 1")
        if self.window > MAX_ONLINE_WINDOW:
            raise ValueError(f"online schedule: window={self.window} is above {MAX_ONLINE_WINDOW:,}")

    @property
    def first_boundary(self) -> int:
        """The first re-plan boundary: the smallest multiple of P that is >= W."""
        return -(-self.window // self.every) * self.every

    def next_boundary(self, step: int) -> int:
        """The first boundary after ``step`` (the step the window holding ``step`` ends before)."""
        b = (int(step) // self.every + 1) * self.every
        return max(b, self.first_boundary)

    def observes(self, step: int) -> bool:
        """True when ``step`` lies in the window of its next boundary (``b - W <= step``)."""
        return int(step) >= self.next_boundary(step) - self.window

    def replans_after(self, step: int) -> bool:
        """True when a re-plan follows ``step`` (``step + 1`` is a boundary)."""
        b = int(step) + 1
        return b % self.every == 0 and b >= self.window


def component_rows(
    params: Mapping[str, tuple[float, float, float, float]],
    *,
    param_component: Mapping[str, str],
    keys: Sequence[str],
) -> np.ndarray:
    """One rank's [C, 5] row of :data:`STAT_FIELDS` from per-parameter ``(sel_norm, grad_norm, k,
    jaccard)`` (jaccard NaN when undefined), summed per component of ``keys`` (the rule of
    :func:`igpolicy.importance.component_stats_from_params`). Every parameter must be named."""
    col = {k: i for i, k in enumerate(keys)}
    missing = sorted(set(param_component) - set(params))
    if missing:
        raise ValueError(f"online stats: no statistics for parameters {missing[:5]}")
    out = np.zeros((len(keys), _F), dtype=np.float64)
    for name, (sel, grad, k, jac) in params.items():
        c = col[param_component[name]]
        out[c, 0] += float(sel) ** 2
        out[c, 1] += float(grad) ** 2
        out[c, 2] += float(k)
        if not math.isnan(jac):
            out[c, 3] += float(k) * float(jac)
            out[c, 4] += float(k)
    return out


class StatsWindow:
    """One rank's ring of the last W component rows, keyed by step (caller-owned mutable state)."""

    def __init__(self, *, keys: Sequence[str], window: int) -> None:
        self.keys = tuple(keys)
        self.window = int(window)
        self.rows = np.zeros((self.window, len(self.keys), _F), dtype=np.float64)
        self.steps = np.full(self.window, -1, dtype=np.int64)

    def add(self, step: int, row: np.ndarray) -> None:
        row = np.asarray(row, dtype=np.float64)
        if row.shape != (len(self.keys), _F) or not np.all(np.isfinite(row)):
            raise ValueError(f"online stats: step {step}: a row must be {len(self.keys)}x{_F} finite numbers")
        slot = int(step) % self.window
        self.rows[slot] = row
        self.steps[slot] = int(step)

    def vector(self, boundary: int) -> np.ndarray:
        """The flat float64 vector of steps ``boundary - W .. boundary - 1`` in step order, then the
        count of those steps this rank did not observe (their rows are zeros)."""
        out = np.zeros((self.window, len(self.keys), _F), dtype=np.float64)
        missing = 0
        for i, step in enumerate(range(int(boundary) - self.window, int(boundary))):
            slot = step % self.window
            if self.steps[slot] == step:
                out[i] = self.rows[slot]
            else:
                missing += 1
        return np.concatenate([out.reshape(-1), [float(missing)]])

    def clear(self) -> None:
        self.rows[:] = 0.0
        self.steps[:] = -1

    def state_dict(self) -> dict[str, Any]:
        """Plain lists (a checkpoint loads them with ``torch.load(weights_only=True)``)."""
        return {"keys": list(self.keys), "rows": self.rows.tolist(), "steps": self.steps.tolist()}

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        if list(sd.get("keys", [])) != list(self.keys):
            raise ValueError("online stats: the saved window is of other components")
        rows = np.asarray(sd["rows"], dtype=np.float64)
        steps = np.asarray(sd["steps"], dtype=np.int64)
        if rows.shape != self.rows.shape or steps.shape != self.steps.shape:
            raise ValueError(
                f"online stats: the saved window holds {rows.shape[0]} steps, this run's {self.window}"
            )
        self.rows, self.steps = rows, steps


def window_complete(reduced: np.ndarray) -> bool:
    """True when no rank missed a step of the window (the reduced vector's trailing count is 0)."""
    return float(reduced[-1]) == 0.0


def stats_from_vector(
    reduced: np.ndarray, *, keys: Sequence[str], numel: Sequence[int], window: int, world_size: int
) -> ComponentStats:
    """The per-component :class:`ComponentStats` of a reduced (summed over ranks) window vector."""
    C, W, P = len(keys), int(window), int(world_size)
    v = np.asarray(reduced, dtype=np.float64)
    if v.shape != (W * C * _F + 1,):
        raise ValueError(f"online stats: the reduced vector has {v.size} values, expected {W * C * _F + 1}")
    a = v[:-1].reshape(W, C, _F) / P
    den = a[..., 4]
    with np.errstate(invalid="ignore", divide="ignore"):
        overlap = np.where(den > 0, np.clip(a[..., 3] / np.where(den > 0, den, 1.0), 0.0, 1.0), np.nan)
    return ComponentStats(
        keys=tuple(keys),
        sel_norm=np.sqrt(np.maximum(a[..., 0], 0.0)),
        numel=np.asarray(numel, dtype=np.int64),
        overlap=overlap,
        grad_norm=np.sqrt(np.maximum(a[..., 1], 0.0)),
        selected=np.maximum(a[..., 2], 0.0),
    )


def online_plan(
    *,
    reduced: np.ndarray,
    keys: Sequence[str],
    numel: Sequence[int],
    expected_bytes: Mapping[str, int],
    release_period: int,
    window: int,
    world_size: int,
    boundary: int,
    method: str = "knee",
    method_params: Mapping[str, Any] | None = None,
    importance: ImportanceConfig | None = None,
    pinned: Iterable[str] = (),
    max_share: float | None = None,
) -> tuple[SyncPlan, ImportanceScores, ThresholdResult]:
    """The plan of re-plan ``boundary`` from the reduced window vector (a pure function of it, so
    every rank gets the same plan): :func:`stats_from_vector`, then :func:`igpolicy.profile.profile`
    with ``igsim profile``'s defaults (``max_share``: its bytes cap, ``PolicyConfig.max_share``). Its
    ``source`` says ``online`` and the window profiled."""
    stats = stats_from_vector(reduced, keys=keys, numel=numel, window=window, world_size=world_size)
    return profile(
        stats=stats,
        expected_bytes=dict(expected_bytes),
        release_period=int(release_period),
        importance=importance,
        method=method,
        method_params=dict(method_params) if method_params else None,
        pinned=pinned,
        max_share=max_share,
        source={
            "online": True,
            "window": [int(boundary) - int(window), int(boundary)],
            "applies_from_step": int(boundary),
            "world_size": int(world_size),
        },
    )


def start_plan(*, expected_bytes: Mapping[str, int], release_period: int) -> SyncPlan:
    """The plan before the first re-plan: every component pinned (sent every step, a warm-up).
    A function of the component keys and bytes only, so every rank builds the same one."""
    comps = tuple(
        ComponentPlan(key=k, score=0.0, cls=ComponentClass.PINNED, expected_bytes=int(expected_bytes[k]))
        for k in sorted(expected_bytes)
    )
    return SyncPlan(
        release_period=int(release_period),
        components=comps,
        settings={"online_start": "every component sends every step until the first re-plan"},
        source={"online": True, "window": None, "applies_from_step": 0},
    )


def important_set(plan: SyncPlan) -> frozenset[str]:
    """The components the profiler classified important (pinned ones left out: they are so by rule)."""
    return frozenset(c.key for c in plan.components if c.cls == ComponentClass.IMPORTANT)


def important_jaccard(a: SyncPlan, b: SyncPlan) -> float:
    """|A ∩ B| / |A ∪ B| of two plans' :func:`important_set` (1.0 when both are empty)."""
    x, y = important_set(a), important_set(b)
    union = x | y
    return 1.0 if not union else len(x & y) / len(union)
