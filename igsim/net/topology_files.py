"""Topology files: a builder with its parameters, or an explicit graph, in JSON or YAML.

:func:`load_topology` parses the file, checks every key strictly (unknown or missing keys are
errors), converts the units at the edge (bandwidths such as ``"100Gbps"`` or ``"300GB/s"`` to
bytes/s, latencies such as ``"2us"`` to seconds) and builds the :class:`~igsim.net.topology.Topology`
with the builders of :mod:`igsim.net.topology`. Every error is a ValueError naming the file and the item.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import networkx as nx

from igpolicy.config import check_keys
from igpolicy.limits import MAX_RANKS, MAX_TOPOLOGY_LINKS, MAX_TOPOLOGY_NODES
from igpolicy.units import parse_bandwidth, parse_time
from igsim.net.topology import Topology, apply_link_overrides, leaf_spine, ring, star, two_level

__all__ = ["load_topology"]

MAX_COUNT = MAX_TOPOLOGY_NODES  # any one count (ranks, nodes, spines); the builders bound the totals


def _count(value: Any) -> int:
    """A count from a file: an integer (not a bool, not a float) in [1, MAX_COUNT]."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"must be an integer, got {value!r}")
    if not 1 <= value <= MAX_COUNT:
        raise ValueError(f"must be in [1, {MAX_COUNT}], got {value}")
    return value


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"must be true or false, got {value!r}")
    return value


# file key -> (builder argument, parser); bandwidths and latencies take units ("100Gbps", "2us")
_FILE_PARAMS: dict[str, tuple[str, Any]] = {
    "num_ranks": ("num_ranks", _count),
    "bandwidth": ("bandwidth_bytes_per_s", parse_bandwidth),
    "latency": ("latency_s", parse_time),
    "link_class": ("link_class", str),
    "num_nodes": ("num_nodes", _count),
    "ranks_per_node": ("ranks_per_node", _count),
    "intra_bandwidth": ("intra_bandwidth_bytes_per_s", parse_bandwidth),
    "intra_latency": ("intra_latency_s", parse_time),
    "inter_bandwidth": ("inter_bandwidth_bytes_per_s", parse_bandwidth),
    "inter_latency": ("inter_latency_s", parse_time),
    "shared_nic": ("shared_nic", _flag),
    "ranks_per_leaf": ("ranks_per_leaf", _count),
    "num_spines": ("num_spines", _count),
    "oversubscription": ("oversubscription", float),
}
_BUILDERS: dict[str, tuple[Any, frozenset[str], frozenset[str]]] = {  # fn, required, optional
    "star": (star, frozenset({"num_ranks", "bandwidth", "latency"}), frozenset({"link_class"})),
    "ring": (ring, frozenset({"num_ranks", "bandwidth", "latency"}), frozenset({"link_class"})),
    "two_level": (
        two_level,
        frozenset(
            {
                "num_nodes",
                "ranks_per_node",
                "intra_bandwidth",
                "intra_latency",
                "inter_bandwidth",
                "inter_latency",
                "shared_nic",
            }
        ),
        frozenset(),
    ),
    "leaf_spine": (
        leaf_spine,
        frozenset({"num_ranks", "ranks_per_leaf", "num_spines", "bandwidth", "latency"}),
        frozenset({"oversubscription"}),
    ),
}
_LINK_KEYS = frozenset({"a", "b", "bandwidth", "latency", "class", "route_cost"})


def _link_attrs(item: Mapping[str, Any], *, where: str, partial_ok: bool) -> dict[str, Any]:
    """File link keys (with units) -> graph edge attributes."""
    required = frozenset({"a", "b"}) if partial_ok else frozenset({"a", "b", "bandwidth", "latency"})
    check_keys(item, allowed=_LINK_KEYS, where=where, required=required)
    attrs: dict[str, Any] = {}
    try:
        if "bandwidth" in item:
            attrs["bandwidth_bytes_per_s"] = parse_bandwidth(item["bandwidth"])
        if "latency" in item:
            attrs["latency_s"] = parse_time(item["latency"])
        if "route_cost" in item:
            attrs["route_cost"] = float(item["route_cost"])
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: {e}") from None
    if "class" in item:
        attrs["link_class"] = str(item["class"])
    elif not partial_ok:
        attrs["link_class"] = "link"
    return attrs


