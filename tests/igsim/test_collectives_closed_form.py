"""Flow-mode collective schedules against their closed forms (the oracle), to 1e-9 relative.

Each contention-free case is simulated message by message over the flow network on a uniform star
(or two-level cluster) and compared with the textbook formula in :mod:`igsim.collectives.analytic`, over random
p, n, α, B and γ. Also: heterogeneity and concurrency oracles, traffic bookkeeping, spec errors,
and the ``igsim collective`` command.
"""

from __future__ import annotations

import json
import math

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from igsim.cli import main
from igsim.collectives import analytic as af
from igsim.collectives.predict import SUPPORTED, CollectiveSpec, predict_collective, run_collective
from igsim.net.calibration import Calibration, LinkCalibration
from igsim.net.network import Network
from igsim.net.topology import leaf_spine, star, two_level

REL = 1e-9
EXAMPLES = settings(max_examples=30, deadline=None)

ps = st.integers(2, 16)
pow2 = st.sampled_from([2, 4, 8, 16])
sizes = st.floats(0, 1e9)
alphas = st.floats(0, 1e-4)
bws = st.floats(1e6, 1e12)
gammas = st.one_of(st.just(0.0), st.floats(1e-12, 1e-9))
chunks = st.integers(2, 8)


def _flow(spec: CollectiveSpec, p: int, alpha: float, bw: float, gamma: float = 0.0) -> float:
    topo = star(num_ranks=p, bandwidth_bytes_per_s=bw, latency_s=alpha / 2)  # rank to rank: alpha
    return predict_collective(spec, topo, calibration=Calibration(gamma_s_per_byte=gamma), mode="flow").time_s


def _same(simulated: float, closed: float) -> None:
    assert math.isclose(simulated, closed, rel_tol=REL, abs_tol=1e-18), (simulated, closed)


@EXAMPLES
@given(p=ps, n=sizes, a=alphas, b=bws, g=gammas)
def test_ring(p, n, a, b, g):
    kw = {"p": p, "size_bytes": n, "alpha_s": a, "bandwidth_bytes_per_s": b}
    _same(
        _flow(CollectiveSpec(op="all_reduce", size_bytes=n), p, a, b, g),
        af.ring_all_reduce_s(**kw, gamma_s_per_byte=g),
    )
    _same(_flow(CollectiveSpec(op="all_gather", size_bytes=n), p, a, b, g), af.ring_all_gather_s(**kw))
    _same(
        _flow(CollectiveSpec(op="reduce_scatter", size_bytes=n), p, a, b, g),
        af.ring_reduce_scatter_s(**kw, gamma_s_per_byte=g),
    )


@EXAMPLES
@given(p=pow2, n=sizes, a=alphas, b=bws, g=gammas)
def test_recursive_halving_and_doubling(p, n, a, b, g):
    kw = {"p": p, "size_bytes": n, "alpha_s": a, "bandwidth_bytes_per_s": b}
    spec = CollectiveSpec(op="all_reduce", algorithm="halving_doubling", size_bytes=n)
    _same(_flow(spec, p, a, b, g), af.halving_doubling_all_reduce_s(**kw, gamma_s_per_byte=g))
    spec = CollectiveSpec(op="reduce_scatter", algorithm="halving_doubling", size_bytes=n)
    _same(_flow(spec, p, a, b, g), af.recursive_halving_reduce_scatter_s(**kw, gamma_s_per_byte=g))
    spec = CollectiveSpec(op="all_reduce", algorithm="recursive_doubling", size_bytes=n)
    _same(_flow(spec, p, a, b, g), af.recursive_doubling_all_reduce_s(**kw, gamma_s_per_byte=g))
    spec = CollectiveSpec(op="all_gather", algorithm="recursive_doubling", size_bytes=n)
    _same(_flow(spec, p, a, b, g), af.recursive_doubling_all_gather_s(**kw))


@EXAMPLES
@given(p=ps, n=sizes, a=alphas, b=bws, g=gammas, root=st.integers(0, 15))
def test_binomial_tree(p, n, a, b, g, root):
    kw = {"p": p, "size_bytes": n, "alpha_s": a, "bandwidth_bytes_per_s": b}
    spec = CollectiveSpec(op="all_reduce", algorithm="tree", size_bytes=n)
    _same(_flow(spec, p, a, b, g), af.binomial_tree_all_reduce_s(**kw, gamma_s_per_byte=g))
    spec = CollectiveSpec(op="broadcast", algorithm="tree", size_bytes=n, root=root % p)
    _same(_flow(spec, p, a, b), af.binomial_broadcast_s(**kw))


