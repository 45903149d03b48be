"""decide_step / release_phases: the per-step decision the simulator and the runtime share."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from igpolicy.choice import dense_allreduce_bytes, sparse_gather_bytes
from igpolicy.config import PolicyConfig
from igpolicy.decide import decide_step, nominal_k, payload_blocks, release_phases
from igpolicy.plan import ComponentPlan, SyncPlan
from igpolicy.vocab import CollectiveKind, ComponentClass, ParamInfo

R = 4
# (component key, importance class) for a two-layer decoder; phases are hand-assigned below
COMPONENTS = {
    "embedding": ComponentClass.IMPORTANT,
    "0.attn_q": ComponentClass.IMPORTANT,
    "0.attn_k": ComponentClass.LOW,
    "0.attn_v": ComponentClass.LOW,
    "0.mlp_up": ComponentClass.LOW,
    "0.mlp_down": ComponentClass.IMPORTANT,
    "1.attn_q": ComponentClass.LOW,
    "1.mlp_up": ComponentClass.LOW,
    "1.norm": ComponentClass.PINNED,
    "head": ComponentClass.IMPORTANT,
}
HAND_PHASES = {"0.attn_k": 0, "0.attn_v": 1, "0.mlp_up": 2, "1.attn_q": 3, "1.mlp_up": 1}


def _params() -> list[ParamInfo]:
    params = []
    for i, key in enumerate(COMPONENTS):
        rows = 64 * (i + 1)
        params.append(
            ParamInfo(name=f"{key}.weight", shape=(rows, 32), dtype="float32", component=key, order=2 * i)
        )
        params.append(
            ParamInfo(name=f"{key}.bias", shape=(rows,), dtype="float32", component=key, order=2 * i + 1)
        )
    return params


PARAMS = _params()
KEYS = sorted(COMPONENTS)


def _plan(*, release_period: int = R, drop: str | None = None, add: str | None = None) -> SyncPlan:
    comps = []
    for key, cls in COMPONENTS.items():
        if key == drop:
            continue
        comps.append(
            ComponentPlan(
                key=key,
                score=1.0 if cls != ComponentClass.LOW else 0.1,
                cls=cls,
                phase=HAND_PHASES[key] % release_period if cls == ComponentClass.LOW else None,
                expected_bytes=1000 * (len(comps) + 1),
            )
        )
    if add is not None:
        comps.append(ComponentPlan(key=add, score=0.0, cls=ComponentClass.LOW, phase=0, expected_bytes=5))
    return SyncPlan(release_period=release_period, components=tuple(comps))


def _params_of(components) -> set[str]:
    return {p.name for p in PARAMS if p.component in components}


def _check_buckets(decision, config, world_size, params=PARAMS):
    """Each sending parameter in exactly one bucket; sizes and collectives follow the oracles."""
    by_name = {p.name: p for p in params}
    names = [n for b in decision.buckets for n in b.param_names]
    assert sorted(names) == sorted(decision.sending_params)
    blocks = {b.name: b for b in payload_blocks(params, config)}
    for b in decision.buckets:
        numel = sum(by_name[n].numel for n in b.param_names)
        assert b.numel == numel
        assert b.size_bytes == sum(blocks[n].size_bytes for n in b.param_names)
        if not config.sparse:
            assert b.collective == CollectiveKind.DENSE_ALLREDUCE and b.nominal_nnz == numel
            continue
        nnz = sum(
            nominal_k(by_name[n].numel, config.density_for(by_name[n].component.split(".")[-1]))
            for n in b.param_names
        )
        assert b.nominal_nnz == nnz
        sparse = sparse_gather_bytes([nnz] * world_size)
        dense = dense_allreduce_bytes(numel, world_size=world_size)
        if config.collective == "auto":
            want = CollectiveKind.SPARSE_GATHER if sparse <= dense else CollectiveKind.DENSE_ALLREDUCE
        else:
            want = CollectiveKind(
                f"{config.collective}_gather" if config.collective == "sparse" else "dense_allreduce"
            )
        assert b.collective == want


@pytest.mark.parametrize("packing", ["ddp", "round_robin", "lpt", "kk"])
def test_dense_sends_every_param_every_step_as_dense_allreduce(packing):
    config = PolicyConfig(policy="dense", packing=packing, num_buckets=3, bucket_cap_bytes=40_000)
    phases = release_phases(plan=None, config=config, component_keys=KEYS)
    assert phases == dict.fromkeys(KEYS)
    for step in range(2 * R):
        d = decide_step(step=step, config=config, params=PARAMS, world_size=4, phases=phases)
        assert d.sending_params == {p.name for p in PARAMS}
        assert d.release.send == set(KEYS) and not d.release.hold
        assert all(b.collective == CollectiveKind.DENSE_ALLREDUCE for b in d.buckets)
        assert sum(b.size_bytes for b in d.buckets) == sum(4 * p.numel for p in PARAMS)
        _check_buckets(d, config, 4)


@pytest.mark.parametrize("world_size", [1, 2, 8, 64])
@pytest.mark.parametrize("collective", ["auto", "sparse", "dense"])
def test_topk_sends_every_param_with_nominal_k(world_size, collective):
    config = PolicyConfig(
        policy="topk", density=0.05, density_per_kind={"mlp_up": 0.5}, collective=collective, num_buckets=4
    )
    phases = release_phases(plan=None, config=config, component_keys=KEYS)
    blocks = {b.name: b for b in payload_blocks(PARAMS, config)}
    for p in PARAMS:
        density = 0.5 if p.component.endswith("mlp_up") else 0.05
        assert blocks[p.name].size_bytes == math.ceil(density * p.numel) * 8
    for step in range(R):
        d = decide_step(step=step, config=config, params=PARAMS, world_size=world_size, phases=phases)
        assert d.sending_params == {p.name for p in PARAMS}
        _check_buckets(d, config, world_size)


def test_importance_releases_low_components_on_their_phase():
    config = PolicyConfig(policy="importance", release_period=R, density=0.1, num_buckets=3)
    plan = _plan()
    phases = release_phases(plan=plan, config=config, component_keys=KEYS)
    low = {k for k, c in COMPONENTS.items() if c == ComponentClass.LOW}
    assert phases == {k: HAND_PHASES.get(k) for k in KEYS}  # plan phases kept when periods agree
    sent_count = dict.fromkeys(_params_of(low), 0)
    for step in range(3, 3 + R):  # any window of R steps
        d = decide_step(step=step, config=config, params=PARAMS, world_size=4, phases=phases)
        due = {k for k in low if HAND_PHASES[k] == step % R}
        assert d.release.send == (set(KEYS) - low) | due
        assert d.release.hold == low - due
        assert d.release.phase == step % R
        assert d.sending_params == _params_of((set(KEYS) - low) | due)
        _check_buckets(d, config, 4)
        for name in d.sending_params & set(sent_count):
            sent_count[name] += 1
    assert set(sent_count.values()) == {1}  # each low parameter exactly once per R steps


def test_importance_resplits_phases_when_periods_differ():
    config = PolicyConfig(policy="importance", release_period=3)
    plan = _plan(release_period=R)
    phases = release_phases(plan=plan, config=config, component_keys=KEYS)
    low = sorted(k for k, c in COMPONENTS.items() if c == ComponentClass.LOW)
    assert all(phases[k] is None for k in KEYS if k not in low)
    assert all(0 <= phases[k] < 3 for k in low)
    expected = plan.by_key
    per_phase = [sum(expected[k].expected_bytes for k in low if phases[k] == p) for p in range(3)]
    total = sum(per_phase)
    assert max(per_phase) * 3 <= total + 3 * max(expected[k].expected_bytes for k in low)


def test_not_staggered_gives_one_burst():
    config = PolicyConfig(policy="importance", release_period=R, staggered=False)
    phases = release_phases(plan=_plan(), config=config, component_keys=KEYS)
    low = {k for k, c in COMPONENTS.items() if c == ComponentClass.LOW}
    for step in range(2 * R):
        d = decide_step(step=step, config=config, params=PARAMS, world_size=2, phases=phases)
        if step % R == R - 1:
            assert d.release.send == set(KEYS)
        else:
            assert d.release.send == set(KEYS) - low and d.release.hold == low


def test_periodic_sends_everything_on_the_last_phase_only():
    config = PolicyConfig(policy="periodic", release_period=R)
    phases = release_phases(plan=None, config=config, component_keys=KEYS)
    for step in range(2 * R):
        d = decide_step(step=step, config=config, params=PARAMS, world_size=2, phases=phases)
        if step % R == R - 1:
            assert d.sending_params == {p.name for p in PARAMS}
        else:
            assert d.sending_params == frozenset() and d.buckets == () and d.num_collectives == 0


def test_plan_mismatch_raises_naming_the_components():
    config = PolicyConfig(policy="importance", release_period=R)
    with pytest.raises(ValueError, match=r"missing from the plan: \['0\.mlp_up'\]"):
        release_phases(plan=_plan(drop="0.mlp_up"), config=config, component_keys=KEYS)
    with pytest.raises(ValueError, match=r"not in the model: \['7\.mlp_down'\]"):
        release_phases(plan=_plan(add="7.mlp_down"), config=config, component_keys=KEYS)
    with pytest.raises(ValueError, match="needs a SyncPlan"):
        release_phases(plan=None, config=config, component_keys=KEYS)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.randoms(use_true_random=False),
    policy=st.sampled_from(["dense", "topk", "importance", "periodic"]),
    packing=st.sampled_from(["ddp", "round_robin", "lpt", "kk"]),
    step=st.integers(0, 100),
)
def test_identical_decisions_for_permuted_param_lists(seed, policy, packing, step):
    config = PolicyConfig(policy=policy, packing=packing, release_period=R, bucket_cap_bytes=30_000)
    plan = _plan() if policy == "importance" else None
    keys = list(KEYS)
    seed.shuffle(keys)
    shuffled = list(PARAMS)
    seed.shuffle(shuffled)
    phases_a = release_phases(plan=plan, config=config, component_keys=KEYS)
    phases_b = release_phases(plan=plan, config=config, component_keys=keys)
    assert phases_a == phases_b
    a = decide_step(step=step, config=config, params=PARAMS, world_size=8, phases=phases_a)
    b = decide_step(step=step, config=config, params=shuffled, world_size=8, phases=phases_b)
    assert a == b


@settings(max_examples=300, deadline=None)
@given(numel=st.integers(0, 10**6), num=st.integers(1, 1000), den=st.integers(1, 1000))
def test_nominal_k_is_ceil_density_times_numel(numel, num, den):
    density = Fraction(min(num, den), den)
    k = nominal_k(numel, float(density))
    if numel == 0:
        assert k == 0
    else:
        assert k == min(numel, max(1, math.ceil(density * numel)))
        assert 1 <= k <= numel


def test_world_size_must_be_positive():
    config = PolicyConfig(policy="dense")
    phases = release_phases(plan=None, config=config, component_keys=KEYS)
    with pytest.raises(ValueError, match="world_size"):
        decide_step(step=0, config=config, params=PARAMS, world_size=0, phases=phases)


def test_param_of_a_component_without_a_phase_is_an_error():
    config = PolicyConfig(policy="topk")
    phases = release_phases(plan=None, config=config, component_keys=[k for k in KEYS if k != "head"])
    with pytest.raises(ValueError, match="head"):
        decide_step(step=0, config=config, params=PARAMS, world_size=2, phases=phases)


def test_random_models_every_sending_param_in_one_bucket():
    rng = random.Random(3)
    params = [
        ParamInfo(
            name=f"p{i}",
            shape=(rng.randint(1, 300), rng.randint(1, 30)),
            dtype="float32",
            component=rng.choice(KEYS),
            order=i,
        )
        for i in range(200)
    ]
    for policy in ("dense", "topk", "importance"):
        config = PolicyConfig(policy=policy, release_period=R, num_buckets=7, density=0.3)
        phases = release_phases(plan=_plan(), config=config, component_keys=KEYS)
        for step in range(R):
            d = decide_step(step=step, config=config, params=params, world_size=4, phases=phases)
            want = {
                p.name for p in params if phases[p.component] in (None, step % R) or policy != "importance"
            }
            assert d.sending_params == want
            _check_buckets(d, config, 4, params=params)
