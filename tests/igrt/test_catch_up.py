"""Catch-up (config.catch_up): a released parameter's optimizer update is scaled by the steps it held.

Oracle: a twin model with the same gradients and catch-up off. Both start equal; on every step a
parameter's catch-up delta must be ``h`` times the twin's delta from the same starting point, where
``h`` is the number of steps since that parameter's previous gradient (1 for important components).
"""

from __future__ import annotations

import copy

import pytest
import torch

from igpolicy.config import PolicyConfig
from igrt.sync.catch_up import CatchUp
from igrt.sync.synchronizer import Synchronizer, build_param_infos, named_parameters
from tests.igrt.tiny_model import TinyLM, make_plan

torch.set_num_threads(1)


def _tokens(step: int) -> torch.Tensor:
    return torch.randint(0, 50, (3, 9), generator=torch.Generator().manual_seed(step))


def test_catch_up_hooks_scale_the_update_of_one_parameter():
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0, 3.0]))
    opt = torch.optim.SGD([p], lr=0.5)
    scales = {"w": 3}
    cu = CatchUp({"w": p}, lambda: scales).attach(opt)
    p.grad = torch.tensor([1.0, 1.0, -2.0])
    opt.step()  # SGD alone: [0.5, -2.5, 4.0]; delta [-0.5, -0.5, 1.0] times 3
    assert torch.allclose(p.detach(), torch.tensor([-0.5, -3.5, 6.0]))
    scales["w"] = 1
    opt.step()  # scale 1: plain step
    assert torch.allclose(p.detach(), torch.tensor([-1.0, -4.0, 7.0]))
    assert cu.applied == 1
    with pytest.raises(RuntimeError, match="already attached"):
        cu.attach(opt)
    cu.detach()
    scales["w"] = 5
    opt.step()
    assert torch.allclose(p.detach(), torch.tensor([-1.5, -4.5, 8.0]))


def _pair(config_kwargs):
    torch.manual_seed(0)
    model = TinyLM()
    twin = copy.deepcopy(model)
    plan = make_plan(build_param_infos(named_parameters(model)), release_period=4, low_every=2)
    on = Synchronizer(model, config=PolicyConfig(catch_up=True, **config_kwargs), plan=plan)
    off = Synchronizer(twin, config=PolicyConfig(**config_kwargs), plan=plan)
    return model, twin, on, off, plan


def test_importance_policy_with_adam_scales_released_updates_by_held_steps():
    model, twin, on, off, _ = _pair({"policy": "importance", "density": 0.2, "release_period": 4})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    opt_twin = torch.optim.AdamW(twin.parameters(), lr=1e-2, weight_decay=0.01)
    with pytest.raises(RuntimeError, match="attach_optimizer"):
        model.loss(_tokens(0)).backward()
        on.step()
    model.zero_grad(set_to_none=True)
    on.attach_optimizer(opt)
    last = dict.fromkeys(on.params, -1)
    seen_scales: set[int] = set()
    for t in range(9):
        before = {n: p.detach().clone() for n, p in on.params.items()}
        for m in (model, twin):
            m.zero_grad(set_to_none=True)
            m.loss(_tokens(t)).backward()
        on.step()
        off.step()
        for n, p in on.params.items():  # same grads going in: the twin's state equals ours before
            assert (p.grad is None) == (off.params[n].grad is None)
            if p.grad is not None:
                assert torch.equal(p.grad, off.params[n].grad)
        scales = on.update_scales()
        assert set(scales) == {n for n, p in on.params.items() if p.grad is not None}
        for n, h in scales.items():
            assert h == t - last[n]
            last[n] = t
        seen_scales |= set(scales.values())
        opt.step()
        opt_twin.step()
        for n, p in on.params.items():
            h = scales.get(n, 0)
            delta, twin_delta = p.detach() - before[n], off.params[n].detach() - before[n]
            if h == 0:
                assert torch.equal(delta, torch.zeros_like(delta))  # no grad, no step
            else:
                assert torch.allclose(delta, h * twin_delta, rtol=1e-5, atol=1e-7)
            off.params[n].data.copy_(p.detach())  # keep the twin at our weights for the next step
    assert {1, 4} <= seen_scales and max(seen_scales) == 4  # important 1, low releases every 4 steps
    # the end-of-training flush: every parameter gets its residual, and catch-up never rescales it
    # (issue 15: it carries what was held, not a release; scaling it moved accuracy by -8..+14 points)
    held = [n for n in on.params if 8 - last[n] > 1]
    assert held, "some parameter must be held at the end for the flush to matter"
    for m in (model, twin):
        m.zero_grad(set_to_none=True)
    on.flush()
    flush_scales = on.update_scales()
    assert set(held) <= set(flush_scales) and set(flush_scales.values()) == {1}
    applied = on._catch_up.applied
    before = {n: p.detach().clone() for n, p in on.params.items()}
    for n, p in on.params.items():
        off.params[n].grad = None if p.grad is None else p.grad.clone()
    opt.step()
    opt_twin.step()
    assert on._catch_up.applied == applied  # nothing rescaled
    for n, p in on.params.items():
        assert torch.allclose(p.detach() - before[n], off.params[n].detach() - before[n], rtol=1e-5, atol=1e-7)


