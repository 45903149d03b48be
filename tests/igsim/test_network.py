"""The flow-level network: uncontended timing, max-min fairness, conservation, determinism.

Oracles: alpha + size / bottleneck for a lone message; a from-scratch water-filling computation of
the max-min fair rates, compared with the incrementally maintained rates at random instants.
"""

from __future__ import annotations

import math
import random

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from igsim.net.calibration import Calibration, LinkCalibration
from igsim.net.network import Network
from igsim.net.topology import leaf_spine, star

REL = 1e-9


def _close(a: float, b: float, rel: float = REL) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-15)


@settings(max_examples=40, deadline=None)
@given(
    size=st.floats(0, 1e9),
    bw=st.floats(1e6, 1e12),
    lat=st.floats(0, 1e-3),
)
def test_lone_message_takes_alpha_plus_size_over_bandwidth(size, bw, lat):
    env = simpy.Environment()
    net = Network(env, star(num_ranks=2, bandwidth_bytes_per_s=bw, latency_s=lat))
    done = net.transfer("r0", "r1", size)
    assert env.run(done) == size
    assert _close(env.now, 2 * lat + size / bw)
    assert net.bytes_delivered == size


def test_two_flows_sharing_a_link_get_half_each():
    env = simpy.Environment()
    net = Network(env, star(num_ranks=3, bandwidth_bytes_per_s=1e9, latency_s=0.0))
    a = net.transfer("r0", "r2", 1e6)
    b = net.transfer("r1", "r2", 1e6)
    env.run(1e-4)
    rates = [f.rate_bytes_per_s for f in net.flows()]
    assert rates == [5e8, 5e8]
    env.run(a & b)
    assert _close(env.now, 2e-3)


def test_a_flow_limited_elsewhere_leaves_the_rest_to_the_others():
    # r0's own link is slow (1e8); r0 and r1 both send to r2, whose downlink (1e9) they share
    topo = star(
        num_ranks=3,
        bandwidth_bytes_per_s=1e9,
        latency_s=0.0,
        link_overrides={("r0", "sw"): {"bandwidth_bytes_per_s": 1e8}},
    )
    env = simpy.Environment()
    net = Network(env, topo)
    net.transfer("r0", "r2", 1e6)
    fast = net.transfer("r1", "r2", 1e6)
    env.run(1e-5)
    by_src = {f.src: f.rate_bytes_per_s for f in net.flows()}
    assert by_src == {"r0": 1e8, "r1": 9e8}
    env.run(fast)
    assert _close(env.now, 1e6 / 9e8)
    env.run(2e-3)  # r1 done: r0 still limited by its own link
    assert [f.rate_bytes_per_s for f in net.flows()] == [1e8]


def test_full_duplex_directions_do_not_compete():
    env = simpy.Environment()
    net = Network(env, star(num_ranks=2, bandwidth_bytes_per_s=1e9, latency_s=0.0))
    ev = net.transfer("r0", "r1", 1e6) & net.transfer("r1", "r0", 1e6)
    env.run(ev)
    assert _close(env.now, 1e-3)


def test_zero_bytes_pays_alpha_self_transfer_is_free_negative_is_an_error():
    env = simpy.Environment()
    net = Network(env, star(num_ranks=2, bandwidth_bytes_per_s=1e9, latency_s=3e-6))
    env.run(net.transfer("r0", "r1", 0))
    assert _close(env.now, 6e-6)
    t = env.now
    env.run(net.transfer("r1", "r1", 1e9))
    assert env.now == t
    with pytest.raises(ValueError, match="size_bytes"):
        net.transfer("r0", "r1", -1)


def test_calibration_adds_alpha_and_scales_capacity():
    cal = Calibration(link_classes={"nic": LinkCalibration(alpha_s=1e-5, effective_bandwidth_factor=0.5)})
    env = simpy.Environment()
    net = Network(env, star(num_ranks=2, bandwidth_bytes_per_s=1e9, latency_s=1e-6), calibration=cal)
    env.run(net.transfer("r0", "r1", 1e6))
    assert _close(env.now, 2e-6 + 1e-5 + 1e6 / 5e8)


# -- max-min fairness against a from-scratch oracle --------------------------------------------


