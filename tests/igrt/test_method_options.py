"""Issue 15's method options in the runtime: the warm-up, small vectors sent whole and fresh
components go through the Synchronizer's step plans with Σg == Σsent + e; igrt train's flags set
them, and a plan's recommended catch-up applies unless the user chose."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from igpolicy.config import PolicyConfig
from igpolicy.plan import ComponentPlan, SyncPlan
from igpolicy.vocab import ComponentClass
from igrt.sync.synchronizer import Synchronizer, build_param_infos, named_parameters
from tests.igrt.tiny_model import TinyLM, make_plan

torch.set_num_threads(1)


def _tokens(step: int) -> torch.Tensor:
    return torch.randint(0, 50, (3, 9), generator=torch.Generator().manual_seed(step))


def _plan(infos, release_period: int) -> SyncPlan:
    """make_plan over the pretrained components, the fresh one pinned (as the profiler does)."""
    base = make_plan([i for i in infos if i.component != "fresh"], release_period=release_period)
    fresh = (
        [ComponentPlan(key="fresh", score=0.0, cls=ComponentClass.PINNED)]
        if any(i.component == "fresh" for i in infos)
        else []
    )
    return SyncPlan(release_period=release_period, components=(*base.components, *fresh))


def _run(config: PolicyConfig, *, steps: int):
    torch.manual_seed(0)
    model = TinyLM()
    infos = build_param_infos(named_parameters(model), fresh=config.fresh_patterns)
    plan = _plan(infos, config.release_period) if config.policy == "importance" else None
    sync = Synchronizer(model, config=config, plan=plan, track_sums=True)
    sent, k = [], []
    for t in range(steps):
        model.zero_grad(set_to_none=True)
        model.loss(_tokens(t)).backward()
        sync.step()
        sent.append({n for n, p in sync.params.items() if p.grad is not None})
        k.append(dict(sync.last_run.sent_k))
        gaps = sync.residuals.conservation_gap()
        assert max(gaps.values()) < 1e-5, gaps  # no gradient mass lost
    return sync, sent, k


def test_warmup_sends_every_parameter_then_follows_the_plan():
    config = PolicyConfig(policy="importance", density=0.2, release_period=3, warmup_steps=4)
    sync, sent, _ = _run(config, steps=10)
    everything = set(sync.params)
    assert all(s == everything for s in sent[:4])
    plain, plain_sent, _ = _run(PolicyConfig(policy="importance", density=0.2, release_period=3), steps=10)
    for t in range(4, 10):  # after the warm-up, the same parameters send as without one
        assert sent[t] == {n for n in plain.params if n in plain.plan_step(t).sending_params}
        assert sent[t] != everything
    assert plain_sent[:4] != [everything] * 4


def test_small_parameters_send_every_entry_in_the_runtime():
    config = PolicyConfig(policy="topk", density=0.05, dense_small_numel=16)
    sync, _, k = _run(config, steps=3)
    small = {n for n, p in sync.params.items() if p.numel() <= 16}
    assert small  # the LayerNorm weights and biases
    for step_k in k:
        for n in small:
            assert step_k[n] == sync.params[n].numel()
        big = [n for n in sync.params if n not in small]
        assert all(step_k[n] < sync.params[n].numel() for n in big)


def test_fresh_parameters_form_their_own_component():
    config = PolicyConfig(policy="importance", density=0.2, release_period=2, fresh_patterns=("lm_head",))
    sync, sent, _ = _run(config, steps=4)
    assert sync.component["lm_head.weight"] == "fresh"
    assert {n for n, c in sync.component.items() if c == "fresh"} == {"lm_head.weight"}
    assert sync.phases["fresh"] is None and all("lm_head.weight" in s for s in sent)  # every step
    # a plan with a fresh component and a run without the patterns: one clear error
    model = TinyLM()
    plan = _plan(build_param_infos(named_parameters(model), fresh=("lm_head",)), 2)
    with pytest.raises(ValueError, match=r"fresh_patterns \(--fresh\)"):
        Synchronizer(model, config=PolicyConfig(policy="importance", release_period=2), plan=plan)


def _parser():
    from igrt.cli.train import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser


def test_igrt_train_flags_set_the_method_options():
    from igrt.cli.train import policy_config

    args = _parser().parse_args(
        ["--workload", "gpt", "--policy", "topk", "--fresh", "auto", "--fresh", "*.ln_f.*",
         "--dense-small", "4096", "--sync-warmup-steps", "20"]
    )  # fmt: skip
    config = policy_config(args)
    assert config.fresh_patterns == ("auto", "*.ln_f.*")
    assert config.dense_small_numel == 4096 and config.warmup_steps == 20
    plain = policy_config(_parser().parse_args(["--workload", "gpt", "--policy", "topk"]))
    assert (plain.fresh_patterns, plain.dense_small_numel, plain.warmup_steps) == ((), 0, 0)
    with pytest.raises(ValueError, match="warmup_steps"):
        policy_config(
            _parser().parse_args(["--workload", "gpt", "--policy", "topk", "--sync-warmup-steps", "-1"])
        )


def test_a_new_plan_turns_catch_up_on_unless_the_user_chose(tmp_path):
    from igrt.cli.train import options_from_args
    from igrt.workloads import make_workload

    infos = build_param_infos(named_parameters(make_workload("gpt", tiny=True, seed=0).model))
    old = make_plan(infos, release_period=3)
    new = SyncPlan(
        release_period=3, components=old.components, settings={"policy_defaults": {"catch_up": True}}
    )
    old.save(tmp_path / "old.json")
    new.save(tmp_path / "new.json")
    base = ["--workload", "gpt", "--tiny", "--policy", "importance", "--out", str(tmp_path / "o")]

    def catch_up(*extra: str) -> bool:
        return options_from_args(_parser().parse_args([*base, *extra])).config.catch_up

    assert catch_up("--plan", str(tmp_path / "new.json")) is True
    assert catch_up("--plan", str(tmp_path / "old.json")) is False  # plans written before: unchanged
    assert catch_up("--plan", str(tmp_path / "new.json"), "--no-catch-up") is False
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"catch_up": False}))
    assert catch_up("--plan", str(tmp_path / "new.json"), "--config", str(cfg)) is False
