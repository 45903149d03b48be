"""Split controls: plans that keep a plan's bytes but replace *which* components are important.

They answer the question every importance result must answer: is it the choice of components that
helps, or only the bytes? Each control is a SyncPlan over the same components, release period and
settings as the plan it is derived from; pinned components stay pinned; the low components get
release phases of equal expected bytes (:func:`igpolicy.schedule.assign_phases`).

- ``all_low``: every unpinned component low;
- ``random``: a random set of unpinned components with about the important set's expected bytes
  important (re-drawn while it equals the real split), the rest low;
- ``swapped``: the lowest-scored unpinned components, filled up to the important set's expected
  bytes, important; the rest (the real important set among them) low.

The evaluation protocol derives them from an offline plan (``experiments.protocol``); online
profiling applies one to every re-plan (``PolicyConfig.online_control``), seeded by the run's seed and
the re-plan's boundary step, so every rank derives the same plan.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from igpolicy.config import SPLIT_CONTROLS
from igpolicy.plan import ComponentPlan, SyncPlan
from igpolicy.schedule import assign_phases
from igpolicy.vocab import ComponentClass

__all__ = ["SPLIT_CONTROLS", "split_control", "split_controls"]


def split_controls(plan: SyncPlan, *, seed: int | Sequence[int] = 0) -> dict[str, SyncPlan]:
    """Every control of :data:`SPLIT_CONTROLS` of ``plan`` (``seed`` draws the random one)."""
    return {name: split_control(plan, name, seed=seed) for name in SPLIT_CONTROLS}


def split_control(plan: SyncPlan, control: str, *, seed: int | Sequence[int] = 0) -> SyncPlan:
    """The ``control`` of ``plan`` (one of :data:`SPLIT_CONTROLS`); its ``source`` names the control
    and the plan it was derived from.

    >>> from igpolicy.plan import ComponentPlan as C
    >>> p = SyncPlan(release_period=2, components=(
    ...     C(key="0.attn_q", score=3.0, cls=ComponentClass.IMPORTANT, expected_bytes=100),
    ...     C(key="0.attn_k", score=2.0, cls=ComponentClass.LOW, phase=0, expected_bytes=60),
    ...     C(key="0.mlp_up", score=1.0, cls=ComponentClass.LOW, phase=1, expected_bytes=100)))
    >>> sorted(split_control(p, "swapped").important), sorted(split_control(p, "all_low").important)
    (['0.mlp_up'], [])
    """
    if control not in SPLIT_CONTROLS:
        raise ValueError(f"split control {control!r} is not one of {', '.join(SPLIT_CONTROLS)}")
    movable = [c for c in plan.components if c.cls != ComponentClass.PINNED]
    real = frozenset(c.key for c in movable if c.cls == ComponentClass.IMPORTANT)
    target = sum(c.expected_bytes for c in movable if c.key in real)
    if control == "all_low":
        return _with_important(plan, frozenset(), control="all_low")
    if control == "swapped":
        by_score = sorted(movable, key=lambda c: (c.score, c.key))
        return _with_important(plan, _fill(by_score, target), control="swapped")
    rng = np.random.default_rng(seed)
    chosen = real
    for _ in range(100):
        chosen = _fill([movable[i] for i in rng.permutation(len(movable))], target)
        if chosen != real or len(movable) < 2:
            break
    label = seed if isinstance(seed, int) else list(seed)
    return _with_important(plan, chosen, control=f"random(seed={label})")


def _fill(order: Sequence[ComponentPlan], target: int) -> frozenset[str]:
    """Components taken in ``order`` while each brings the total bytes closer to ``target``."""
    chosen, total = [], 0
    for c in order:
        if abs(total + c.expected_bytes - target) < abs(total - target):
            chosen.append(c.key)
            total += c.expected_bytes
    return frozenset(chosen)


def _with_important(plan: SyncPlan, important: frozenset[str], *, control: str) -> SyncPlan:
    low = {
        c.key: c.expected_bytes
        for c in plan.components
        if c.cls != ComponentClass.PINNED and c.key not in important
    }
    phases = assign_phases(low, num_phases=plan.release_period) if low else {}
    components = []
    for c in plan.components:
        if c.cls == ComponentClass.PINNED:
            components.append(c)
        else:
            cls = ComponentClass.LOW if c.key in low else ComponentClass.IMPORTANT
            components.append(ComponentPlan(key=c.key, score=c.score, cls=cls, phase=phases.get(c.key),
                                            expected_bytes=c.expected_bytes))  # fmt: skip
    source = {**plan.source, "control": control, "derived_from": plan.fingerprint}
    return dataclasses.replace(plan, components=tuple(components), source=source)
