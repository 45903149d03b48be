"""Cluster topologies: ranks, switches and NICs joined by full-duplex links.

A :class:`Topology` wraps an undirected, frozen ``networkx.Graph``. Nodes carry ``kind`` in
{"rank", "switch", "nic"}; edges carry ``bandwidth_bytes_per_s``, ``latency_s`` (one hop, one way),
``link_class`` (the name a :class:`~igsim.net.calibration.Calibration` keys on) and optionally
``route_cost`` (default 1). Every edge is full duplex: each direction has its own capacity of
``bandwidth_bytes_per_s``, so a send and a receive over the same cable never compete.

Files (JSON/YAML) are read by :func:`igsim.net.topology_files.load_topology`, also importable from
here. Latencies are per link: in ``star`` two ranks are ``2 * latency_s`` apart (rank -> switch -> rank).
:meth:`Topology.path_latency_s` gives the end-to-end figure.

Routing: a message follows a path of minimum total ``route_cost`` (hop count by default). Where
several paths tie, each hop picks its next node by a stable hash of (src, dst, node) among the tied
candidates: deterministic ECMP, so two flows between different pairs may use different spines.

>>> topo = star(num_ranks=4, bandwidth_bytes_per_s=12.5e9, latency_s=1e-6)
>>> topo.path("r0", "r3")
('r0', 'sw', 'r3')
>>> topo.path_latency_s("r0", "r3")
2e-06
"""

from __future__ import annotations

import itertools
import math
import zlib
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from igpolicy.limits import MAX_TOPOLOGY_LINKS, MAX_TOPOLOGY_NODES, check_count

__all__ = ["LINK_ATTRS", "NODE_KINDS", "Topology", "apply_link_overrides", "check_link", "leaf_spine",
           "load_topology", "ring", "star", "two_level"]  # fmt: skip

NODE_KINDS = ("rank", "switch", "nic")
LINK_ATTRS = ("bandwidth_bytes_per_s", "latency_s", "link_class", "route_cost")

# (u, v) -> {"bandwidth_bytes_per_s": ..., "latency_s": ..., "link_class": ...}; either orientation
LinkOverrides = Mapping[tuple[str, str], Mapping[str, Any]]