def test_catch_up_changes_nothing_for_top_k_and_checkpoints_keep_the_last_sends():
    model, twin, on, off, _ = _pair({"policy": "topk", "density": 0.2})
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    opt_twin = torch.optim.Adam(twin.parameters(), lr=1e-2)
    cu = on.attach_optimizer(opt)
    for t in range(3):
        for m, s, o in ((model, on, opt), (twin, off, opt_twin)):
            m.zero_grad(set_to_none=True)
            m.loss(_tokens(t)).backward()
            s.step()
            o.step()
        assert set(on.update_scales().values()) == {1}
    assert cu is not None and cu.applied == 0
    for a, b in zip(model.parameters(), twin.parameters()):
        assert torch.equal(a, b)
    sd = on.state_dict()
    assert sd["last_sent"] == dict.fromkeys(on.params, 2)
    fresh = Synchronizer(copy.deepcopy(model), config=on.config, plan=on.plan)
    fresh.load_state_dict(sd)
    assert fresh.last_sent == on.last_sent
    old = {k: v for k, v in sd.items() if k != "last_sent"}  # a state written before catch-up existed
    fresh.load_state_dict(old)
    assert fresh.last_sent == dict.fromkeys(on.params, 2)


def test_catch_up_config_rules():
    with pytest.raises(ValueError, match=r"catch_up.*skip_unsent"):
        PolicyConfig(catch_up=True, skip_unsent=False)
    with pytest.raises(ValueError, match=r"catch_up.*true or false"):
        PolicyConfig(catch_up=1)
    sync = Synchronizer(TinyLM(), config=PolicyConfig(policy="topk"), plan=None)
    assert sync.attach_optimizer(torch.optim.SGD(sync.params.values(), lr=0.1)) is None  # off: nothing