def _water_filling(flows: list[tuple], cap: dict, weights: list[float] | None = None) -> list[float]:
    """Reference (weighted) max-min rates: raise one level for all unfrozen flows, each at its
    weight (default 1) x level; freeze those on the first saturated link; repeat (quadratic and
    simple, independent of the network's heap)."""
    weights = weights or [1.0] * len(flows)
    rate = [0.0] * len(flows)
    frozen = [False] * len(flows)
    used = dict.fromkeys(cap, 0.0)
    while not all(frozen):
        best, best_links = math.inf, []
        for link, c in cap.items():
            w = sum(weights[i] for i, f in enumerate(flows) if not frozen[i] and link in f)
            if w:
                level = (c - used[link]) / w
                if level < best * (1 - 1e-12):
                    best, best_links = level, [link]
                elif level <= best * (1 + 1e-12):
                    best_links.append(link)
        for i, f in enumerate(flows):
            if not frozen[i] and any(link in f for link in best_links):
                frozen[i], rate[i] = True, weights[i] * best
                for link in f:
                    used[link] += rate[i]
    return rate


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), num_flows=st.integers(1, 24), oversub=st.sampled_from([1.0, 2.0, 3.0]))
def test_rates_are_max_min_fair_capacities_respected_bytes_conserved(seed, num_flows, oversub):
    rng = random.Random(seed)
    overrides = {("r3", "leaf0"): {"bandwidth_bytes_per_s": 2.5e8}}
    topo = leaf_spine(num_ranks=12, ranks_per_leaf=4, num_spines=2, bandwidth_bytes_per_s=1e9, latency_s=1e-6,
                      oversubscription=oversub, link_overrides=overrides)  # fmt: skip
    env = simpy.Environment()
    net = Network(env, topo)
    sizes = []
    done = []

    def sender(delay, src, dst, size):
        yield env.timeout(delay)
        size_got = yield net.transfer(src, dst, size)
        done.append((size_got, size))

    for _ in range(num_flows):
        src, dst = rng.sample(topo.ranks, 2)
        size = rng.uniform(1e3, 5e6)
        sizes.append(size)
        env.process(sender(rng.uniform(0, 5e-3), src, dst, size))
    checks = 0
    for t in sorted(rng.uniform(0, 2e-2) for _ in range(8)):
        env.run(until=max(t, env.now + 1e-9))
        env.run(until=env.now + 1e-12)  # let same-instant recomputations settle
        flows = net.flows()
        if not flows:
            continue
        cap = {}
        for link, (load, c) in net.link_load().items():
            assert load <= c * (1 + REL), f"link {link} over capacity: {load} > {c}"
            cap[link] = c
        expected = _water_filling([f.links for f in flows], cap)
        for f, r in zip(flows, expected):
            assert _close(f.rate_bytes_per_s, r, 1e-7), (f, r)
        checks += 1
    env.run()
    assert net.num_active_flows == 0
    assert len(done) == num_flows and all(a == b for a, b in done)
    assert math.isclose(net.bytes_delivered, sum(sizes), rel_tol=1e-12)


def test_deterministic():
    def run_once():
        rng = random.Random(7)
        topo = leaf_spine(num_ranks=16, ranks_per_leaf=4, num_spines=2, bandwidth_bytes_per_s=1e9, latency_s=1e-6,
                          oversubscription=2.0)  # fmt: skip
        env = simpy.Environment()
        net = Network(env, topo)
        times = []
        for _ in range(40):
            src, dst = rng.sample(topo.ranks, 2)
            ev = net.transfer(src, dst, rng.uniform(1e3, 1e6))
            ev.callbacks.append(lambda e: times.append(env.now))
        env.run()
        return times

    assert run_once() == run_once()


def test_calibration_file_round_trip_and_strict_keys(tmp_path):
    cal = Calibration(
        link_classes={"nic": LinkCalibration(alpha_s=3e-5, effective_bandwidth_factor=0.94),
                      "inter": LinkCalibration(effective_bandwidth_bytes_per_s=1e9)},
        gamma_s_per_byte=2e-10,
        source="unit test",
    )  # fmt: skip
    path = tmp_path / "cal.json"
    cal.save(path)
    assert Calibration.load(path) == cal
    assert cal.capacity_bytes_per_s("inter", 5e10) == 1e9  # absolute effective bandwidth wins
    assert cal.capacity_bytes_per_s("other", 5e10) == 5e10  # default: identity
    assert cal.message_alpha_s(["other", "nic", "inter"]) == 3e-5  # the largest overhead, once
    path.write_text('{"link_classes": {"nic": {"alpha": 1}}}')
    with pytest.raises(ValueError, match=r"cal.json: link_classes.nic: unknown key 'alpha'"):
        Calibration.load(path)
    path.write_text('{"gamma": 1}')
    with pytest.raises(ValueError, match="unknown key 'gamma'"):
        Calibration.load(path)
    path.write_text('{"default": {"alpha_s": "5 parsecs"}}')
    with pytest.raises(ValueError, match=r"cal\.json: default: .*unknown unit"):
        Calibration.load(path)
    path.write_text('{"default": {"effective_bandwidth_factor": 0}}')
    with pytest.raises(ValueError, match="effective_bandwidth_factor"):
        Calibration.load(path)
    with pytest.raises(ValueError, match="gamma_s_per_byte"):
        Calibration(gamma_s_per_byte=-1.0)


