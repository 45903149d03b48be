"""Issue 15's method parts in igpolicy: fresh components, small vectors sent whole, the
size-unbiased score, the warm-up, the plan's policy defaults (catch-up for new plans) and
low components thinned instead of held (``low_mode="thin"``)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from igpolicy.components import FRESH_AUTO, fresh_names, mark_fresh, param_infos
from igpolicy.config import PolicyConfig
from igpolicy.decide import decide_step, payload_blocks, release_phases, step_config
from igpolicy.importance import (
    ComponentStats,
    ImportanceConfig,
    component_stats_from_params,
    score_components,
)
from igpolicy.plan import ComponentPlan, SyncPlan, apply_policy_defaults
from igpolicy.planner import StepPlanner
from igpolicy.profile import build_plan, profile
from igpolicy.step_plan import OpKind
from igpolicy.vocab import ComponentClass
from igpolicy.wire import config_k, nominal_k, pairs_of

# a tiny BERT classifier: pretrained pooler and a fresh classifier share "head" by default
BERT = [
    ("bert.embeddings.word_embeddings.weight", (1000, 16), "float32"),
    ("bert.encoder.layer.0.attention.self.query.weight", (16, 16), "float32"),
    ("bert.encoder.layer.0.attention.self.query.bias", (16,), "float32"),
    ("bert.encoder.layer.0.output.LayerNorm.weight", (16,), "float32"),
    ("bert.encoder.layer.0.intermediate.dense.weight", (64, 16), "float32"),
    ("bert.encoder.layer.0.intermediate.dense.bias", (64,), "float32"),
    ("bert.pooler.dense.weight", (16, 16), "float32"),
    ("bert.pooler.dense.bias", (16,), "float32"),
    ("classifier.weight", (8, 16), "float32"),
    ("classifier.bias", (8,), "float32"),
]


def _components(infos):
    return {i.name: i.component for i in infos}


# --------------------------------------------------------------------------- (a) fresh parameters
def test_fresh_classifier_is_split_from_the_pretrained_pooler():
    plain = _components(param_infos(BERT))
    assert plain["classifier.weight"] == plain["bert.pooler.dense.weight"] == "head"
    fresh = _components(param_infos(BERT, fresh=["auto"]))
    assert fresh["classifier.weight"] == fresh["classifier.bias"] == "fresh"
    assert fresh["bert.pooler.dense.weight"] == "head"
    # nothing else moves
    assert {n: c for n, c in fresh.items() if not n.startswith("classifier")} == {
        n: c for n, c in plain.items() if not n.startswith("classifier")
    }


def test_fresh_patterns_by_module_name_and_glob():
    names = [n for n, _, _ in BERT]
    assert fresh_names(names, ["pooler"]) == ("bert.pooler.dense.weight", "bert.pooler.dense.bias")
    assert fresh_names(names, ["*.bias"]) == tuple(n for n in names if n.endswith(".bias"))
    assert "score" in FRESH_AUTO and "lm_head" not in FRESH_AUTO  # an untied lm_head is pretrained
    # a module name matches outside the layers only: "query" is no head
    assert fresh_names(names, ["query"]) == ()


def test_fresh_pattern_that_matches_nothing_is_an_error():
    infos = param_infos(BERT)
    with pytest.raises(ValueError, match=r"'clasifier'.*match no parameter"):
        mark_fresh(infos, ["clasifier"])
    with pytest.raises(ValueError, match="not the string"):
        mark_fresh(infos, "classifier")
    with pytest.raises(ValueError, match="non-empty"):
        mark_fresh(infos, [""])
    gpt = param_infos([("transformer.wte.weight", (10, 4), "float32")])
    assert mark_fresh(gpt, ["auto"]) == gpt  # auto may find nothing


def test_profile_pins_the_fresh_component_whatever_its_score():
    infos = param_infos(BERT, fresh=["auto"])
    keys = sorted({i.component for i in infos})
    T = 6
    sel = np.ones((T, len(keys)))
    sel[:, keys.index("fresh")] = 1e-9  # the smallest score of all
    stats = ComponentStats(
        keys=tuple(keys), sel_norm=sel, numel=np.full(len(keys), 100), overlap=np.full((T, len(keys)), 0.5)
    )
    plan, scores, _ = profile(stats=stats, expected_bytes=dict.fromkeys(keys, 8), release_period=4)
    assert plan.by_key["fresh"].cls == ComponentClass.PINNED
    assert scores.as_dict()["fresh"] == min(scores.as_dict().values())
    with pytest.raises(ValueError, match="freshly initialised"):
        SyncPlan(
            release_period=2,
            components=(ComponentPlan(key="fresh", score=0.0, cls=ComponentClass.LOW, phase=0),),
        )


def test_release_phases_names_fresh_patterns_when_the_plan_has_them():
    infos = param_infos(BERT, fresh=["classifier"])
    plan = SyncPlan(
        release_period=2,
        components=tuple(
            ComponentPlan(key=k, score=1.0, cls=ComponentClass.IMPORTANT)
            for k in {i.component for i in infos}
        ),
        source={"fresh_patterns": ["classifier"]},
    )
    with pytest.raises(ValueError, match=r"set fresh_patterns \(--fresh\) to classifier"):
        release_phases(
            plan=plan, config=PolicyConfig(), component_keys=[i.component for i in param_infos(BERT)]
        )


# --------------------------------------------------------------------------- (b) small vectors whole
def test_small_parameters_send_every_entry_and_large_ones_keep_nominal_k():
    infos = param_infos(BERT)
    off = PolicyConfig(policy="topk", density=0.01)
    on = PolicyConfig(policy="topk", density=0.01, dense_small_numel=64)
    for i in infos:
        assert config_k(i, off) == nominal_k(i.numel, 0.01)
        if i.numel <= 64:
            assert config_k(i, on) is None and pairs_of(i, on) == i.numel
        else:
            assert config_k(i, on) == nominal_k(i.numel, 0.01)
    assert config_k(infos[0], PolicyConfig(policy="dense", dense_small_numel=64)) is None
    # the decision's payloads and the step plan carry the same per-parameter sizes
    blocks = {b.name: b.size_bytes for b in payload_blocks(infos, on)}
    assert blocks["classifier.bias"] == 8 * 8 and blocks["bert.pooler.dense.weight"] == 8 * nominal_k(
        256, 0.01
    )
    phases = release_phases(plan=None, config=on, component_keys=[i.component for i in infos])
    planner = StepPlanner(config=on, params=infos, world_size=2, phases=phases)
    ops = [op for op in planner.plan(0).ops if op.kind != OpKind.COUNT_EXCHANGE]
    k_of = {n: k for op in ops for n, k in zip(op.param_names, op.param_k)}
    assert {n for n, k in k_of.items() if k is None} == {i.name for i in infos if i.numel <= 64}
    for op in ops:
        if op.kind == OpKind.SPARSE_GATHER:
            assert op.nominal_nnz == sum(n if k is None else k for n, k in zip(op.param_numel, op.param_k))
    total = sum(pairs_of(i, on) for i in infos)
    assert sum(b.nominal_nnz for b in planner.decision(0).buckets) == total


def test_dense_small_numel_is_validated():
    with pytest.raises(ValueError, match="dense_small_numel"):
        PolicyConfig(dense_small_numel=-1)
    with pytest.raises(ValueError, match=r"dense_small_numel.*integer"):
        PolicyConfig(dense_small_numel=1.5)


# --------------------------------------------------------------------------- (c) size-unbiased score
def _row_sparse_stats(T: int = 5):
    """A row-sparse embedding (100 touched of 100 000 entries), a dense matrix with the same
    magnitude per selected entry, and a dense matrix at half that magnitude (which, per √numel,
    still beats the embedding)."""
    m = 0.5
    k = {"emb": 100, "dense": 100, "weak": 100}
    per_entry = {"emb": m, "dense": m, "weak": 0.5 * m}
    return component_stats_from_params(
        param_component={"emb": "embedding", "dense": "0.mlp_up", "weak": "0.mlp_down"},
        param_numel={"emb": 100_000, "dense": 10_000, "weak": 10_000},
        sel_norm={n: np.full(T, per_entry[n] * np.sqrt(k[n])) for n in k},
        overlap={n: np.full(T, 0.5) for n in k},
        k={n: np.full(T, k[n]) for n in k},
    )


def test_selected_size_norm_stops_diluting_a_row_sparse_embedding():
    stats = _row_sparse_stats()
    assert stats.selected is not None and stats.selected[0].tolist() == [100, 100, 100]
    by_numel = score_components(stats, ImportanceConfig())
    by_selected = score_components(stats, ImportanceConfig(size_norm="selected"))
    s0, s1 = by_numel.as_dict(), by_selected.as_dict()
    assert min(s0, key=s0.get) == "embedding"  # diluted by its untouched rows: ranked last
    assert min(s1, key=s1.get) == "0.mlp_down"  # now the weak matrix is last
    assert s1["embedding"] == pytest.approx(s1["0.mlp_up"])  # same magnitude per sent entry
    raw = dict(zip(by_selected.keys, by_selected.raw_magnitude))
    assert raw["embedding"] == pytest.approx(0.5)


def test_selected_size_norm_needs_counts_and_is_recorded_only_when_chosen():
    stats = ComponentStats(
        keys=("a", "b"), sel_norm=np.ones((2, 2)), numel=np.array([4, 4]), overlap=np.zeros((2, 2))
    )
    with pytest.raises(ValueError, match=r"ComponentStats\.selected"):
        score_components(stats, ImportanceConfig(size_norm="selected"))
    with pytest.raises(ValueError, match="size_norm"):
        ImportanceConfig(size_norm="rows")
    assert "size_norm" not in ImportanceConfig().to_dict()  # old plans keep their fingerprint
    assert ImportanceConfig(size_norm="selected").to_dict()["size_norm"] == "selected"
    # a step where a component selected nothing contributes 0, not a division by zero
    zero = ComponentStats(
        keys=("a", "b"), sel_norm=np.array([[0.0, 1.0], [2.0, 1.0]]), numel=np.array([4, 4]),
        overlap=np.zeros((2, 2)), selected=np.array([[0.0, 1.0], [4.0, 1.0]]),
    )  # fmt: skip
    raw = score_components(zero, ImportanceConfig(size_norm="selected")).raw_magnitude
    assert raw.tolist() == [pytest.approx(0.5), pytest.approx(1.0)]


# --------------------------------------------------------------------------- (d) warm-up
@pytest.mark.parametrize("warmup", [1, 5, 9])
def test_warmup_sends_every_component_then_the_schedule_runs(warmup):
    infos = param_infos(BERT)
    keys = sorted({i.component for i in infos})
    low = [k for k in keys if k != "embedding"][:3]
    comps = [
        ComponentPlan(key=k, score=0.1, cls=ComponentClass.LOW, phase=j % 3, expected_bytes=8) if k in low
        else ComponentPlan(key=k, score=1.0, cls=ComponentClass.IMPORTANT)
        for j, k in enumerate(keys)
    ]  # fmt: skip
    plan = SyncPlan(release_period=3, components=tuple(comps))
    config = PolicyConfig(release_period=3, warmup_steps=warmup)
    plain = PolicyConfig(release_period=3)
    phases = release_phases(plan=plan, config=config, component_keys=keys)
    planner = StepPlanner(config=config, params=infos, world_size=2, phases=phases)
    reference = StepPlanner(config=plain, params=infos, world_size=2, phases=phases)
    everything = frozenset(i.name for i in infos)
    for t in range(warmup + 12):
        got = planner.decision(t)
        direct = decide_step(step=t, config=config, params=infos, world_size=2, phases=phases)
        assert got.sending_params == direct.sending_params and got.step == t
        if t < warmup:
            assert got.sending_params == everything
        else:  # after the warm-up: exactly the schedule without one
            assert got.sending_params == reference.decision(t).sending_params
            assert planner.plan(t).ops == reference.plan(t).ops
    assert planner.slot(0) == -1 and planner.slot(warmup) == warmup % 3
    with pytest.raises(ValueError, match="warmup_steps"):
        PolicyConfig(warmup_steps=-1)


# --------------------------------------------------------------------------- (e) catch-up defaults
def test_new_plans_recommend_catch_up_and_old_plans_do_not():
    stats = _row_sparse_stats()
    keys = stats.keys
    plan, _, _ = profile(stats=stats, expected_bytes=dict.fromkeys(keys, 8), release_period=4)
    assert plan.low and plan.policy_defaults == {"catch_up": True}
    config = PolicyConfig(policy="importance")
    assert apply_policy_defaults(config, plan).catch_up is True
    assert apply_policy_defaults(config, plan, explicit={"catch_up"}).catch_up is False  # the user's choice
    assert apply_policy_defaults(PolicyConfig(policy="topk"), plan).catch_up is False
    assert apply_policy_defaults(config, None) is config
    old = SyncPlan(release_period=plan.release_period, components=plan.components)  # written before
    assert old.policy_defaults == {} and apply_policy_defaults(config, old) is config
    # no low components or R = 1: nothing is held, nothing to catch up
    one, _, _ = profile(stats=stats, expected_bytes=dict.fromkeys(keys, 8), release_period=1)
    assert one.policy_defaults == {}
    with pytest.raises(ValueError, match="recorded by the profiler"):
        build_plan(scores=score_components(stats), expected_bytes=dict.fromkeys(keys, 8), release_period=4,
                   settings={"policy_defaults": {}})  # fmt: skip


def test_a_bad_recorded_default_is_a_clear_error():
    plan = SyncPlan(
        release_period=2,
        components=(ComponentPlan(key="embedding", score=1.0, cls=ComponentClass.IMPORTANT),),
        settings={"policy_defaults": {"catch_upp": True}},
    )
    with pytest.raises(ValueError, match="catch_upp"):
        apply_policy_defaults(PolicyConfig(policy="importance"), plan)


# --------------------------------------------------------------------------- (f) low_mode "thin"
def _thin_setup(low_mode: str, R: int = 4):
    infos = param_infos(BERT)
    keys = sorted({i.component for i in infos})
    low = {k for k in keys if k != "embedding"}
    comps = [
        ComponentPlan(key=k, score=0.1, cls=ComponentClass.LOW, phase=j % R, expected_bytes=8) if k in low
        else ComponentPlan(key=k, score=1.0, cls=ComponentClass.IMPORTANT)
        for j, k in enumerate(keys)
    ]  # fmt: skip
    plan = SyncPlan(release_period=R, components=tuple(comps))
    config = PolicyConfig(policy="importance", density=0.1, release_period=R, low_mode=low_mode)
    phases = release_phases(plan=plan, config=config, component_keys=keys)
    return infos, config, phases, low


def test_thin_low_components_send_every_step_at_density_over_r():
    R = 4
    infos, config, phases, low = _thin_setup("thin", R)
    planner = StepPlanner(config=config, params=infos, world_size=2, phases=phases)
    assert planner.base_config is config and planner.config.low_mode == "thin"
    assert step_config(config, phases) == planner.config
    everything = frozenset(i.name for i in infos)
    for t in range(2 * R):
        d = planner.decision(t)
        assert d.sending_params == everything  # nothing is held
        k_of = {n: k for op in planner.plan(t).ops if op.kind != OpKind.COUNT_EXCHANGE
                for n, k in zip(op.param_names, op.param_k)}  # fmt: skip
        for i in infos:
            want = nominal_k(i.numel, 0.1 / R if i.component in low else 0.1)
            assert k_of[i.name] == want == config_k(i, planner.config), (t, i.name)
    # about the bytes of holding: per R steps, thin sends ceil(k / R) x R pairs where hold sends k
    held = StepPlanner(config=dataclasses.replace(config, low_mode="hold"), params=infos, world_size=2,
                       phases=phases)  # fmt: skip
    thin_pairs = sum(b.nominal_nnz for t in range(R) for b in planner.decision(t).buckets)
    hold_pairs = sum(b.nominal_nnz for t in range(R) for b in held.decision(t).buckets)
    assert hold_pairs <= thin_pairs <= hold_pairs + R * len(infos)
    assert {frozenset(held.decision(t).sending_params) for t in range(R)} != {everything}


def test_hold_keeps_the_config_and_thin_is_validated():
    _, config, phases, _ = _thin_setup("hold")
    assert step_config(config, phases) is config
    with pytest.raises(ValueError, match="low_mode"):
        PolicyConfig(policy="importance", low_mode="drip")
    with pytest.raises(ValueError, match=r"low_mode.*'importance'"):
        PolicyConfig(policy="topk", low_mode="thin")
    with pytest.raises(ValueError, match=r"density_per_component\[0\.mlp_up\]"):
        PolicyConfig(density_per_component={"0.mlp_up": 0.0})
    with pytest.raises(ValueError, match="density_per_component"):
        PolicyConfig(density_per_component={"0.mlp_up": "a lot"})
    cfg = PolicyConfig(policy="importance", low_mode="thin", density_per_component={"0.mlp_up": 0.002})
    assert PolicyConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.density_of("0.mlp_up") == 0.002 and cfg.density_of("0.attn_q") == cfg.density
