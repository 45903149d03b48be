"""Compact payloads (issue 15, item 3): bucket-local 16-bit indices and 8-bit values.

Oracles: a decoded payload gives back the encoded pairs (the indices sorted for 16-bit ones, the
values as ``q · scale`` for 8-bit ones); the encoded buffer is exactly
:func:`igpolicy.wire.encoded_pairs_bytes` long, the size the simulator costs; 8-bit rounding error
is at most half a scale step; and on 2 gloo ranks, with the rounding error fed back into the
residuals, Σg == Σsent + e holds on every step within the bound of tests/igrt/test_synchronizer.py,
while the synchronized gradient is the rank average of what was sent.
"""

from __future__ import annotations

import math

import pytest
import torch

from igpolicy.config import PolicyConfig
from igpolicy.step_plan import CollectiveOp, OpKind, op_bytes
from igpolicy.vocab import CollectiveKind
from igpolicy.wire import BLOCK_ENTRIES, dense_value_bytes, encoded_pairs_bytes, num_blocks, pairs_layout
from igrt.sync import comm
from igrt.sync.synchronizer import Synchronizer, build_param_infos, named_parameters
from tests.igrt.dist_util import DistPool
from tests.igrt.tiny_model import TinyLM, make_plan

torch.set_num_threads(1)

WIDTHS = [(ib, vb) for ib in (2, 4, 8) for vb in (1, 2, 4)]
VALUE_DTYPE = {1: torch.int8, 2: torch.bfloat16, 4: torch.float32}


def _encode(idx: torch.Tensor, vals: torch.Tensor, *, capacity: int, numel: int, ib: int, vb: int):
    """Encode fp32 ``vals`` at (ib, vb); returns (buffer, the values as they travel, in idx order)."""
    index = {2: torch.int64, 4: torch.int32, 8: torch.int64}[ib]
    if vb == 1:
        q, scale = comm.quantize_int8(vals)
        sent = comm.dequantize_int8(q, scale)
        buf = comm.encode_pairs(idx.to(index), q, capacity=capacity, index_bytes=ib, numel=numel, scale=scale)
    else:
        sent = vals.to(VALUE_DTYPE[vb]).float()
        buf = comm.encode_pairs(
            idx.to(index), vals.to(VALUE_DTYPE[vb]), capacity=capacity, index_bytes=ib, numel=numel
        )
    return buf, sent


def _decode(flat, *, num_ranks, capacity, numel, ib, vb):
    index = {2: torch.int64, 4: torch.int32, 8: torch.int64}[ib]
    return comm.decode_pairs(
        flat, num_ranks=num_ranks, capacity=capacity, index_dtype=index, value_dtype=VALUE_DTYPE[vb],
        index_bytes=ib, numel=numel,
    )  # fmt: skip


def _cases(seed: int):
    """(numel, k, capacity): empty, k = 1, k = numel, more than one 16-bit block, random."""
    g = torch.Generator().manual_seed(seed)
    yield 0, 0, 0
    yield 5, 0, 3
    yield 7, 1, 1
    yield 9, 9, 9
    yield BLOCK_ENTRIES, BLOCK_ENTRIES, BLOCK_ENTRIES
    yield BLOCK_ENTRIES + 1, 3, 5
    yield 3 * BLOCK_ENTRIES + 17, 1000, 1400
    for _ in range(6):
        numel = int(torch.randint(1, 300_000, (1,), generator=g))
        k = int(torch.randint(0, numel + 1, (1,), generator=g)) // (1 if numel < 50 else 20)
        yield numel, k, min(numel, k + int(torch.randint(0, 40, (1,), generator=g)))


