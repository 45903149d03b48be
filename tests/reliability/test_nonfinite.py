"""NaN / inf local gradients (AMP GradScaler style): detected before they touch a residual, the step
skipped on every rank alike (or every rank stops with an error), residuals finite, nothing lost.

2 gloo ranks, the Synchronizer (after backward) and the DDP hook, every sparsifier, fp32 / bf16 /
fp16 models. Rank 1 gets a NaN in one parameter and an inf in another at step 1. Oracles: the
step's row says skipped on both ranks and no parameter has a gradient; every residual stays
finite; conservation (Σ finite g == Σ sent + e, fp64) holds on every rank at every step; the
replicas stay identical; ``nonfinite='error'`` raises on both ranks, rank 1 naming the parameter.
"""

from __future__ import annotations

import pytest
import torch

from igpolicy.config import PolicyConfig
from tests.igrt.dist_util import DistPool
from tests.igrt.tiny_model import VOCAB, TinyLM

STEPS, BAD_STEP = 4, 1
SPARSIFIERS = ("topk", "adtopk", "threshold", "randomk")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@pytest.fixture(scope="module")
def pool():
    with DistPool(world_size=2) as p:
        yield p


def _tokens(rank: int, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randint(0, VOCAB, (4, 12), generator=g)


def _worker(rank: int, world: int, integration: str, sparsifier: str, dtype_name: str, mode: str):
    from igrt.integrations.ddp_hook import ImportanceHookState, importance_hook
    from igrt.sync.sparsifiers import make_sparsifier
    from igrt.sync.synchronizer import Synchronizer

    torch.manual_seed(0)
    dtype = DTYPES[dtype_name]
    model = TinyLM().to(dtype)
    cfg = PolicyConfig(policy="topk", sparsifier=sparsifier, density=0.3, num_buckets=3, nonfinite=mode,
                       value_bytes=4 if dtype == torch.float32 else 2)  # fmt: skip
    sp = make_sparsifier(sparsifier, seed=0, threshold=1e-3) if sparsifier == "threshold" else None
    names = [n for n, _ in model.named_parameters()]
    nan_name, inf_name = names[1], names[-1]
    if integration == "sync":
        sync = Synchronizer(model, config=cfg, plan=None, sparsifier=sp, track_sums=True)
        fwd = model
    else:
        from torch.nn.parallel import DistributedDataParallel

        fwd = DistributedDataParallel(model, bucket_cap_mb=0.001)  # several DDP buckets
        state = ImportanceHookState(fwd, config=cfg, plan=None, sparsifier=sp, track_sums=True)
        fwd.register_comm_hook(state, importance_hook)
        sync = state.sync
    params = dict(model.named_parameters())
    out = {"skipped": [], "grads_none": [], "finite": [], "gap": [], "error": None}
    for t in range(STEPS):
        model.zero_grad(set_to_none=True)
        handles = []
        if t == BAD_STEP and rank == 1 and integration != "sync":
            handles = [params[nan_name].register_hook(lambda g: torch.full_like(g, float("nan"))),
                       params[inf_name].register_hook(lambda g: g.index_fill(0, torch.tensor([0]), float("inf")))]  # fmt: skip
        try:
            tokens = _tokens(rank, t)
            logits = fwd(tokens[:, :-1]).float()  # through DDP's forward under the hook
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
            loss.backward()
            if t == BAD_STEP and rank == 1 and integration == "sync":
                params[nan_name].grad.view(-1)[0] = float("nan")
                params[inf_name].grad.view(-1)[0] = float("inf")
            row = sync.step() if integration == "sync" else state.finish_step()[0]
        except ValueError as e:
            out["error"] = str(e)
            break
        finally:
            for h in handles:
                h.remove()
        out["skipped"].append(row.extra["nonfinite_skipped"])
        out["grads_none"].append(all(p.grad is None for p in model.parameters()))
        out["finite"].append(all(bool(torch.isfinite(e).all()) for e in (sync.residuals.get(n) for n in names) if e is not None))
        out["gap"].append(max(sync.residuals.conservation_gap().values(), default=0.0))
        with torch.no_grad():  # a plain SGD step on what came back, so replicas can be compared
            for p in model.parameters():
                if p.grad is not None:
                    p.add_(p.grad, alpha=-0.1)
    out["params"] = [p.detach().float().clone() for p in model.parameters()]
    out["nan_name"] = nan_name
    return out


CASES = [(i, s, d) for i in ("sync", "ddp-hook") for s in SPARSIFIERS for d in DTYPES]


@pytest.mark.parametrize(("integration", "sparsifier", "dtype"), CASES)
def test_a_nonfinite_step_is_skipped_on_every_rank(pool, integration, sparsifier, dtype):
    outs = pool.run(_worker, args=(integration, sparsifier, dtype, "skip"), timeout_s=120)
    for r, o in enumerate(outs):
        assert o["error"] is None, (r, o["error"])
        assert o["skipped"] == [1.0 if t == BAD_STEP else 0.0 for t in range(STEPS)], (r, o["skipped"])
        assert o["grads_none"][BAD_STEP], r
        assert all(o["finite"]), (r, o["finite"])
        assert max(o["gap"]) < 1e-5, (r, o["gap"])
    for a, b in zip(outs[0]["params"], outs[1]["params"]):
        assert torch.equal(a, b)  # the replicas never diverged


@pytest.mark.parametrize("integration", ["sync", "ddp-hook"])
def test_nonfinite_error_stops_every_rank_naming_the_parameter(pool, integration):
    outs = pool.run(_worker, args=(integration, "topk", "fp32", "error"), timeout_s=120)
    assert all(o["error"] is not None for o in outs)
    assert outs[1]["nan_name"] in outs[1]["error"] and "rank 1" in outs[1]["error"]
    assert "another rank" in outs[0]["error"]
    assert all(len(o["skipped"]) == BAD_STEP for o in outs)  # stopped at the bad step, no hang
