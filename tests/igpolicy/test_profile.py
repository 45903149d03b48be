"""Plan building: the big, persistent components become important under every threshold method;
kind 'other' and pinned keys are pinned; low phases are in range and balanced; plans round-trip."""

from __future__ import annotations

import json

import numpy as np
import pytest

from igpolicy.importance import ComponentStats, ImportanceConfig, score_components
from igpolicy.plan import SyncPlan
from igpolicy.profile import build_plan, profile
from igpolicy.schedule import assign_phases
from igpolicy.vocab import ComponentClass

BIG = ("0.attn_q", "1.attn_v", "2.mlp_down")
OTHER = ("other", "3.other")


def _synthetic_stats(seed: int = 0, T: int = 40) -> ComponentStats:
    """Three components with large, persistent, stable selections; the rest small and noisy."""
    rng = np.random.default_rng(seed)
    keys = [
        f"{layer}.{kind}"
        for layer in range(4)
        for kind in ("attn_q", "attn_k", "attn_v", "mlp_up", "mlp_down")
    ]
    keys += ["embedding", "norm", "head", *OTHER]
    C = len(keys)
    numel = rng.integers(1_000, 100_000, size=C)
    per_entry = rng.uniform(0.01, 0.05, size=(T, C))  # per-entry RMS of the selected entries
    overlap = rng.uniform(0.05, 0.3, size=(T, C))
    for key in BIG:
        c = keys.index(key)
        per_entry[:, c] = rng.uniform(0.8, 1.0, size=T)
        overlap[:, c] = rng.uniform(0.8, 0.95, size=T)
    overlap[0] = np.nan
    return ComponentStats(
        keys=tuple(keys), sel_norm=per_entry * np.sqrt(numel)[None, :], numel=numel, overlap=overlap
    )


