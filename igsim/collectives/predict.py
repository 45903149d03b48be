"""Collective algorithms as message schedules, run over the flow network or costed in closed form.

An algorithm is a *schedule*: a DAG of messages (src rank, dst rank, bytes), each starting once the
messages it depends on have arrived, each dependency with a local compute delay (reducing a received
chunk costs ``gamma_s_per_byte`` per byte). :func:`run_collective` sends the schedule's messages
over a :class:`~igsim.net.network.Network`, so concurrent collectives and a non-uniform topology
contend for links. :func:`predict_collective` times one collective on an idle topology, in closed
form where that is exact (:mod:`igsim.collectives.analytic`) or by simulating it.

The schedules themselves (which messages each algorithm sends, and their dependencies) are in
:mod:`igsim.collectives.schedules`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import simpy

from igsim.collectives import analytic as af
from igsim.collectives.execute import CollectiveResult, execute_schedule
from igsim.collectives.rings import ring_terms
from igsim.collectives.schedules import build_schedule, machine_groups
from igsim.net.calibration import Calibration
from igsim.net.network import Network
from igsim.net.topology import Topology

__all__ = [
    "ALGORITHMS",
    "OPS",
    "SUPPORTED",
    "CollectiveResult",
    "CollectiveSpec",
    "closed_form_exact",
    "predict_collective",
    "run_collective",
]

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "sparse_all_gather")
ALGORITHMS = (
    "ring", "tree", "double_binary_tree", "halving_doubling", "recursive_doubling",
    "direct", "hierarchical", "padded", "ideal",
)  # fmt: skip
SUPPORTED: dict[str, tuple[str, ...]] = {
    "all_reduce": ("ring", "tree", "double_binary_tree", "halving_doubling", "recursive_doubling",
                   "direct", "hierarchical", "ideal"),
    "all_gather": ("ring", "recursive_doubling", "direct", "ideal"),
    "reduce_scatter": ("ring", "halving_doubling", "direct", "ideal"),
    "broadcast": ("ring", "tree", "direct", "ideal"),
    "sparse_all_gather": ("ring", "padded", "direct", "ideal"),
}  # fmt: skip
MODES = ("auto", "flow", "analytic")


@dataclass(frozen=True, kw_only=True)
class CollectiveSpec:
    """One collective: what (``op``), how (``algorithm``) and how much.

    - ``size_bytes``: n, each rank's full buffer (all-reduce input, all-gather output,
      reduce-scatter input, broadcast payload). Unused by ``sparse_all_gather``.
    - ``sizes_bytes``: per-rank payload bytes for ``sparse_all_gather`` (one per rank).
    - ``num_chunks``: pipelining depth for ``tree`` / ``double_binary_tree`` and ring broadcast.
    - ``root``: the broadcast root (rank index).
    """

    op: str
    algorithm: str = "ring"
    size_bytes: float = 0.0
    sizes_bytes: tuple[float, ...] = ()
    num_chunks: int = 1
    root: int = 0

    def __post_init__(self) -> None:
        if self.op not in SUPPORTED:
            raise ValueError(f"collective op {self.op!r} is not one of {', '.join(OPS)}")
        if self.algorithm not in SUPPORTED[self.op]:
            raise ValueError(
                f"collective {self.op}: algorithm {self.algorithm!r} is not one of {', '.join(SUPPORTED[self.op])}"
            )
        if not (math.isfinite(self.size_bytes) and self.size_bytes >= 0):
            raise ValueError(f"collective {self.op}: size_bytes={self.size_bytes!r} must be >= 0 and finite")
        object.__setattr__(self, "sizes_bytes", tuple(float(s) for s in self.sizes_bytes))
        if any(not (math.isfinite(s) and s >= 0) for s in self.sizes_bytes):
            raise ValueError(
                f"collective {self.op}: sizes_bytes must be >= 0 and finite, got {self.sizes_bytes}"
            )
        if self.op == "sparse_all_gather" and not self.sizes_bytes:
            raise ValueError("collective sparse_all_gather: sizes_bytes must give one payload size per rank")
        if int(self.num_chunks) < 1:
            raise ValueError(f"collective {self.op}: num_chunks={self.num_chunks!r} must be >= 1")

    def check_ranks(self, p: int) -> None:
        """ValueError if this spec cannot run on ``p`` ranks."""
        if self.op == "sparse_all_gather" and len(self.sizes_bytes) != p:
            raise ValueError(
                f"collective sparse_all_gather: {len(self.sizes_bytes)} sizes_bytes for {p} ranks"
            )
        if not 0 <= self.root < p:
            raise ValueError(f"collective {self.op}: root={self.root} is not a rank index below {p}")
        if self.algorithm in ("halving_doubling", "recursive_doubling"):
            af.log2_exact(p, what=f"{self.op} {self.algorithm}")


# -- running a schedule over the network -------------------------------------------------------


def run_collective(
    net: Network, spec: CollectiveSpec, *, ranks: Sequence[str] | None = None
) -> simpy.Process:
    """Start ``spec`` on ``net`` now among ``ranks`` (default: all the topology's ranks, in order).

    Returns the simpy process; it ends when the last rank is done (including the final local
    reduction) and its value is a :class:`CollectiveResult`. Messages share the network with
    whatever else is running on it. ``gamma_s_per_byte`` comes from the network's calibration.
    """
    names = list(net.topology.ranks if ranks is None else ranks)
    unknown = [r for r in names if r not in net.topology.ranks]
    if unknown:
        raise ValueError(f"collective {spec.op}: {unknown} are not ranks of topology {net.topology.name!r}")
    p = len(names)
    spec.check_ranks(p)
    groups = machine_groups(net.topology, names) if spec.algorithm == "hierarchical" else None
    sched = build_schedule(spec, p, net.calibration.gamma_s_per_byte, groups)
    return net.env.process(execute_schedule(net, sched, names))


# -- prediction --------------------------------------------------------------------------------


def predict_collective(
    spec: CollectiveSpec, topology: Topology, *, calibration: Calibration | None = None, mode: str = "auto"
) -> CollectiveResult:
    """Time one collective among all ranks of an otherwise idle ``topology``.

    ``mode``: ``flow`` simulates the schedule in a fresh simpy environment; ``analytic`` uses the
    closed form with α and B taken from the topology (exact on a uniform star, on a uniform ring
    for ring schedules and on an unmodified two-level cluster for ``hierarchical``; an estimate
    elsewhere, for ring schedules the contention-aware α* and B* of
    :mod:`igsim.collectives.rings`: an upper bound everywhere, exact where its certificate holds);
    ``auto`` uses the closed form exactly where it is exact, else the flow mode.
    ``ideal`` is always analytic.

    >>> from igsim.net.topology import star
    >>> spec = CollectiveSpec(op="all_reduce", algorithm="ring", size_bytes=1e6)
    >>> topo = star(num_ranks=4, bandwidth_bytes_per_s=1e9, latency_s=5e-6)
    >>> r = predict_collective(spec, topo, mode="flow")
    >>> round(r.time_s, 9), r.num_messages
    (0.00156, 24)
    """
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {', '.join(MODES)}")
    calibration = (calibration or Calibration()).for_op(spec.op)
    spec.check_ranks(topology.num_ranks)
    if (
        mode == "analytic"
        or spec.algorithm == "ideal"
        or (mode == "auto" and closed_form_exact(spec, topology, calibration))
    ):
        return _analytic(spec, topology, calibration)
    env = simpy.Environment()
    net = Network(env, topology, calibration=calibration)
    proc = run_collective(net, spec)
    env.run(proc)
    return proc.value


def closed_form_exact(spec: CollectiveSpec, topo: Topology, cal: Calibration) -> bool:
    """Whether ``mode="auto"`` costs ``spec`` on ``topo`` in closed form (where that is exact)."""
    alg = spec.algorithm
    if alg == "tree" and spec.num_chunks > 1 and spec.op == "all_reduce" and cal.gamma_s_per_byte > 0:
        return False
    if alg == "hierarchical":
        return topo.kind == "two_level"
    if alg == "double_binary_tree" or (spec.op == "sparse_all_gather" and alg == "direct"):
        return False
    if topo.uniform_star() is not None:
        return True
    return topo.uniform_ring() is not None and alg in ("ring", "padded")


def _is_ring(spec: CollectiveSpec) -> bool:
    return spec.algorithm in ("ring", "padded") and spec.op != "broadcast"


def _alpha_bandwidth(topo: Topology, cal: Calibration, *, ring: bool = False) -> tuple[float, float]:
    """(α, B) for the closed forms: on a uniform star or ring its links'; elsewhere, for a ring
    schedule (``ring``), α* and B* of :func:`igsim.collectives.rings.ring_terms` (the fair share
    of the most shared link), else the largest α and smallest capacity over ring-neighbour paths."""
    uni = topo.uniform_star() or topo.uniform_ring()
    if uni is not None:
        lat, bw, cls = uni
        hops = 2 if topo.uniform_star() is not None else 1
        return hops * lat + cal.for_class(cls).alpha_s, cal.capacity_bytes_per_s(cls, bw)
    if ring:
        terms = ring_terms(topo, cal)
        return terms.alpha_s, terms.bandwidth_bytes_per_s
    net = Network(simpy.Environment(), topo, calibration=cal)
    pairs = [(r, topo.ranks[(i + 1) % topo.num_ranks]) for i, r in enumerate(topo.ranks)]
    pairs = [(a, b) for a, b in pairs if a != b]
    if not pairs:
        return 0.0, math.inf
    return max(net.path_alpha_s(a, b) for a, b in pairs), min(
        net.path_capacity_bytes_per_s(a, b) for a, b in pairs
    )


def _hierarchical_terms(topo: Topology, cal: Calibration) -> dict[str, float]:
    """α and per-ring bandwidth inside and across machines, counting how many concurrent ring
    messages share each link (a NIC shared by the machine's g rails gives each rail 1/g)."""
    net = Network(simpy.Environment(), topo, calibration=cal)
    groups = [list(g) for g in topo.groups]
    g, m = len(groups[0]), len(groups)

    def per_flow(pairs: list[tuple[str, str]]) -> tuple[float, float]:
        use: dict[int, int] = {}
        for a, b in pairs:
            for li in net.route(a, b)[0]:
                use[li] = use.get(li, 0) + 1
        a, b = pairs[0]
        links = net.route(a, b)[0]
        return net.path_alpha_s(a, b), min(net._capacity[li] / use[li] for li in links)

    out = {"intra_alpha_s": 0.0, "intra_bandwidth_bytes_per_s": math.inf,
           "inter_alpha_s": 0.0, "inter_bandwidth_bytes_per_s": math.inf}  # fmt: skip
    if g > 1:
        pairs = [(grp[k], grp[(k + 1) % g]) for grp in groups for k in range(g)]
        out["intra_alpha_s"], out["intra_bandwidth_bytes_per_s"] = per_flow(pairs)
    if m > 1:
        pairs = [(groups[k][j], groups[(k + 1) % m][j]) for j in range(g) for k in range(m)]
        out["inter_alpha_s"], out["inter_bandwidth_bytes_per_s"] = per_flow(pairs)
    return out


def _analytic(spec: CollectiveSpec, topo: Topology, cal: Calibration) -> CollectiveResult:
    p = topo.num_ranks
    gamma = cal.gamma_s_per_byte
    g = len(topo.groups[0]) if topo.groups else None
    if spec.algorithm == "hierarchical":
        if not topo.groups:
            raise ValueError(
                f"hierarchical all_reduce needs a topology with machines; {topo.name!r} has none"
            )
        t = af.hierarchical_all_reduce_s(
            ranks_per_node=g,
            num_nodes=len(topo.groups),
            size_bytes=spec.size_bytes,
            gamma_s_per_byte=gamma,
            **_hierarchical_terms(topo, cal),
        )
    else:
        alpha, bw = _alpha_bandwidth(topo, cal, ring=_is_ring(spec))
        t = _closed_form(spec, p, alpha, bw, gamma)
    sent, count = af.collective_traffic(
        op=spec.op,
        algorithm=spec.algorithm,
        p=p,
        size_bytes=spec.size_bytes,
        sizes_bytes=spec.sizes_bytes,
        num_chunks=spec.num_chunks,
        root=spec.root,
        ranks_per_node=g,
    )
    return CollectiveResult(time_s=t, bytes_sent_per_rank=sent, num_messages=count)


def _closed_form(spec: CollectiveSpec, p: int, a: float, b: float, gamma: float) -> float:
    op, alg, n, c = spec.op, spec.algorithm, spec.size_bytes, int(spec.num_chunks)
    kw = {"p": p, "size_bytes": n, "alpha_s": a, "bandwidth_bytes_per_s": b}
    red = {**kw, "gamma_s_per_byte": gamma}
    if alg == "ideal":
        return af.ideal_s(op=op, **kw, sizes_bytes=spec.sizes_bytes)
    if op == "sparse_all_gather":
        if alg == "direct":
            raise ValueError(
                "sparse_all_gather 'direct' has no closed form (unequal flows share links); use mode='flow'"
            )
        f = af.ring_allgatherv_s if alg == "ring" else af.padded_sparse_all_gather_s
        return f(sizes_bytes=spec.sizes_bytes, alpha_s=a, bandwidth_bytes_per_s=b)
    table = {
        ("all_reduce", "ring"): lambda: af.ring_all_reduce_s(**red),
        ("all_reduce", "halving_doubling"): lambda: af.halving_doubling_all_reduce_s(**red),
        ("all_reduce", "recursive_doubling"): lambda: af.recursive_doubling_all_reduce_s(**red),
        ("all_reduce", "direct"): lambda: af.direct_all_reduce_s(**red),
        ("all_reduce", "tree"): lambda: af.binomial_tree_all_reduce_s(**red) if c == 1
        else af.pipelined_tree_all_reduce_s(**red, num_chunks=c),
        ("all_reduce", "double_binary_tree"): lambda: af.double_binary_tree_all_reduce_s(**kw, num_chunks=c),
        ("all_gather", "ring"): lambda: af.ring_all_gather_s(**kw),
        ("all_gather", "recursive_doubling"): lambda: af.recursive_doubling_all_gather_s(**kw),
        ("all_gather", "direct"): lambda: af.direct_all_gather_s(**kw),
        ("reduce_scatter", "ring"): lambda: af.ring_reduce_scatter_s(**red),
        ("reduce_scatter", "halving_doubling"): lambda: af.recursive_halving_reduce_scatter_s(**red),
        ("reduce_scatter", "direct"): lambda: af.direct_reduce_scatter_s(**red),
        ("broadcast", "ring"): lambda: af.ring_broadcast_s(**kw, num_chunks=c),
        ("broadcast", "direct"): lambda: af.direct_broadcast_s(**kw),
        ("broadcast", "tree"): lambda: af.binomial_broadcast_s(**kw) if c == 1
        else af.pipelined_tree_broadcast_s(**kw, num_chunks=c),
    }  # fmt: skip
    return table[(op, alg)]()
