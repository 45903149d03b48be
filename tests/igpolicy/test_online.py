"""Online profiling's pure core (igpolicy.online): schedule, window vector, reduction, plan rule.

Oracles: the offline aggregation :func:`igpolicy.importance.component_stats_from_params` (the online
rows of one rank must reduce to the same statistics, and so to the same plan, as a one-rank trace);
the mean over ranks (identical ranks reduce to one rank); a planted structure (components with large,
consistent gradients) must come out important.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from igpolicy.config import PolicyConfig
from igpolicy.decide import release_phases
from igpolicy.importance import component_stats_from_params
from igpolicy.online import (
    STAT_FIELDS,
    OnlineSchedule,
    StatsWindow,
    component_rows,
    important_jaccard,
    important_set,
    online_plan,
    start_plan,
    stats_from_vector,
    stats_vector_bytes,
    window_complete,
)
from igpolicy.profile import profile
from igpolicy.vocab import ComponentClass

KEYS = ("0.attn_q", "0.attn_k", "0.mlp_up", "1.attn_q", "1.mlp_down", "embedding", "norm")
PARAMS = {  # name -> (component, numel); two parameters share 0.mlp_up
    "l0.q": ("0.attn_q", 64),
    "l0.k": ("0.attn_k", 64),
    "l0.up.w": ("0.mlp_up", 128),
    "l0.up.b": ("0.mlp_up", 16),
    "l1.q": ("1.attn_q", 64),
    "l1.down": ("1.mlp_down", 128),
    "emb": ("embedding", 256),
    "norm": ("norm", 16),
}
KEYS_SORTED = tuple(sorted(KEYS))
PARAM_COMPONENT = {n: c for n, (c, _) in PARAMS.items()}
NUMEL = {k: sum(n for c, n in PARAMS.values() if c == k) for k in KEYS_SORTED}


# --------------------------------------------------------------------------- the schedule
@given(window=st.integers(1, 12), every=st.integers(1, 12))
@settings(max_examples=60, deadline=None)
def test_every_boundary_window_is_observed_and_nothing_else(window, every):
    sched = OnlineSchedule(window=window, every=every)
    horizon = 6 * max(window, every)
    boundaries = [b for b in range(1, horizon) if sched.replans_after(b - 1)]
    assert boundaries and boundaries[0] == sched.first_boundary >= window
    assert all(b % every == 0 and b >= window for b in boundaries)
    needed = {s for b in boundaries for s in range(b - window, b)}
    observed = {s for s in range(boundaries[-1]) if sched.observes(s)}
    assert observed == needed  # the window of every re-plan, and no step more


def test_schedule_examples_and_errors():
    s = OnlineSchedule(window=3, every=5)
    assert [t for t in range(15) if s.observes(t)] == [2, 3, 4, 7, 8, 9, 12, 13, 14]
    assert [t for t in range(15) if s.replans_after(t)] == [4, 9, 14]
    long = OnlineSchedule(window=7, every=5)  # a window longer than the period slides over every step
    assert long.first_boundary == 10 and [t for t in range(20) if long.observes(t)] == list(range(3, 20))
    for bad in ({"window": 0, "every": 5}, {"window": 3, "every": 0}, {"window": True, "every": 5}):
        with pytest.raises(ValueError, match="must be an integer >= 1"):
            OnlineSchedule(**bad)


# --------------------------------------------------------------------------- one rule with offline
def _series(rng, T: int, *, planted: tuple[str, ...] = ()) -> dict[str, dict[str, np.ndarray]]:
    """Per-parameter series as a recorded trace holds them (sel_norm, grad_norm, k, overlap)."""
    out: dict[str, dict[str, np.ndarray]] = {c: {} for c in ("sel_norm", "grad_norm", "k", "overlap")}
    for name, (comp, numel) in PARAMS.items():
        big = comp in planted
        sel = rng.uniform(5.0, 6.0, T) if big else rng.uniform(0.0, 1.0, T)
        out["sel_norm"][name] = sel
        out["grad_norm"][name] = sel * rng.uniform(1.0, 3.0, T)
        out["k"][name] = np.full(T, float(max(1, numel // 10)))
        ov = rng.uniform(0.8, 1.0, T) if big else rng.uniform(0.0, 0.3, T)
        ov[0] = math.nan  # the first recorded step has no previous selection
        out["overlap"][name] = ov
    return out


def _window_vector(series, T: int, *, start: int = 0) -> np.ndarray:
    win = StatsWindow(keys=KEYS_SORTED, window=T)
    for t in range(T):
        per_param = {
            n: (
                series["sel_norm"][n][t],
                series["grad_norm"][n][t],
                series["k"][n][t],
                series["overlap"][n][t],
            )
            for n in PARAMS
        }
        win.add(start + t, component_rows(per_param, param_component=PARAM_COMPONENT, keys=KEYS_SORTED))
    return win.vector(start + T)


def test_one_rank_window_reduces_to_the_offline_component_statistics():
    rng = np.random.default_rng(0)
    T = 6
    series = _series(rng, T)
    offline = component_stats_from_params(
        param_component=PARAM_COMPONENT, param_numel={n: v for n, (_, v) in PARAMS.items()}, **series
    )
    vec = _window_vector(series, T, start=10)
    assert vec.size * 8 == stats_vector_bytes(num_components=len(KEYS), window=T)
    assert window_complete(vec)
    online = stats_from_vector(
        vec, keys=KEYS_SORTED, numel=[NUMEL[k] for k in KEYS_SORTED], window=T, world_size=1
    )
    assert online.keys == offline.keys
    np.testing.assert_allclose(online.sel_norm, offline.sel_norm, rtol=1e-12)
    np.testing.assert_allclose(online.grad_norm, offline.grad_norm, rtol=1e-12)
    np.testing.assert_allclose(online.selected, offline.selected, rtol=1e-12)
    np.testing.assert_allclose(online.overlap, offline.overlap, rtol=1e-12)  # NaN where NaN
    np.testing.assert_array_equal(online.numel, offline.numel)
    # ... and so to the offline plan: the same scoring and threshold code
    expected = {k: 8 * NUMEL[k] // 10 for k in KEYS_SORTED}
    ref, _, _ = profile(stats=offline, expected_bytes=expected, release_period=4)
    got, _, _ = online_plan(
        reduced=vec, keys=KEYS_SORTED, numel=[NUMEL[k] for k in KEYS_SORTED], expected_bytes=expected,
        release_period=4, window=T, world_size=1, boundary=10 + T,
    )  # fmt: skip
    assert [(c.key, c.cls, c.phase) for c in got.components] == [
        (c.key, c.cls, c.phase) for c in ref.components
    ]
    assert got.source["online"] is True and got.source["window"] == [10, 10 + T]


def test_identical_ranks_reduce_to_one_rank_and_the_plan_is_a_function_of_the_sum():
    rng = np.random.default_rng(1)
    series = _series(rng, 5)
    vec = _window_vector(series, 5)
    args = dict(keys=KEYS_SORTED, numel=[NUMEL[k] for k in KEYS_SORTED], window=5)
    one = stats_from_vector(vec, world_size=1, **args)
    three = stats_from_vector(3 * vec, world_size=3, **args)  # what an all-reduce of 3 equal ranks gives
    np.testing.assert_allclose(three.sel_norm, one.sel_norm, rtol=1e-12)
    np.testing.assert_allclose(three.overlap, one.overlap, rtol=1e-12)
    kw = dict(expected_bytes={k: 8 for k in KEYS_SORTED}, release_period=4, boundary=5, **args)
    a, _, _ = online_plan(reduced=vec + 0.0, world_size=1, **kw)
    b, _, _ = online_plan(reduced=vec.copy(), world_size=1, **kw)
    assert a.fingerprint == b.fingerprint  # deterministic: same vector, same plan, same hash


def test_planted_structure_is_marked_important():
    rng = np.random.default_rng(2)
    planted = ("0.attn_q", "1.mlp_down")
    T = 8
    vec = _window_vector(_series(rng, T, planted=planted), T)
    plan, scores, _ = online_plan(
        reduced=vec, keys=KEYS_SORTED, numel=[NUMEL[k] for k in KEYS_SORTED],
        expected_bytes={k: 8 * NUMEL[k] for k in KEYS_SORTED}, release_period=2, window=T, world_size=2, boundary=T,
    )  # fmt: skip
    imp = important_set(plan)
    assert set(planted) <= imp, scores.table()
    assert len(plan.low) >= 3  # the unplanted noise is not all important


def test_a_missing_step_on_any_rank_marks_the_window_incomplete():
    win = StatsWindow(keys=KEYS_SORTED, window=3)
    row = np.ones((len(KEYS_SORTED), len(STAT_FIELDS)))
    win.add(4, row)
    win.add(5, row)  # step 3 was never observed (a resume at another world size)
    vec = win.vector(6)
    assert vec[-1] == 1.0 and not window_complete(vec)
    assert window_complete(_window_vector(_series(np.random.default_rng(3), 3), 3))
    with pytest.raises(ValueError, match="finite"):
        win.add(6, row * np.nan)
    restored = StatsWindow(keys=KEYS_SORTED, window=3)
    restored.load_state_dict(win.state_dict())
    np.testing.assert_array_equal(restored.vector(6), vec)
    with pytest.raises(ValueError, match="holds 3 steps"):
        StatsWindow(keys=KEYS_SORTED, window=4).load_state_dict(win.state_dict())


def test_start_plan_sends_everything_and_plans_compare_by_their_important_sets():
    plan = start_plan(expected_bytes={k: 8 for k in KEYS}, release_period=4)
    assert {c.cls for c in plan.components} == {ComponentClass.PINNED} and not plan.low
    config = PolicyConfig(policy="importance", online_window=2, replan_every=2)
    assert set(release_phases(plan=plan, config=config, component_keys=KEYS).values()) == {None}
    assert important_set(plan) == frozenset() and important_jaccard(plan, plan) == 1.0
    rng = np.random.default_rng(4)
    kw = dict(keys=KEYS_SORTED, numel=[NUMEL[k] for k in KEYS_SORTED], expected_bytes={k: 8 for k in KEYS_SORTED},
              release_period=2, window=6, world_size=1, boundary=6)  # fmt: skip
    a, _, _ = online_plan(reduced=_window_vector(_series(rng, 6, planted=("0.attn_q",)), 6), **kw)
    b, _, _ = online_plan(reduced=_window_vector(_series(rng, 6, planted=("1.mlp_down",)), 6), **kw)
    x, y = important_set(a), important_set(b)
    assert important_jaccard(a, b) == pytest.approx(len(x & y) / len(x | y))
    assert important_jaccard(a, b) < 1.0


# --------------------------------------------------------------------------- the config keys
@pytest.mark.parametrize(
    "keys, match",
    [
        ({"replan_every": 5}, "needs online_window >= 1"),
        ({"online_window": 5}, "needs replan_every >= 1"),
        ({"online_window": -1, "replan_every": 5}, "online_window=-1 must be >= 0"),
        ({"online_window": 5, "replan_every": 5, "policy": "topk"}, "is for policy 'importance'"),
        ({"online_window": 2.5, "replan_every": 5}, "must be an integer"),
        ({"online_window": 10**6, "replan_every": 5}, "above the limit"),
    ],
)
def test_online_config_keys_are_validated(keys, match):
    with pytest.raises(ValueError, match=match):
        PolicyConfig.from_dict({"policy": "importance", **keys})


def test_online_config_round_trips():
    c = PolicyConfig.from_dict({"policy": "importance", "online_window": 8, "replan_every": 4})
    assert c.online_profiling and PolicyConfig.from_dict(c.to_dict()) == c
    assert not PolicyConfig(policy="importance").online_profiling
