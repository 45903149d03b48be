"""The plan's bytes cap (``max_share``): the threshold raised until the plan's expected bytes per
step fit, the lowest-scored important components made low first, pinned ones never; off by default
(the same plan, the same fingerprint); bad caps refused by name."""

from __future__ import annotations

import numpy as np
import pytest

from igpolicy.config import PolicyConfig
from igpolicy.importance import ComponentStats
from igpolicy.plan import bytes_share
from igpolicy.profile import profile
from igpolicy.vocab import ComponentClass


def _stats(T: int = 30) -> ComponentStats:
    """Eight components whose score falls with their index (0 the most important); one 'other'."""
    rng = np.random.default_rng(3)
    keys = [f"{i}.mlp_up" for i in range(8)] + ["other"]
    numel = np.array([40_000, 10_000, 80_000, 20_000, 5_000, 60_000, 30_000, 15_000, 2_000])
    strength = np.array([1.0, 0.95, 0.9, 0.85, 0.8, 0.1, 0.08, 0.05, 0.5])
    per_entry = strength[None, :] * rng.uniform(0.9, 1.0, size=(T, len(keys)))
    overlap = np.clip(strength[None, :] * rng.uniform(0.9, 1.0, size=(T, len(keys))), 0, 1)
    overlap[0] = np.nan
    return ComponentStats(keys=tuple(keys), sel_norm=per_entry * np.sqrt(numel)[None, :], numel=numel, overlap=overlap)


def _bytes(stats: ComponentStats) -> dict[str, int]:
    return {k: int(n) // 100 * 8 for k, n in zip(stats.keys, stats.numel)}


def _plan(max_share=None, R=4):
    stats = _stats()
    return profile(stats=stats, expected_bytes=_bytes(stats), release_period=R, max_share=max_share)


def test_no_cap_is_the_plan_as_before():
    plan, _, _ = _plan()
    assert "max_share" not in plan.settings["threshold"]
    assert _plan(0)[0].fingerprint == plan.fingerprint  # 0: off
    assert _plan(1.0)[0].important == plan.important  # a cap it already meets changes no class


def test_the_cap_makes_the_lowest_scored_important_components_low_until_the_plan_fits():
    free, scores, _ = _plan()
    important = [c for c in free.components if c.cls == ComponentClass.IMPORTANT]
    assert len(important) >= 3, "the synthetic split must leave something to demote"
    cap = (free.expected_share + 0.25) / 2  # between all-low-plus-pinned and the free plan
    plan, _, _ = _plan(cap)
    rec = plan.settings["threshold"]["max_share"]
    assert rec["reached"] and plan.expected_share <= cap < free.expected_share
    assert rec["share"] == pytest.approx(plan.expected_share)
    assert rec["share_before"] == pytest.approx(free.expected_share)
    score = scores.as_dict()
    kept = {c.key for c in plan.components if c.cls == ComponentClass.IMPORTANT}
    assert rec["demoted"] and set(rec["demoted"]).isdisjoint(kept)
    assert kept | set(rec["demoted"]) == {c.key for c in important}
    assert [score[k] for k in rec["demoted"]] == sorted(score[k] for k in rec["demoted"])
    assert max(score[k] for k in rec["demoted"]) <= min(score[k] for k in kept)
    # minimal: keeping the last demoted component would have broken the cap
    last = rec["demoted"][-1]
    b = plan.by_key[last].expected_bytes
    low = sum(c.expected_bytes for c in plan.components if c.cls == ComponentClass.LOW)
    total = sum(c.expected_bytes for c in plan.components)
    assert bytes_share(every_step=total - low + b, low=low - b, release_period=4) > cap
    assert plan.by_key[last].cls == ComponentClass.LOW and plan.by_key[last].phase is not None


def test_pinned_components_are_never_demoted_and_an_unreachable_cap_says_so():
    plan, _, _ = _plan(0.01)
    rec = plan.settings["threshold"]["max_share"]
    assert not rec["reached"]
    assert plan.by_key["other"].cls == ComponentClass.PINNED
    assert not [c for c in plan.components if c.cls == ComponentClass.IMPORTANT]
    other = plan.by_key["other"].expected_bytes
    total = sum(c.expected_bytes for c in plan.components)
    assert rec["share"] == pytest.approx(bytes_share(every_step=other, low=total - other, release_period=4))


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan"), True, "0.2"])
def test_bad_caps_are_refused(bad):
    with pytest.raises(ValueError, match="max_share"):
        _plan(bad)
    with pytest.raises(ValueError, match="max_share"):
        PolicyConfig(policy="importance", online_window=5, replan_every=5, max_share=bad)


def test_the_cap_needs_online_profiling_in_a_policy_config():
    with pytest.raises(ValueError, match="needs online profiling"):
        PolicyConfig(policy="importance", max_share=0.2)
    assert PolicyConfig(policy="importance", online_window=5, replan_every=5, max_share=0.2).max_share == 0.2