@pytest.mark.parametrize(("ib", "vb"), WIDTHS)
def test_round_trip_over_random_shapes(ib, vb):
    g = torch.Generator().manual_seed(ib * 10 + vb)
    for numel, k, cap in _cases(ib + vb):
        perm = torch.randperm(numel, generator=g)
        edges = torch.tensor(
            sorted({min(e, numel - 1) for e in (numel - 1, BLOCK_ENTRIES - 1, BLOCK_ENTRIES)})
        )
        edges = edges[edges >= 0]  # the block edges are where an offset coding slips
        idx = torch.cat([edges, perm[~torch.isin(perm, edges)]])[:k]
        idx = idx[torch.randperm(k, generator=g)]
        k = idx.numel()
        vals = torch.randn(k, generator=g) * 10 ** float(torch.randint(-6, 3, (1,), generator=g))
        buf, sent = _encode(idx, vals, capacity=cap, numel=numel, ib=ib, vb=vb)
        assert buf.numel() == encoded_pairs_bytes(cap, index_bytes=ib, value_bytes=vb, numel=numel)
        ((got_i, got_v),) = _decode(buf, num_ranks=1, capacity=cap, numel=numel, ib=ib, vb=vb)
        order = torch.argsort(idx) if ib == 2 else torch.arange(k)
        assert torch.equal(got_i.to(torch.int64), idx[order].to(torch.int64)), (numel, k, cap)
        assert torch.equal(got_v.float(), sent[order]), (numel, k, cap)
        if vb == 1 and k:
            step = float(vals.abs().max()) / 127
            assert float((got_v - vals[order]).abs().max()) <= 0.5 * step * (1 + 1e-5) + 1e-30


def test_several_ranks_decode_from_one_gathered_buffer():
    numel, cap = 5 * BLOCK_ENTRIES + 3, 300
    g = torch.Generator().manual_seed(3)
    pairs = [(torch.randperm(numel, generator=g)[:k], torch.randn(k, generator=g)) for k in (300, 0, 17)]
    bufs, sents = zip(*[_encode(i, v, capacity=cap, numel=numel, ib=2, vb=1) for i, v in pairs])
    back = _decode(torch.cat(bufs), num_ranks=3, capacity=cap, numel=numel, ib=2, vb=1)
    for (i, _), s, (gi, gv) in zip(pairs, sents, back):
        order = torch.argsort(i)
        assert torch.equal(gi, i[order]) and torch.equal(gv, s[order])


def test_more_than_2_16_blocks():
    """A bucket of more than 2^32 positions (65,537 blocks): the table and the offsets still code it
    (only the indices are materialised)."""
    numel = 2**32 + 5
    assert num_blocks(numel) == 2**16 + 1
    idx = torch.tensor([numel - 1, 0, 2**32, BLOCK_ENTRIES - 1, BLOCK_ENTRIES, 2**31 + 7], dtype=torch.int64)
    vals = torch.arange(1.0, 7.0)
    for vb in (1, 4):
        buf, sent = _encode(idx, vals, capacity=8, numel=numel, ib=2, vb=vb)
        assert buf.numel() == encoded_pairs_bytes(8, index_bytes=2, value_bytes=vb, numel=numel)
        ((gi, gv),) = _decode(buf, num_ranks=1, capacity=8, numel=numel, ib=2, vb=vb)
        order = torch.argsort(idx)
        assert gi.tolist() == sorted(idx.tolist()) and torch.equal(gv, sent[order])
    with pytest.raises(ValueError, match="outside the bucket"):
        _encode(torch.tensor([numel]), torch.ones(1), capacity=1, numel=numel, ib=2, vb=4)


def test_layout_sizes_are_a_function_of_capacity_numel_and_widths():
    assert encoded_pairs_bytes(3, index_bytes=4, value_bytes=4) == 32  # unchanged legacy layout
    lay = pairs_layout(10, index_bytes=2, value_bytes=1, numel=3 * BLOCK_ENTRIES + 1)
    assert (lay.num_blocks, lay.extra_metadata_bytes) == (4, 4 * 4 + 4)
    assert lay.size_bytes == math.ceil((8 + 16 + 4 + 10 * 3) / 8) * 8
    assert pairs_layout(10, index_bytes=4, value_bytes=1).extra_metadata_bytes == 4
    assert pairs_layout(0, index_bytes=2, value_bytes=2, numel=0).size_bytes == 8
    with pytest.raises(ValueError, match="needs the bucket's numel"):
        pairs_layout(1, index_bytes=2, value_bytes=4)
    with pytest.raises(ValueError, match="index_bytes=3"):
        pairs_layout(1, index_bytes=3, value_bytes=4)
    assert [dense_value_bytes(v) for v in (1, 2, 4)] == [2, 2, 4]


