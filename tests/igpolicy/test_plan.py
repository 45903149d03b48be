import json

import pytest

from igpolicy.plan import ComponentPlan, SyncPlan, compare_plans
from igpolicy.vocab import ComponentClass, ComponentId, ComponentKind


def make_plan(**kw) -> SyncPlan:
    comps = (
        ComponentPlan(key="0.attn_q", score=0.9, cls=ComponentClass.IMPORTANT, expected_bytes=800),
        ComponentPlan(key="0.mlp_up", score=0.1, cls=ComponentClass.LOW, phase=0, expected_bytes=1600),
        ComponentPlan(key="1.mlp_up", score=0.2, cls=ComponentClass.LOW, phase=1, expected_bytes=1600),
        ComponentPlan(key="other", score=0.0, cls=ComponentClass.PINNED, expected_bytes=8),
    )
    return SyncPlan(release_period=kw.pop("release_period", 2), components=comps,
                    settings={"method": "knee"}, **kw)


def test_round_trip_and_fingerprint(tmp_path):
    plan = make_plan()
    path = plan.save(tmp_path / "plan.json")
    again = SyncPlan.load(path)
    assert again == plan
    assert again.fingerprint == plan.fingerprint
    assert plan.important == {"0.attn_q", "other"}
    assert plan.low == {"0.mlp_up", "1.mlp_up"}
    assert plan.phases["1.mlp_up"] == 1 and plan.phases["0.attn_q"] is None


def test_fingerprint_changes_with_content():
    a = make_plan()
    b = SyncPlan(release_period=2, components=a.components, settings={"method": "otsu"})
    assert a.fingerprint != b.fingerprint


def test_component_order_does_not_change_fingerprint():
    a = make_plan()
    b = SyncPlan(release_period=2, components=tuple(reversed(a.components)), settings=a.settings)
    assert a.fingerprint == b.fingerprint


def _write(tmp_path, data):
    p = tmp_path / "plan.json"
    p.write_text(json.dumps(data))
    return p


def test_unknown_key(tmp_path):
    data = make_plan().to_json()
    data["threshold"] = 0.5
    with pytest.raises(ValueError, match="unknown key 'threshold'"):
        SyncPlan.load(_write(tmp_path, data))


def test_unknown_component_key(tmp_path):
    data = make_plan().to_json()
    data["components"][0]["weight"] = 1
    with pytest.raises(ValueError, match=r"components\[0\].*unknown key 'weight'"):
        SyncPlan.load(_write(tmp_path, data))


def test_wrong_schema_version(tmp_path):
    data = make_plan().to_json()
    data["schema_version"] = 99
    with pytest.raises(ValueError, match="schema_version 99"):
        SyncPlan.load(_write(tmp_path, data))


def test_fingerprint_mismatch(tmp_path):
    data = make_plan().to_json()
    data["components"][1]["score"] = 0.5
    with pytest.raises(ValueError, match="does not match the content"):
        SyncPlan.load(_write(tmp_path, data))


def test_not_json_and_missing(tmp_path):
    p = tmp_path / "plan.json"
    p.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        SyncPlan.load(p)
    with pytest.raises(ValueError, match="no such SyncPlan"):
        SyncPlan.load(tmp_path / "missing.json")


def test_invalid_phases_and_scores():
    with pytest.raises(ValueError, match="needs a phase"):
        SyncPlan(release_period=2, components=(ComponentPlan(key="0.norm", score=0.1, cls=ComponentClass.LOW),))
    with pytest.raises(ValueError, match="needs a phase"):
        SyncPlan(release_period=2,
                 components=(ComponentPlan(key="0.norm", score=0.1, cls=ComponentClass.LOW, phase=2),))
    with pytest.raises(ValueError, match="must not have a phase"):
        SyncPlan(release_period=2,
                 components=(ComponentPlan(key="0.norm", score=0.1, cls=ComponentClass.IMPORTANT, phase=0),))
    with pytest.raises(ValueError, match="non-finite"):
        SyncPlan(release_period=2,
                 components=(ComponentPlan(key="0.norm", score=float("nan"), cls=ComponentClass.IMPORTANT),))
    with pytest.raises(ValueError, match="appears twice"):
        c = ComponentPlan(key="0.norm", score=0.1, cls=ComponentClass.IMPORTANT)
        SyncPlan(release_period=2, components=(c, c))
    with pytest.raises(ValueError, match="unknown kind"):
        SyncPlan(release_period=2, components=(ComponentPlan(key="0.bogus", score=0.1, cls=ComponentClass.PINNED),))


def test_compare_plans():
    missing, extra = compare_plans(make_plan(), ["0.attn_q", "0.mlp_up", "2.mlp_up"])
    assert missing == ["2.mlp_up"]
    assert extra == ["1.mlp_up", "other"]


@pytest.mark.parametrize(
    "cid",
    [
        ComponentId(kind=ComponentKind.ATTN_Q, layer=3),
        ComponentId(kind=ComponentKind.MLP_DOWN, layer=0, stack="decoder"),
        ComponentId(kind=ComponentKind.MLP_GATE, layer=7, expert=5),
        ComponentId(kind=ComponentKind.EMBEDDING),
        ComponentId(kind=ComponentKind.NORM, stack="encoder"),
    ],
)
def test_component_key_round_trip(cid):
    assert ComponentId.from_key(cid.key) == cid