# --------------------------------------------------------------------------- the DDP hook, 2 ranks
def _ddp_catch_up_worker(rank: int, world: int):
    from torch.nn.parallel import DistributedDataParallel as DDP

    from igrt.integrations.ddp_hook import ImportanceHookState, importance_hook

    torch.manual_seed(0)
    model = TinyLM()
    plan = make_plan(build_param_infos(named_parameters(model)), release_period=3, low_every=2)
    ddp = DDP(model, bucket_cap_mb=0.02)
    state = ImportanceHookState(
        ddp, config=PolicyConfig(policy="importance", density=0.2, release_period=3, catch_up=True), plan=plan
    )
    ddp.register_comm_hook(state, importance_hook)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    state.attach(opt)  # finish_step, then catch-up's pre-hook
    last = dict.fromkeys(state.sync.params, -1)
    for t in range(7):
        opt.zero_grad(set_to_none=True)
        tokens = torch.randint(0, 50, (3, 9), generator=torch.Generator().manual_seed(100 * rank + t))
        logits = ddp(tokens[:, :-1])
        torch.nn.functional.cross_entropy(logits.reshape(-1, 50), tokens[:, 1:].reshape(-1)).backward()
        opt.step()
        scales = state.sync.update_scales()
        assert scales, f"step {t}: no parameter recorded as sent"
        for n, h in scales.items():
            assert h == t - last[n], (n, t, h, last[n])
            last[n] = t
    applied = state.sync._catch_up.applied
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(world)]
    torch.distributed.all_gather(gathered, flat)
    assert torch.equal(gathered[0], gathered[1])  # scaled updates keep the replicas identical
    return applied


def test_ddp_hook_with_catch_up_keeps_replicas_identical():
    from tests.igrt.dist_util import run_distributed

    applied = run_distributed(_ddp_catch_up_worker, world_size=2, timeout_s=120)
    assert applied[0] == applied[1] > 0


def test_igrt_train_flag_sets_catch_up(tmp_path):
    import argparse
    import json

    from igrt.cli.train import add_arguments, policy_config

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert policy_config(parser.parse_args(["--workload", "gpt", "--policy", "topk"])).catch_up is False
    assert policy_config(parser.parse_args(["--workload", "gpt", "--policy", "topk", "--catch-up"])).catch_up
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"policy": "importance", "catch_up": True}))
    args = parser.parse_args(["--workload", "gpt", "--config", str(cfg), "--no-catch-up"])
    assert policy_config(args).catch_up is False  # the flag overrides the file
    cfg.write_text(json.dumps({"policy": "importance", "catch_up": True, "skip_unsent": False}))
    with pytest.raises(ValueError, match="skip_unsent"):
        policy_config(parser.parse_args(["--workload", "gpt", "--config", str(cfg)]))


def test_config_fingerprint_of_states_saved_before_catch_up_existed():
    import hashlib
    import json

    from igrt.sync.setup import default_sparsifier, fingerprint_parts

    infos = build_param_infos(named_parameters(TinyLM()))

    def fp(config):
        return fingerprint_parts(plan=None, config=config, infos=infos, sparsifier=default_sparsifier(config))

    config = PolicyConfig(policy="topk")
    # the dict of older versions: neither catch_up, nonfinite nor the issue-15 keys existed
    added = (
        "catch_up", "nonfinite", "fresh_patterns", "dense_small_numel", "warmup_steps",
        "online_window", "replan_every", "max_share", "density_per_component", "low_mode", "online_control",
    )  # fmt: skip
    before = {k: v for k, v in config.to_dict().items() if k not in added}
    text = json.dumps(before, sort_keys=True, separators=(",", ":"), default=str)
    assert fp(config)["config"] == hashlib.sha256(text.encode()).hexdigest()[:16]
    assert fp(PolicyConfig(policy="topk", catch_up=True))["config"] != fp(config)["config"]
    assert fp(PolicyConfig(policy="topk", nonfinite="error"))["config"] != fp(config)["config"]
    online = {"online_window": 5, "replan_every": 5}
    assert fp(PolicyConfig(policy="importance", **online, max_share=0.2))["config"] != fp(
        PolicyConfig(policy="importance", **online)
    )["config"]
    for changed in ({"fresh_patterns": ("auto",)}, {"dense_small_numel": 4096}, {"warmup_steps": 5}):
        assert fp(PolicyConfig(policy="topk", **changed))["config"] != fp(config)["config"], changed
    plain = PolicyConfig(policy="importance")
    for changed in ({"low_mode": "thin"}, {"density_per_component": {"0.mlp_up": 0.002}}):
        assert fp(PolicyConfig(policy="importance", **changed))["config"] != fp(plain)["config"], changed