def _read(path: Path) -> Any:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ValueError(f"topology file {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"topology file {path}: cannot read ({e})") from None
    try:
        if path.suffix == ".json":
            import json

            return json.loads(text)
        if path.suffix in (".yaml", ".yml"):
            import yaml

            return yaml.safe_load(text)
    except Exception as e:  # json.JSONDecodeError, yaml.YAMLError
        raise ValueError(f"topology file {path}: cannot parse ({e})") from None
    raise ValueError(f"topology file {path}: unknown suffix {path.suffix!r} (use .json, .yaml or .yml)")


def load_topology(path: str | Path) -> Topology:
    """Read a topology from JSON or YAML; every error names the file and the item.

    Two forms. A builder with its parameters (units as strings)::

        builder: two_level
        num_nodes: 4
        ranks_per_node: 8
        intra_bandwidth: 300GB/s
        intra_latency: 1us
        inter_bandwidth: 100Gbps
        inter_latency: 2us
        shared_nic: false
        overrides:                      # optional: heterogeneity
          - {a: r5.nic, b: core, bandwidth: 25Gbps}

    Or an explicit graph: ``ranks`` (rank order), ``switches``, ``nics`` (node names), ``groups``
    (optional machines) and ``links`` (``a``, ``b``, ``bandwidth``, ``latency``, ``class``,
    ``route_cost``). Both take ``name``.
    """
    path = Path(path)
    data = _read(path)
    where = f"topology file {path}"
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: expected a mapping at the top level")
    try:
        if "builder" in data:
            if not isinstance(data["builder"], str):
                raise ValueError(f"{where}: builder must be a name, got {data['builder']!r}")
            topo = _from_builder(data, where=where)
        else:
            for key in ("ranks", "switches", "nics", "groups", "links"):
                if key in data and not isinstance(data[key], (list, type(None))):
                    raise ValueError(f"{where}: {key} must be a list, got {data[key]!r}")
            topo = _from_links(data, where=where)
    except (TypeError, AttributeError, KeyError) as e:  # a value of the wrong shape deep inside
        raise ValueError(f"{where}: malformed value ({type(e).__name__}: {e})") from None
    overrides = data.get("overrides") or []
    if not isinstance(overrides, list):
        raise ValueError(f"{where}: overrides must be a list of links")
    changes = {}
    for i, item in enumerate(overrides):
        w = f"{where}: overrides[{i}]"
        attrs = _link_attrs(item, where=w, partial_ok=True)
        a, b = str(item["a"]), str(item["b"])
        if not topo.graph.has_edge(a, b):
            raise ValueError(f"{w}: link {a}-{b} does not exist")
        changes[(a, b)] = attrs
    return apply_link_overrides(topo, changes, where=where)


def _from_builder(data: Mapping[str, Any], *, where: str) -> Topology:
    kind = data["builder"]
    if kind not in _BUILDERS:
        raise ValueError(f"{where}: builder {kind!r} is not one of {', '.join(_BUILDERS)}")
    fn, required, optional = _BUILDERS[kind]
    check_keys(data, allowed=required | optional | {"builder", "name", "overrides"}, required=required,
               where=f"{where} (builder {kind})")  # fmt: skip
    kwargs = {}
    for key in sorted(required | optional):
        if key not in data:
            continue
        arg, parse = _FILE_PARAMS[key]
        value = data[key]
        if parse is bool and not isinstance(value, bool):
            raise ValueError(f"{where}: {key}={value!r} must be true or false")
        try:
            kwargs[arg] = parse(value)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: {key}: {e}") from None
    try:
        topo = fn(**kwargs)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    if "name" in data:
        topo = Topology(graph=topo.graph, ranks=topo.ranks, name=str(data["name"]), kind=topo.kind,
                        params=topo.params, groups=topo.groups)  # fmt: skip
    return topo


def _from_links(data: Mapping[str, Any], *, where: str) -> Topology:
    allowed = {"name", "ranks", "switches", "nics", "groups", "links", "overrides"}
    check_keys(data, allowed=allowed, required={"ranks", "links"}, where=where)
    sizes = {key: len(data.get(key) or ()) for key in ("ranks", "switches", "nics", "links")}
    if sizes["ranks"] > MAX_RANKS:
        raise ValueError(f"{where}: {sizes['ranks']:,} ranks; at most {MAX_RANKS:,} (igpolicy.limits.MAX_RANKS)")
    num_nodes = sizes["ranks"] + sizes["switches"] + sizes["nics"]
    if num_nodes > MAX_TOPOLOGY_NODES or sizes["links"] > MAX_TOPOLOGY_LINKS:
        raise ValueError(
            f"{where}: {num_nodes:,} nodes and {sizes['links']:,} links; at most {MAX_TOPOLOGY_NODES:,} "
            f"nodes and {MAX_TOPOLOGY_LINKS:,} links (igpolicy.limits.MAX_TOPOLOGY_NODES, MAX_TOPOLOGY_LINKS)"
        )
    g = nx.Graph()
    for key, kind in (("ranks", "rank"), ("switches", "switch"), ("nics", "nic")):
        names = data.get(key) or []
        if not isinstance(names, list):
            raise ValueError(f"{where}: {key} must be a list of node names")
        for name in names:
            if str(name) in g:
                raise ValueError(f"{where}: node {name!r} is declared twice")
            g.add_node(str(name), kind=kind)
    links = data["links"]
    if not isinstance(links, list):
        raise ValueError(f"{where}: links must be a list")
    for i, item in enumerate(links):
        w = f"{where}: links[{i}]"
        attrs = _link_attrs(item, where=w, partial_ok=False)
        a, b = str(item["a"]), str(item["b"])
        for end in (a, b):
            if end not in g:
                raise ValueError(f"{w}: node {end!r} is not declared in ranks, switches or nics")
        if g.has_edge(a, b):
            raise ValueError(f"{w}: link {a}-{b} is given twice")
        g.add_edge(a, b, **attrs)
    groups = tuple(tuple(str(r) for r in grp) for grp in data.get("groups") or ())
    topo = Topology(graph=g, ranks=tuple(str(r) for r in data["ranks"]), name=str(data.get("name", "")),
                    kind="custom", groups=groups)  # fmt: skip
    return topo.validate(where=where)
