"""The Synchronizer on real gloo processes: DDP equivalence, conservation, agreement, empty payloads.

Oracles: plain DDP for always-sync policies; for sparse policies, the synchronized gradient must be
the rank average of what each rank recorded as sent (an fp64 running sum kept by the residual
state), parameters that sent nothing get ``grad = None``, and Σg == Σsent + e on every step.
Tolerances: fp32 averaging in a different order than DDP's (divide-then-sum vs sum-then-divide)
differs by a few ulps: rtol 1e-5, atol 1e-6 after 4 SGD steps.
"""

from __future__ import annotations

import copy
import random
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from igpolicy.config import PolicyConfig
from igpolicy.vocab import CollectiveKind
from igrt.sync import comm
from igrt.sync.synchronizer import Synchronizer, build_param_infos, named_parameters
from tests.igrt.dist_util import DistPool, DistributedFailure, run_distributed
from tests.igrt.tiny_model import TinyLM, make_plan

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def pool():
    with DistPool(world_size=2) as p:
        yield p


def _tokens(rank: int, step: int, *, batch: int = 3, length: int = 9) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randint(0, 50, (batch, length), generator=g)


def _plan_for(model, period: int, *, low_every: int = 2):
    return make_plan(build_param_infos(named_parameters(model)), release_period=period, low_every=low_every)