@dataclass(frozen=True, kw_only=True, eq=False)
class Topology:
    """A cluster: a frozen graph, the ranks in rank order, and how it was built.

    - ``graph``: nodes with ``kind``, edges with :data:`LINK_ATTRS` (see the module docstring).
    - ``ranks``: rank node names; ``ranks[i]`` is rank i.
    - ``groups``: ranks that share a machine (two-level topologies), for hierarchical collectives;
      empty where the notion does not apply.
    - ``kind`` / ``params``: the builder and its arguments ("custom" when loaded from a link list or
      modified by :meth:`with_link`); the analytic fast path trusts only unmodified builders.

    Compared and hashed by identity (a graph has no cheap value equality). Picklable.
    """

    graph: nx.Graph
    ranks: tuple[str, ...]
    name: str = ""
    kind: str = "custom"
    params: Mapping[str, Any] = field(default_factory=dict)
    groups: tuple[tuple[str, ...], ...] = ()
    _pred_cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _path_cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _unit_costs: bool = field(default=False, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not nx.is_frozen(self.graph):
            object.__setattr__(self, "graph", nx.freeze(self.graph.copy()))
        object.__setattr__(self, "ranks", tuple(self.ranks))
        object.__setattr__(self, "groups", tuple(tuple(g) for g in self.groups))
        object.__setattr__(self, "_unit_costs", _unit_costs(self.graph))

    @property
    def num_ranks(self) -> int:
        return len(self.ranks)

    def validate(self, *, where: str = "topology") -> Topology:
        """Check the graph; raise ValueError naming ``where`` and the offending node or link.

        Checks: node kinds, unique ranks that are ``rank`` nodes, positive finite bandwidths,
        non-negative finite latencies and route costs, string link classes, every rank reachable
        from rank 0, groups that partition the ranks. Returns ``self`` so builders can chain.
        Bounded: at most ``igpolicy.limits.MAX_TOPOLOGY_NODES`` nodes, ``MAX_TOPOLOGY_LINKS`` links
        and ``MAX_RANKS`` ranks, checked before anything else; the checks take O(nodes + links).
        """
        g = self.graph
        if not self.ranks:
            raise ValueError(f"{where}: no ranks")
        # bounded first (O(1)), then every check one pass over the ranks, nodes or links: O(N + E)
        check_count(len(self.ranks), what=f"{where}: num_ranks", limit="MAX_RANKS")
        _check_size(where, num_nodes=g.number_of_nodes(), num_links=g.number_of_edges())
        rank_set = set(self.ranks)
        if len(rank_set) != len(self.ranks):
            dup = sorted(r for r, c in Counter(self.ranks).items() if c > 1)
            raise ValueError(
                f"{where}: duplicate ranks {dup[:10]}"
                + (f" and {len(dup) - 10} more" if len(dup) > 10 else "")
            )
        for node, data in g.nodes(data=True):
            if data.get("kind") not in NODE_KINDS:
                raise ValueError(
                    f"{where}: node {node!r} has kind {data.get('kind')!r}, not one of {NODE_KINDS}"
                )
        for r in self.ranks:
            if r not in g:
                raise ValueError(f"{where}: rank {r!r} is not a node of the graph")
            if g.nodes[r]["kind"] != "rank":
                raise ValueError(f"{where}: rank {r!r} is a {g.nodes[r]['kind']!r} node, not a 'rank'")
        extra = sorted(n for n, d in g.nodes(data=True) if d["kind"] == "rank" and n not in rank_set)
        if extra:
            raise ValueError(
                f"{where}: rank nodes {extra[:10]} are missing from the rank order"
                + (f" ({len(extra)} in all)" if len(extra) > 10 else "")
            )
        for u, v, data in g.edges(data=True):
            check_link(data, where=f"{where}: link {u}-{v}")
        reach = nx.node_connected_component(g, self.ranks[0])
        lost = [r for r in self.ranks if r not in reach]
        if lost:
            more = f" and {len(lost) - 10} more" if len(lost) > 10 else ""
            raise ValueError(f"{where}: rank(s) {lost[:10]}{more} unreachable from rank {self.ranks[0]!r}")
        if self.groups:
            flat = [r for grp in self.groups for r in grp]
            if sorted(flat) != sorted(self.ranks) or len(set(map(len, self.groups))) != 1:
                raise ValueError(f"{where}: groups must partition the ranks into equal-sized groups")
        return self

    def link(self, u: str, v: str) -> Mapping[str, Any]:
        """The attributes of the link between ``u`` and ``v`` (KeyError if there is none)."""
        return self.graph.edges[u, v]

    def path(self, src: str, dst: str) -> tuple[str, ...]:
        """The nodes a message from ``src`` to ``dst`` crosses, both ends included; cached.

        Minimum total ``route_cost``; ties resolved hop by hop with a stable hash (ECMP), so the
        answer depends only on the graph and the two names. ``path(a, a) == (a,)``.
        """
        key = (src, dst)
        cached = self._path_cache.get(key)
        if cached is not None:
            return cached
        if src not in self.graph or dst not in self.graph:
            raise ValueError(
                f"topology {self.name!r}: unknown node {src if src not in self.graph else dst!r}"
            )
        pred = self._pred_cache.get(src)
        if pred is None:
            if self._unit_costs:  # hop counts: a breadth-first search finds the same predecessors
                pred = nx.predecessor(self.graph, src)
            else:
                pred, _ = nx.dijkstra_predecessor_and_distance(self.graph, src, weight=_route_cost)
            self._pred_cache[src] = pred
        if dst not in pred:
            raise ValueError(f"topology {self.name!r}: no path from {src!r} to {dst!r}")
        nodes = [dst]
        node = dst
        while node != src:
            options = sorted(pred[node])
            if len(options) > 1:
                h = zlib.crc32(f"{src}>{dst}@{node}".encode())
                node = options[h % len(options)]
            else:
                node = options[0]
            nodes.append(node)
        result = tuple(reversed(nodes))
        self._path_cache[key] = result
        return result

    def path_links(self, src: str, dst: str) -> tuple[tuple[str, str], ...]:
        """The directed links ``(u, v)`` of :meth:`path`, in order."""
        p = self.path(src, dst)
        return tuple(itertools.pairwise(p))

    def path_latency_s(self, src: str, dst: str) -> float:
        """Sum of link latencies along :meth:`path` (seconds, one way)."""
        return float(sum(self.graph.edges[u, v]["latency_s"] for u, v in self.path_links(src, dst)))

    def path_bandwidth_bytes_per_s(self, src: str, dst: str) -> float:
        """The smallest nominal link bandwidth along :meth:`path` (``inf`` for ``src == dst``)."""
        links = self.path_links(src, dst)
        return min((self.graph.edges[u, v]["bandwidth_bytes_per_s"] for u, v in links), default=math.inf)

    def with_link(self, u: str, v: str, **attrs: Any) -> Topology:
        """A copy with the attributes of link ``u``-``v`` replaced (a slow NIC, a slow uplink).

        The copy's ``kind`` is "custom" (it is no longer what the builder made).
        """
        return apply_link_overrides(self, {(u, v): attrs}, where=f"topology {self.name!r}")

    def uniform_star(self) -> tuple[float, float, str] | None:
        """``(latency_s, bandwidth_bytes_per_s, link_class)`` of every link if this is a star whose
        links are all identical (one switch, each rank attached to it by one link); else None."""
        g = self.graph
        if g.number_of_nodes() != self.num_ranks + 1 or g.number_of_edges() != self.num_ranks:
            return None
        hubs = [n for n, d in g.nodes(data=True) if d["kind"] != "rank"]
        if len(hubs) != 1 or g.degree(hubs[0]) != self.num_ranks:
            return None
        return _uniform_links(g)

    def uniform_ring(self) -> tuple[float, float, str] | None:
        """``(latency_s, bandwidth_bytes_per_s, link_class)`` if the graph is exactly the cycle
        ``ranks[0] - ranks[1] - ... - ranks[-1] - ranks[0]`` of identical links; else None."""
        g, p = self.graph, self.num_ranks
        if p < 3 or g.number_of_nodes() != p or g.number_of_edges() != p:
            return None
        if not all(g.has_edge(self.ranks[i], self.ranks[(i + 1) % p]) for i in range(p)):
            return None
        return _uniform_links(g)


def _route_cost(u: str, v: str, data: Mapping[str, Any]) -> float:
    return float(data.get("route_cost", 1.0))


def _unit_costs(g: nx.Graph) -> bool:
    """Whether every link's route cost is 1 (the predecessors of a BFS are then Dijkstra's)."""
    return all(d.get("route_cost", 1.0) == 1.0 for _, _, d in g.edges(data=True))


def _uniform_links(g: nx.Graph) -> tuple[float, float, str] | None:
    seen = {(d["latency_s"], d["bandwidth_bytes_per_s"], d["link_class"]) for _, _, d in g.edges(data=True)}
    return next(iter(seen)) if len(seen) == 1 else None


def check_link(data: Mapping[str, Any], *, where: str) -> None:
    """ValueError naming ``where`` unless ``data`` are valid :data:`LINK_ATTRS` of one link."""
    bw = data.get("bandwidth_bytes_per_s")
    if not isinstance(bw, (int, float)) or isinstance(bw, bool) or not math.isfinite(bw) or bw <= 0:
        raise ValueError(f"{where}: bandwidth_bytes_per_s={bw!r} must be > 0 and finite")
    lat = data.get("latency_s")
    if not isinstance(lat, (int, float)) or isinstance(lat, bool) or not math.isfinite(lat) or lat < 0:
        raise ValueError(f"{where}: latency_s={lat!r} must be >= 0 and finite")
    if not isinstance(data.get("link_class"), str) or not data["link_class"]:
        raise ValueError(f"{where}: link_class={data.get('link_class')!r} must be a non-empty string")
    cost = data.get("route_cost", 1.0)
    if not isinstance(cost, (int, float)) or not math.isfinite(cost) or cost < 0:
        raise ValueError(f"{where}: route_cost={cost!r} must be >= 0 and finite")
    unknown = sorted(set(data) - set(LINK_ATTRS))
    if unknown:
        raise ValueError(f"{where}: unknown link attributes {unknown} (allowed: {', '.join(LINK_ATTRS)})")


def apply_link_overrides(topo: Topology, overrides: LinkOverrides | None, *, where: str) -> Topology:
    """A validated "custom" copy of ``topo`` with the given links' attributes replaced (``topo``
    itself when there is nothing to change); ValueError naming ``where`` for a missing link or an
    unknown attribute."""
    if not overrides:
        return topo
    g = nx.Graph(topo.graph)  # unfrozen copy
    for (u, v), attrs in overrides.items():
        if not g.has_edge(u, v):
            raise ValueError(f"{where}: override names link {u}-{v}, which does not exist")
        bad = sorted(set(attrs) - set(LINK_ATTRS))
        if bad:
            raise ValueError(
                f"{where}: override of link {u}-{v} has unknown keys {bad} (allowed: {LINK_ATTRS})"
            )
        g.edges[u, v].update(attrs)
    out = Topology(
        graph=g, ranks=topo.ranks, name=topo.name, kind="custom", params=topo.params, groups=topo.groups
    )
    return out.validate(where=where)


def _add_link(g: nx.Graph, u: str, v: str, bw: float, lat: float, cls: str, **extra: Any) -> None:
    g.add_edge(u, v, bandwidth_bytes_per_s=float(bw), latency_s=float(lat), link_class=cls, **extra)


def _built(g: nx.Graph, ranks: list[str], *, kind: str, name: str, params: dict[str, Any],
           overrides: LinkOverrides | None, groups: tuple = ()) -> Topology:  # fmt: skip
    """The builder ``kind``'s validated topology, then its link overrides applied."""
    topo = Topology(graph=g, ranks=tuple(ranks), name=name, kind=kind, params=params, groups=groups)
    return apply_link_overrides(topo.validate(where=kind), overrides, where=kind)


def _rank_names(num_ranks: int) -> list[str]:
    if int(num_ranks) < 1:
        raise ValueError(f"num_ranks={num_ranks!r} must be >= 1")
    check_count(int(num_ranks), what="num_ranks", limit="MAX_RANKS")
    return [f"r{i}" for i in range(int(num_ranks))]


def _check_size(kind: str, *, num_nodes: int, num_links: int) -> None:
    """ValueError before a builder makes a graph above :data:`igpolicy.limits.MAX_TOPOLOGY_NODES`
    nodes or ``MAX_TOPOLOGY_LINKS`` links."""
    if num_nodes > MAX_TOPOLOGY_NODES or num_links > MAX_TOPOLOGY_LINKS:
        raise ValueError(
            f"{kind}: {num_nodes:,} nodes and {num_links:,} links; at most {MAX_TOPOLOGY_NODES:,} nodes "
            f"and {MAX_TOPOLOGY_LINKS:,} links (igpolicy.limits.MAX_TOPOLOGY_NODES, MAX_TOPOLOGY_LINKS)"
        )


def star(
    *,
    num_ranks: int,
    bandwidth_bytes_per_s: float,
    latency_s: float,
    link_class: str = "nic",
    link_overrides: LinkOverrides | None = None,
) -> Topology:
    """Ranks ``r0..r{p-1}`` each joined to one non-blocking switch ``sw`` by one link.

    Rank-to-rank: ``2 * latency_s`` and ``bandwidth_bytes_per_s`` (each direction). The textbook
    alpha-beta setting: every collective algorithm whose steps send and receive one message per rank
    is contention-free here.
    """
    ranks = _rank_names(num_ranks)
    g = nx.Graph()
    g.add_node("sw", kind="switch")
    for r in ranks:
        g.add_node(r, kind="rank")
        _add_link(g, r, "sw", bandwidth_bytes_per_s, latency_s, link_class)
    params = {"num_ranks": num_ranks, "bandwidth_bytes_per_s": bandwidth_bytes_per_s, "latency_s": latency_s}
    return _built(g, ranks, kind="star", name=f"star-{num_ranks}", params=params, overrides=link_overrides)


def ring(
    *,
    num_ranks: int,
    bandwidth_bytes_per_s: float,
    latency_s: float,
    link_class: str = "nic",
    link_overrides: LinkOverrides | None = None,
) -> Topology:
    """Ranks joined in a cycle ``r0 - r1 - ... - r{p-1} - r0`` by direct links (p >= 3; p = 2 is
    a single link). Neighbours are ``latency_s`` apart; others route around the shorter side."""
    ranks = _rank_names(num_ranks)
    g = nx.Graph()
    for r in ranks:
        g.add_node(r, kind="rank")
    p = len(ranks)
    for i in range(p if p > 2 else p - 1):
        _add_link(g, ranks[i], ranks[(i + 1) % p], bandwidth_bytes_per_s, latency_s, link_class)
    params = {"num_ranks": num_ranks, "bandwidth_bytes_per_s": bandwidth_bytes_per_s, "latency_s": latency_s}
    return _built(g, ranks, kind="ring", name=f"ring-{num_ranks}", params=params, overrides=link_overrides)


def two_level(
    *,
    num_nodes: int,
    ranks_per_node: int,
    intra_bandwidth_bytes_per_s: float,
    intra_latency_s: float,
    inter_bandwidth_bytes_per_s: float,
    inter_latency_s: float,
    shared_nic: bool,
    link_overrides: LinkOverrides | None = None,
) -> Topology:
    """Machines of ``ranks_per_node`` ranks on an intra-node switch, machines joined by a core switch.

    Node ``i`` has switch ``n{i}`` (kind switch); rank ``r{j}`` sits on node ``j // ranks_per_node``
    and reaches ``n{i}`` over an "intra" link. The network side:

    - ``shared_nic=True``: one NIC ``n{i}.nic`` per machine, joined to ``n{i}`` by an "intra" link
      and to the core switch ``core`` by an "inter" link, shared by all ranks of the machine.
      Across machines: r -> n_i -> nic_i -> core -> nic_k -> n_k -> r'.
    - ``shared_nic=False``: a NIC ``r{j}.nic`` per rank (rail style): r -> nic ("intra" link,
      PCIe-like) -> core ("inter"). Intra-node traffic stays on the switch (``route_cost`` 2 on the
      NIC links keeps ECMP from sending it through the core).

    Link latencies are per hop (see the module docstring); ``groups`` lists each machine's ranks.
    """
    if int(num_nodes) < 1 or int(ranks_per_node) < 1:
        raise ValueError(
            f"two_level: num_nodes={num_nodes!r}, ranks_per_node={ranks_per_node!r} must be >= 1"
        )
    p = int(num_nodes) * int(ranks_per_node)
    check_count(p, what=f"two_level: {num_nodes} x {ranks_per_node} ranks =", limit="MAX_RANKS")
    nics = int(num_nodes) if shared_nic else p
    _check_size("two_level", num_nodes=1 + int(num_nodes) + nics + p, num_links=2 * nics + p)
    ranks = _rank_names(p)
    g = nx.Graph()
    g.add_node("core", kind="switch")
    groups = []
    ib, il = intra_bandwidth_bytes_per_s, intra_latency_s
    ob, ol = inter_bandwidth_bytes_per_s, inter_latency_s
    for i in range(num_nodes):
        sw = f"n{i}"
        g.add_node(sw, kind="switch")
        members = ranks[i * ranks_per_node : (i + 1) * ranks_per_node]
        groups.append(tuple(members))
        if shared_nic:
            nic = f"{sw}.nic"
            g.add_node(nic, kind="nic")
            _add_link(g, sw, nic, ib, il, "intra")
            _add_link(g, nic, "core", ob, ol, "inter")
        for r in members:
            g.add_node(r, kind="rank")
            _add_link(g, r, sw, ib, il, "intra")
            if not shared_nic:
                nic = f"{r}.nic"
                g.add_node(nic, kind="nic")
                _add_link(g, r, nic, ib, il, "intra", route_cost=2.0)
                _add_link(g, nic, "core", ob, ol, "inter", route_cost=2.0)
    params = {"num_nodes": num_nodes, "ranks_per_node": ranks_per_node, "intra_bandwidth_bytes_per_s": ib,
              "intra_latency_s": il, "inter_bandwidth_bytes_per_s": ob, "inter_latency_s": ol,
              "shared_nic": bool(shared_nic)}  # fmt: skip
    name = f"two_level-{num_nodes}x{ranks_per_node}"
    return _built(g, ranks, kind="two_level", name=name, params=params, overrides=link_overrides,
                  groups=tuple(groups))  # fmt: skip


def leaf_spine(
    *,
    num_ranks: int,
    ranks_per_leaf: int,
    num_spines: int,
    bandwidth_bytes_per_s: float,
    latency_s: float,
    oversubscription: float = 1.0,
    link_overrides: LinkOverrides | None = None,
) -> Topology:
    """A two-tier Clos: ranks on leaf switches ``leaf{i}``, every leaf joined to every spine.

    Rank links ("nic") have ``bandwidth_bytes_per_s``; each leaf-spine link ("uplink") has
    ``ranks_per_leaf * bandwidth_bytes_per_s / (oversubscription * num_spines)``, so a leaf's total
    uplink is its total downlink divided by ``oversubscription`` (1 = non-blocking). Every link has
    ``latency_s``; across leaves a message crosses 4 links. Spines are chosen by ECMP.
    """
    if int(ranks_per_leaf) < 1 or int(num_spines) < 1:
        raise ValueError(
            f"leaf_spine: ranks_per_leaf={ranks_per_leaf!r}, num_spines={num_spines!r} must be >= 1"
        )
    if not (math.isfinite(oversubscription) and oversubscription > 0):
        raise ValueError(f"leaf_spine: oversubscription={oversubscription!r} must be > 0 and finite")
    ranks = _rank_names(num_ranks)
    num_leaves = -(-len(ranks) // ranks_per_leaf)
    _check_size("leaf_spine", num_nodes=len(ranks) + num_leaves + int(num_spines),
                num_links=len(ranks) + num_leaves * int(num_spines))  # fmt: skip
    up_bw = ranks_per_leaf * bandwidth_bytes_per_s / (oversubscription * num_spines)
    g = nx.Graph()
    for s in range(num_spines):
        g.add_node(f"spine{s}", kind="switch")
    for leaf in range(num_leaves):
        g.add_node(f"leaf{leaf}", kind="switch")
        for s in range(num_spines):
            _add_link(g, f"leaf{leaf}", f"spine{s}", up_bw, latency_s, "uplink")
    for j, r in enumerate(ranks):
        g.add_node(r, kind="rank")
        _add_link(g, r, f"leaf{j // ranks_per_leaf}", bandwidth_bytes_per_s, latency_s, "nic")
    params = {"num_ranks": num_ranks, "ranks_per_leaf": ranks_per_leaf, "num_spines": num_spines,
              "bandwidth_bytes_per_s": bandwidth_bytes_per_s, "latency_s": latency_s,
              "oversubscription": oversubscription}  # fmt: skip
    name = f"leaf_spine-{num_ranks}"
    return _built(g, ranks, kind="leaf_spine", name=name, params=params, overrides=link_overrides)


def load_topology(path: Any) -> Topology:
    """Read a topology from a JSON or YAML file: :func:`igsim.net.topology_files.load_topology`."""
    from igsim.net.topology_files import load_topology as load  # that module imports the builders above

    return load(path)
