"""The step engine against hand computations, decide_step, and its own invariants."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from igpolicy.config import PolicyConfig
from igpolicy.decide import decide_step, nominal_k, release_phases
from igpolicy.plan import ComponentPlan, SyncPlan
from igpolicy.vocab import CollectiveKind, ComponentClass, ParamInfo, StepMetrics
from igsim.net.topology import star
from igsim.step.engine import METADATA_BYTES_PER_BUCKET, simulate
from igsim.step.results import SPAN_KINDS
from igsim.step.workload import Jitter, Workload

B = 1.25e9  # 10 Gbit/s
LAT = 5e-6  # per link; a rank-to-rank message crosses two links on a star
ALPHA = 2 * LAT


def ring_allreduce_s(n_bytes: float, p: int) -> float:
    """Closed form (Thakur et al.): 2(p-1)α + 2(p-1)/p · n/B."""
    return 2 * (p - 1) * ALPHA + 2 * (p - 1) / p * n_bytes / B


def ring_allgather_s(total_bytes: float, p: int) -> float:
    """(p-1)α + (p-1)/p · n/B, n the gathered buffer."""
    return (p - 1) * ALPHA + (p - 1) / p * total_bytes / B


def make_params(num_layers: int = 3, hidden: int = 64) -> tuple[ParamInfo, ...]:
    out = [ParamInfo(name="emb", shape=(500, hidden), dtype="float32", component="embedding", order=0)]
    for layer in range(num_layers):
        for kind, shape in (
            ("attn_q", (hidden, hidden)),
            ("attn_o", (hidden, hidden)),
            ("mlp_up", (4 * hidden, hidden)),
        ):
            out.append(
                ParamInfo(
                    name=f"l{layer}.{kind}",
                    shape=shape,
                    dtype="float32",
                    component=f"{layer}.{kind}",
                    order=len(out),
                )
            )
        out.append(
            ParamInfo(
                name=f"l{layer}.norm",
                shape=(hidden,),
                dtype="float32",
                component=f"{layer}.norm",
                order=len(out),
            )
        )
    out.append(ParamInfo(name="head", shape=(10, hidden), dtype="float32", component="head", order=len(out)))
    return tuple(out)


def make_workload(
    params, *, T: int = 1, k: np.ndarray | None = None, k_density=None, seed: int = 0
) -> Workload:
    len(params)
    bwd = 0.2
    order = np.array([p.order for p in params], dtype=float)
    ready = bwd * (1 - order / order.max())  # reverse registration order, the embedding last
    rng = np.random.default_rng(seed)
    return Workload(
        name="hand",
        params=params,
        ready_s=np.tile(ready, (T, 1)),
        forward_s=np.full(T, 0.1),
        backward_s=np.full(T, bwd),
        optimizer_s=np.full(T, 0.01),
        k=k,
        k_density=k_density,
        source={"seed": seed, "noise": float(rng.random())},
    )


def plan_for(params, *, R: int, low_fraction: float = 0.7) -> SyncPlan:
    keys = sorted({p.component for p in params})
    comps = []
    n_low = int(len(keys) * low_fraction)
    for i, key in enumerate(keys):
        low = i < n_low
        comps.append(
            ComponentPlan(
                key=key,
                score=0.1 if low else 0.9,
                cls=ComponentClass.LOW if low else ComponentClass.IMPORTANT,
                phase=(i % R) if low else None,
                expected_bytes=100 + i,
            )
        )
    return SyncPlan(release_period=R, components=tuple(comps))


# -------------------------------------------------------------------------- closed-form oracle
@pytest.mark.parametrize("p", [2, 4, 16])
def test_dense_single_bucket_equals_closed_form(p: int) -> None:
    params = make_params()
    w = make_workload(params)
    cfg = PolicyConfig(policy="dense", num_buckets=1, packing="lpt")
    r = simulate(
        workload=w,
        config=cfg,
        plan=None,
        topology=star(num_ranks=p, bandwidth_bytes_per_s=B, latency_s=LAT),
        num_steps=3,
    )
    n_bytes = sum(q.numel for q in params) * 4
    comm = ring_allreduce_s(n_bytes, p)
    # one bucket: ready when the last gradient (the embedding) is, at the end of backward
    expected = 0.1 + 0.2 + comm + 0.01
    np.testing.assert_allclose(r.columns["step_s"], expected, rtol=1e-9)
    np.testing.assert_allclose(r.columns["exposed_comm_s"], comm, rtol=1e-9)
    np.testing.assert_allclose(r.columns["comm_s"], comm, rtol=1e-9)
    assert np.all(r.columns["dense_bytes"] == n_bytes)
    assert np.all(r.columns["values_bytes"] == 0) and np.all(r.columns["metadata_bytes"] == 0)
    assert np.all(r.columns["num_collectives"] == 1)
    assert r.representative and r.num_rows == 3


def test_dense_per_parameter_buckets_follow_the_stream_recurrence() -> None:
    """DDP hook with a 1-byte bucket cap: from step 1 on (DDP's rebuilt buckets), one bucket per
    parameter, launched in the order gradients became ready."""
    p = 8
    params = make_params()
    w = make_workload(params)
    cfg = PolicyConfig(policy="dense")
    r = simulate(
        workload=w,
        config=cfg,
        plan=None,
        topology=star(num_ranks=p, bandwidth_bytes_per_s=B, latency_s=LAT),
        num_steps=2,
        integration="ddp-hook",
        ddp_bucket_cap_bytes=1,
        ddp_first_bucket_cap_bytes=None,
    )
    # hand timeline: buckets in ready order, each ready at forward + its ready_s
    cur = 0.0
    total = 0.0
    for i in sorted(range(len(params)), key=lambda i: (w.ready_s[0, i], -params[i].order)):
        q = params[i]
        cost = ring_allreduce_s(q.numel * 4, p)
        cur = max(0.1 + w.ready_s[0, i], cur) + cost
        total += cost
    assert r.columns["num_collectives"][1] == len(params)
    assert r.columns["num_collectives"][0] == 1  # step 0: DDP's single construction-time bucket
    assert r.columns["comm_s"][1] == pytest.approx(total, rel=1e-9)
    assert r.steps["comm_end_s"][1] == pytest.approx(cur, rel=1e-9)
    assert r.columns["step_s"][1] == pytest.approx(max(0.3, cur) + 0.01, rel=1e-9)
    assert r.columns["exposed_comm_s"][1] == pytest.approx(max(0.0, cur - 0.3), rel=1e-9)


def gatherv_s(wire_bytes: float, p: int) -> float:
    """All-gather(v) with equal payloads: (p-1)α + s · Σ_{j≠i} k_j / B."""
    return (p - 1) * ALPHA + (p - 1) * wire_bytes / B


def test_hook_path_sparse_bucket_is_one_padded_gather() -> None:
    """Top-k is bounded: the runtime's hook pads to the nominal k with the count in a header."""
    p = 4
    params = make_params()
    k = np.array([[max(1, nominal_k(q.numel, 0.01) // 2) for q in params]])  # fewer than nominal
    w = make_workload(params, k=k, k_density=0.01)
    cfg = PolicyConfig(policy="topk", density=0.01, num_buckets=1, collective="sparse", packing="lpt")
    r = simulate(
        workload=w,
        config=cfg,
        plan=None,
        topology=star(num_ranks=p, bandwidth_bytes_per_s=B, latency_s=LAT),
        num_steps=1,
    )
    nominal = sum(nominal_k(q.numel, 0.01) for q in params)
    wire = 8 + 8 * nominal  # header + padded pairs, already a multiple of 8
    assert [SPAN_KINDS[i] for i in r.spans["kind"]] == ["sparse_gather"]
    assert r.spans["size_bytes"][0] == wire
    assert r.columns["comm_s"][0] == pytest.approx(gatherv_s(wire, p), rel=1e-9)
    # bytes are the payload (actual k), not the padding
    assert r.columns["values_bytes"][0] == 4 * k.sum() and r.columns["indices_bytes"][0] == 4 * k.sum()
    assert r.columns["metadata_bytes"][0] == METADATA_BYTES_PER_BUCKET
    assert r.columns["num_collectives"][0] == 1


def test_unbounded_sparsifier_exchanges_counts_per_bucket() -> None:
    p = 4
    params = make_params()
    cfg = PolicyConfig(
        policy="topk", sparsifier="threshold", density=0.01, num_buckets=2, collective="sparse", packing="lpt"
    )
    r = simulate(
        workload=make_workload(params),
        config=cfg,
        plan=None,
        topology=star(num_ranks=p, bandwidth_bytes_per_s=B, latency_s=LAT),
        num_steps=1,
    )
    # step 0: DDP's one construction-time bucket -> its count exchange, then its gather
    assert [SPAN_KINDS[i] for i in r.spans["kind"]] == ["metadata", "sparse_gather"]
    meta = r.spans["end_s"][0] - r.spans["start_s"][0]
    assert meta == pytest.approx(ring_allgather_s(8 * p, p), rel=1e-9)
    assert r.columns["metadata_bytes"][0] == METADATA_BYTES_PER_BUCKET
    assert r.columns["num_collectives"][0] == 2


def test_synchronizer_path_after_backward() -> None:
    """overlap=False: one count exchange for every sparse bucket at backward end, sparse, then dense."""
    p = 8
    params = make_params()
    cfg = PolicyConfig(
        policy="topk", density=0.01, density_per_kind={"embedding": 0.5}, num_buckets=4, packing="lpt"
    )
    r = simulate(
        workload=make_workload(params),
        config=cfg,
        plan=None,
        topology=star(num_ranks=p, bandwidth_bytes_per_s=B, latency_s=LAT),
        num_steps=1,
        integration="sync",
    )
    dec = decide_step(
        step=0, config=cfg, params=params, world_size=p, phases={q.component: None for q in params}
    )
    sparse = [b for b in dec.buckets if b.collective == CollectiveKind.SPARSE_GATHER]
    dense = [b for b in dec.buckets if b.collective == CollectiveKind.DENSE_ALLREDUCE]
    assert sparse and dense  # the embedding bucket is dense at p = 8, the rest sparse
    kinds = [SPAN_KINDS[i] for i in r.spans["kind"]]
    assert kinds == ["metadata"] + ["sparse_gather"] * len(sparse) + ["dense_allreduce"] * len(dense)
    assert list(r.spans["bucket"][1:]) == [b.index for b in sparse] + [b.index for b in dense]
    # hand timeline: everything starts at backward end, back to back
    costs = [ring_allgather_s(8 * len(sparse) * p, p)]
    costs += [gatherv_s(8 + 8 * b.nominal_nnz, p) for b in sparse]
    costs += [ring_allreduce_s(4 * b.numel, p) for b in dense]
    assert r.spans["start_s"][0] == pytest.approx(0.3)
    assert r.steps["comm_end_s"][0] == pytest.approx(0.3 + sum(costs), rel=1e-9)
    assert r.columns["exposed_comm_s"][0] == pytest.approx(sum(costs), rel=1e-9)
    assert r.columns["num_collectives"][0] == 1 + len(sparse) + len(dense)  # the count exchange too
    assert r.columns["metadata_bytes"][0] == 8 * len(sparse)


def test_exposed_communication_hand_built() -> None:
    """One parameter ready at backward start: its collective hides behind backward when short."""
    param = (ParamInfo(name="w", shape=(1000,), dtype="float32", component="0.mlp_up", order=0),)
    p = 2
    cost = ring_allreduce_s(4000, p)

    def run(ready_s: float, backward_s: float) -> StepMetrics:
        w = Workload(
            name="h",
            params=param,
            ready_s=[[ready_s]],
            forward_s=[0.5],
            backward_s=[backward_s],
            optimizer_s=[0.25],
        )
        r = simulate(
            workload=w,
            config=PolicyConfig(policy="dense"),
            plan=None,
            topology=star(num_ranks=p, bandwidth_bytes_per_s=B, latency_s=LAT),
            num_steps=1,
        )
        return r.rows[0]

    hidden = run(0.0, 1.0)  # comm [0.5, 0.5 + cost] inside backward [0.5, 1.5]
    assert hidden.exposed_comm_s == 0.0
    assert hidden.step_s == pytest.approx(0.5 + 1.0 + 0.25)
    late = run(cost / 2, cost)  # starts half-way through backward, ends cost/2 after it
    assert late.exposed_comm_s == pytest.approx(cost / 2, rel=1e-9)
    assert late.step_s == pytest.approx(0.5 + cost + cost / 2 + 0.25, rel=1e-9)
    assert late.step_s - late.compute_s == pytest.approx(late.exposed_comm_s)


# ------------------------------------------------------------------------ same decisions
@pytest.mark.parametrize("policy", ["importance", "periodic", "topk", "dense"])
def test_decisions_equal_decide_step_every_step(policy: str) -> None:
    params = make_params(num_layers=4)
    R = 3
    plan = plan_for(params, R=R)
    cfg = PolicyConfig(policy=policy, release_period=R, num_buckets=4, density=0.05)
    p = 8
    r = simulate(
        workload=make_workload(params),
        config=cfg,
        plan=plan,
        topology=star(num_ranks=p, bandwidth_bytes_per_s=B, latency_s=LAT),
        num_steps=4 * R + 1,
        integration="sync",  # the decision's own buckets
    )
    phases = release_phases(plan=plan, config=cfg, component_keys=[q.component for q in params])
    for t in range(4 * R + 1):
        dec = decide_step(step=t, config=cfg, params=params, world_size=p, phases=phases)
        assert r.sent_params[t] == dec.sending_params, t
        has_sparse = any(b.collective == CollectiveKind.SPARSE_GATHER for b in dec.buckets)
        assert r.columns["num_collectives"][t] == dec.num_collectives + has_sparse  # + count exchange
        sel = r.spans["step"] == t
        kinds = [SPAN_KINDS[i] for i in r.spans["kind"][sel] if SPAN_KINDS[i] != "metadata"]
        assert kinds == [b.collective.value for b in dec.buckets]
        assert list(dict.fromkeys(r.spans["bucket"][sel])) == [b.index for b in dec.buckets]
        dense = sum(b.numel * 4 for b in dec.buckets if b.collective == CollectiveKind.DENSE_ALLREDUCE)
        assert r.columns["dense_bytes"][t] == dense


def test_plan_mismatch_is_an_error() -> None:
    params = make_params()
    plan = plan_for(params[:-1], R=2)
    with pytest.raises(ValueError, match="does not match"):
        simulate(
            workload=make_workload(params),
            config=PolicyConfig(policy="importance", release_period=2),
            plan=plan,
            topology=star(num_ranks=2, bandwidth_bytes_per_s=B, latency_s=LAT),
            num_steps=2,
        )


# --------------------------------------------------------------------------- conservation
@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), R=st.integers(1, 4), T=st.integers(1, 5))
def test_values_bytes_are_the_recorded_k_of_sent_params(seed: int, R: int, T: int) -> None:
    params = make_params()
    numel = np.array([q.numel for q in params])
    rng = np.random.default_rng(seed)
    nominal = np.array([nominal_k(int(n), 0.05) for n in numel])
    k = rng.integers(0, nominal + 1, size=(T, len(params)))  # a bounded sparsifier keeps at most nominal k
    w = make_workload(params, T=T, k=k, k_density=0.05)
    cfg = PolicyConfig(
        policy="importance", release_period=R, density=0.05, collective="sparse", num_buckets=3
    )
    steps = 2 * R + T
    r = simulate(
        workload=w,
        config=cfg,
        plan=plan_for(params, R=R),
        topology=star(num_ranks=4, bandwidth_bytes_per_s=B, latency_s=LAT),
        num_steps=steps,
    )
    assert r.settings["k_source"] == "trace"
    names = [q.name for q in params]
    expected = [sum(int(k[t % T, names.index(n)]) for n in r.sent_params[t]) for t in range(steps)]
    assert list(r.columns["values_bytes"]) == [4 * e for e in expected]
    assert list(r.columns["indices_bytes"]) == [4 * e for e in expected]
    assert int(r.columns["values_bytes"].sum()) == 4 * sum(expected)
    # every low component is released exactly once per period
    low = [q.name for q in params if q.component in plan_for(params, R=R).low]
    for n in low:
        assert sum(n in r.sent_params[t] for t in range(R)) == 1
    # on the wire, every gather is padded to its bucket's nominal k (+ an 8-byte header)
    gather = r.spans["kind"] == SPAN_KINDS.index("sparse_gather")
    phases = release_phases(
        plan=plan_for(params, R=R), config=cfg, component_keys=[q.component for q in params]
    )
    wire = 0  # the model fits DDP's first 1 MiB bucket: one DDP bucket, padded to its sending params' nominal k
    for t in range(steps):
        dec = decide_step(step=t, config=cfg, params=params, world_size=4, phases=phases)
        nnz = sum(nominal[names.index(n)] for n in dec.sending_params)
        wire += 8 + 8 * nnz if nnz else 0
    assert int(r.spans["size_bytes"][gather].sum()) == wire
    assert int(r.spans["size_bytes"][gather].sum()) >= int(
        (r.columns["values_bytes"] + r.columns["indices_bytes"]).sum()
    )


def test_nominal_k_when_density_differs() -> None:
    params = make_params()
    k = np.ones((1, len(params)), dtype=int)
    w = make_workload(params, k=k, k_density=0.5)
    cfg = PolicyConfig(policy="topk", density=0.01, collective="sparse")
    r = simulate(
        workload=w,
        config=cfg,
        plan=None,
        topology=star(num_ranks=2, bandwidth_bytes_per_s=B, latency_s=LAT),
        num_steps=1,
    )
    assert r.settings["k_source"] == "nominal"
    assert r.columns["values_bytes"][0] == 4 * sum(nominal_k(q.numel, 0.01) for q in params)


def test_staggered_release_has_a_lower_peak_than_the_burst() -> None:
    params = make_params(num_layers=6)
    R = 4
    plan = plan_for(params, R=R, low_fraction=0.8)
    topo = star(num_ranks=8, bandwidth_bytes_per_s=B, latency_s=LAT)
    out = {}
    for staggered in (True, False):
        cfg = PolicyConfig(
            policy="importance", release_period=R, staggered=staggered, collective="sparse", density=0.05
        )
        out[staggered] = simulate(
            workload=make_workload(params), config=cfg, plan=plan, topology=topo, num_steps=4 * R
        )
    wire = {s: out[s].column("wire_bytes") for s in out}
    payload = {s: (out[s].columns["values_bytes"] + out[s].columns["indices_bytes"]).sum() for s in out}
    assert payload[True] == payload[False]  # the same gradient mass goes out over a period
    assert wire[True].max() < wire[False].max()
    assert out[True].summary()["peak_wire_bytes"] < out[False].summary()["peak_wire_bytes"]


# ---------------------------------------------------------------------------- jitter / determinism
def test_determinism_and_jitter() -> None:
    params = make_params()
    topo = star(num_ranks=16, bandwidth_bytes_per_s=B, latency_s=LAT)
    cfg = PolicyConfig(policy="topk", density=0.05)
    j = Jitter(seed=3, compute_cv=0.1)

    def run(seed: int):
        return simulate(
            workload=make_workload(params),
            config=cfg,
            plan=None,
            topology=topo,
            num_steps=5,
            seed=seed,
            jitter=j,
        )

    a, b, c = run(1), run(1), run(2)
    assert not a.representative and a.num_rows == 5 * 16
    assert a.rows == b.rows
    for name in a.columns:
        assert np.array_equal(a.columns[name], b.columns[name])
    assert not np.array_equal(a.columns["step_s"], c.columns["step_s"])
    # per-rank rows: the slowest rank's compute sets when buckets are ready, so nobody finishes early
    s = a.columns["step_s"].reshape(5, 16)
    comp = a.columns["compute_s"].reshape(5, 16)
    assert np.all(s >= comp - 1e-12)
    np.testing.assert_allclose(a.steps["step_s"], s.max(axis=1))


def test_straggler_slows_every_rank_through_the_collectives() -> None:
    params = make_params()
    topo = star(num_ranks=4, bandwidth_bytes_per_s=B, latency_s=LAT)
    cfg = PolicyConfig(policy="dense", num_buckets=1, packing="lpt")
    base = simulate(workload=make_workload(params), config=cfg, plan=None, topology=topo, num_steps=1)
    slow = simulate(
        workload=make_workload(params),
        config=cfg,
        plan=None,
        topology=topo,
        num_steps=1,
        jitter=Jitter(straggler_rank=2, straggler_slowdown=2.0),
    )
    comm = base.columns["comm_s"][0]
    rows = slow.columns["step_s"]
    # one bucket, ready at the straggler's backward end 2·0.3; others wait for it
    assert rows[0] == pytest.approx(0.6 + comm + 0.01, rel=1e-9)
    assert rows[2] == pytest.approx(0.6 + comm + 0.02, rel=1e-9)
    assert slow.columns["exposed_comm_s"][0] == pytest.approx(0.3 + comm, rel=1e-9)


# ------------------------------------------------------------------------------------- outputs
def test_outputs(tmp_path) -> None:
    params = make_params()
    plan = plan_for(params, R=2)
    cfg = PolicyConfig(policy="importance", release_period=2, num_buckets=3)
    r = simulate(
        workload=make_workload(params),
        config=cfg,
        plan=plan,
        topology=star(num_ranks=4, bandwidth_bytes_per_s=B, latency_s=LAT),
        num_steps=4,
    )
    s = r.summary()
    assert s["step_s_mean"] == pytest.approx(float(np.mean(r.steps["step_s"])))
    assert s["wire_bytes"] == pytest.approx(float(np.mean([row.wire_bytes for row in r.rows])))
    csv_path = r.to_csv(tmp_path / "rows.csv")
    lines = csv_path.read_text().splitlines()
    assert lines[0].split(",") == list(StepMetrics.columns()) and len(lines) == 5
    data = json.loads(r.to_json(tmp_path / "rows.json").read_text())
    assert len(data["rows"]) == 4 and data["summary"]["policy"] == "importance"
    trace = json.loads(r.to_chrome_trace(tmp_path / "trace.json").read_text())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert sum(e["tid"] == 1 for e in spans) == len(r.spans["step"])
    assert sum(e["tid"] == 0 for e in spans) == 3 * 4
    assert all(e["dur"] >= 0 for e in spans)
    assert "step time" in r.format_summary()


def test_bad_arguments() -> None:
    params = make_params()
    topo = star(num_ranks=2, bandwidth_bytes_per_s=B, latency_s=LAT)
    with pytest.raises(ValueError, match="num_steps"):
        simulate(
            workload=make_workload(params),
            config=PolicyConfig(policy="dense"),
            plan=None,
            topology=topo,
            num_steps=0,
        )
    with pytest.raises(ValueError, match="mode"):
        simulate(
            workload=make_workload(params),
            config=PolicyConfig(policy="dense"),
            plan=None,
            topology=topo,
            num_steps=1,
            mode="x",
        )
    with pytest.raises(ValueError, match="needs a SyncPlan"):
        simulate(
            workload=make_workload(params),
            config=PolicyConfig(policy="importance"),
            plan=None,
            topology=topo,
            num_steps=1,
        )


# ------------------------------------------------------------------------- costing modes
def test_affine_cost_shortcut_equals_exact_costs() -> None:
    """Per-step k gives a new size per bucket and step; the verified line must match exact costs."""
    params = make_params()
    numel = np.array([q.numel for q in params])
    k = np.random.default_rng(5).integers(1, numel // 10 + 2, size=(9, len(params)))
    w = make_workload(params, T=9, k=k, k_density=0.05)
    cfg = PolicyConfig(policy="topk", density=0.05, collective="sparse", num_buckets=4)
    topo = star(num_ranks=8, bandwidth_bytes_per_s=B, latency_s=LAT)
    # after backward, gathers are padded to the actual (largest) k: a new size per bucket and step
    fast = simulate(workload=w, config=cfg, plan=None, topology=topo, num_steps=9, integration="sync")
    exact = simulate(
        workload=w, config=cfg, plan=None, topology=topo, num_steps=9, integration="sync", exact_costs=True
    )
    assert fast.settings["num_collective_evaluations"] < exact.settings["num_collective_evaluations"]
    np.testing.assert_allclose(fast.columns["step_s"], exact.columns["step_s"], rtol=1e-9)
    np.testing.assert_allclose(fast.spans["end_s"], exact.spans["end_s"], rtol=1e-9)


def test_flow_mode_on_contended_and_heterogeneous_topologies() -> None:
    from igsim.collectives.predict import CollectiveSpec, predict_collective
    from igsim.net.topology import leaf_spine

    params = make_params()
    cfg = PolicyConfig(policy="dense", num_buckets=1, packing="lpt")
    n_bytes = sum(q.numel for q in params) * 4
    comm = {}
    for over in (1.0, 8.0):
        topo = leaf_spine(
            num_ranks=8,
            ranks_per_leaf=4,
            num_spines=1,
            bandwidth_bytes_per_s=B,
            latency_s=LAT,
            oversubscription=over,
        )
        r = simulate(
            workload=make_workload(params), config=cfg, plan=None, topology=topo, num_steps=2, mode="flow"
        )
        oracle = predict_collective(
            CollectiveSpec(op="all_reduce", algorithm="ring", size_bytes=n_bytes), topo, mode="flow"
        ).time_s
        assert r.columns["comm_s"][0] == pytest.approx(oracle, rel=1e-12)
        comm[over] = oracle
    assert comm[8.0] > comm[1.0]  # uplinks at half a NIC: the two cross-leaf ring hops queue
    # one slow NIC slows every rank's ring all-reduce
    fast = star(num_ranks=4, bandwidth_bytes_per_s=B, latency_s=LAT)
    slow = fast.with_link("r2", "sw", bandwidth_bytes_per_s=B / 4)
    runs = [
        simulate(workload=make_workload(params), config=cfg, plan=None, topology=t, num_steps=1)
        for t in (fast, slow)
    ]
    assert runs[1].columns["comm_s"][0] > 2 * runs[0].columns["comm_s"][0]