# --------------------------------------------------------------------------- DDP equivalence
def _equivalence_worker(rank: int, world: int):
    torch.manual_seed(0)
    base = TinyLM()
    ref = copy.deepcopy(base)
    ddp = torch.nn.parallel.DistributedDataParallel(ref)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    configs = [
        PolicyConfig(policy="dense"),
        PolicyConfig(policy="topk", density=1.0),  # auto -> dense all-reduce of the zero-filled bucket
        PolicyConfig(policy="topk", density=1.0, collective="sparse", num_buckets=3),  # every pair gathered
    ]
    models = [copy.deepcopy(base) for _ in configs]
    syncs = [Synchronizer(m, config=c, plan=None) for m, c in zip(models, configs)]
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in models]
    for t in range(4):
        ddp.module.zero_grad(set_to_none=True)
        ddp(_tokens(rank, t)[:, :-1])  # warm the forward path DDP tracks
        ref_opt.zero_grad(set_to_none=True)
        logits = ddp(_tokens(rank, t)[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 50), _tokens(rank, t)[:, 1:].reshape(-1))
        loss.backward()
        for m, s, o in zip(models, syncs, opts):
            o.zero_grad(set_to_none=True)
            m.loss(_tokens(rank, t)).backward()
            row = s.step()
            for (n, p), q in zip(m.named_parameters(), ref.parameters()):
                torch.testing.assert_close(
                    p.grad, q.grad, rtol=1e-5, atol=1e-6, msg=lambda x, n=n: f"{n}: {x}"
                )
            assert row.source == "real" and row.step == t
            o.step()
        ref_opt.step()
    for m in models:
        for p, q in zip(m.parameters(), ref.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    return [[p.detach().clone() for p in m.parameters()] for m in models]


def test_always_sync_density_one_equals_ddp(pool):
    outs = pool.run(_equivalence_worker, timeout_s=90)
    for a, b in zip(outs[0], outs[1]):
        assert all(torch.equal(x, y) for x, y in zip(a, b)), "ranks must end with identical parameters"


# --------------------------------------------------------------------------- conservation oracle
def _random_config(seed: int) -> tuple[PolicyConfig, torch.dtype]:
    rnd = random.Random(seed)
    policy = rnd.choice(["importance", "importance", "periodic", "topk", "adtopk"])
    cfg = PolicyConfig(
        policy=policy,
        sparsifier=rnd.choice(["topk", "randomk", "adtopk"]),
        density=rnd.choice([0.02, 0.2, 0.6]),
        release_period=rnd.randint(1, 4),
        staggered=rnd.random() < 0.7,
        packing=rnd.choice(["ddp", "round_robin", "lpt", "kk"]),
        num_buckets=rnd.choice([None, 2, 5]),
        bucket_cap_bytes=rnd.choice([2_000, 50_000]),
        collective=rnd.choice(["auto", "sparse", "dense"]),
        value_bytes=rnd.choice([4, 2]),
        seed=seed,
    )
    return cfg, rnd.choice([torch.float32, torch.bfloat16])


def _conservation_worker(rank: int, world: int, seeds: list[int]):
    out = []
    for seed in seeds:
        cfg, dtype = _random_config(seed)
        torch.manual_seed(seed)
        model = TinyLM().to(dtype)
        plan = _plan_for(model, cfg.release_period) if cfg.policy == "importance" else None
        sync = Synchronizer(model, config=cfg, plan=plan, track_sums=True)
        steps = []
        for t in range(6):
            model.zero_grad(set_to_none=True)
            model.loss(_tokens(rank, t)).backward()
            if t == 2 and rank == 1:  # this rank has nothing new: its payloads may be empty
                for p in model.parameters():
                    p.grad = None
            before = {n: sync.residuals.sums(n)[1].clone() for n in sync.residuals.names()}
            decision = sync.decide()
            row = sync.step()
            gaps = sync.residuals.conservation_gap()
            scale = max(float(sync.residuals.sums(n)[0].abs().max()) for n in gaps) + 1.0
            assert max(gaps.values()) <= 1e-6 * scale * (t + 1), (seed, t, max(gaps.values()))
            assert all(sync.residuals.get(n).dtype == torch.float32 for n in gaps)
            sent = {
                n: (sync.residuals.sums(n)[1] - before.get(n, 0.0)).float() for n in decision.sending_params
            }
            grads = {
                n: None if p.grad is None else p.grad.detach().float().clone()
                for n, p in model.named_parameters()
            }
            for n, p in model.named_parameters():
                assert (p.grad is None) == (n not in decision.sending_params), (seed, t, n)
                assert p.grad is None or p.grad.dtype == dtype
            vb = cfg.value_bytes
            dense = [b for b in decision.buckets if b.collective == CollectiveKind.DENSE_ALLREDUCE]
            assert row.dense_bytes == sum(b.numel for b in dense) * vb
            assert row.indices_bytes * vb == row.values_bytes * cfg.index_bytes
            assert row.values_bytes <= sum(b.nominal_nnz for b in decision.buckets if b not in dense) * vb
            assert row.num_collectives <= len(decision.buckets) + 1  # + the count exchange
            assert row.bucket_imbalance == decision.packing.imbalance
            steps.append({"sent": sent, "grads": grads, "sending": sorted(decision.sending_params)})
            for p in model.parameters():  # a plain SGD step on the synchronized gradient
                if p.grad is not None:
                    p.data.add_(p.grad, alpha=-0.05)
        out.append(
            {"steps": steps, "params": [p.detach().clone() for p in model.parameters()], "dtype": dtype}
        )
    return out


@pytest.mark.parametrize("seeds", [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]])
def test_conservation_and_average_oracle_on_random_schedules(pool, seeds):
    outs = pool.run(_conservation_worker, args=(seeds,), timeout_s=110)
    for run0, run1 in zip(*outs):
        for s0, s1 in zip(run0["steps"], run1["steps"]):
            assert s0["sending"] == s1["sending"], "every rank takes the same decision"
            for n, g0 in s0["grads"].items():
                g1 = s1["grads"][n]
                if g0 is None:
                    assert g1 is None and n not in s0["sending"]
                    continue
                assert torch.equal(g0, g1), f"{n}: ranks disagree on the synchronized gradient"
                mean = (s0["sent"][n] + s1["sent"][n]) / 2
                tol = 1e-2 if run0["dtype"] == torch.bfloat16 else 1e-6
                torch.testing.assert_close(g0, mean, rtol=tol, atol=tol * float(mean.abs().max() + 1e-3))
        assert all(torch.equal(a, b) for a, b in zip(run0["params"], run1["params"]))


