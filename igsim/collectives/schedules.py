"""Collective algorithms as message schedules: DAGs of messages between rank indices.

A :class:`Schedule` lists messages (src rank, dst rank, bytes), each starting once the messages it
depends on have arrived, each dependency with a local compute delay in seconds (reducing a
received chunk costs ``gamma`` seconds per byte). :func:`build_schedule` makes the schedule of one
:class:`~igsim.collectives.predict.CollectiveSpec`; :func:`igsim.collectives.predict.run_collective` sends it over
the network. No simpy here: a schedule is plain data.

Schedules (p ranks, n bytes; ranks progress independently, no global barrier):

- ``ring``: reduce-scatter / all-gather in p-1 neighbour steps of n/p; all-reduce is both
  (2(p-1) steps); broadcast is a pipelined chain of ``num_chunks`` chunks; the sparse all-gather is
  a ring all-gatherv (each rank forwards the block it just received).
- ``tree``: one chunk: binomial tree (reduce to rank 0, then broadcast); ``num_chunks`` > 1: the
  heap-ordered binary tree, pipelined, each rank sending and receiving one message at a time
  (reduce completes before the broadcast starts).
- ``double_binary_tree``: two pipelined binary trees (the second over the reversed rank order),
  each carrying n/2, run side by side.
- ``halving_doubling`` (Rabenseifner) and ``recursive_doubling``: p a power of two.
- ``direct``: every rank sends to every other at once (shares of n/p; broadcast: the root to all).
- ``hierarchical`` (all-reduce): ring reduce-scatter inside each machine, ring all-reduce of n/g
  across machines among ranks with the same local index, ring all-gather inside each machine;
  machines are the topology's ``groups``.
- ``padded`` (sparse all-gather): every payload padded to the largest, then a ring all-gather.
- ``ideal``: a bound (one α plus the bandwidth lower bound), analytic only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from igsim.collectives import analytic as af
from igsim.net.topology import Topology

if TYPE_CHECKING:
    from igsim.collectives.predict import CollectiveSpec

__all__ = ["Dep", "Entry", "Schedule", "build_schedule", "machine_groups"]

Dep = tuple[int, float]  # (message index, compute delay after its arrival, seconds)


class Schedule:
    """A message DAG over rank indices. Message ``m`` goes from rank ``src[m]`` to ``dst[m]``
    carrying ``size[m]`` bytes once every ``(d, delay)`` of ``deps[m]`` holds (message ``d`` arrived
    ``delay`` seconds ago); ``tails`` are the (message, delay) pairs that end the collective."""

    def __init__(self, gamma: float):
        self.gamma = gamma
        self.src: list[int] = []
        self.dst: list[int] = []
        self.size: list[float] = []
        self.deps: list[tuple[Dep, ...]] = []
        self.tails: list[Dep] = []

    def send(self, src: int, dst: int, size: float, deps: Sequence[Dep] = ()) -> int:
        """Append one message; returns its index."""
        self.src.append(src)
        self.dst.append(dst)
        self.size.append(size)
        self.deps.append(tuple(deps))
        return len(self.src) - 1


Entry = dict[int, list[Dep]]  # rank -> what its first send of a phase waits for


def _ring(
    s: Schedule, group: Sequence[int], chunk: float, steps: int, reduce_steps: int, entry: Entry
) -> Entry:
    """``steps`` neighbour steps around ``group`` (position k sends to k+1); the chunks received
    in the first ``reduce_steps`` steps are reduced before being forwarded. Returns each rank's exit."""
    q = len(group)
    if q == 1 or steps == 0:
        return {r: list(entry.get(r, [])) for r in group}
    prev: list[int] = []
    for t in range(steps):
        cur = []
        red = s.gamma * chunk if t - 1 < reduce_steps else 0.0
        for k, r in enumerate(group):
            deps = list(entry.get(r, [])) if t == 0 else [(prev[k], 0.0), (prev[k - 1], red)]
            cur.append(s.send(r, group[(k + 1) % q], chunk, deps))
        prev = cur
    red = s.gamma * chunk if steps <= reduce_steps else 0.0
    return {r: [(prev[k], 0.0), (prev[k - 1], red)] for k, r in enumerate(group)}


def _exchange(s: Schedule, p: int, rounds: Sequence[tuple[int, float, bool]], entry: Entry) -> Entry:
    """Pairwise exchange rounds (partner = i xor mask, ``size`` bytes each way, reduce or not)."""
    last_send: dict[int, int] = {}
    last_recv: dict[int, Dep] = {}
    for mask, size, reduce in rounds:
        msgs = {}
        for i in range(p):
            deps = [(last_send[i], 0.0), last_recv[i]] if i in last_send else list(entry.get(i, []))
            msgs[i] = s.send(i, i ^ mask, size, deps)
        for i in range(p):
            last_send[i] = msgs[i]
            last_recv[i] = (msgs[i ^ mask], s.gamma * size if reduce else 0.0)
    return {
        i: [(last_send[i], 0.0), last_recv[i]] if i in last_send else list(entry.get(i, [])) for i in range(p)
    }


