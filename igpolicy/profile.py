"""From importance scores to a SyncPlan: classify components and stagger the low ones' releases.

Classes follow one rule set, in order:

1. **pinned** — components of kind ``other`` (unrecognised parameters are never silently treated as
   low-importance), of kind ``fresh`` (freshly initialised parameters, see
   :func:`igpolicy.components.mark_fresh`) and every key in ``pinned``: sent every step, whatever
   their score;
2. **important** — the remaining components whose score is at or above the adaptive threshold
   (:func:`igpolicy.thresholds.split_scores`, computed over these remaining components only);
3. **low** — the rest, split into ``release_period`` phases of equal expected bytes by
   :func:`igpolicy.schedule.assign_phases`.

With a bytes cap (``max_share``, a share of every component sending every step) the threshold is
raised until the plan fits: while the plan's :func:`igpolicy.plan.bytes_share` is above the cap,
the lowest-scored important component becomes low (ties: the first key first). Pinned components
are never demoted, so a cap below what they alone send leaves every candidate low and is recorded
as not reached.

:func:`profile` is the one-call pipeline (statistics -> scores -> threshold -> plan) behind
``igsim profile``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from igpolicy.config import check_max_share
from igpolicy.importance import ComponentStats, ImportanceConfig, ImportanceScores, score_components
from igpolicy.plan import ComponentPlan, SyncPlan, bytes_share
from igpolicy.schedule import assign_phases
from igpolicy.thresholds import ThresholdResult, split_scores
from igpolicy.thresholds import method_params as check_method_params
from igpolicy.vocab import ComponentClass, ComponentId, ComponentKind

__all__ = ["build_plan", "profile"]

_RECORDED_SETTINGS = ("importance", "threshold", "pinned", "policy_defaults")
_ALWAYS_PINNED = (ComponentKind.OTHER, ComponentKind.FRESH)


def _check_inputs(
    scores: ImportanceScores, expected_bytes: Mapping[str, int], release_period: int, pinned: set[str]
) -> None:
    if isinstance(release_period, bool) or not isinstance(release_period, int) or release_period < 1:
        raise ValueError(f"profile: release_period must be an integer >= 1, got {release_period!r}")
    keys = scores.keys
    score = np.asarray(scores.score, dtype=np.float64)
    if score.shape != (len(keys),) or not np.all(np.isfinite(score)):
        raise ValueError(f"profile: scores must be {len(keys)} finite numbers, one per key")
    for key in keys:
        ComponentId.from_key(key)  # ValueError naming a malformed key
    missing = sorted(set(keys) - set(expected_bytes))
    extra = sorted(set(expected_bytes) - set(keys))
    if missing or extra:
        raise ValueError(
            "profile: expected_bytes does not match the scored components: "
            f"missing {missing or 'none'}, unknown {extra or 'none'}"
        )
    for key in keys:
        b = expected_bytes[key]
        if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 0:
            raise ValueError(f"profile: expected_bytes[{key!r}]={b!r} must be an integer >= 0")
    unknown = sorted(pinned - set(keys))
    if unknown:
        raise ValueError(f"profile: pinned components {unknown} are not among the scored components")


def _split(
    scores: ImportanceScores, candidates: list[str], method: str, params: dict[str, Any]
) -> ThresholdResult:
    """The threshold over the candidate (non-pinned) components, in ``scores.keys`` order."""
    index = {k: i for i, k in enumerate(scores.keys)}
    values = np.array([scores.score[index[k]] for k in candidates], dtype=np.float64)
    if values.size == 1:  # nothing to split against: the only candidate is sent every step
        important = np.ones(1, dtype=bool)
        important.setflags(write=False)
        result = ThresholdResult(
            method=method,
            threshold=float(values[0]),
            important=important,
            params=params,
            details={"reason": "a single unpinned component"},
        )
    else:
        result = split_scores(values, method=method, **params)
    return dataclasses.replace(result, keys=tuple(candidates))


def _build(
    *,
    scores: ImportanceScores,
    expected_bytes: Mapping[str, int],
    release_period: int,
    method: str,
    method_params_: Mapping[str, Any] | None,
    pinned: Iterable[str],
    settings: Mapping[str, Any] | None,
    source: Mapping[str, Any] | None,
    max_share: float | None = None,
) -> tuple[SyncPlan, ThresholdResult]:
    if isinstance(pinned, str):
        raise ValueError(f"profile: pinned must be a collection of component keys, not the string {pinned!r}")
    pinned_set = set(pinned)
    _check_inputs(scores, expected_bytes, release_period, pinned_set)
    params = check_method_params(method, method_params_)
    check_max_share(max_share, where="profile")
    settings = dict(settings or {})
    clash = sorted(set(settings) & set(_RECORDED_SETTINGS))
    if clash:
        raise ValueError(f"profile: settings keys {clash} are recorded by the profiler; use other names")

    keys = scores.keys
    pinned_set |= {k for k in keys if ComponentId.from_key(k).kind in _ALWAYS_PINNED}
    candidates = [k for k in keys if k not in pinned_set]
    if not candidates:
        raise ValueError(
            f"profile: all {len(keys)} components are pinned (kind 'other' or listed in pinned); "
            "there is nothing to classify — check the parameter-name mapping"
        )
    result = _split(scores, candidates, method, params)
    important = {k for k, imp in zip(candidates, result.important) if imp}
    cap = _cap_to_share(scores, candidates, important, expected_bytes, release_period, max_share) if max_share else None
    low = [k for k in candidates if k not in important]
    phases = assign_phases({k: int(expected_bytes[k]) for k in low}, num_phases=release_period) if low else {}
    assert set(phases) == set(low), "assign_phases must give every low component exactly one phase"

    score_of = scores.as_dict()
    components = []
    for key in keys:
        if key in pinned_set:
            cls, phase = ComponentClass.PINNED, None
        elif key in important:
            cls, phase = ComponentClass.IMPORTANT, None
        else:
            cls, phase = ComponentClass.LOW, int(phases[key])
        components.append(
            ComponentPlan(
                key=key, score=score_of[key], cls=cls, phase=phase, expected_bytes=int(expected_bytes[key])
            )
        )
    settings["importance"] = {**scores.config.to_dict(), "num_steps": int(scores.num_steps)}
    settings["threshold"] = {
        "method": method,
        "params": {k: v.item() if isinstance(v, np.generic) else v for k, v in params.items()},
        "value": result.threshold,
        "details": _finite(result.details),
        "num_candidates": len(candidates),
        "num_important": len(important),
        "num_low": len(low),
    }
    if cap is not None:
        settings["threshold"]["max_share"] = cap
    settings["pinned"] = sorted(pinned_set)
    if low and release_period > 1:
        # held components get one optimizer step per release; catch-up restores their Adam pace
        # (docs/runtime.md); a default of plans profiled from now on (SyncPlan.policy_defaults)
        settings["policy_defaults"] = {"catch_up": True}
    plan = SyncPlan(
        release_period=release_period,
        components=tuple(components),
        settings=settings,
        source=dict(source or {}),
    )
    return plan, result


def _cap_to_share(
    scores: ImportanceScores,
    candidates: list[str],
    important: set[str],
    expected_bytes: Mapping[str, int],
    release_period: int,
    max_share: float,
) -> dict[str, Any]:
    """Demote ``important`` (in place), lowest score first, until the plan's expected share of the
    bytes is at most ``max_share``; what it did, for the plan's settings."""
    score_of = scores.as_dict()
    total = sum(int(expected_bytes[k]) for k in scores.keys)
    low = sum(int(expected_bytes[k]) for k in candidates if k not in important)
    every = total - low  # pinned and important

    def share() -> float:
        return bytes_share(every_step=every, low=low, release_period=release_period)

    before = share()
    demoted: list[str] = []
    for key in sorted(important, key=lambda k: (score_of[k], k)):
        if share() <= max_share:
            break
        important.discard(key)
        b = int(expected_bytes[key])
        every, low = every - b, low + b
        demoted.append(key)
    return {
        "cap": float(max_share),
        "share_before": before,
        "share": share(),
        "reached": share() <= max_share,
        "demoted": demoted,
    }