@EXAMPLES
@given(p=ps, n=sizes, a=alphas, b=bws, c=chunks, root=st.integers(0, 15))
def test_pipelined_tree_and_chain(p, n, a, b, c, root):
    kw = {"p": p, "size_bytes": n, "alpha_s": a, "bandwidth_bytes_per_s": b, "num_chunks": c}
    spec = CollectiveSpec(op="all_reduce", algorithm="tree", size_bytes=n, num_chunks=c)
    _same(_flow(spec, p, a, b), af.pipelined_tree_all_reduce_s(**kw))
    spec = CollectiveSpec(op="broadcast", algorithm="tree", size_bytes=n, num_chunks=c, root=root % p)
    _same(_flow(spec, p, a, b), af.pipelined_tree_broadcast_s(**kw))
    spec = CollectiveSpec(op="broadcast", algorithm="ring", size_bytes=n, num_chunks=c, root=root % p)
    _same(_flow(spec, p, a, b), af.ring_broadcast_s(**kw))


@EXAMPLES
@given(p=ps, n=sizes, a=alphas, b=bws, g=gammas)
def test_direct(p, n, a, b, g):
    kw = {"p": p, "size_bytes": n, "alpha_s": a, "bandwidth_bytes_per_s": b}
    _same(_flow(CollectiveSpec(op="all_reduce", algorithm="direct", size_bytes=n), p, a, b, g),
          af.direct_all_reduce_s(**kw, gamma_s_per_byte=g))  # fmt: skip
    _same(
        _flow(CollectiveSpec(op="all_gather", algorithm="direct", size_bytes=n), p, a, b),
        af.direct_all_gather_s(**kw),
    )
    _same(
        _flow(CollectiveSpec(op="broadcast", algorithm="direct", size_bytes=n), p, a, b),
        af.direct_broadcast_s(**kw),
    )


@EXAMPLES
@given(
    m=st.integers(1, 4),
    g=st.integers(1, 4),
    shared=st.booleans(),
    n=sizes,
    lat=st.tuples(alphas, alphas),
    bw=st.tuples(bws, bws),
    cal=st.tuples(alphas, alphas, st.floats(0.5, 1.0), st.floats(0.5, 1.0)),
    gamma=gammas,
)
def test_two_level_hierarchical(m, g, shared, n, lat, bw, cal, gamma):
    if m * g < 2:
        return
    topo = two_level(num_nodes=m, ranks_per_node=g, intra_bandwidth_bytes_per_s=bw[0], intra_latency_s=lat[0],
                     inter_bandwidth_bytes_per_s=bw[1], inter_latency_s=lat[1], shared_nic=shared)  # fmt: skip
    calib = Calibration(
        link_classes={
            "intra": LinkCalibration(alpha_s=cal[0], effective_bandwidth_factor=cal[2]),
            "inter": LinkCalibration(alpha_s=cal[1], effective_bandwidth_factor=cal[3]),
        },
        gamma_s_per_byte=gamma,
    )
    b_in, b_out = bw[0] * cal[2], bw[1] * cal[3]
    # across machines: 2 inter hops, and 4 intra hops (rank-switch-NIC each side) with a shared NIC
    # or 2 (rank-NIC each side) with one NIC per rank; a shared NIC is split among the g rails
    inter_bw = min(b_in, b_out) / g if shared else min(b_in, b_out)
    expected = af.hierarchical_all_reduce_s(
        ranks_per_node=g,
        num_nodes=m,
        size_bytes=n,
        intra_alpha_s=2 * lat[0] + cal[0],
        intra_bandwidth_bytes_per_s=b_in,
        inter_alpha_s=(4 if shared else 2) * lat[0] + 2 * lat[1] + max(cal[0], cal[1]),
        inter_bandwidth_bytes_per_s=inter_bw,
        gamma_s_per_byte=gamma,
    )
    spec = CollectiveSpec(op="all_reduce", algorithm="hierarchical", size_bytes=n)
    _same(predict_collective(spec, topo, calibration=calib, mode="flow").time_s, expected)
    _same(predict_collective(spec, topo, calibration=calib, mode="auto").time_s, expected)


