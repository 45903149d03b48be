"""Release schedules (STUB: signatures are the contract; bodies being written)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from igpolicy.vocab import ReleaseDecision


def assign_phases(expected_bytes: Mapping[str, int], *, num_phases: int) -> dict[str, int]:
    """Split components into ``num_phases`` release phases of (nearly) equal expected bytes.

    Deterministic: the same input gives the same phases on every rank (balanced number partitioning,
    ties by component key). Returns {component key: phase in [0, num_phases)}.
    """
    raise NotImplementedError


@dataclass(frozen=True, kw_only=True)
class AlwaysSchedule:
    """Every component sends every step."""

    def decide(self, *, step: int, components: Mapping[str, int | None]) -> ReleaseDecision:
        """``components`` maps every component key to its release phase (None = important)."""
        raise NotImplementedError


@dataclass(frozen=True, kw_only=True)
class PeriodicSchedule:
    """Every component sends at steps t with t % period == period - 1 (all at once)."""

    period: int

    def decide(self, *, step: int, components: Mapping[str, int | None]) -> ReleaseDecision:
        raise NotImplementedError


@dataclass(frozen=True, kw_only=True)
class ImportanceSchedule:
    """Important components (phase None) send every step; a low component with phase φ sends at
    steps t with t % period == φ. Staggered phases come from :func:`assign_phases`; the prototype's
    burst is every low component on phase period - 1."""

    period: int

    def decide(self, *, step: int, components: Mapping[str, int | None]) -> ReleaseDecision:
        raise NotImplementedError