def _finite(details: Mapping[str, Any]) -> dict[str, Any]:
    """Details as JSON can hold them (a non-finite float becomes None)."""
    out: dict[str, Any] = {}
    for k, v in details.items():
        if isinstance(v, float) and not math.isfinite(v):
            v = None
        elif isinstance(v, list):
            v = [None if isinstance(x, float) and not math.isfinite(x) else x for x in v]
        out[k] = v
    return out


def build_plan(
    *,
    scores: ImportanceScores,
    expected_bytes: Mapping[str, int],
    release_period: int,
    method: str = "knee",
    method_params: Mapping[str, Any] | None = None,
    pinned: Iterable[str] = (),
    settings: Mapping[str, Any] | None = None,
    source: Mapping[str, Any] | None = None,
    max_share: float | None = None,
) -> SyncPlan:
    """Classify every scored component (pinned / important / low, see the module docstring) into a plan.

    ``expected_bytes`` maps every component key to the bytes it puts on the wire per release (used to
    balance the low components' phases, each in [0, release_period)). ``settings`` is recorded in the
    plan next to what the profiler records itself (``importance`` weights and window, ``threshold``
    method, parameters and value, ``pinned``, and ``policy_defaults``: ``catch_up`` on when there are
    low components and R > 1); ``source`` says where the statistics came from. ``max_share`` caps
    the plan's expected bytes per step at that share of every component every step (module
    docstring; None or 0: no cap), recorded as ``settings["threshold"]["max_share"]``.

    Raises ValueError when ``expected_bytes`` or ``pinned`` do not match the scored keys, a key is
    malformed, the method or its parameters are bad, or every component is pinned.
    """
    plan, _ = _build(
        scores=scores,
        expected_bytes=expected_bytes,
        release_period=release_period,
        method=method,
        method_params_=method_params,
        pinned=pinned,
        settings=settings,
        source=source,
        max_share=max_share,
    )
    return plan


def profile(
    *,
    stats: ComponentStats,
    expected_bytes: Mapping[str, int],
    release_period: int,
    importance: ImportanceConfig | None = None,
    method: str = "knee",
    method_params: Mapping[str, Any] | None = None,
    pinned: Iterable[str] = (),
    source: Mapping[str, Any] | None = None,
    max_share: float | None = None,
) -> tuple[SyncPlan, ImportanceScores, ThresholdResult]:
    """Statistics -> scores -> threshold -> plan, in one call (``importance`` None = defaults;
    ``max_share``: the bytes cap of :func:`build_plan`).

    Returns the plan, the scores of every component, and the threshold result over the unpinned
    components (``result.keys`` names them, in ``stats.keys`` order).
    """
    scores = score_components(stats, importance or ImportanceConfig())
    plan, result = _build(
        scores=scores,
        expected_bytes=expected_bytes,
        release_period=release_period,
        method=method,
        method_params_=method_params,
        pinned=pinned,
        settings=None,
        source=source,
        max_share=max_share,
    )
    return plan, scores, result
