"""igpolicy.controls: split controls keep a plan's bytes and change which components are important.

Oracles: the module's doctest; a control drawn twice from one seed is the same plan (what lets every
rank of an online run derive it alone) while another re-plan step draws another; bad names and
configs are errors that name the key.
"""

from __future__ import annotations

import doctest

import pytest

from igpolicy import controls
from igpolicy.config import PolicyConfig
from igpolicy.controls import split_control, split_controls
from igpolicy.plan import ComponentPlan, SyncPlan
from igpolicy.vocab import ComponentClass


def _plan(n: int = 12) -> SyncPlan:
    def comp(i: int) -> ComponentPlan:
        important = i < 3
        return ComponentPlan(key=f"{i}.mlp_up", score=float(n - i), expected_bytes=100 + 10 * i,
                             cls=ComponentClass.IMPORTANT if important else ComponentClass.LOW,
                             phase=None if important else i % 4)  # fmt: skip

    comps = tuple(comp(i) for i in range(n))
    return SyncPlan(release_period=4, components=comps)


def test_doctest() -> None:
    assert doctest.testmod(controls).failed == 0


def test_a_seed_gives_the_same_random_split_and_another_step_another() -> None:
    plan = _plan()
    draws = {s: split_control(plan, "random", seed=(0, s)) for s in (25, 50, 75, 100)}
    assert split_control(plan, "random", seed=(0, 25)).fingerprint == draws[25].fingerprint
    assert len({frozenset(p.important) for p in draws.values()}) > 1  # re-plans draw afresh
    target = sum(c.expected_bytes for c in plan.components[:3])
    for p in draws.values():
        got = sum(c.expected_bytes for c in p.components if c.cls == ComponentClass.IMPORTANT)
        assert abs(got - target) <= max(c.expected_bytes for c in plan.components)
        assert p.important != plan.important
        assert {c.phase for c in p.components if c.cls == ComponentClass.LOW} <= set(range(4))


def test_every_control_and_bad_names() -> None:
    got = split_controls(_plan())
    assert sorted(got) == ["all_low", "random", "swapped"]
    assert got["swapped"].important == {"11.mlp_up", "10.mlp_up"}  # the lowest scores, 410 B for 330
    with pytest.raises(ValueError, match="split control 'inverse' is not one of"):
        split_control(_plan(), "inverse")
    with pytest.raises(ValueError, match="online_control='inverse' is not one of"):
        PolicyConfig(online_window=5, replan_every=5, online_control="inverse")
    with pytest.raises(ValueError, match="online_control='swapped' replaces online re-plans and needs online"):
        PolicyConfig(online_control="swapped")
    cfg = PolicyConfig(online_window=5, replan_every=5, online_control="random")
    assert PolicyConfig.from_dict(cfg.to_dict()).online_control == "random"
