"""The DDP comm hook on real gloo processes: DDP equivalence, the Synchronizer as oracle, no_sync.

The hook keeps every per-parameter decision of ``decide_step`` and communicates per DDP bucket, so
its synchronized gradients must equal the Synchronizer's (same residuals, same selections; only the
summation grouping differs: rtol 1e-5, atol 1e-6) while DDP rebuilds its buckets after iteration 1.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from igpolicy.config import PolicyConfig
from igrt.integrations.ddp_hook import ImportanceHookState, importance_hook
from igrt.sync.synchronizer import Synchronizer, build_param_infos, named_parameters
from tests.igrt.dist_util import DistPool
from tests.igrt.tiny_model import TinyLM, make_plan

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def pool():
    with DistPool(world_size=2) as p:
        yield p


def _tokens(rank: int, step: int, micro: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(10_000 * rank + 100 * step + micro)
    return torch.randint(0, 50, (3, 9), generator=g)


def _ddp_loss(ddp: DDP, tokens: torch.Tensor) -> torch.Tensor:
    logits = ddp(tokens[:, :-1])
    return torch.nn.functional.cross_entropy(logits.reshape(-1, 50), tokens[:, 1:].reshape(-1))


def _dense_worker(rank: int, world: int):
    torch.manual_seed(0)
    base = TinyLM()
    ref, mine = copy.deepcopy(base), copy.deepcopy(base)
    ddp_ref = DDP(ref, bucket_cap_mb=0.02)
    ddp = DDP(mine, bucket_cap_mb=0.02)
    state = ImportanceHookState(ddp, config=PolicyConfig(policy="dense"), plan=None)
    ddp.register_comm_hook(state, importance_hook)
    for t in range(3):
        for d in (ddp_ref, ddp):
            d.zero_grad(set_to_none=True)
            _ddp_loss(d, _tokens(rank, t)).backward()
        state.finish_step()
        for (n, p), q in zip(mine.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6, msg=lambda m, n=n: f"{n}: {m}")
    rows = list(state.sync.log)
    assert [r.step for r in rows] == [0, 1, 2]
    numel = sum(p.numel() for p in mine.parameters())
    assert all(r.dense_bytes == 4 * numel and r.values_bytes == 0 for r in rows)
    return True


def test_dense_policy_through_the_hook_equals_ddp(pool):
    assert pool.run(_dense_worker, timeout_s=90) == [True, True]


def _importance_worker(rank: int, world: int, collective: str):
    torch.manual_seed(0)
    base = TinyLM()
    infos = build_param_infos(named_parameters(base))
    plan = make_plan(infos, release_period=3)
    cfg = PolicyConfig(
        policy="importance", density=0.15, release_period=3, collective=collective, num_buckets=3
    )
    hooked, oracle = copy.deepcopy(base), copy.deepcopy(base)
    ddp = DDP(hooked, bucket_cap_mb=0.01)
    state = ImportanceHookState(ddp, config=cfg, plan=plan, track_sums=True)
    ddp.register_comm_hook(state, importance_hook)
    opt = torch.optim.AdamW(hooked.parameters(), lr=1e-2)
    state.attach(opt)  # unsent grads -> None before every optimizer step
    sync = Synchronizer(oracle, config=cfg, plan=plan)
    opt_ref = torch.optim.AdamW(oracle.parameters(), lr=1e-2)
    for t in range(5):
        decision = sync.decide()
        with ddp.no_sync():  # micro-batch 0: DDP accumulates locally, no hook call
            _ddp_loss(ddp, _tokens(rank, t, 0)).backward()
        assert len(state.sync.log) == t
        _ddp_loss(ddp, _tokens(rank, t, 1)).backward()  # the boundary: the hook runs
        for micro in (0, 1):
            oracle.loss(_tokens(rank, t, micro)).backward()
        sync.step()
        before = {n: p.detach().clone() for n, p in hooked.named_parameters()}
        opt.step()
        opt_ref.step()
        for (n, p), q in zip(hooked.named_parameters(), oracle.parameters()):
            assert (p.grad is None) == (n not in decision.sending_params), (t, n)
            assert (p.grad is None) == (q.grad is None)
            if p.grad is not None:
                torch.testing.assert_close(
                    p.grad, q.grad, rtol=1e-5, atol=1e-6, msg=lambda m, n=n: f"{n}: {m}"
                )
            else:  # skipped by AdamW: no momentum step, no weight decay
                assert torch.equal(p.detach(), before[n]), n
        gaps = state.sync.residuals.conservation_gap()
        assert max(gaps.values()) < 1e-5
        opt.zero_grad(set_to_none=True)
        opt_ref.zero_grad(set_to_none=True)
    hook_rows, sync_rows = list(state.sync.log), list(sync.log)
    assert len(hook_rows) == 5
    for a, b in zip(hook_rows, sync_rows):
        assert a.values_bytes == b.values_bytes and a.indices_bytes == b.indices_bytes, (a, b)
        assert a.low_bytes == b.low_bytes and a.num_sending_components == b.num_sending_components
    return [p.detach().clone() for p in hooked.parameters()]


@pytest.mark.parametrize("collective", ["sparse", "auto"])
def test_hook_matches_the_synchronizer_with_no_sync_accumulation(pool, collective):
    outs = pool.run(_importance_worker, args=(collective,), timeout_s=90)
    assert all(torch.equal(a, b) for a, b in zip(*outs)), "ranks must end with identical parameters"