def _bytes(stats: ComponentStats) -> dict[str, int]:
    return {k: int(n) // 100 * 8 for k, n in zip(stats.keys, stats.numel)}


METHOD_CASES = [
    ("knee", None),
    ("otsu", None),
    ("gmm", None),
    ("kmeans2", None),
    ("percentile", {"q": 85}),
    ("fixed_ratio", {"ratio": 0.2}),
]


@pytest.mark.parametrize(("method", "params"), METHOD_CASES)
@pytest.mark.parametrize("seed", [0, 1])
def test_large_persistent_components_are_important_under_every_method(method, params, seed):
    stats = _synthetic_stats(seed)
    plan, scores, result = profile(
        stats=stats, expected_bytes=_bytes(stats), release_period=4, method=method, method_params=params
    )
    by_key = plan.by_key
    assert {k for k in BIG if by_key[k].cls == ComponentClass.IMPORTANT} == set(BIG)
    if method in ("knee", "otsu", "gmm", "kmeans2"):  # clusters: exactly the big ones
        assert {c.key for c in plan.components if c.cls == ComponentClass.IMPORTANT} == set(BIG)
    for key in OTHER:
        assert by_key[key].cls == ComponentClass.PINNED and by_key[key].phase is None
    # the threshold result covers the unpinned components, in stats order
    assert result.keys == tuple(k for k in stats.keys if k not in OTHER)
    assert {k for k, imp in zip(result.keys, result.important) if imp} == {
        c.key for c in plan.components if c.cls == ComponentClass.IMPORTANT
    }
    assert plan.settings["threshold"]["method"] == method
    assert plan.settings["threshold"]["value"] == result.threshold
    assert scores.keys == stats.keys


@pytest.mark.parametrize("release_period", [1, 2, 3, 8])
def test_low_phases_are_in_range_and_every_component_is_classified_once(release_period):
    stats = _synthetic_stats(2)
    eb = _bytes(stats)
    plan, _, _ = profile(stats=stats, expected_bytes=eb, release_period=release_period, method="otsu")
    assert sorted(c.key for c in plan.components) == sorted(stats.keys)
    low = [c for c in plan.components if c.cls == ComponentClass.LOW]
    assert low and all(0 <= c.phase < release_period for c in low)
    assert all(c.phase is None for c in plan.components if c.cls != ComponentClass.LOW)
    assert all(c.expected_bytes == eb[c.key] for c in plan.components)
    assert plan.low == frozenset(c.key for c in low)
    assert plan.important == frozenset(stats.keys) - plan.low


def test_low_phases_come_from_assign_phases_and_are_balanced():
    stats = _synthetic_stats(3)
    eb = _bytes(stats)
    plan, _, _ = profile(stats=stats, expected_bytes=eb, release_period=4, method="otsu")
    low = {c.key: c.phase for c in plan.components if c.cls == ComponentClass.LOW}
    assert low == assign_phases({k: eb[k] for k in low}, num_phases=4)
    load = [sum(eb[k] for k, p in low.items() if p == phase) for phase in range(4)]
    assert max(load) <= sum(load) / 4 + max(eb[k] for k in low)  # assign_phases' stated bound
    assert sum(load) == sum(eb[k] for k in low)


def test_plan_round_trips_through_json_with_the_same_fingerprint(tmp_path):
    stats = _synthetic_stats(4)
    plan, _, _ = profile(
        stats=stats,
        expected_bytes=_bytes(stats),
        release_period=4,
        importance=ImportanceConfig(window=(5, 40), normalise="rank"),
        method="gmm",
        source={"trace": "synthetic", "seed": 4},
    )
    text = json.dumps(plan.to_json())
    again = SyncPlan.from_json(json.loads(text))
    assert again.fingerprint == plan.fingerprint
    assert again.by_key == plan.by_key
    loaded = SyncPlan.load(plan.save(tmp_path / "plan.json"))
    assert loaded.fingerprint == plan.fingerprint
    assert loaded.settings["importance"]["window"] == [5, 40]
    assert loaded.settings["importance"]["normalise"] == "rank"
    assert loaded.source == {"trace": "synthetic", "seed": 4}


def test_plan_is_deterministic_and_independent_of_component_order():
    stats = _synthetic_stats(5)
    eb = _bytes(stats)
    perm = np.random.default_rng(0).permutation(len(stats.keys))
    shuffled = ComponentStats(
        keys=tuple(stats.keys[i] for i in perm),
        sel_norm=stats.sel_norm[:, perm],
        numel=stats.numel[perm],
        overlap=stats.overlap[:, perm],
    )
    for method in ("knee", "otsu", "gmm", "kmeans2", "percentile", "fixed_ratio"):
        a, _, _ = profile(stats=stats, expected_bytes=eb, release_period=3, method=method)
        b, _, _ = profile(stats=stats, expected_bytes=eb, release_period=3, method=method)
        c, _, _ = profile(stats=shuffled, expected_bytes=eb, release_period=3, method=method)
        assert a.fingerprint == b.fingerprint == c.fingerprint


def test_settings_record_weights_method_and_threshold():
    stats = _synthetic_stats(6)
    config = ImportanceConfig(magnitude_weight=0.6, consistency_weight=0.4, overlap_weight=0.0)
    scores = score_components(stats, config)
    plan = build_plan(
        scores=scores,
        expected_bytes=_bytes(stats),
        release_period=4,
        method="percentile",
        method_params={"q": 80},
        pinned=["head"],
        settings={"density": 0.01, "sparsifier": "topk"},
    )
    s = plan.settings
    assert s["density"] == 0.01 and s["sparsifier"] == "topk"
    assert s["importance"]["magnitude_weight"] == 0.6 and s["importance"]["overlap_weight"] == 0.0
    assert s["importance"]["num_steps"] == stats.num_steps
    assert s["threshold"]["method"] == "percentile" and s["threshold"]["params"] == {"q": 80}
    candidates = [k for k in stats.keys if k not in (*OTHER, "head")]
    values = [scores.as_dict()[k] for k in candidates]
    assert s["threshold"]["value"] == pytest.approx(np.percentile(values, 80))
    assert s["threshold"]["num_candidates"] == len(candidates)
    assert s["pinned"] == sorted([*OTHER, "head"])
    assert plan.by_key["head"].cls == ComponentClass.PINNED


def test_pinned_components_stay_pinned_whatever_their_score():
    stats = _synthetic_stats(7)
    plan, _, result = profile(
        stats=stats,
        expected_bytes=_bytes(stats),
        release_period=2,
        method="otsu",
        pinned={"0.attn_q", "norm"},
    )
    assert plan.by_key["0.attn_q"].cls == ComponentClass.PINNED  # the highest score, pinned anyway
    assert plan.by_key["norm"].cls == ComponentClass.PINNED  # a low score, pinned anyway
    assert "0.attn_q" not in result.keys and "norm" not in result.keys


def test_a_single_unpinned_component_is_important():
    stats = ComponentStats(
        keys=("other", "0.attn_q"), sel_norm=np.ones((3, 2)), numel=[10, 10], overlap=np.full((3, 2), 0.5)
    )
    plan, _, result = profile(stats=stats, expected_bytes={"other": 8, "0.attn_q": 8}, release_period=4)
    assert plan.by_key["0.attn_q"].cls == ComponentClass.IMPORTANT
    assert result.keys == ("0.attn_q",) and result.important.tolist() == [True]


def _bad_build(**change):
    stats = _synthetic_stats(8, T=5)
    kwargs = {
        "scores": score_components(stats),
        "expected_bytes": _bytes(stats),
        "release_period": 4,
    }
    kwargs.update(change)
    return build_plan(**kwargs)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"release_period": 0}, "release_period must be an integer >= 1, got 0"),
        ({"release_period": True}, "release_period"),
        ({"expected_bytes": {"0.attn_q": 8}}, "expected_bytes does not match the scored components: missing"),
        ({"method": "elbow"}, "unknown threshold method 'elbow'"),
        ({"method": "otsu", "method_params": {"q": 3}}, r"unknown parameter\(s\) \['q'\]"),
        ({"method": "percentile", "method_params": {"q": -1}}, "q=-1"),
        ({"pinned": ["9.attn_q"]}, r"pinned components \['9.attn_q'\] are not among the scored components"),
        ({"pinned": "head"}, "not the string 'head'"),
        ({"settings": {"threshold": 1}}, r"settings keys \['threshold'\] are recorded by the profiler"),
    ],
)
def test_bad_input_is_a_clear_value_error(change, match):
    with pytest.raises(ValueError, match=match):
        _bad_build(**change)


def test_bad_bytes_keys_and_all_pinned_are_errors():
    stats = _synthetic_stats(9, T=5)
    eb = _bytes(stats)
    scores = score_components(stats)
    with pytest.raises(ValueError, match=r"unknown \['9.norm'\]"):
        build_plan(scores=scores, expected_bytes={**eb, "9.norm": 1}, release_period=2)
    with pytest.raises(ValueError, match=r"expected_bytes\['norm'\]=-1"):
        build_plan(scores=scores, expected_bytes={**eb, "norm": -1}, release_period=2)
    with pytest.raises(ValueError, match="all 25 components are pinned"):
        build_plan(scores=scores, expected_bytes=eb, release_period=2, pinned=stats.keys)
    bad_key = ComponentStats(
        keys=("0.attention",), sel_norm=np.ones((2, 1)), numel=[1], overlap=np.zeros((2, 1))
    )
    with pytest.raises(ValueError, match="unknown kind 'attention'"):
        profile(stats=bad_key, expected_bytes={"0.attention": 1}, release_period=2)