@pytest.mark.parametrize(("ib", "vb"), WIDTHS)
def test_op_bytes_is_the_encoder_s_buffer(ib, vb):
    """The accounting the simulator costs (op_bytes) is the buffer the runtime hands to gloo."""
    cfg = PolicyConfig(policy="topk", index_bytes=ib, value_bytes=vb)
    for numel, k, cap in _cases(7):
        op = CollectiveOp(seq=0, kind=OpKind.SPARSE_GATHER, buckets=(0,), numel=numel, nominal_nnz=cap,
                          padded_to_nominal=True)  # fmt: skip
        b = op_bytes(op, k=k, capacity=cap, config=cfg)
        if cap == 0:
            assert not b.issued
            continue
        buf, _ = _encode(torch.randperm(numel)[:k], torch.randn(k), capacity=cap, numel=numel, ib=ib, vb=vb)
        assert b.wire_size_bytes == buf.numel()
        lay = pairs_layout(cap, index_bytes=ib, value_bytes=vb, numel=numel)
        assert (b.indices_bytes, b.values_bytes, b.metadata_bytes) == (
            k * ib,
            k * vb,
            8 + lay.extra_metadata_bytes,
        )
        assert b.wire_size_bytes == lay.size_bytes and b.padding_bytes == (cap - k) * (ib + vb)
    dense = CollectiveOp(seq=0, kind=OpKind.DENSE_ALLREDUCE, buckets=(0,), numel=100)
    assert op_bytes(dense, k=0, capacity=0, config=cfg).dense_bytes == 100 * dense_value_bytes(vb)


def test_quantize_int8_edges():
    q, s = comm.quantize_int8(torch.zeros(4))
    assert float(s) == 0.0 and not q.any()
    q, s = comm.quantize_int8(torch.empty(0))
    assert q.numel() == 0 and float(s) == 0.0
    q, s = comm.quantize_int8(torch.tensor([1.0, float("nan")]))
    assert torch.isnan(comm.dequantize_int8(q, s)).all()  # a poisoned payload stays poisoned
    q, s = comm.quantize_int8(torch.tensor([-2.0, 1.0, 0.004]))
    assert q.tolist() == [-127, 64, 0] and comm.dequantize_int8(q, s)[0] == -2.0


def test_config_names_bad_widths():
    for key, bad, words in (("index_bytes", 3, "bucket-local"), ("value_bytes", 8, "int8")):
        with pytest.raises(ValueError, match=rf"{key}=.*{words}"):
            PolicyConfig(**{key: bad})
    PolicyConfig(index_bytes=2, value_bytes=1)


# --------------------------------------------------------------------------- 2 gloo ranks
@pytest.fixture(scope="module")
def pool():
    with DistPool(world_size=2) as p:
        yield p


