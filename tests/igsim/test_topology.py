"""Topologies: builders, routing, overrides, validation and the file loader's errors."""

from __future__ import annotations

import itertools
import json
from importlib import resources

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from igsim.net.topology import leaf_spine, load_topology, ring, star, two_level

DATA = resources.files("igsim") / "data"


def _two_level(shared: bool, m: int = 3, g: int = 4):
    return two_level(num_nodes=m, ranks_per_node=g, intra_bandwidth_bytes_per_s=1e11, intra_latency_s=1e-6,
                     inter_bandwidth_bytes_per_s=1e10, inter_latency_s=2e-6, shared_nic=shared)  # fmt: skip


def test_star_shape_and_path_latency():
    t = star(num_ranks=5, bandwidth_bytes_per_s=1e9, latency_s=1e-6)
    assert t.ranks == ("r0", "r1", "r2", "r3", "r4")
    assert t.path("r1", "r4") == ("r1", "sw", "r4")
    assert t.path("r2", "r2") == ("r2",)
    assert t.path_latency_s("r0", "r1") == pytest.approx(2e-6)
    assert t.uniform_star() == (1e-6, 1e9, "nic")
    assert t.uniform_ring() is None


def test_ring_routes_around_the_shorter_side():
    t = ring(num_ranks=8, bandwidth_bytes_per_s=1e9, latency_s=1e-6)
    assert t.path("r0", "r1") == ("r0", "r1")
    assert t.path("r0", "r7") == ("r0", "r7")
    assert len(t.path("r1", "r4")) == 4
    assert t.uniform_ring() is not None and t.uniform_star() is None


@pytest.mark.parametrize("shared", [True, False])
def test_two_level_keeps_intra_node_traffic_inside_the_node(shared):
    t = _two_level(shared)
    assert t.groups == (("r0", "r1", "r2", "r3"), ("r4", "r5", "r6", "r7"), ("r8", "r9", "r10", "r11"))
    assert t.path("r0", "r3") == ("r0", "n0", "r3")
    cross = t.path("r1", "r5")
    assert "core" in cross
    classes = {t.link(u, v)["link_class"] for u, v in t.path_links("r1", "r5")}
    assert classes == {"intra", "inter"}
    if shared:
        assert cross == ("r1", "n0", "n0.nic", "core", "n1.nic", "n1", "r5")
    else:
        assert cross == ("r1", "r1.nic", "core", "r5.nic", "r5")


def test_leaf_spine_uplinks_and_ecmp_spreads_over_spines_deterministically():
    kw = {"num_ranks": 32, "ranks_per_leaf": 8, "num_spines": 4, "bandwidth_bytes_per_s": 1e9,
          "latency_s": 1e-6, "oversubscription": 2.0}  # fmt: skip
    t = leaf_spine(**kw)
    assert t.link("leaf0", "spine3")["bandwidth_bytes_per_s"] == pytest.approx(8 * 1e9 / (2.0 * 4))
    spines = {t.path(a, b)[2] for a in t.ranks[:8] for b in t.ranks[8:16]}
    assert spines == {"spine0", "spine1", "spine2", "spine3"}
    again = leaf_spine(**kw)
    assert all(t.path(a, b) == again.path(a, b) for a in t.ranks for b in t.ranks[::5])


@settings(max_examples=30, deadline=None)
@given(
    builder=st.sampled_from(["star", "ring", "two_shared", "two_rail", "leaf"]),
    pair=st.tuples(st.integers(0, 23), st.integers(0, 23)),
)
def test_paths_are_shortest_and_made_of_links(builder, pair):
    t = {
        "star": lambda: star(num_ranks=24, bandwidth_bytes_per_s=1e9, latency_s=1e-6),
        "ring": lambda: ring(num_ranks=24, bandwidth_bytes_per_s=1e9, latency_s=1e-6),
        "two_shared": lambda: _two_level(True, 6, 4),
        "two_rail": lambda: _two_level(False, 6, 4),
        "leaf": lambda: leaf_spine(
            num_ranks=24, ranks_per_leaf=6, num_spines=3, bandwidth_bytes_per_s=1e9, latency_s=1e-6
        ),
    }[builder]()
    a, b = t.ranks[pair[0]], t.ranks[pair[1]]
    path = t.path(a, b)
    assert path[0] == a and path[-1] == b
    assert all(t.graph.has_edge(u, v) for u, v in itertools.pairwise(path))
    cost = sum(t.link(u, v).get("route_cost", 1.0) for u, v in itertools.pairwise(path))
    best = nx.shortest_path_length(t.graph, a, b, weight=lambda u, v, d: d.get("route_cost", 1.0))
    assert cost == pytest.approx(best)
    assert t.path(a, b) is path  # cached


def test_overrides_make_a_slow_link_and_a_custom_topology():
    t = star(num_ranks=4, bandwidth_bytes_per_s=1e9, latency_s=1e-6)
    slow = t.with_link("r2", "sw", bandwidth_bytes_per_s=1e8)
    assert slow.link("sw", "r2")["bandwidth_bytes_per_s"] == 1e8
    assert t.link("sw", "r2")["bandwidth_bytes_per_s"] == 1e9  # the original is untouched
    assert slow.kind == "custom" and slow.uniform_star() is None
    assert slow.path_bandwidth_bytes_per_s("r0", "r2") == 1e8
    with pytest.raises(ValueError, match="does not exist"):
        t.with_link("r0", "r1", bandwidth_bytes_per_s=1.0)
    with pytest.raises(ValueError, match="bandwidth_bytes_per_s=0"):
        t.with_link("r0", "sw", bandwidth_bytes_per_s=0)
    with pytest.raises(ValueError, match="latency_s=-1"):
        t.with_link("r0", "sw", latency_s=-1)
    with pytest.raises(ValueError, match="unknown keys"):
        t.with_link("r0", "sw", speed=3)
    with pytest.raises(nx.NetworkXError, match="Frozen"):
        t.graph.add_edge("r0", "r1")


