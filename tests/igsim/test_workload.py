"""Workloads: from traces (means over ranks), jitter, built-in architectures, plan transfer."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from igpolicy.components import map_parameters
from igpolicy.plan import ComponentPlan, SyncPlan
from igpolicy.vocab import ComponentClass, ComponentId, ComponentKind, ParamInfo
from igsim.step.architectures import (
    ACCELERATORS,
    ARCHITECTURES,
    Architecture,
    architecture_params,
    architecture_workload,
    ready_fractions,
    transfer_plan,
)
from igsim.step.workload import Jitter, Workload
from traces.reader import read_trace
from traces.samples import write_synthetic_trace

PARAM_NAMES = Path(__file__).resolve().parents[1] / "igpolicy" / "data" / "param_names.json"


# ----------------------------------------------------------------------------------- from_trace
@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("trace")
    write_synthetic_trace(d, num_steps=6, world_size=3, density=0.05, seed=1)
    return d


def test_from_trace_is_the_mean_over_ranks(trace_dir: Path) -> None:
    w = Workload.from_trace(trace_dir)
    trace = read_trace(trace_dir)
    names = [p.name for p in w.params]
    assert names == list(trace.manifest.param_names)
    assert w.ready_s.shape == (6, len(names)) and w.k.shape == (6, len(names))
    # oracle: a plain loop over the rows
    P = trace.params
    for j, name in enumerate(names):
        code = trace.param_names.index(name)
        for t in range(6):
            sel = (P["param"] == code) & (P["step"] == t)
            assert w.ready_s[t, j] == pytest.approx(P["ready_s"][sel].mean())
            assert w.k[t, j] == round(P["k"][sel].mean())
    S = trace.steps
    for t in range(6):
        sel = S["step"] == t
        assert w.forward_s[t] == pytest.approx(S["forward_s"][sel].mean())
        assert w.backward_s[t] == pytest.approx(S["backward_s"][sel].mean())
        assert w.optimizer_s[t] == pytest.approx(S["optimizer_s"][sel].mean())
    assert w.k_density == pytest.approx(0.05)
    assert np.all(w.k <= w.numel[None, :])


def test_from_trace_window_and_cycling(trace_dir: Path) -> None:
    full = Workload.from_trace(trace_dir)
    w = Workload.from_trace(trace_dir, window=(2, 5))
    assert w.num_recorded_steps == 3
    np.testing.assert_allclose(w.ready_s, full.ready_s[2:5])
    assert [w.recorded_index(s) for s in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    with pytest.raises(ValueError, match="window"):
        Workload.from_trace(trace_dir, window=(5, 2))


def test_from_trace_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no such trace"):
        Workload.from_trace(tmp_path / "missing")


def test_workload_validation() -> None:
    p = (ParamInfo(name="a", shape=(4,), dtype="float32", component="norm", order=0),)
    with pytest.raises(ValueError, match="ready_s"):
        Workload(name="x", params=p, ready_s=np.zeros((1, 2)), forward_s=[0], backward_s=[0], optimizer_s=[0])
    with pytest.raises(ValueError, match="backward_s"):
        Workload(
            name="x", params=p, ready_s=np.zeros((1, 1)), forward_s=[0], backward_s=[-1], optimizer_s=[0]
        )
    w = Workload(
        name="x", params=p, ready_s=np.zeros((1, 1)), k=[[9]], forward_s=[0], backward_s=[0], optimizer_s=[0]
    )
    assert w.k[0, 0] == 4  # clipped to numel


# ----------------------------------------------------------------------------------------- jitter
def test_jitter_identity_and_straggler() -> None:
    assert Jitter().is_identity
    assert np.all(Jitter().factors(step=3, num_ranks=5) == 1.0)
    j = Jitter(straggler_rank=2, straggler_slowdown=1.5)
    assert not j.is_identity
    assert list(j.factors(step=0, num_ranks=4)) == [1.0, 1.0, 1.5, 1.0]
    with pytest.raises(ValueError, match="straggler_rank"):
        j.factors(step=0, num_ranks=2)
    with pytest.raises(ValueError, match="compute_cv"):
        Jitter(compute_cv=-0.1)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31), cv=st.floats(0.01, 0.5), step=st.integers(0, 10_000))
def test_jitter_is_seeded_with_mean_one(seed: int, cv: float, step: int) -> None:
    j = Jitter(seed=seed, compute_cv=cv)
    a = j.factors(step=step, num_ranks=4000)
    assert np.array_equal(a, j.factors(step=step, num_ranks=4000))
    assert np.all(a > 0)
    assert a.mean() == pytest.approx(1.0, abs=5 * cv / math.sqrt(4000))
    assert a.std() == pytest.approx(cv, rel=0.2)


# ---------------------------------------------------------------------------------- architectures
@pytest.mark.parametrize(
    "name, published",
    [
        ("llama-7b", 6.74e9),
        ("llama-13b", 13.02e9),
        ("llama-70b", 68.98e9),
        ("opt-1.3b", 1.316e9),
        ("opt-6.7b", 6.658e9),
        ("gpt-neox-20b", 20.55e9),
        ("pythia-160m", 162.3e6),
        ("pythia-1b", 1.012e9),
    ],
)
def test_parameter_counts_match_published(name: str, published: float) -> None:
    params = architecture_params(name)
    assert sum(p.numel for p in params) == pytest.approx(published, rel=0.003)
    assert map_parameters([p.name for p in params]).unknown == ()
    ids = [ComponentId.from_key(p.component) for p in params]
    layers = {c.layer for c in ids if c.layer is not None}
    assert layers == set(range(ARCHITECTURES[name].num_layers))


def test_llama_70b_uses_grouped_query_attention() -> None:
    shapes = dict(ARCHITECTURES["llama-70b"].named_shapes())
    assert shapes["model.layers.0.self_attn.k_proj.weight"] == (1024, 8192)  # 8 kv heads x 128
    assert shapes["model.layers.0.self_attn.q_proj.weight"] == (8192, 8192)


@pytest.mark.skipif(not PARAM_NAMES.exists(), reason="tests/igpolicy/data/param_names.json not generated")
@pytest.mark.parametrize("family", ["llama", "opt", "gpt_neox"])
def test_names_and_shapes_match_transformers(family: str) -> None:
    """Oracle: named_parameters() of tiny transformers models of the same family (recorded JSON)."""
    entry = json.loads(PARAM_NAMES.read_text())[family]
    real = [(n, tuple(s)) for n, s in entry["params"]]
    d = dict(real)
    first = real[0][1]
    inter = {
        "llama": lambda: d["model.layers.0.mlp.up_proj.weight"][0],
        "opt": lambda: d["model.decoder.layers.0.fc1.weight"][0],
        "gpt_neox": lambda: d["gpt_neox.layers.0.mlp.dense_h_to_4h.weight"][0],
    }[family]()
    arch = Architecture(
        name="tiny",
        family=family,
        hidden=first[1],
        num_layers=entry["num_layers"],
        num_heads=entry["attn"]["num_heads"],
        num_kv_heads=entry["attn"]["num_kv_heads"],
        intermediate=inter,
        vocab=first[0],
        max_positions=d.get("model.decoder.embed_positions.weight", (2050,))[0] - 2,
        tie_embeddings="lm_head.weight" not in d,
    )
    assert arch.named_shapes() == real


def test_roofline_workload() -> None:
    w = architecture_workload("llama-7b", accelerator="a100", utilisation=0.5, tokens_per_step=1000)
    n_matmul = sum(p.numel for p in w.params if "embed_tokens" not in p.name)
    total = 6 * n_matmul * 1000 / (312e12 * 0.5)
    assert w.forward_s[0] == pytest.approx(total / 3)
    assert w.backward_s[0] == pytest.approx(2 * total / 3)
    n_all = sum(p.numel for p in w.params)
    assert w.optimizer_s[0] == pytest.approx(n_all * 28 / ACCELERATORS["a100"].hbm_bytes_per_s)
    assert w.k is None and w.num_recorded_steps == 1
    # readiness: the head first, then layers from last to first, the embedding last
    by = {p.name: w.ready_s[0, i] for i, p in enumerate(w.params)}
    assert by["lm_head.weight"] < by["model.layers.31.mlp.down_proj.weight"]
    assert by["model.layers.31.self_attn.q_proj.weight"] < by["model.layers.0.self_attn.q_proj.weight"]
    assert by["model.embed_tokens.weight"] == pytest.approx(w.backward_s[0])
    with pytest.raises(ValueError, match="accelerator"):
        architecture_workload("llama-7b", accelerator="tpu")
    with pytest.raises(ValueError, match="unknown architecture"):
        architecture_workload("llama-8b")


def test_ready_fractions_are_monotone_in_backward_order() -> None:
    params = architecture_params("pythia-160m")
    frac = ready_fractions(params)
    assert np.all((frac >= 0) & (frac <= 1))
    layer = np.array(
        [
            ComponentId.from_key(p.component).layer
            if ComponentId.from_key(p.component).layer is not None
            else -1
            for p in params
        ]
    )
    for a in range(11):
        assert frac[layer == a + 1].max() <= frac[layer == a].min() + 1e-12


# -------------------------------------------------------------------------------- transfer_plan
def _small_plan() -> tuple[SyncPlan, list[ParamInfo]]:
    """A plan on a 2-layer LLaMA-like model: layer 1 (deep) attention important, the rest low."""
    arch = Architecture(
        name="t", family="llama", hidden=32, num_layers=2, num_heads=4, intermediate=64, vocab=100
    )
    src = architecture_params(arch)
    comps = []
    for key in sorted({p.component for p in src}):
        cid = ComponentId.from_key(key)
        important = (cid.layer == 1 and cid.kind.value.startswith("attn")) or cid.kind == ComponentKind.HEAD
        comps.append(
            ComponentPlan(
                key=key,
                score=0.9 if important else 0.1,
                cls=ComponentClass.IMPORTANT if important else ComponentClass.LOW,
                phase=None if important else 0,
                expected_bytes=8,
            )
        )
    return SyncPlan(release_period=2, components=tuple(comps), settings={"density": 0.01}), src


def test_transfer_plan_by_kind_and_relative_depth() -> None:
    plan, src = _small_plan()
    dst = architecture_params("llama-7b")
    moved = transfer_plan(plan, src, dst)
    assert {c.key for c in moved.components} == {p.component for p in dst}
    for c in moved.components:
        cid = ComponentId.from_key(c.key)
        deep_attn = cid.layer is not None and cid.layer >= 16 and cid.kind.value.startswith("attn")
        expect = deep_attn or cid.kind == ComponentKind.HEAD
        assert (c.cls == ComponentClass.IMPORTANT) == expect, c.key
        if c.cls == ComponentClass.LOW:
            assert 0 <= c.phase < 2
    phases = [c.phase for c in moved.components if c.cls == ComponentClass.LOW]
    assert set(phases) == {0, 1}  # re-balanced over the period
    assert moved.source["transferred_from"] == plan.fingerprint
    assert SyncPlan.from_json(moved.to_json()).fingerprint == moved.fingerprint


def test_transfer_plan_fused_and_unmatched() -> None:
    plan, _src = _small_plan()
    dst = architecture_params("pythia-160m")  # fused qkv, LayerNorm biases, no gate
    moved = transfer_plan(plan, None, dst)
    by = moved.by_key
    assert by["11.attn_qkv"].cls == ComponentClass.IMPORTANT  # from layer 1's q/k/v
    assert by["0.attn_qkv"].cls == ComponentClass.LOW
    assert moved.source["unmatched"] == []
    other = [
        *dst,
        ParamInfo(name="weird.thing", shape=(3,), dtype="float32", component="other", order=10_000),
    ]
    moved = transfer_plan(plan, None, other)
    assert moved.by_key["other"].cls == ComponentClass.PINNED
    assert moved.source["unmatched"] == ["other"]
    with pytest.raises(ValueError, match="does not match the source"):
        transfer_plan(plan, dst, dst)


def test_gradient_accumulation_shifts_readiness_to_the_last_backward_pass() -> None:
    p = tuple(
        ParamInfo(name=f"w{i}", shape=(4,), dtype="float32", component=f"{i}.mlp_up", order=i)
        for i in range(2)
    )
    w = Workload(
        name="acc",
        params=p,
        ready_s=[[0.01, 0.5]],
        forward_s=[0.3],
        backward_s=[0.8],
        optimizer_s=[0.0],
        grad_accum_steps=4,
    )
    # 4 passes of 0.2 s: the last starts at 0.6 s; 0.5 s is clipped to its end
    np.testing.assert_allclose(w.ready_since_backward(0), [0.61, 0.8])
    one = Workload(
        name="one", params=p, ready_s=[[0.01, 0.9]], forward_s=[0.3], backward_s=[0.8], optimizer_s=[0.0]
    )
    np.testing.assert_allclose(one.ready_since_backward(0), [0.01, 0.8])