def _tokens(rank: int, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randint(0, 50, (3, 9), generator=g)


CONSERVATION = [
    (policy, collective, ib, vb)
    for policy in ("topk", "adtopk", "importance")
    for collective, ib, vb in (("sparse", 2, 1), ("auto", 4, 1), ("sparse", 2, 2), ("dense", 2, 1))
]


def _conservation_worker(rank: int, world: int, cases):
    out = []
    for policy, collective, ib, vb in cases:
        torch.manual_seed(0)
        model = TinyLM()
        cfg = PolicyConfig(
            policy=policy, sparsifier="adtopk" if policy == "adtopk" else "topk", density=0.1, release_period=2,
            collective=collective, num_buckets=3, index_bytes=ib, value_bytes=vb,
        )  # fmt: skip
        plan = (
            make_plan(build_param_infos(named_parameters(model)), release_period=2)
            if policy == "importance"
            else None
        )
        sync = Synchronizer(model, config=cfg, plan=plan, track_sums=True)
        steps = []
        for t in range(5):
            model.zero_grad(set_to_none=True)
            model.loss(_tokens(rank, t)).backward()
            before = {n: sync.residuals.sums(n)[1].clone() for n in sync.residuals.names()}
            decision = sync.decide()
            row = sync.step()
            gaps = sync.residuals.conservation_gap()
            scale = max(float(sync.residuals.sums(n)[0].abs().max()) for n in gaps) + 1.0
            assert max(gaps.values()) <= 1e-6 * scale * (t + 1), (policy, ib, vb, t, max(gaps.values()))
            dense = [b for b in decision.buckets if b.collective == CollectiveKind.DENSE_ALLREDUCE]
            assert row.dense_bytes == sum(b.numel for b in dense) * dense_value_bytes(vb)
            assert row.indices_bytes * vb == row.values_bytes * ib
            sent = {
                n: (sync.residuals.sums(n)[1] - before.get(n, 0.0)).float() for n in decision.sending_params
            }
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
            in_dense = {n for b in dense for n in b.param_names}
            steps.append({"sent": sent, "grads": grads, "in_dense": in_dense, "dense": bool(dense),
                          "sparse": len(dense) < len(decision.buckets)})  # fmt: skip
            for p in model.parameters():
                if p.grad is not None:
                    p.data.add_(p.grad, alpha=-0.05)
        out.append(steps)
    return out


@pytest.mark.parametrize("policy", ["topk", "adtopk", "importance"])
def test_conservation_with_rounding_error_feedback_on_two_ranks(pool, policy):
    cases = [c for c in CONSERVATION if c[0] == policy]
    outs = pool.run(_conservation_worker, args=(cases,), timeout_s=240)
    kinds = set()
    for case, run0, run1 in zip(cases, *outs):
        for s0, s1 in zip(run0, run1):
            kinds |= {k for k in ("dense", "sparse") if s0[k]}
            assert s0["grads"].keys() == s1["grads"].keys()
            for n, g0 in s0["grads"].items():
                assert torch.equal(g0, s1["grads"][n]), (case, n)
                mean = (s0["sent"][n] + s1["sent"][n]) / 2  # what the ranks recorded as sent, averaged
                # a dense bucket is summed in bf16 by the all-reduce: that sum rounds (no rank's error)
                tol = 2**-7 if n in s0["in_dense"] else 1e-5
                torch.testing.assert_close(g0, mean, rtol=tol, atol=tol * float(mean.abs().max() + 1e-3))
    assert kinds == {"dense", "sparse"}


def _nonfinite_worker(rank: int, world: int, integration: str, collective: str):
    """Rank 1 gets a NaN gradient at step 1 under (2,1) widths: the poisoned int8 payload (its scale
    is NaN) must make every rank skip that step, and nothing is lost."""
    from igrt.integrations.ddp_hook import ImportanceHookState, importance_hook

    torch.manual_seed(0)
    model = TinyLM()
    cfg = PolicyConfig(
        policy="topk", density=0.3, num_buckets=3, collective=collective, index_bytes=2, value_bytes=1
    )
    if integration == "sync":
        sync, fwd = Synchronizer(model, config=cfg, plan=None, track_sums=True), model
    else:
        fwd = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.001)
        state = ImportanceHookState(fwd, config=cfg, plan=None, track_sums=True)
        fwd.register_comm_hook(state, importance_hook)
        sync = state.sync
    first = next(iter(model.parameters()))
    skipped, gaps, finite = [], [], []
    for t in range(3):
        model.zero_grad(set_to_none=True)
        handle = None
        if t == 1 and rank == 1 and integration != "sync":
            handle = first.register_hook(lambda g: torch.full_like(g, float("nan")))
        tokens = _tokens(rank, t)
        logits = fwd(tokens[:, :-1])
        torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)
        ).backward()
        if t == 1 and rank == 1 and integration == "sync":
            first.grad.view(-1)[0] = float("nan")
        row = sync.step() if integration == "sync" else state.finish_step()[0]
        if handle is not None:
            handle.remove()
        skipped.append(row.extra["nonfinite_skipped"])
        finite.append(all(bool(torch.isfinite(sync.residuals.get(n)).all()) for n in sync.residuals.names()))
        gaps.append(max(sync.residuals.conservation_gap().values()))
    return skipped, finite, gaps


@pytest.mark.parametrize(
    ("integration", "collective"), [("sync", "sparse"), ("ddp-hook", "sparse"), ("sync", "dense")]
)
def test_a_poisoned_compact_payload_skips_the_step_on_every_rank(pool, integration, collective):
    for skipped, finite, gaps in pool.run(_nonfinite_worker, args=(integration, collective), timeout_s=120):
        assert skipped == [0.0, 1.0, 0.0] and all(finite) and max(gaps) < 1e-5, (skipped, finite, gaps)