def test_shipped_topology_files_load():
    s = load_topology(DATA / "star.yaml")
    assert s.num_ranks == 8 and s.link("r7", "sw")["bandwidth_bytes_per_s"] == pytest.approx(25e9 / 8)
    assert s.path_latency_s("r0", "r7") == pytest.approx(2e-6)
    tl = load_topology(DATA / "two_level.json")
    assert tl.num_ranks == 32 and len(tl.groups) == 4 and tl.kind == "custom"  # it has an override
    assert tl.link("r13.nic", "core")["bandwidth_bytes_per_s"] == pytest.approx(25e9 / 8)
    ls = load_topology(DATA / "leaf_spine.yaml")
    assert ls.num_ranks == 64 and ls.kind == "leaf_spine" and ls.name == "leaf-spine-64"


def _write(tmp_path, name, data):
    p = tmp_path / name
    p.write_text(json.dumps(data) if name.endswith(".json") else data)
    return p


def _explicit(**change):
    data = {
        "ranks": ["a", "b", "c"],
        "switches": ["sw"],
        "links": [{"a": x, "b": "sw", "bandwidth": "10Gbps", "latency": "1us"} for x in ("a", "b", "c")],
    }
    data.update(change)
    return data


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"builder": "star", "num_ranks": 4, "bandwidth": "100 Gbs", "latency": "1us"}, r"bandwidth.*unknown unit 'Gbs'"),
        ({"builder": "star", "num_ranks": 4, "bandwidth": "0Gbps", "latency": "1us"}, "must be > 0"),
        ({"builder": "star", "num_ranks": 4, "bandwidth": "1Gbps", "latency": "1 lightyear"}, "unknown unit"),
        ({"builder": "star", "num_ranks": 4, "bandwidth": "1Gbps", "latency": "1us", "lat": 1}, "unknown key 'lat'"),
        ({"builder": "star", "num_ranks": 4, "bandwidth": "1Gbps"}, "missing required key 'latency'"),
        ({"builder": "torus", "num_ranks": 4}, "builder 'torus'"),
        ({"builder": "star", "num_ranks": 2, "bandwidth": "1Gbps", "latency": "1us",
          "overrides": [{"a": "r0", "b": "r1", "bandwidth": "1Gbps"}]}, r"overrides.*r0-r1.*does not exist"),
        (_explicit(links=[{"a": "a", "b": "sw", "bandwidth": "10Gbps", "latency": "1us"},
                          {"a": "b", "b": "sw", "bandwidth": "10Gbps", "latency": "1us"}]), r"\['c'\] unreachable"),
        (_explicit(links=[{"a": "a", "b": "sw", "bandwidth": "-5Gbps", "latency": "1us"}]), r"links\[0\]"),
        (_explicit(links=[{"a": "a", "b": "hub", "bandwidth": "5Gbps", "latency": "1us"}]), r"links\[0\].*'hub'"),
        (_explicit(links=[{"a": "a", "b": "sw", "bandwidth": "5Gbps"}]), r"links\[0\].*missing required key 'latency'"),
        (_explicit(ranks=["a", "b", "c", "a"]), "declared twice"),
    ],
)  # fmt: skip
def test_file_errors_name_the_file_and_the_item(tmp_path, data, message):
    path = _write(tmp_path, "topo.json", data)
    with pytest.raises(ValueError, match=message) as info:
        load_topology(path)
    assert str(path) in str(info.value)


def test_yaml_and_suffix_errors(tmp_path):
    ok = _write(tmp_path, "t.yaml", "builder: ring\nnum_ranks: 4\nbandwidth: 1GB/s\nlatency: 0.5us\n")
    t = load_topology(ok)
    assert t.kind == "ring" and t.link("r0", "r1")["bandwidth_bytes_per_s"] == 1e9
    with pytest.raises(ValueError, match="cannot parse"):
        load_topology(_write(tmp_path, "bad.yaml", "builder: [star\n"))
    with pytest.raises(ValueError, match="unknown suffix"):
        load_topology(_write(tmp_path, "t.toml", "x = 1"))
    with pytest.raises(ValueError, match="shared_nic"):
        load_topology(_write(tmp_path, "t2.yaml", "builder: two_level\nnum_nodes: 2\nranks_per_node: 2\n"
                             "intra_bandwidth: 1GB/s\nintra_latency: 1us\ninter_bandwidth: 1GB/s\n"
                             "inter_latency: 1us\nshared_nic: maybe\n"))  # fmt: skip


def test_builder_argument_errors():
    with pytest.raises(ValueError, match="num_ranks"):
        star(num_ranks=0, bandwidth_bytes_per_s=1e9, latency_s=0)
    with pytest.raises(ValueError, match="bandwidth_bytes_per_s"):
        star(num_ranks=2, bandwidth_bytes_per_s=-1, latency_s=0)
    with pytest.raises(ValueError, match="oversubscription"):
        leaf_spine(num_ranks=4, ranks_per_leaf=2, num_spines=1, bandwidth_bytes_per_s=1e9, latency_s=0,
                   oversubscription=0)  # fmt: skip