def test_inlined_schedule_is_simpys():
    """The hot path pushes onto simpy's queue itself (``Environment.schedule`` inlined): the same
    entry, so events keep their order against events scheduled the ordinary way."""
    env = simpy.Environment()
    order = []
    net = Network(env, star(num_ranks=2, bandwidth_bytes_per_s=1e9, latency_s=1e-6))
    env.timeout(2e-6).callbacks.append(lambda _: order.append("timeout before"))
    net.send("r0", "r1", 0.0, lambda: order.append("message"))  # arrives after its 2e-6 latency
    env.timeout(2e-6).callbacks.append(lambda _: order.append("timeout after"))
    env.run()
    assert order == ["timeout before", "message", "timeout after"]
    assert isinstance(env._queue, list) and hasattr(env._eid, "__next__")


def test_array_schedules_run_millions_of_messages_lightly():
    """A ring all-gather's schedule is built as arrays and run from machine arrays: no Python
    object per message beyond the active flows (a list of tuples took about 340 bytes a message)."""
    import tracemalloc

    from igsim.collectives.predict import CollectiveSpec, run_collective

    topo = star(num_ranks=300, bandwidth_bytes_per_s=1e9, latency_s=1e-6)
    net = Network(simpy.Environment(), topo)
    for i in range(300):
        net.route(topo.ranks[i], topo.ranks[(i + 1) % 300])  # routes are the topology's, cached
    tracemalloc.start()
    proc = run_collective(net, CollectiveSpec(op="all_gather", size_bytes=3e6))
    net.env.run(proc)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert proc.value.num_messages == 300 * 299
    assert peak < 200 * proc.value.num_messages  # bytes, the build's temporaries included


# -- the downstream share (weighted max-min) ---------------------------------------------------


def test_a_flow_behind_a_slower_link_gets_its_share_weight_on_the_link_it_shares():
    """The two-level testbed's broadcast: the root sends to a local child and, over the half-rate
    uplink, to a remote one. Plain max-min: 0.5 / 0.5 of the root's NIC and the uplink full; with
    share s the remote send gets 2s / (1 + s) of the uplink's rate and the local one the rest."""
    from igsim.studies.validation import TestbedDescription, testbed_topology

    topo = testbed_topology(TestbedDescription(num_ranks=4, rate_bytes_per_s=2e6, two_level=True,
                                               uplink_rate_bytes_per_s=1e6))  # fmt: skip
    for s in (1.0, 0.6):
        env = simpy.Environment()
        net = Network(env, topo, calibration=Calibration(downstream_share=s))
        net.transfer("r0", "r1", 1e6)
        net.transfer("r0", "r2", 1e6)
        env.run(1e-6)
        local, remote = (f.rate_bytes_per_s for f in net.flows())
        assert _close(remote, 2e6 * s / (1 + s)) and _close(local + remote, 2e6)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), num_flows=st.integers(1, 24), share=st.sampled_from([1.0, 0.7, 0.3]))
def test_weighted_rates_match_a_weighted_water_filling(seed, num_flows, share):
    rng = random.Random(seed)
    overrides = {("r3", "leaf0"): {"bandwidth_bytes_per_s": 2.5e8}}
    topo = leaf_spine(num_ranks=12, ranks_per_leaf=4, num_spines=2, bandwidth_bytes_per_s=1e9, latency_s=1e-6,
                      oversubscription=3.0, link_overrides=overrides)  # fmt: skip
    env = simpy.Environment()
    net = Network(env, topo, calibration=Calibration(downstream_share=share))
    for _ in range(num_flows):
        src, dst = rng.sample(topo.ranks, 2)
        net.transfer(src, dst, rng.uniform(1e5, 5e6))
    env.run(until=1e-5)  # every flow started, none done
    flows = net.flows()
    cap = {link: c for link, (_, c) in net.link_load().items()}
    weights = []
    for f in flows:
        caps = [cap[link] for link in f.links]
        weights.append(share if min(caps) < max(caps) * (1 - 1e-9) else 1.0)
    expected = _water_filling([f.links for f in flows], cap, weights)
    for f, r in zip(flows, expected):
        assert _close(f.rate_bytes_per_s, r, 1e-7), (f, r)