def _binomial_reduce(s: Schedule, p: int, n: float, entry: Entry) -> Entry:
    """Binomial reduce to rank 0; each rank receives its children one at a time (returns root exit)."""
    recvs: dict[int, list[int]] = {i: [] for i in range(p)}
    red = s.gamma * n
    for k in range(max(p - 1, 0).bit_length()):
        for i in range(1 << k, p, 1 << (k + 1)):
            parent = i - (1 << k)
            deps = [(m, red) for m in recvs[i]] or list(entry.get(i, []))
            if recvs[parent]:
                deps.append((recvs[parent][-1], red))
            elif entry.get(parent):
                deps.extend(entry[parent])
            recvs[parent].append(s.send(i, parent, n, deps))
    return {0: [(m, red) for m in recvs[0]] or list(entry.get(0, []))}


def _binomial_bcast(s: Schedule, p: int, n: float, entry: Entry, root: int = 0) -> None:
    """Binomial broadcast from ``root``: a rank sends to its children farthest first, one at a time."""
    got: dict[int, list[Dep]] = {0: list(entry.get(root, []))}
    top = max(p - 1, 0).bit_length()
    for rel in range(p):  # parents come before children in this order
        low = (rel & -rel).bit_length() - 1 if rel else top
        deps = got[rel]
        for k in range(low - 1, -1, -1):
            child = rel + (1 << k)
            if child < p:
                m = s.send((rel + root) % p, (child + root) % p, n, deps)
                got[child] = [(m, 0.0)]
                deps = [(m, 0.0)]


def _heap_children(v: int, p: int) -> list[int]:
    return [c for c in (2 * v + 1, 2 * v + 2) if c < p]


def _tree_reduce(s: Schedule, order: Sequence[int], n: float, c: int, entry: Entry) -> list[Dep]:
    """Pipelined reduce up the heap tree over ``order`` (order[0] is the root), the exact time
    reverse of :func:`_tree_bcast`: a parent takes chunk j from its second child, then its first,
    then chunk j+1; a rank sends chunk j up once it has reduced chunk j of all its children.
    Returns the root's exit."""
    p, m = len(order), n / c
    red = s.gamma * m
    up: dict[tuple[int, int], int] = {}
    port_last: dict[int, int] = {}  # parent -> last message it received
    for j in range(c):
        for v in range(p - 1, 0, -1):  # children (larger index) first; second child before first
            parent = (v - 1) // 2
            deps = [(up[(ch, j)], red) for ch in _heap_children(v, p)]
            if j == 0:
                deps.extend(entry.get(order[v], []))
            if parent in port_last:
                deps.append((port_last[parent], 0.0))
            elif j == 0:
                deps.extend(entry.get(order[parent], []))
            up[(v, j)] = port_last[parent] = s.send(order[v], order[parent], m, deps)
    if p == 1:
        return list(entry.get(order[0], []))
    return [(up[(ch, c - 1)], red) for ch in _heap_children(0, p)]


def _tree_bcast(s: Schedule, order: Sequence[int], n: float, c: int, root_deps: list[Dep]) -> None:
    """Pipelined broadcast down the heap tree over ``order``: each node sends chunk j to its first
    child, then its second, then chunk j+1 (one message at a time)."""
    p, m = len(order), n / c
    recv: dict[tuple[int, int], int] = {}
    for v in range(p):
        last = None
        for j in range(c):
            for ch in _heap_children(v, p):
                deps = [(last, 0.0)] if last is not None else []
                if v == 0:
                    if j == 0:
                        deps.extend(root_deps)
                else:
                    deps.append((recv[(v, j)], 0.0))
                last = s.send(order[v], order[ch], m, deps)
                recv[(ch, j)] = last


def _direct(s: Schedule, p: int, chunk_of, entry: Entry, *, reduce: bool) -> Entry:
    """Every rank sends ``chunk_of(i)`` bytes to every other rank at once."""
    got: dict[int, list[int]] = {i: [] for i in range(p)}
    sent: dict[int, list[int]] = {i: [] for i in range(p)}
    for i in range(p):
        for d in range(1, p):
            j = (i + d) % p
            m = s.send(i, j, chunk_of(i), entry.get(i, []))
            got[j].append(m)
            sent[i].append(m)
    exit_: Entry = {}
    for i in range(p):
        red = s.gamma * sum(chunk_of(s.src[m]) for m in got[i]) if reduce else 0.0
        exit_[i] = [(m, red) for m in got[i]] + [(m, 0.0) for m in sent[i]] or list(entry.get(i, []))
    return exit_


