"""Release schedules: coverage over every window of R steps, the staggering bound, validation."""

from __future__ import annotations

import doctest

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import igpolicy.schedule as schedule
from igpolicy.schedule import AlwaysSchedule, ImportanceSchedule, PeriodicSchedule, assign_phases

SETTINGS = settings(max_examples=150, deadline=None)

component_bytes = st.dictionaries(
    keys=st.builds(
        lambda layer, kind: f"{layer}.{kind}", st.integers(0, 40), st.sampled_from(["attn_q", "mlp_up"])
    ),
    values=st.integers(0, 10**7),
    max_size=60,
)


def _phase_bytes(expected: dict[str, int], phases: dict[str, int], num_phases: int) -> list[int]:
    out = [0] * num_phases
    for key, phase in phases.items():
        out[phase] += expected[key]
    return out


@SETTINGS
@given(expected=component_bytes, num_phases=st.integers(1, 12))
def test_assign_phases_is_balanced_and_complete(expected, num_phases):
    phases = assign_phases(expected, num_phases=num_phases)
    assert set(phases) == set(expected)
    assert all(0 <= p < num_phases for p in phases.values())
    per_phase = _phase_bytes(expected, phases, num_phases)
    assert sum(per_phase) == sum(expected.values())
    if expected:
        # the documented bound: total / R + largest component
        assert max(per_phase) * num_phases <= sum(expected.values()) + num_phases * max(expected.values())
        used = {p for p in phases.values()}
        assert len(used) == min(num_phases, len(expected))  # no empty phase unless too few components
        assert per_phase == sorted(per_phase, reverse=True)  # phase 0 is the heaviest


@SETTINGS
@given(expected=component_bytes, num_phases=st.integers(1, 12), seed=st.randoms(use_true_random=False))
def test_assign_phases_is_deterministic_whatever_the_insertion_order(expected, num_phases, seed):
    items = list(expected.items())
    seed.shuffle(items)
    assert assign_phases(dict(items), num_phases=num_phases) == assign_phases(expected, num_phases=num_phases)


@SETTINGS
@given(expected=component_bytes, period=st.integers(2, 10))
def test_staggered_peak_never_above_the_burst_and_lower_with_two_senders(expected, period):
    phases = assign_phases(expected, num_phases=period)
    staggered = ImportanceSchedule(period=period)
    total = sum(expected.values())
    peak = 0
    for step in range(period):
        d = staggered.decide(step=step, components=phases)
        peak = max(peak, sum(expected[k] for k in d.send))
    burst = {k: period - 1 for k in expected}  # the prototype: every low component on one step
    burst_peak = max(
        sum(expected[k] for k in ImportanceSchedule(period=period).decide(step=s, components=burst).send)
        for s in range(period)
    )
    assert burst_peak == total
    assert peak * period <= total + period * max(expected.values(), default=0)
    assert peak <= burst_peak
    if sum(1 for v in expected.values() if v > 0) >= 2:
        assert peak < burst_peak


@SETTINGS
@given(
    phases=st.dictionaries(
        keys=st.text("abcdefgh", min_size=1, max_size=4), values=st.none() | st.integers(0, 9), max_size=20
    ),
    period=st.integers(1, 10),
    start=st.integers(0, 10**6),
)
def test_every_window_of_period_steps_releases_each_low_component_exactly_once(phases, period, start):
    phases = {k: (None if p is None else p % period) for k, p in phases.items()}
    sched = ImportanceSchedule(period=period)
    counts = dict.fromkeys(phases, 0)
    for step in range(start, start + period):
        d = sched.decide(step=step, components=phases)
        assert d.step == step and d.phase == step % period
        assert d.send | d.hold == set(phases) and not (d.send & d.hold)
        for k in d.send:
            counts[k] += 1
        assert all(d.sends(k) for k, p in phases.items() if p is None)  # important: every step
    for k, p in phases.items():
        assert counts[k] == (period if p is None else 1)


@SETTINGS
@given(keys=st.sets(st.text("xyz", min_size=1, max_size=3), max_size=10), period=st.integers(1, 8))
def test_periodic_sends_everything_once_per_window_all_at_once(keys, period):
    components = dict.fromkeys(keys, period - 1)
    sched = PeriodicSchedule(period=period)
    for start in range(period):
        sends = [sched.decide(step=s, components=components) for s in range(start, start + period)]
        releasing = [d for d in sends if d.send]
        if keys:
            assert len(releasing) == 1 and releasing[0].send == set(keys)
            assert releasing[0].step % period == period - 1
        for d in sends:
            assert d.phase == d.step % period
            assert d.send | d.hold == set(keys)


def test_always_sends_everything_every_step():
    components = {"0.attn_q": None, "0.mlp_up": 2, "head": None}
    for step in range(5):
        d = AlwaysSchedule().decide(step=step, components=components)
        assert d.send == set(components) and d.hold == frozenset() and d.phase is None


def test_burst_and_periodic_agree_on_low_components():
    components = {"0.attn_q": 3, "0.mlp_up": 3, "1.mlp_up": 3}
    for step in range(12):
        a = ImportanceSchedule(period=4).decide(step=step, components=components)
        b = PeriodicSchedule(period=4).decide(step=step, components=components)
        assert a.send == b.send and a.hold == b.hold


def test_bad_input_raises_value_error_naming_it():
    for cls in (PeriodicSchedule, ImportanceSchedule):
        with pytest.raises(ValueError, match="period"):
            cls(period=0)
        with pytest.raises(ValueError, match="period"):
            cls(period=True)
        with pytest.raises(ValueError, match="step"):
            cls(period=2).decide(step=-1, components={})
        with pytest.raises(ValueError, match=r"'0\.mlp_up' has phase 2"):
            cls(period=2).decide(step=0, components={"0.mlp_up": 2})
        with pytest.raises(ValueError, match=r"'0\.mlp_up' has phase -1"):
            cls(period=2).decide(step=0, components={"0.mlp_up": -1})
    with pytest.raises(ValueError, match="step"):
        AlwaysSchedule().decide(step=1.5, components={})
    with pytest.raises(ValueError, match="num_phases"):
        assign_phases({"a": 1}, num_phases=0)
    with pytest.raises(ValueError, match=r"expected_bytes\['0.norm'\]"):
        assign_phases({"0.norm": -1}, num_phases=2)
    with pytest.raises(ValueError, match=r"expected_bytes\['0.norm'\]"):
        assign_phases({"0.norm": 1.5}, num_phases=2)


def test_numpy_integers_are_accepted():
    np = pytest.importorskip("numpy")
    d = ImportanceSchedule(period=4).decide(step=np.int64(5), components={"a": np.int64(1), "b": None})
    assert d.send == {"a", "b"} and d.phase == 1 and type(d.phase) is int and type(d.step) is int
    assert assign_phases({"a": np.int64(3), "b": 4}, num_phases=2) == {"a": 1, "b": 0}


def test_docstring_examples():
    assert doctest.testmod(schedule).failed == 0