# --------------------------------------------------------------------------- empty payloads, agreement
def _empty_worker(rank: int, world: int):
    torch.manual_seed(0)
    model = TinyLM()
    cfg = PolicyConfig(policy="topk", density=0.1, collective="sparse", num_buckets=4)
    sync = Synchronizer(model, config=cfg, plan=None)
    for p in model.parameters():  # every rank: zero gradient, zero residual -> nothing anywhere
        p.grad = torch.zeros_like(p)
    row = sync.step()
    assert row.values_bytes == 0 and row.num_collectives == 1 and row.metadata_bytes == 8 * 4  # counts only
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())
    # only rank 0 has something: rank 1's payloads are empty, the gather still completes
    model.zero_grad(set_to_none=True)
    if rank == 0:
        model.loss(_tokens(0, 0)).backward()
    row = sync.step()
    assert (row.values_bytes > 0) == (rank == 0)
    # the bare collective, including an all-empty call
    c = comm.CommCounter()
    k = 5 if rank == 0 else 0
    got = comm.sparse_all_gather(torch.arange(k, dtype=torch.int32), torch.ones(k), counter=c)
    assert [i.numel() for i, _ in got] == [5, 0]
    got = comm.sparse_all_gather(torch.empty(0, dtype=torch.int32), torch.empty(0), counter=c)
    assert [i.numel() for i, _ in got] == [0, 0]
    assert c.indices_bytes == 4 * k and c.values_bytes == 4 * k and c.metadata_bytes == 16
    return True


def test_zero_length_payloads_do_not_hang(pool):
    assert pool.run(_empty_worker, timeout_s=60) == [True, True]


def _mismatch_worker(rank: int, world: int):
    torch.manual_seed(0)
    model = TinyLM()
    messages = []
    plan = _plan_for(model, 2, low_every=2 if rank == 0 else 3)  # rank 1 profiled differently
    cfg = PolicyConfig(policy="importance", release_period=2)
    for kwargs in (
        {"config": cfg, "plan": plan},
        {"config": PolicyConfig(density=0.01 * (rank + 1)), "plan": None},
    ):
        if kwargs["plan"] is None:
            kwargs["config"] = PolicyConfig(policy="topk", density=0.01 * (rank + 1))
        t0 = time.monotonic()
        try:
            Synchronizer(model, **kwargs)
        except ValueError as e:
            messages.append((str(e), time.monotonic() - t0))
        else:
            messages.append(("no error", 0.0))
    return messages


def test_plan_mismatch_raises_on_every_rank(pool):
    outs = pool.run(_mismatch_worker, timeout_s=60)
    for rank, msgs in enumerate(outs):
        (plan_msg, dt1), (cfg_msg, dt2) = msgs
        assert "plan differs" in plan_msg and "rank 0:" in plan_msg and "rank 1:" in plan_msg, plan_msg
        assert f"rank {rank}" in plan_msg
        assert "config differs" in cfg_msg and "plan differs" not in cfg_msg, cfg_msg
        assert dt1 < 20 and dt2 < 20


def test_dist_util_reports_a_failing_rank(pool):
    with pytest.raises(DistributedFailure, match="rank 1 raised"):
        pool.run(_failing_worker, timeout_s=60, grace_s=3)


def _failing_worker(rank: int, world: int):
    if rank == 1:
        raise AssertionError("boom")
    torch.distributed.barrier()  # rank 0 waits for a rank that never comes: killed after the grace