def test_downstream_share_is_checked_and_round_trips(tmp_path):
    with pytest.raises(ValueError, match="downstream_share"):
        Calibration(downstream_share=0.0)
    with pytest.raises(ValueError, match="downstream_share"):
        Calibration.from_dict({"downstream_share": 1.5})
    with pytest.raises(ValueError, match="downstream_share"):
        Calibration.from_dict({"downstream_share": "most"})
    cal = Calibration(downstream_share=0.62)
    cal.save(tmp_path / "c.json")
    assert Calibration.load(tmp_path / "c.json").downstream_share == 0.62
    assert "downstream_share" not in Calibration().to_dict()  # files without it read as plain max-min


# -- queue overflow at a step-down link -------------------------------------------------------


def _two_level(queue_bytes: float | None, factor: float) -> tuple:
    from igsim.studies.validation import TestbedDescription, testbed_topology

    topo = testbed_topology(TestbedDescription(num_ranks=4, rate_bytes_per_s=2e6, two_level=True,
                                               uplink_rate_bytes_per_s=1e6))  # fmt: skip
    up = LinkCalibration(queue_bytes=queue_bytes, overflow_factor=factor)
    return topo, Calibration(link_classes={"uplink": up})


@pytest.mark.parametrize(("src", "dst", "size", "expected"), [
    ("r1", "r2", 99_999.0, 99_999.0 / 1e6),  # under 2 x 100 kB x (1 - 1/2) = 100 kB: no overflow
    ("r1", "r2", 100_000.0, 100_000.0 / 0.8 / 1e6),  # from there on: size / 0.8 at the uplink's rate
    ("r2", "r1", 300_000.0, 300_000.0 / 0.8 / 1e6),  # either direction of the uplink
    ("r0", "r1", 300_000.0, 300_000.0 / 2e6),  # a local message never meets the uplink
])  # fmt: skip
def test_a_message_that_overflows_a_step_down_queue_occupies_its_links_longer(src, dst, size, expected):
    topo, cal = _two_level(100_000.0, 0.8)
    env = simpy.Environment()
    net = Network(env, topo, calibration=cal)
    env.run(net.transfer(src, dst, size))
    assert _close(env.now, expected)
    assert net.bytes_delivered == size  # the payload, not the link work


def test_without_a_faster_link_before_it_a_slow_link_does_not_overflow():
    """A sender behind its own slow NIC is backpressured by it (no queue builds further on)."""
    topo = star(num_ranks=2, bandwidth_bytes_per_s=2e6, latency_s=0.0,
                link_overrides={("r0", "sw"): {"bandwidth_bytes_per_s": 1e6}})  # fmt: skip
    slow = Calibration(link_classes={"nic": LinkCalibration(queue_bytes=1.0, overflow_factor=0.5)})
    for src, dst, t in (("r0", "r1", 1.0), ("r1", "r0", 2.0)):  # r1 -> sw (2e6) -> r0 (1e6) steps down
        env = simpy.Environment()
        net = Network(env, topo, calibration=slow)
        env.run(net.transfer(src, dst, 1e6))
        assert _close(env.now, t)


def test_overflow_settings_are_checked_and_round_trip(tmp_path):
    with pytest.raises(ValueError, match="needs the queue"):
        LinkCalibration(overflow_factor=0.9)
    with pytest.raises(ValueError, match=r"overflow_factor=1\.5 must be in \(0, 1\]"):
        LinkCalibration(queue_bytes=1e5, overflow_factor=1.5)
    with pytest.raises(ValueError, match="queue_bytes=-1"):
        LinkCalibration.from_dict({"queue_bytes": -1, "overflow_factor": 0.9}, where="x")
    _, cal = _two_level(125_000.0, 0.92)
    cal.save(tmp_path / "c.json")
    back = Calibration.load(tmp_path / "c.json").for_class("uplink")
    assert (back.queue_bytes, back.overflow_factor, back.overflows) == (125_000.0, 0.92, True)
    assert not LinkCalibration(queue_bytes=1e5).overflows  # a queue with a factor of 1 costs nothing
    assert "queue_bytes" not in LinkCalibration().to_dict()