def machine_groups(topo: Topology, ranks: Sequence[str]) -> list[list[int]]:
    """The topology's machines as lists of indices into ``ranks`` (for the hierarchical
    all-reduce); ValueError when the topology has no machines or they hold unequal numbers of
    the participating ranks."""
    if not topo.groups:
        raise ValueError(
            f"hierarchical all_reduce needs a topology with machines (groups); {topo.name!r} has none"
        )
    index = {r: i for i, r in enumerate(ranks)}
    groups = [[index[r] for r in g if r in index] for g in topo.groups]
    groups = [g for g in groups if g]
    if len({len(g) for g in groups}) != 1:
        raise ValueError(
            "hierarchical all_reduce needs the same number of participating ranks on every machine"
        )
    return groups


def build_schedule(
    spec: CollectiveSpec, p: int, gamma: float, groups: list[list[int]] | None = None
) -> Schedule:
    """The message DAG of ``spec`` among ``p`` rank indices, reductions costing ``gamma`` s/byte;
    ``groups``: the machines (from :func:`machine_groups`) for ``hierarchical``. ValueError for
    ``ideal``, which has no schedule."""
    s = Schedule(gamma)
    op, alg, n, c = spec.op, spec.algorithm, spec.size_bytes, int(spec.num_chunks)
    everyone = list(range(p))
    ex: Entry = {}
    if alg == "ideal":
        raise ValueError(
            f"collective {op}: algorithm 'ideal' is a bound with no message schedule; use mode='analytic'"
        )
    if op == "sparse_all_gather":
        sizes = spec.sizes_bytes
        if alg == "direct":
            ex = _direct(s, p, lambda i: sizes[i], {}, reduce=False)
        elif alg == "padded":
            ex = _ring(s, everyone, max(sizes), p - 1, 0, {})
        else:  # ring all-gatherv: step t, rank k forwards block (k - t) mod p
            prev: list[int] = []
            for t in range(p - 1):
                cur = []
                for k in range(p):
                    deps = [] if t == 0 else [(prev[k], 0.0), (prev[k - 1], 0.0)]
                    cur.append(s.send(k, (k + 1) % p, sizes[(k - t) % p], deps))
                prev = cur
            ex = {k: [(prev[k], 0.0), (prev[k - 1], 0.0)] for k in range(p)} if p > 1 else {}
    elif op == "broadcast":
        order = [(spec.root + i) % p for i in range(p)]
        if alg == "ring":  # pipelined chain: position k forwards chunk j to k + 1
            chain: dict[tuple[int, int], int] = {}
            for j in range(c):
                for k in range(p - 1):
                    deps = [(chain[(k, j - 1)], 0.0)] if j else []
                    if k:
                        deps.append((chain[(k - 1, j)], 0.0))
                    chain[(k, j)] = s.send(order[k], order[k + 1], n / c, deps)
        elif alg == "direct":
            for k in range(1, p):
                s.send(spec.root, order[k], n)
        elif c == 1:
            _binomial_bcast(s, p, n, {}, root=spec.root)
        else:
            _tree_bcast(s, order, n, c, [])
        return s
    elif alg == "ring":
        steps = {"all_reduce": 2 * (p - 1), "all_gather": p - 1, "reduce_scatter": p - 1}[op]
        reduce_steps = 0 if op == "all_gather" else p - 1
        ex = _ring(s, everyone, n / p, steps, reduce_steps, {})
    elif alg in ("halving_doubling", "recursive_doubling"):
        masks = [1 << k for k in range(af.log2_exact(p, what=f"{op} {alg}"))]
        rs = [(mk, n * mk / p, True) for mk in reversed(masks)]
        ag = [(mk, n * mk / p, False) for mk in masks]
        if op == "all_reduce" and alg == "recursive_doubling":
            rounds = [(mk, n, True) for mk in masks]
        else:
            rounds = {"all_reduce": rs + ag, "reduce_scatter": rs, "all_gather": ag}[op]
        ex = _exchange(s, p, rounds, {})
    elif alg == "direct":
        if op in ("reduce_scatter", "all_reduce"):
            ex = _direct(s, p, lambda i: n / p, {}, reduce=True)
        if op in ("all_gather", "all_reduce"):
            ex = _direct(s, p, lambda i: n / p, ex, reduce=False)
    elif alg == "tree" and c == 1:
        root_exit = _binomial_reduce(s, p, n, {})
        _binomial_bcast(s, p, n, root_exit)
    elif alg in ("tree", "double_binary_tree"):
        orders = [everyone] if alg == "tree" else [everyone, everyone[::-1]]
        share = n / len(orders)
        for order in orders:
            root_exit = _tree_reduce(s, order, share, c, {})
            _tree_bcast(s, order, share, c, root_exit)
    elif alg == "hierarchical":
        groups = groups or [everyone]
        g = len(groups[0])
        for grp in groups:
            ex.update(_ring(s, grp, n / g, g - 1, g - 1, {}))
        inner = dict(ex)
        for local in range(g):
            rail = [grp[local] for grp in groups]
            inner.update(_ring(s, rail, n / g / len(groups), 2 * (len(groups) - 1), len(groups) - 1, ex))
        ex = {}
        for grp in groups:
            ex.update(_ring(s, grp, n / g, g - 1, 0, inner))
    s.tails = [d for deps in ex.values() for d in deps]
    return s