# --------------------------------------------------------------------------- three ranks, uneven payloads
def _three_rank_worker(rank: int, world: int):
    c = comm.CommCounter()
    k = [5, 0, 3][rank]
    idx = torch.arange(k, dtype=torch.int32) * (rank + 1)
    got = comm.sparse_all_gather(idx, torch.full((k,), float(rank), dtype=torch.bfloat16), counter=c)
    assert [i.tolist() for i, _ in got] == [[0, 1, 2, 3, 4], [], [0, 3, 6]]
    assert [v.float().tolist() for _, v in got] == [[0.0] * 5, [], [2.0] * 3]
    assert (c.indices_bytes, c.values_bytes, c.metadata_bytes, c.padding_bytes) == (
        4 * k,
        2 * k,
        8,
        6 * (5 - k),
    )
    torch.manual_seed(0)
    model = TinyLM()
    cfg = PolicyConfig(policy="adtopk", density=0.05, collective="sparse", num_buckets=3)
    sync = Synchronizer(model, config=cfg, plan=None, track_sums=True)
    sent_total = {}
    for t in range(3):
        model.zero_grad(set_to_none=True)
        if rank != 1 or t == 2:  # rank 1 has no gradient for two steps: its payloads are empty
            model.loss(_tokens(rank, t)).backward()
        row = sync.step()
        assert (row.values_bytes == 0) == (rank == 1 and t < 2)
        sent_total = {n: sync.residuals.sums(n)[1].clone() for n in sync.residuals.names()}
    assert max(sync.residuals.conservation_gap().values()) < 1e-5
    return [p.grad.clone() for p in model.parameters()], sent_total


def test_three_ranks_with_uneven_and_empty_payloads():
    outs = run_distributed(_three_rank_worker, world_size=3, timeout_s=90)
    grads = [o[0] for o in outs]
    for g in grads[1:]:
        assert all(torch.equal(a, b) for a, b in zip(grads[0], g))


# --------------------------------------------------------------------------- single process pieces
@settings(max_examples=40, deadline=None)
@given(
    counts=st.lists(st.integers(0, 30), min_size=1, max_size=4),
    value_dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    index_dtype=st.sampled_from([torch.int32, torch.int64]),
    extra=st.integers(0, 5),
)
def test_encode_decode_roundtrip(counts, value_dtype, index_dtype, extra):
    capacity = max(counts) + extra
    pairs = [(torch.randperm(1000)[:k].to(index_dtype), torch.randn(k).to(value_dtype)) for k in counts]
    flat = torch.cat([comm.encode_pairs(i, v, capacity=capacity) for i, v in pairs])
    assert flat.numel() % 8 == 0
    back = comm.decode_pairs(
        flat, num_ranks=len(counts), capacity=capacity, index_dtype=index_dtype, value_dtype=value_dtype
    )
    for (i, v), (i2, v2) in zip(pairs, back):
        assert torch.equal(i, i2) and torch.equal(v, v2)
    mean = comm.aggregate_pairs(back, numel=1000, device=torch.device("cpu"))
    ref = torch.zeros(1000)
    for i, v in pairs:
        ref.index_add_(0, i.long(), v.float())
    torch.testing.assert_close(mean, ref / len(counts))


def test_single_process_step_metrics_and_csv(tmp_path):
    torch.manual_seed(0)
    model = TinyLM()
    sync = Synchronizer(model, config=PolicyConfig(policy="topk", density=0.1, num_buckets=2), plan=None)
    for t in range(2):
        model.zero_grad(set_to_none=True)
        model.loss(_tokens(0, t)).backward()
        row = sync.step()
        assert row.step == t and row.rank == 0 and row.source == "real" and row.num_collectives == 3  # counts + 2
        assert {"select_s", "pack_s", "comm_s", "scatter_s", "decide_s"} <= set(row.extra)
        nominal = sum(b.nominal_nnz for b in sync.decide(t).buckets)
        assert row.values_bytes == 4 * nominal  # no exact zeros in these gradients: k pairs each
    path = sync.log.write_csv(tmp_path / "m.csv")
    lines = path.read_text().splitlines()
    assert len(lines) == 3 and lines[0].startswith("step,rank,source,policy") and "x_select_s" in lines[0]
    assert sync.log.totals()["num_collectives"] == 6
    with pytest.raises(ValueError, match="needs a SyncPlan"):
        Synchronizer(model, config=PolicyConfig(policy="importance"), plan=None)