@EXAMPLES
@given(
    ks=st.lists(st.floats(0, 1e7), min_size=2, max_size=16),
    a=alphas,
    b=bws,
)
def test_sparse_all_gathers(ks, a, b):
    p = len(ks)
    kw = {"sizes_bytes": ks, "alpha_s": a, "bandwidth_bytes_per_s": b}
    padded = CollectiveSpec(op="sparse_all_gather", algorithm="padded", sizes_bytes=ks)
    _same(_flow(padded, p, a, b), af.padded_sparse_all_gather_s(**kw))
    ring = _flow(CollectiveSpec(op="sparse_all_gather", algorithm="ring", sizes_bytes=ks), p, a, b)
    _same(ring, af.ring_allgatherv_s(**kw))
    # the abs tolerance of _same: a denormal α (5e-324) halves to 0 per hop in the star's latency
    assert ring >= af.allgatherv_bound_s(**kw) * (1 - REL) - 1e-18
    # equal payloads: the ring meets the textbook all-gatherv cost (p-1)α + s·Σ_{j≠i} k_j / B
    equal = CollectiveSpec(op="sparse_all_gather", algorithm="ring", sizes_bytes=(ks[0],) * p)
    _same(
        _flow(equal, p, a, b),
        af.allgatherv_bound_s(sizes_bytes=[ks[0]] * p, alpha_s=a, bandwidth_bytes_per_s=b),
    )


@settings(max_examples=15, deadline=None)
@given(
    p=st.integers(3, 12),
    n=st.floats(1e3, 1e9),
    a=alphas,
    b=bws,
    slow=st.floats(0.05, 1.0),
    which=st.integers(0, 11),
)
def test_one_slow_link_sets_the_pace_of_the_ring(p, n, a, b, slow, which):
    topo = star(num_ranks=p, bandwidth_bytes_per_s=b, latency_s=a / 2)
    topo = topo.with_link(f"r{which % p}", "sw", bandwidth_bytes_per_s=b * slow)
    spec = CollectiveSpec(op="all_reduce", size_bytes=n)
    expected = 2 * (p - 1) * (a + n / p / (b * slow))
    _same(predict_collective(spec, topo).time_s, expected)


def test_two_concurrent_rings_share_every_link():
    p, n, a, b = 6, 6e6, 1e-5, 1e9
    env = simpy.Environment()
    net = Network(env, star(num_ranks=p, bandwidth_bytes_per_s=b, latency_s=a / 2))
    spec = CollectiveSpec(op="all_reduce", size_bytes=n)
    one, two = run_collective(net, spec), run_collective(net, spec)
    env.run(one & two)
    expected = af.ring_all_reduce_s(
        p=p, size_bytes=2 * n, alpha_s=a, bandwidth_bytes_per_s=b
    )  # half the rate each
    _same(one.value.time_s, expected)
    _same(two.value.time_s, expected)


@pytest.mark.parametrize("p", [1, 2, 5, 8])
def test_traffic_bookkeeping_matches_the_schedules(p):
    topo = star(num_ranks=p, bandwidth_bytes_per_s=1e9, latency_s=1e-6)
    for op, algs in SUPPORTED.items():
        for alg in algs:
            if alg in ("hierarchical", "ideal") or (
                alg in ("halving_doubling", "recursive_doubling") and p & (p - 1)
            ):
                continue
            for c in (1, 3):
                spec = CollectiveSpec(op=op, algorithm=alg, size_bytes=1e6, sizes_bytes=[1e3 * (i + 1) for i in range(p)],
                                      num_chunks=c, root=p - 1)  # fmt: skip
                flow = predict_collective(spec, topo, mode="flow")
                sent, count = af.collective_traffic(op=op, algorithm=alg, p=p, size_bytes=1e6,
                                                    sizes_bytes=spec.sizes_bytes, num_chunks=c, root=p - 1)  # fmt: skip
                assert count == flow.num_messages, (op, alg, c)
                assert all(
                    math.isclose(x, y, rel_tol=1e-12, abs_tol=1e-9)
                    for x, y in zip(sent, flow.bytes_sent_per_rank)
                )
                if op in ("all_reduce", "all_gather", "reduce_scatter") and alg == "ring":
                    factor = 2 if op == "all_reduce" else 1
                    assert sum(sent) == pytest.approx(factor * (p - 1) * 1e6)


