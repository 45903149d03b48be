"""From a recorded trace to a SyncPlan: the offline profiling pipeline shared by ``igsim profile``,
``igrt bench`` and the experiments (traces may import igpolicy; neither igsim nor igrt may import
the other, so the pipeline lives with the format it reads).

Read the trace (optionally a step window) -> per-parameter series, means over ranks (sel_norm, overlap,
k, grad_norm) -> per-component statistics -> importance scores -> adaptive threshold -> plan. A
component's expected bytes per release are its nominal k pairs times 8 bytes (int32 index + fp32 value),
at the trace's density unless ``density`` is given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from igpolicy.components import mark_fresh
from igpolicy.decide import nominal_k
from igpolicy.importance import ImportanceConfig, ImportanceScores, component_stats_from_params
from igpolicy.plan import SyncPlan
from igpolicy.profile import profile
from igpolicy.thresholds import ThresholdResult
from traces.reader import read_trace

__all__ = ["PAIR_BYTES", "profile_trace"]

PAIR_BYTES = 8  # int32 index + fp32 value


def profile_trace(
    trace_dir: str | Path,
    *,
    method: str = "knee",
    method_params: Mapping[str, Any] | None = None,
    release_period: int = 4,
    window: tuple[int, int] | None = None,
    density: float | None = None,
    complete_prefix: bool = False,
    fresh: Sequence[str] = (),
    importance: ImportanceConfig | None = None,
    max_share: float | None = None,
) -> tuple[SyncPlan, ImportanceScores, ThresholdResult]:
    """Profile ``trace_dir``; returns (SyncPlan, ImportanceScores, ThresholdResult).

    ``fresh``: fresh patterns (:func:`igpolicy.components.mark_fresh`): those parameters form the
    always-pinned component ``fresh``; recorded in the plan's ``source``. ``importance``: how
    statistics become scores (None: :class:`igpolicy.importance.ImportanceConfig`'s defaults);
    ``max_share``: the plan's bytes cap (:func:`igpolicy.profile.build_plan`).
    An incomplete trace (a recording that stopped mid-way) is refused unless ``complete_prefix``,
    which profiles the steps before its first incomplete one; the plan's ``source`` then says
    where the trace was cut (``truncated_at``).
    Raises ValueError (TraceError) naming the trace when it is unreadable or incomplete, has no
    steps in the window or no parameter rows, or when ``release_period`` < 1.
    """
    if release_period < 1:
        raise ValueError(f"release period {release_period}: must be >= 1")
    trace = read_trace(trace_dir, steps=window, complete_prefix=complete_prefix)
    if trace.num_steps == 0:
        raise ValueError(
            f"{trace_dir}: no recorded steps"
            + (f" in window {window[0]}:{window[1]}" if window else "")
            + (f" complete on every rank ({trace.incomplete})" if trace.truncated_at is not None else "")
        )
    manifest = trace.manifest
    series = {c: trace.per_param_series(c) for c in ("sel_norm", "overlap", "k", "grad_norm")}
    present = [p for p in sorted(manifest.params, key=lambda p: p.order) if p.name in series["k"]]
    present = mark_fresh(present, fresh)
    if not present:
        raise ValueError(f"{trace_dir}: the trace has no parameter rows")
    names = [p.name for p in present]
    stats = component_stats_from_params(
        param_component={p.name: p.component for p in present},
        param_numel={p.name: p.numel for p in present},
        **{c: {n: series[c][n] for n in names} for c in series},
    )
    d = manifest.density if density is None else density
    expected: dict[str, int] = {}
    for p in present:
        expected[p.component] = expected.get(p.component, 0) + nominal_k(p.numel, d) * PAIR_BYTES
    return profile(
        stats=stats,
        expected_bytes=expected,
        release_period=int(release_period),
        importance=importance,
        method=method,
        method_params=dict(method_params) if method_params else None,
        max_share=max_share,
        source={
            "trace": str(trace_dir),
            "workload": manifest.workload,
            "sparsifier": manifest.sparsifier,
            "density": d,
            "world_size": manifest.world_size,
            "window": list(window) if window else None,
            "num_steps": trace.num_steps,
            **({"truncated_at": trace.truncated_at} if trace.truncated_at is not None else {}),
            **({"fresh_patterns": list(fresh)} if fresh else {}),
        },
    )
