"""Release schedules: which components send at a step, given each component's release phase.

A schedule is a frozen dataclass with one pure method, ``decide(step=, components=)``, where
``components`` maps every component key to its release phase (None = sends every step). The phases
themselves come from :func:`assign_phases`, which splits low-importance components into R phases of
nearly equal expected bytes, so that releases are staggered instead of arriving as one burst.

Staggering bound: with phases from :func:`assign_phases`, the low-importance bytes released at any
one step are at most ``total_low_bytes / R + max_component_bytes`` (and never more than the
all-at-once burst ``total_low_bytes``; strictly less when R >= 2 and at least two components have
non-zero bytes).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from numbers import Integral

from igpolicy.packing import partition
from igpolicy.vocab import ReleaseDecision

__all__ = ["AlwaysSchedule", "ImportanceSchedule", "PeriodicSchedule", "assign_phases"]


def assign_phases(expected_bytes: Mapping[str, int], *, num_phases: int) -> dict[str, int]:
    """Split components into ``num_phases`` release phases of (nearly) equal expected bytes.

    Deterministic: the same input gives the same phases on every rank (balanced number partitioning,
    ties by component key). Returns {component key: phase in [0, num_phases)}.

    Uses :func:`igpolicy.packing.partition` (Karmarkar–Karp plus local search), so the bytes of the
    heaviest phase are at most ``sum(expected_bytes) / num_phases + max(expected_bytes)``. Phases are
    numbered by descending bytes (phase 0 the heaviest), ties by their smallest key; a phase is empty
    only when there are fewer components than phases. Raises ValueError for ``num_phases < 1`` or a
    negative or non-integer byte count.

    >>> assign_phases({"0.mlp_up": 8, "1.mlp_up": 7, "0.attn_q": 6, "1.attn_q": 5, "0.attn_k": 4},
    ...               num_phases=2)
    {'0.attn_k': 0, '0.attn_q': 0, '0.mlp_up': 1, '1.attn_q': 0, '1.mlp_up': 1}
    """
    if not _is_int(num_phases) or num_phases < 1:
        raise ValueError(f"assign_phases: num_phases must be an integer >= 1, got {num_phases!r}")
    keys = sorted(expected_bytes)
    sizes = []
    for key in keys:
        value = expected_bytes[key]
        if not _is_int(value) or value < 0:
            raise ValueError(f"assign_phases: expected_bytes[{key!r}] must be an integer >= 0, got {value!r}")
        sizes.append(int(value))
    groups = partition(sizes, num_parts=num_phases, method="kk")
    # heaviest first; ties by smallest key (indices follow sorted keys); empty groups last
    groups.sort(key=lambda g: (-sum(sizes[i] for i in g), min(g) if g else len(keys)))
    phase_of = {i: phase for phase, g in enumerate(groups) for i in g}
    return {key: phase_of[i] for i, key in enumerate(keys)}


def _is_int(value: object) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool)


def _check_step(step: int) -> int:
    if not _is_int(step) or step < 0:
        raise ValueError(f"schedule: step must be an integer >= 0, got {step!r}")
    return int(step)


def _check_period(period: int, schedule: str) -> None:
    if not _is_int(period) or period < 1:
        raise ValueError(f"{schedule}: period must be an integer >= 1, got {period!r}")


def _check_phases(components: Mapping[str, int | None], period: int | None, schedule: str) -> None:
    """Every phase is None or an integer in [0, period) ([0, inf) when ``period`` is None)."""
    for key, phase in components.items():
        if phase is None:
            continue
        if not _is_int(phase) or phase < 0 or (period is not None and phase >= period):
            bound = f"[0, {period})" if period is not None else ">= 0"
            raise ValueError(f"{schedule}: component {key!r} has phase {phase!r}, expected None or {bound}")


def _decision(
    step: int, components: Mapping[str, int | None], send: set[str], phase: int | None
) -> ReleaseDecision:
    return ReleaseDecision(
        step=step,
        send=frozenset(send),
        hold=frozenset(k for k in components if k not in send),
        phase=phase,
    )


@dataclass(frozen=True, kw_only=True)
class AlwaysSchedule:
    """Every component sends every step."""

    def decide(self, *, step: int, components: Mapping[str, int | None]) -> ReleaseDecision:
        """``components`` maps every component key to its release phase (None = important).

        Phases are ignored (but must be None or >= 0); ``phase`` of the decision is None.
        """
        step = _check_step(step)
        _check_phases(components, None, "AlwaysSchedule")
        return _decision(step, components, set(components), None)


@dataclass(frozen=True, kw_only=True)
class PeriodicSchedule:
    """Every component sends at steps t with t % period == period - 1 (all at once)."""

    period: int

    def __post_init__(self) -> None:
        _check_period(self.period, "PeriodicSchedule")

    def decide(self, *, step: int, components: Mapping[str, int | None]) -> ReleaseDecision:
        """All of ``components`` send when ``step % period == period - 1``, none otherwise.

        Per-component phases are ignored but must be None or in [0, period). The decision's
        ``phase`` is ``step % period``. Raises ValueError for a negative step or a bad phase.
        """
        step = _check_step(step)
        _check_phases(components, self.period, "PeriodicSchedule")
        phase = int(step % self.period)
        send = set(components) if phase == self.period - 1 else set()
        return _decision(step, components, send, phase)


@dataclass(frozen=True, kw_only=True)
class ImportanceSchedule:
    """Important components (phase None) send every step; a low component with phase φ sends at
    steps t with t % period == φ. Staggered phases come from :func:`assign_phases`; the prototype's
    burst is every low component on phase period - 1."""

    period: int

    def __post_init__(self) -> None:
        _check_period(self.period, "ImportanceSchedule")

    def decide(self, *, step: int, components: Mapping[str, int | None]) -> ReleaseDecision:
        """Send the important components and the low ones whose phase is ``step % period``.

        Over any ``period`` consecutive steps each low component is released exactly once. The
        decision's ``phase`` is ``step % period``. Raises ValueError for a negative step or a phase
        outside [0, period).
        """
        step = _check_step(step)
        _check_phases(components, self.period, "ImportanceSchedule")
        phase = int(step % self.period)
        send = {k for k, p in components.items() if p is None or p == phase}
        return _decision(step, components, send, phase)
