"""igpolicy.step_plan.ddp_buckets against torch's own bucket assignment and against real DDP.

Oracles: ``torch.distributed._compute_bucket_assignment_by_size`` (the function DDP calls) on the same
sizes, dtypes, limits and order; and the buckets a real DDP hands its comm hook (2 gloo ranks), at
construction (step 0) and after its rebuild (step 1 on).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

from igpolicy.step_plan import ddp_buckets
from igpolicy.vocab import ParamInfo
from tests.igrt.dist_util import run_distributed

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 300_000), min_size=1, max_size=24),
    dtypes=st.data(),
    cap=st.sampled_from([2**12, 2**16, 2**20, 25 * 2**20]),
    first=st.sampled_from([None, 2**10, 2**20]),
    seed=st.integers(0, 1000),
)
def test_rebuilt_buckets_equal_torchs_assignment(sizes, dtypes, cap, first, seed):
    names = [f"p{i}" for i in range(len(sizes))]
    kinds = [dtypes.draw(st.sampled_from(sorted(DTYPES))) for _ in sizes]
    params = [ParamInfo(name=n, shape=(s,), dtype=k, component="0.norm", order=i)
              for i, (n, s, k) in enumerate(zip(names, sizes, kinds))]  # fmt: skip
    order = torch.randperm(len(sizes), generator=torch.Generator().manual_seed(seed)).tolist()
    # DDP's rebuild passes the tensors in ready order, with their registration indices as labels
    tensors = [torch.empty(sizes[i], dtype=DTYPES[kinds[i]]) for i in order]
    limits = [cap if first is None else first, cap]
    want, _ = dist._compute_bucket_assignment_by_size(tensors, limits, [False] * len(sizes), order)
    got = ddp_buckets(params, bucket_cap_bytes=cap, first_bucket_cap_bytes=first, ready_order=[names[i] for i in order])
    if len({k for k in kinds}) == 1:  # torch's order of buckets still open at the end is a hash order
        assert [list(b) for b in got] == [[names[i] for i in b] for b in want]
    else:
        assert sorted(map(sorted, got)) == sorted(sorted(names[i] for i in b) for b in want)


def _ddp_worker(rank: int, world: int, cap_mb: float):
    from tests.igrt.tiny_model import VOCAB, TinyLM

    torch.manual_seed(0)
    model = TinyLM(d=32)
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=cap_mb)
    name_of = {id(p): n for n, p in model.named_parameters()}
    seen: list[list[tuple[str, ...]]] = []

    def hook(_state, bucket):
        seen[-1].append(tuple(name_of[id(p)] for p in bucket.parameters()))
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    ddp.register_comm_hook(None, hook)
    ready: list[str] = []
    handles = [p.register_post_accumulate_grad_hook(lambda _p, n=n: ready.append(n)) for n, p in model.named_parameters()]
    for t in range(3):
        seen.append([])
        ready.clear()
        tokens = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(t))
        logits = ddp(tokens[:, :-1])
        torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1)).backward()
        if t == 0:
            first_ready = list(ready)
        model.zero_grad(set_to_none=True)
    for h in handles:
        h.remove()
    infos = [ParamInfo(name=n, shape=tuple(p.shape), dtype="float32", component="0.norm", order=i)
             for i, (n, p) in enumerate(model.named_parameters())]  # fmt: skip
    cap = int(cap_mb * 2**20)
    return {
        "seen": seen,
        "initial": ddp_buckets(infos, bucket_cap_bytes=cap, first_bucket_cap_bytes=None),
        "rebuilt": ddp_buckets(infos, bucket_cap_bytes=cap, first_bucket_cap_bytes=None, ready_order=first_ready),
    }


@pytest.mark.parametrize("cap_mb", [0.002, 0.01])
def test_predicted_buckets_are_the_buckets_real_ddp_hands_the_hook(cap_mb):
    out = run_distributed(_ddp_worker, world_size=2, args=(cap_mb,), timeout_s=120)[0]
    assert [tuple(b) for b in out["seen"][0]] == list(out["initial"])  # construction: one bucket
    assert len(out["rebuilt"]) > 1
    for step in (1, 2):
        assert [tuple(b) for b in out["seen"][step]] == list(out["rebuilt"])