def test_auto_mode_uses_closed_forms_only_where_exact():
    spec = CollectiveSpec(op="all_reduce", size_bytes=1e7)
    ls = leaf_spine(num_ranks=16, ranks_per_leaf=4, num_spines=2, bandwidth_bytes_per_s=1e9, latency_s=1e-6,
                    oversubscription=4.0)  # fmt: skip
    assert predict_collective(spec, ls) == predict_collective(spec, ls, mode="flow")
    s = star(num_ranks=7, bandwidth_bytes_per_s=1e9, latency_s=1e-6)
    assert predict_collective(spec, s).time_s == pytest.approx(
        predict_collective(spec, s, mode="flow").time_s, rel=REL
    )
    ideal = predict_collective(CollectiveSpec(op="all_reduce", algorithm="ideal", size_bytes=1e7), s)
    assert ideal.time_s < predict_collective(spec, s).time_s


def test_spec_errors():
    with pytest.raises(ValueError, match="op 'allreduce'"):
        CollectiveSpec(op="allreduce")
    with pytest.raises(ValueError, match="algorithm 'padded'"):
        CollectiveSpec(op="all_reduce", algorithm="padded")
    with pytest.raises(ValueError, match="sizes_bytes"):
        CollectiveSpec(op="sparse_all_gather")
    with pytest.raises(ValueError, match="num_chunks"):
        CollectiveSpec(op="broadcast", num_chunks=0)
    s6 = star(num_ranks=6, bandwidth_bytes_per_s=1e9, latency_s=0)
    with pytest.raises(ValueError, match="power-of-two"):
        predict_collective(CollectiveSpec(op="all_reduce", algorithm="halving_doubling", size_bytes=1), s6)
    with pytest.raises(ValueError, match="3 sizes_bytes for 6 ranks"):
        predict_collective(CollectiveSpec(op="sparse_all_gather", sizes_bytes=(1, 2, 3)), s6)
    with pytest.raises(ValueError, match="groups"):
        predict_collective(CollectiveSpec(op="all_reduce", algorithm="hierarchical", size_bytes=1), s6)
    with pytest.raises(ValueError, match="no message schedule"):
        run_collective(Network(simpy.Environment(), s6), CollectiveSpec(op="all_reduce", algorithm="ideal"))
    with pytest.raises(ValueError, match="mode"):
        predict_collective(CollectiveSpec(op="all_reduce"), s6, mode="fast")


def test_cli_collective_reports_nccl_bus_bandwidth(capsys):
    argv = [
        "collective",
        "--ranks",
        "8",
        "--size",
        "100MB",
        "--bandwidth",
        "100Gbps",
        "--latency",
        "5us",
        "--json",
    ]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    expected = af.ring_all_reduce_s(p=8, size_bytes=1e8, alpha_s=5e-6, bandwidth_bytes_per_s=12.5e9)
    assert out["time_s"] == pytest.approx(expected, rel=REL)
    assert out["busbw_bytes_per_s"] == pytest.approx(1e8 / expected * 2 * 7 / 8)
    argv = [
        "collective",
        "--op",
        "sparse_all_gather",
        "--ranks",
        "3",
        "--sizes",
        "1MB,2MB,1MB",
        "--bandwidth",
        "1GB/s",
    ]
    assert main(argv) == 0
    assert "busbw" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--ranks", "4", "--size", "1MB", "--bandwidth", "100 Gbs"], "unknown unit 'Gbs'"),
        (["--ranks", "4", "--size", "1 MBB", "--bandwidth", "1Gbps"], "unknown unit"),
        (["--ranks", "4", "--op", "sparse_all_gather", "--bandwidth", "1Gbps"], "needs --sizes"),
        (
            ["--ranks", "4", "--op", "sparse_all_gather", "--sizes", "1MB", "--bandwidth", "1Gbps"],
            "1 payloads for 4",
        ),
        (["--size", "1MB"], "give --ranks"),
    ],
)
def test_cli_collective_errors_exit_2(capsys, argv, message):
    assert main(["collective", *argv]) == 2
    assert message in capsys.readouterr().err


def test_empty_messages_do_not_launch_twice():
    """Regression (found by hypothesis): empty blocks arrive inside send(); a message whose deps all
    arrived that way was launched twice and ended the collective early."""
    ks = [0.0, 0.0, 1.0]
    kw = {"sizes_bytes": ks, "alpha_s": 0.0, "bandwidth_bytes_per_s": 1e6}
    ring = _flow(CollectiveSpec(op="sparse_all_gather", algorithm="ring", sizes_bytes=ks), 3, 0.0, 1e6)
    _same(ring, af.ring_allgatherv_s(**kw))
    assert ring == pytest.approx(2e-6)
