"""Checkpointing the sync state: bit-exact resume on real gloo ranks, world-size rules, flush."""

from __future__ import annotations

import pytest
import torch

from igpolicy.config import PolicyConfig
from igrt.sync.checkpoint import load_sync_state, save_sync_state, sync_state_path
from igrt.sync.synchronizer import Synchronizer, build_param_infos, named_parameters
from tests.igrt.dist_util import DistPool
from tests.igrt.tiny_model import TinyLM, make_plan

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def pool():
    with DistPool(world_size=2) as p:
        yield p


def _tokens(rank: int, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(7919 * rank + step)
    return torch.randint(0, 50, (3, 9), generator=g)


def _config(sparsifier: str) -> PolicyConfig:
    return PolicyConfig(
        policy="importance", sparsifier=sparsifier, density=0.1, release_period=3, num_buckets=2, seed=11
    )


def _build(init_seed: int, sparsifier: str):
    torch.manual_seed(init_seed)
    model = TinyLM()
    plan = make_plan(build_param_infos(named_parameters(model)), release_period=3)
    sync = Synchronizer(model, config=_config(sparsifier), plan=plan)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    return model, sync, opt


def _train(model, sync, opt, rank: int, steps: range) -> None:
    for t in steps:
        opt.zero_grad(set_to_none=True)
        model.loss(_tokens(rank, t)).backward()
        sync.step()
        opt.step()


def _resume_worker(rank: int, world: int, directory: str, sparsifier: str):
    model, sync, opt = _build(0, sparsifier)
    _train(model, sync, opt, rank, range(6))
    straight = ([p.detach().clone() for p in model.parameters()], sync.state_dict()["residuals"]["residuals"])

    model, sync, opt = _build(0, sparsifier)
    _train(model, sync, opt, rank, range(3))
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, f"{directory}/model-rank{rank}.pt")
    path = save_sync_state(sync, directory, rank=rank)
    assert path == sync_state_path(directory, rank=rank) and path.name == f"igsync-rank{rank:03d}.pt"
    del model, sync, opt

    model, sync, opt = _build(
        123, sparsifier
    )  # fresh objects, different init: everything must come from disk
    saved = torch.load(f"{directory}/model-rank{rank}.pt", weights_only=True)
    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["opt"])
    load_sync_state(sync, directory, rank=rank)
    assert sync.step_index == 3
    _train(model, sync, opt, rank, range(3, 6))
    resumed = ([p.detach().clone() for p in model.parameters()], sync.state_dict()["residuals"]["residuals"])
    for a, b in zip(straight[0], resumed[0]):
        assert torch.equal(a, b), "resume must be bit-for-bit"
    assert straight[1].keys() == resumed[1].keys()
    assert all(torch.equal(straight[1][n], resumed[1][n]) for n in straight[1])
    return straight[0]


@pytest.mark.parametrize("sparsifier", ["topk", "randomk"])
def test_resume_is_bit_exact(pool, tmp_path, sparsifier):
    outs = pool.run(_resume_worker, args=(str(tmp_path), sparsifier), timeout_s=90)
    assert all(torch.equal(a, b) for a, b in zip(*outs))


# --------------------------------------------------------------------------- single process
def _trained(steps: int = 3):
    model, sync, opt = _build(0, "topk")
    _train(model, sync, opt, 0, range(steps))
    return model, sync


def test_world_size_change_needs_a_flush(tmp_path):
    model, sync = _trained()
    assert not sync.residuals.is_zero()
    sd = sync.state_dict()
    sd["world_size"] = 4  # as if saved by a 4-rank run
    fresh = _build(0, "topk")[1]
    with pytest.raises(ValueError, match="world size 4 with unflushed residuals"):
        fresh.load_state_dict(sd)
    residual_before = {n: sync.residuals.get(n).clone() for n in sync.residuals.names()}
    sync.flush()
    assert sync.residuals.is_zero()
    for n, p in model.named_parameters():  # world size 1: the flushed gradient is the residual itself
        r = residual_before[n]
        if r.any():
            torch.testing.assert_close(p.grad, r, rtol=0, atol=0)
        else:
            assert p.grad is None
    sd = sync.state_dict()
    assert sd["flushed"]
    sd["world_size"], sd["rank"] = 4, 3
    fresh.load_state_dict(sd)  # a flushed state loads at any world size
    assert fresh.residuals.is_zero() and fresh.step_index == 3


def test_mismatches_are_named(tmp_path):
    _, sync = _trained(2)
    save_sync_state(sync, tmp_path, rank=0)
    model = TinyLM()
    plan = make_plan(build_param_infos(named_parameters(model)), release_period=3, low_every=3)
    other = Synchronizer(model, config=_config("topk"), plan=plan)
    with pytest.raises(ValueError, match=r"igsync-rank000.pt: sync state does not match this run: plan"):
        load_sync_state(other, tmp_path, rank=0)
    other = Synchronizer(model, config=PolicyConfig(policy="topk", density=0.1), plan=None)
    with pytest.raises(ValueError, match="config"):
        load_sync_state(other, tmp_path, rank=0)
    with pytest.raises(ValueError, match="no sync state"):
        load_sync_state(other, tmp_path / "empty", rank=0)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "igsync-rank000.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="cannot read sync state"):
        load_sync_state(other, tmp_path / "bad", rank=0)
    sd = sync.state_dict()
    sd["rank"] = 1
    with pytest.raises(ValueError, match="rank 1 loaded on rank 0"):
        _build(0, "topk")[1].load_state_dict(sd)
