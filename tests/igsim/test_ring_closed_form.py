"""The contention-aware ring closed form (igsim.collectives.rings) against the flow mode.

Oracles: the flow-mode simulation of the same schedule. Properties over random topologies (leaf-
spines, two-level clusters, stars and rings with odd links), rank orders, calibrations, sizes and
reduction costs: the closed form is never below the flow mode (an upper bound everywhere), equals
it to 1e-9 wherever its certificate holds, and a passing (truncated) check implies that the whole
ring agrees. Then the step engine's cost cache: the ring form and the flow-mode line give the
costs of exact flow evaluations, fall back where the check fails, and are reported per op.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from igpolicy.config import PolicyConfig
from igpolicy.vocab import ParamInfo
from igsim.collectives.costs import CostCache
from igsim.collectives.predict import CollectiveSpec, predict_collective
from igsim.collectives.rings import check_ring, ring_shape, ring_terms, ring_time_s
from igsim.net.calibration import Calibration, LinkCalibration
from igsim.net.topology import Topology, leaf_spine, ring, star, two_level
from igsim.step.engine import simulate
from igsim.step.workload import Workload

REL = 1e-9
OPS = ("all_reduce", "all_gather", "reduce_scatter", "sparse_ring", "sparse_padded")


def _spec(op: str, n: float, p: int) -> CollectiveSpec:
    if op == "sparse_ring":
        return CollectiveSpec(op="sparse_all_gather", algorithm="ring", sizes_bytes=(n,) * p)
    if op == "sparse_padded":  # unequal payloads, padded to the largest: still a ring of equal messages
        return CollectiveSpec(op="sparse_all_gather", algorithm="padded", sizes_bytes=[n * (1 + i % 3) for i in range(p)])
    return CollectiveSpec(op=op, algorithm="ring", size_bytes=n)


def _reordered(topo: Topology, order: list[int]) -> Topology:
    """The same cluster with its ranks in another ring order."""
    return Topology(graph=topo.graph, ranks=tuple(topo.ranks[i] for i in order), name=topo.name + "-perm",
                    kind="custom", groups=topo.groups)  # fmt: skip


@st.composite
def clusters(draw) -> Topology:
    bw = draw(st.sampled_from([1e8, 1e9, 1.25e10]))
    lat = draw(st.sampled_from([0.0, 1e-6, 5e-6]))
    kind = draw(st.sampled_from(["leaf_spine", "leaf_spine", "two_level", "star", "ring"]))
    if kind == "leaf_spine":
        per_leaf = draw(st.integers(1, 5))
        topo = leaf_spine(num_ranks=draw(st.integers(2, 20)), ranks_per_leaf=per_leaf, num_spines=draw(st.integers(1, 3)),
                          bandwidth_bytes_per_s=bw, latency_s=lat,
                          oversubscription=draw(st.sampled_from([0.5, 1.0, 2.0, 3.0, 4.0])))  # fmt: skip
    elif kind == "two_level":
        topo = two_level(num_nodes=draw(st.integers(1, 4)), ranks_per_node=draw(st.integers(1, 4)),
                         intra_bandwidth_bytes_per_s=4 * bw, intra_latency_s=lat / 4, inter_bandwidth_bytes_per_s=bw,
                         inter_latency_s=lat, shared_nic=draw(st.booleans()))  # fmt: skip
        if topo.num_ranks < 2:
            topo = star(num_ranks=2, bandwidth_bytes_per_s=bw, latency_s=lat)
    elif kind == "star":
        topo = star(num_ranks=draw(st.integers(2, 16)), bandwidth_bytes_per_s=bw, latency_s=lat)
    else:
        topo = ring(num_ranks=draw(st.integers(3, 12)), bandwidth_bytes_per_s=bw, latency_s=lat)
    if draw(st.booleans()):  # one odd link: slower, or longer
        edges = sorted(topo.graph.edges())
        u, v = edges[draw(st.integers(0, len(edges) - 1))]
        attrs = draw(st.sampled_from([{"bandwidth_bytes_per_s": bw * 0.3}, {"latency_s": lat + 2e-6},
                                      {"bandwidth_bytes_per_s": bw * 2.5}]))  # fmt: skip
        topo = topo.with_link(u, v, **attrs)
    order = list(range(topo.num_ranks))
    if draw(st.booleans()):
        order = draw(st.permutations(order))
    return _reordered(topo, order)


calibrations = st.builds(
    lambda a, f, g: Calibration(
        link_classes={"uplink": LinkCalibration(alpha_s=a, effective_bandwidth_factor=f),
                      "inter": LinkCalibration(alpha_s=a / 2, effective_bandwidth_factor=f)},
        gamma_s_per_byte=g,
    ),
    st.sampled_from([0.0, 3e-6]),
    st.sampled_from([1.0, 0.8]),
    st.sampled_from([0.0, 0.0, 2e-10]),
)


@settings(max_examples=120, deadline=None)
@given(topo=clusters(), cal=calibrations, op=st.sampled_from(OPS), n=st.floats(1e3, 5e7))
def test_ring_form_bounds_the_flow_mode_and_equals_it_where_certified(topo, cal, op, n):
    p = topo.num_ranks
    spec = _spec(op, n, p)
    terms = ring_terms(topo, cal)
    shape = ring_shape(spec, p)
    closed = ring_time_s(shape, terms, gamma_s_per_byte=cal.gamma_s_per_byte)
    flow = predict_collective(spec, topo, calibration=cal, mode="flow").time_s
    assert flow <= closed * (1 + REL) + 1e-15, (terms, flow, closed)
    check = check_ring(spec, topo, cal, terms=terms, max_messages=3 * p)  # 3 of the ring's steps
    event(f"certified={check.certified} tight={math.isclose(flow, closed, rel_tol=REL)}")
    if check.certified:
        assert math.isclose(flow, closed, rel_tol=REL, abs_tol=1e-15), (terms, flow, closed)
        assert check.ok, check
    if check.ok:  # a passing (truncated) check is only ever followed by agreement
        assert math.isclose(flow, closed, rel_tol=REL, abs_tol=1e-15)


def test_analytic_mode_uses_the_contention_aware_terms_for_rings():
    ls = leaf_spine(num_ranks=32, ranks_per_leaf=8, num_spines=2, bandwidth_bytes_per_s=1e9, latency_s=1e-6,
                    oversubscription=4.0)  # fmt: skip
    interleaved = _reordered(ls, [(i % 4) * 8 + i // 4 for i in range(32)])
    spec = CollectiveSpec(op="all_reduce", size_bytes=64e6)
    terms = ring_terms(interleaved)
    assert terms.num_sharing > 1 and terms.bandwidth_bytes_per_s < 1e9  # every hop crosses a shared uplink
    analytic = predict_collective(spec, interleaved, mode="analytic").time_s
    assert analytic == pytest.approx(predict_collective(spec, interleaved, mode="flow").time_s, rel=REL)


@pytest.mark.parametrize("p", [64, 256])
@pytest.mark.parametrize("interleave", [False, True])
def test_leaf_spine_examples_agree_to_1e12(p, interleave):
    """The prototype's cases: 2:1 leaf-spine of 16-rank leaves, rank order and interleaved."""
    ls = leaf_spine(num_ranks=p, ranks_per_leaf=16, num_spines=4, bandwidth_bytes_per_s=12.5e9, latency_s=1e-6,
                    oversubscription=2.0)  # fmt: skip
    leaves = p // 16
    topo = _reordered(ls, [(i % leaves) * 16 + i // leaves for i in range(p)]) if interleave else ls
    spec = CollectiveSpec(op="all_gather", size_bytes=32e6)
    terms = ring_terms(topo)
    assert terms.exact_without_reduction
    flow = predict_collective(spec, topo, mode="flow").time_s
    assert flow == pytest.approx(ring_time_s(ring_shape(spec, p), terms), rel=1e-12)
    assert check_ring(spec, topo, terms=terms).ok


def test_a_failed_certificate_is_reported_not_trusted():
    # one rank's link is slower but its flows are not the slowest-latency ones: the bound is loose
    topo = star(num_ranks=6, bandwidth_bytes_per_s=1e9, latency_s=1e-6)
    topo = topo.with_link("r2", "sw", bandwidth_bytes_per_s=4e8, latency_s=0.0)
    terms = ring_terms(topo)
    assert not terms.exact_without_reduction
    spec = CollectiveSpec(op="all_gather", size_bytes=6e6)
    check = check_ring(spec, topo, terms=terms)
    assert not check.ok and check.flow_s < check.closed_s
    with pytest.raises(ValueError, match="not a ring"):
        check_ring(CollectiveSpec(op="all_reduce", algorithm="tree", size_bytes=1.0), topo)


# -- the engine's cost cache --------------------------------------------------------------------


def _params(num_layers: int = 3, hidden: int = 64) -> list[ParamInfo]:
    out = [ParamInfo(name="emb", shape=(500, hidden), dtype="float32", component="embedding", order=0)]
    for layer in range(num_layers):
        for kind, shape in (("attn_q", (hidden, hidden)), ("mlp_up", (4 * hidden, hidden)), ("norm", (hidden,))):
            out.append(ParamInfo(name=f"l{layer}.{kind}", shape=shape, dtype="float32", component=f"{layer}.{kind}",
                                 order=len(out)))  # fmt: skip
    return out


def _workload(params: list[ParamInfo], num_steps: int, *, density: float, seed: int = 0) -> Workload:
    numel = np.array([q.numel for q in params])
    k = np.random.default_rng(seed).integers(1, (numel * density * 2).astype(int) + 2, size=(num_steps, len(params)))
    ready = np.linspace(0.002, 0.01, len(params))[::-1]
    return Workload(
        name="unit", params=tuple(params), ready_s=np.repeat(ready[None, :], num_steps, axis=0),
        forward_s=np.full(num_steps, 0.005), backward_s=np.full(num_steps, 0.01),
        optimizer_s=np.full(num_steps, 0.001), k=k, k_density=density,
    )  # fmt: skip


def _leaf_spine(p: int = 24, *, interleave: bool = True) -> Topology:
    ls = leaf_spine(num_ranks=p, ranks_per_leaf=4, num_spines=2, bandwidth_bytes_per_s=1e9, latency_s=1e-6,
                    oversubscription=2.0)  # fmt: skip
    leaves = p // 4
    return _reordered(ls, [(i % leaves) * 4 + i // leaves for i in range(p)]) if interleave else ls


@pytest.mark.parametrize("integration", ["sync", "ddp-hook"])
@pytest.mark.parametrize("policy", ["topk", "dense"])
def test_flow_mode_costs_from_the_ring_form_equal_exact_flow_costs(integration, policy):
    params = _params()
    w = _workload(params, 7, density=0.02)
    cfg = PolicyConfig(policy=policy, density=0.02, num_buckets=3, packing="lpt",
                       collective="sparse" if policy == "topk" else "auto")  # fmt: skip
    kw = {"workload": w, "config": cfg, "plan": None, "topology": _leaf_spine(), "num_steps": 7, "mode": "flow",
          "integration": integration}  # fmt: skip
    fast, exact = simulate(**kw), simulate(**kw, exact_costs=True)
    methods = fast.settings["collective_costs"]
    assert methods and all(m.startswith("ring closed form") for m in methods.values()), methods
    assert set(exact.settings["collective_costs"].values()) == {"exact"}
    # after backward, gathers are padded to the largest k: a new size per bucket and step
    fewer = fast.settings["num_collective_evaluations"] < exact.settings["num_collective_evaluations"]
    assert fewer or integration == "ddp-hook"
    np.testing.assert_allclose(fast.columns["step_s"], exact.columns["step_s"], rtol=REL)
    np.testing.assert_allclose(fast.spans["end_s"], exact.spans["end_s"], rtol=REL)


def test_flow_mode_line_for_non_rings_and_fallback_where_the_ring_check_fails():
    params = _params()
    w = _workload(params, 8, density=0.02, seed=3)
    topo = star(num_ranks=6, bandwidth_bytes_per_s=1e9, latency_s=1e-6).with_link(
        "r2", "sw", bandwidth_bytes_per_s=4e8, latency_s=0.0
    )  # the ring's certificate fails here
    for dense_algorithm in ("ring", "tree"):
        cfg = PolicyConfig(policy="topk", density=0.02, num_buckets=3, packing="lpt", collective="dense")
        kw = {"workload": w, "config": cfg, "plan": None, "topology": topo, "num_steps": 8, "mode": "flow",
              "integration": "sync", "dense_algorithm": dense_algorithm}  # fmt: skip
        fast, exact = simulate(**kw), simulate(**kw, exact_costs=True)
        assert fast.settings["collective_costs"]["dense"] == "line", fast.settings["collective_costs"]
        np.testing.assert_allclose(fast.spans["end_s"], exact.spans["end_s"], rtol=REL)


def test_cost_cache_line_reads_inside_its_range_and_checks_outside():
    topo = star(num_ranks=5, bandwidth_bytes_per_s=1e9, latency_s=1e-6).with_link("r1", "sw", latency_s=4e-6)
    costs = CostCache(topology=topo, calibration=None, mode="flow", world_size=5, dense_algorithm="tree",
                      sparse_algorithm="direct")  # fmt: skip
    sizes = [1000, 9000, 3000, 5000, 7000]
    for s in sizes:
        costs.sparse(s)
    assert costs.num_evaluations == 5 and costs.methods() == {"sparse": "line"}
    inside = costs.sparse(4000)
    assert costs.num_evaluations == 5  # read off the line
    outside = costs.sparse(20000)
    assert costs.num_evaluations == 6  # beyond the verified range: evaluated (and on the line)
    for s, t in ((4000, inside), (20000, outside)):
        spec = CollectiveSpec(op="sparse_all_gather", algorithm="direct", sizes_bytes=(s,) * 5)
        assert t == pytest.approx(predict_collective(spec, topo, mode="flow").time_s, rel=REL)
    one = CostCache(topology=star(num_ranks=1, bandwidth_bytes_per_s=1e9, latency_s=0.0), calibration=None,
                    mode="flow", world_size=1, dense_algorithm="ring", sparse_algorithm="ring")  # fmt: skip
    assert one.dense(10**6) == 0.0 and one.methods() == {"dense": "single rank"}
