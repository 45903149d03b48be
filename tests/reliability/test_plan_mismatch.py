"""A SyncPlan that does not match the model, or differs between ranks, stops the run before step 0.

Every refusal is a ValueError whose message names the difference: the components the plan lacks,
the components the model lacks, or the ranks and fingerprints that disagree — on every rank, never a
hang (the distributed cases run with a hard timeout). Oracle for "names the difference": the exact
component keys removed from or added to a plan built from the model.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from igpolicy.config import PolicyConfig
from igpolicy.plan import ComponentPlan, SyncPlan
from igpolicy.vocab import ComponentClass
from igrt.sync.checkpoint import load_sync_state, save_sync_state
from igrt.sync.synchronizer import Synchronizer, build_param_infos, named_parameters
from tests.igrt.dist_util import DistPool
from tests.igrt.tiny_model import TinyLM, make_plan

torch.set_num_threads(1)
CONFIG = PolicyConfig(policy="importance", density=0.1, release_period=2)


def _model() -> TinyLM:
    torch.manual_seed(0)
    return TinyLM(d=8, num_layers=2)


def _plan(model) -> SyncPlan:
    return make_plan(build_param_infos(named_parameters(model)), release_period=2)


def _without(plan: SyncPlan, key: str) -> SyncPlan:
    return dataclasses.replace(plan, components=tuple(c for c in plan.components if c.key != key))


def _with_extra(plan: SyncPlan, key: str) -> SyncPlan:
    extra = ComponentPlan(key=key, score=0.5, cls=ComponentClass.IMPORTANT)
    return dataclasses.replace(plan, components=(*plan.components, extra))


# ----------------------------------------------------------------------------- one process
def test_missing_and_extra_components_are_named() -> None:
    model = _model()
    plan = _plan(model)
    gone = sorted(plan.by_key)[1]
    added = "7.attn_q"
    for bad, missing, extra in (
        (_without(plan, gone), [gone], []),
        (_with_extra(plan, added), [], [added]),
        (_with_extra(_without(plan, gone), added), [gone], [added]),
    ):
        with pytest.raises(ValueError) as info:
            Synchronizer(model, config=CONFIG, plan=bad)
        message = str(info.value)
        assert bad.fingerprint in message
        assert f"components missing from the plan: {missing or 'none'}" in message, message
        assert f"components in the plan but not in the model: {extra or 'none'}" in message, message


def test_importance_without_a_plan_refuses() -> None:
    with pytest.raises(ValueError, match="needs a SyncPlan"):
        Synchronizer(_model(), config=CONFIG, plan=None)


def test_a_checkpoint_of_another_plan_is_refused(tmp_path) -> None:
    model = _model()
    plan = _plan(model)
    sync = Synchronizer(model, config=CONFIG, plan=plan)
    save_sync_state(sync, tmp_path, rank=0)
    other = make_plan(build_param_infos(named_parameters(model)), release_period=2, low_every=3)
    resumed = Synchronizer(model, config=CONFIG, plan=other)
    with pytest.raises(ValueError, match=rf"plan: saved '{plan.fingerprint}', now '{other.fingerprint}'"):
        load_sync_state(resumed, tmp_path, rank=0)


def test_igrt_train_refuses_a_plan_of_another_model(tmp_path, capsys) -> None:
    """The CLI checks before any rank starts: exit status 2, a one-line error naming components."""
    from igrt.cli import main
    from igrt.workloads import make_workload

    model = make_workload("minilm", tiny=True, seed=0).model
    plan = make_plan(build_param_infos(named_parameters(model)), release_period=2)
    gone = sorted(plan.by_key)[0]
    path = _without(_with_extra(plan, "9.mlp_up"), gone).save(tmp_path / "plan.json")
    code = main(["train", "--workload", "minilm", "--tiny", "--policy", "importance", "--plan", str(path),
                 "--nproc", "2", "--steps", "2", "--no-progress", "--out", str(tmp_path / "run")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2
    assert "Traceback" not in err
    assert f"missing from the plan: [{gone!r}]" in err and "not in the model: ['9.mlp_up']" in err, err
    assert not (tmp_path / "run" / "metrics.csv").exists()


# ----------------------------------------------------------------------------- two ranks
def _build_with(rank: int, world: int, plan_on: dict) -> str:
    """Build a Synchronizer with this rank's plan; return the ValueError's message (or '' if none)."""
    model = _model()
    plan = _plan(model)
    change = plan_on.get(rank)
    if change == "reordered phases":
        plan = make_plan(build_param_infos(named_parameters(model)), release_period=2, low_every=3)
    elif change == "missing component":
        plan = _without(plan, sorted(plan.by_key)[1])
    try:
        Synchronizer(model, config=CONFIG, plan=plan)
    except ValueError as e:
        return str(e)
    return ""


@pytest.fixture(scope="module")
def pool():
    with DistPool(world_size=2) as p:
        yield p


def test_another_fingerprint_on_another_rank_fails_on_every_rank(pool) -> None:
    messages = pool.run(_build_with, args=({1: "reordered phases"},), timeout_s=60)
    model = _model()
    mine = _plan(model).fingerprint
    theirs = make_plan(build_param_infos(named_parameters(model)), release_period=2, low_every=3).fingerprint
    for r, message in enumerate(messages):
        assert message, f"rank {r} started although rank 1's plan differs"
        assert re.search(rf"plan differs \(rank 0: {mine}, rank 1: {theirs}\)", message), message


def test_a_plan_missing_a_component_on_one_rank_fails_on_every_rank_without_hanging(pool) -> None:
    messages = pool.run(_build_with, args=({1: "missing component"},), timeout_s=10, grace_s=5)
    for r, message in enumerate(messages):
        assert re.search(r"plan differs \(rank 0: \w+, rank 1: \w+\)", message), f"rank {r}: {message!r}"
    assert "missing from the plan" in messages[1], messages[1]
