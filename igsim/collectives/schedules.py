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
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from igsim.collectives import analytic as af
from igsim.net.topology import Topology

if TYPE_CHECKING:
    from igsim.collectives.predict import CollectiveSpec

__all__ = ["Dep", "Entry", "Schedule", "ScheduleArrays", "build_schedule", "machine_groups", "ring_schedule"]

Dep = tuple[int, float]  # (message index, compute delay after its arrival, seconds)


class Schedule:
    """A message DAG over rank indices. Message ``m`` goes from rank ``src[m]`` to ``dst[m]``
    carrying ``size[m]`` bytes once every ``(d, delay)`` of its deps holds (message ``d`` arrived
    ``delay`` seconds ago); ``tails`` are the (message, delay) pairs that end the collective.

    Built one message at a time (:meth:`send`) or a block of messages at once (:meth:`send_block`,
    numpy arrays: a 1,024-rank ring all-reduce has two million messages); :meth:`arrays` gives the
    whole DAG as flat arrays (dependencies in CSR form), which is what the executor reads."""

    def __init__(self, gamma: float):
        self.gamma = gamma
        self.tails: list[Dep] = []
        self._blocks: list[tuple[np.ndarray, ...]] = []  # (src, dst, size, dep_count, dep_msg, dep_delay)
        self._num = 0  # messages so far
        self._frozen: ScheduleArrays | None = None
        self._src: list[int] = []
        self._dst: list[int] = []
        self._size: list[float] = []
        self._deps: list[Sequence[Dep]] = []

    def __len__(self) -> int:
        return self._num

    def send(self, src: int, dst: int, size: float, deps: Sequence[Dep] = ()) -> int:
        """Append one message; returns its index."""
        self._src.append(src)
        self._dst.append(dst)
        self._size.append(size)
        self._deps.append(deps)
        self._num += 1
        return self._num - 1

    def send_block(
        self, src: np.ndarray, dst: np.ndarray, size: np.ndarray, dep_msg: np.ndarray, dep_delay: np.ndarray
    ) -> int:
        """Append ``len(src)`` messages; message i depends on ``dep_msg[i, j]`` (after
        ``dep_delay[i, j]`` seconds) for every j. Returns the index of the first one."""
        self._flush()
        first = self._num
        n = len(src)
        width = dep_msg.shape[1] if dep_msg.ndim == 2 else 0
        self._blocks.append((
            np.asarray(src, dtype=np.int32), np.asarray(dst, dtype=np.int32),
            np.broadcast_to(np.asarray(size, dtype=np.float64), (n,)),
            np.full(n, width, dtype=np.int32), np.asarray(dep_msg, dtype=np.int64).reshape(-1),
            np.broadcast_to(np.asarray(dep_delay, dtype=np.float64), (n, width)).reshape(-1),
        ))  # fmt: skip
        self._num += n
        return first

    def _flush(self) -> None:
        if not self._src:
            return
        deps = self._deps
        self._blocks.append((
            np.array(self._src, dtype=np.int32), np.array(self._dst, dtype=np.int32),
            np.array(self._size, dtype=np.float64), np.array([len(d) for d in deps], dtype=np.int32),
            np.array([m for ds in deps for m, _ in ds], dtype=np.int64),
            np.array([delay for ds in deps for _, delay in ds], dtype=np.float64),
        ))  # fmt: skip
        for part in (self._src, self._dst, self._size, self._deps):
            part.clear()

    def arrays(self) -> ScheduleArrays:
        """The whole DAG as flat arrays (see :class:`ScheduleArrays`). Built once: the blocks
        are released, and messages appended later start a new DAG (an error, by assertion)."""
        self._flush()
        if self._frozen is not None:
            assert not self._blocks, "messages appended after arrays()"
            return self._frozen
        self._frozen = self._concatenate()
        self._blocks = []
        return self._frozen

    def _concatenate(self) -> ScheduleArrays:
        tails = tuple(self.tails)
        if not self._blocks:
            empty_i, empty_f = np.zeros(0, dtype=np.int64), np.zeros(0)
            return ScheduleArrays(src=empty_i, dst=empty_i, size=empty_f, dep_ptr=np.zeros(1, dtype=np.int64),
                                  dep_msg=empty_i, dep_delay=empty_f, tails=tails)  # fmt: skip
        cols = [
            np.concatenate(c) if len(self._blocks) > 1 else np.ascontiguousarray(c[0])
            for c in zip(*self._blocks)
        ]
        src, dst, size, count, dep_msg, dep_delay = cols
        ptr = np.zeros(len(src) + 1, dtype=np.int64)
        np.cumsum(count, out=ptr[1:])
        return ScheduleArrays(src=src, dst=dst, size=size, dep_ptr=ptr, dep_msg=dep_msg, dep_delay=dep_delay,
                              tails=tails)  # fmt: skip


@dataclass(frozen=True, kw_only=True, eq=False)
class ScheduleArrays:
    """A schedule as flat arrays: message m goes ``src[m] -> dst[m]`` with ``size[m]`` bytes and
    depends on ``dep_msg[dep_ptr[m]:dep_ptr[m+1]]`` (with the matching ``dep_delay``)."""

    src: np.ndarray
    dst: np.ndarray
    size: np.ndarray
    dep_ptr: np.ndarray
    dep_msg: np.ndarray
    dep_delay: np.ndarray
    tails: tuple[Dep, ...]

    @property
    def num_messages(self) -> int:
        return len(self.src)

    def dependents(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The inverse CSR: message m enables ``target[ptr[m]:ptr[m+1]]`` after ``delay[...]``."""
        m = len(self.src)
        owner = np.repeat(np.arange(m, dtype=np.int64), np.diff(self.dep_ptr))
        order = np.argsort(self.dep_msg, kind="stable")
        ptr = np.zeros(m + 1, dtype=np.int64)
        np.cumsum(np.bincount(self.dep_msg, minlength=m), out=ptr[1:])
        return ptr, owner[order], self.dep_delay[order]


Entry = dict[int, list[Dep]]  # rank -> what its first send of a phase waits for


def _ring(
    s: Schedule, group: Sequence[int], chunk: float, steps: int, reduce_steps: int, entry: Entry
) -> Entry:
    """``steps`` neighbour steps around ``group`` (position k sends to k+1); the chunks received
    in the first ``reduce_steps`` steps are reduced before being forwarded. Returns each rank's exit."""
    q = len(group)
    if q == 1 or steps == 0:
        return {r: list(entry.get(r, [])) for r in group}
    base = len(s)
    for k, r in enumerate(group):  # step 0 waits for the phase's entry
        s.send(r, group[(k + 1) % q], chunk, entry.get(r, []))
    reduced = s.gamma * chunk
    if steps > 1:  # step t >= 1: message base + t q + k after (t-1, k) and (t-1, k-1), in one block
        g = np.asarray(group, dtype=np.int64)
        t = np.repeat(np.arange(1, steps, dtype=np.int64), q)
        k = np.tile(np.arange(q, dtype=np.int64), steps - 1)
        prev = base + (t - 1) * q
        deps = np.stack([prev + k, prev + (k - 1) % q], axis=1)
        delays = np.zeros((len(t), 2))
        delays[:, 1] = np.where(t - 1 < reduce_steps, reduced, 0.0)
        s.send_block(g[k], g[(k + 1) % q], np.float64(chunk), deps, delays)
    last = base + (steps - 1) * q
    red = reduced if steps <= reduce_steps else 0.0
    return {r: [(last + k, 0.0), (last + (k - 1) % q, red)] for k, r in enumerate(group)}


def ring_schedule(p: int, chunk: float, *, steps: int, reduce_steps: int, gamma: float) -> Schedule:
    """``steps`` ring steps among ranks 0..p-1 (rank k sends ``chunk`` bytes to k + 1 in every
    step), the chunks received in the first ``reduce_steps`` steps reduced at ``gamma`` s/byte:
    the schedule of a ring all-reduce (2(p-1) steps, p-1 reduced), all-gather (p-1, none),
    reduce-scatter (p-1, p-1) or equal-payload sparse all-gather, or a prefix of one."""
    s = Schedule(gamma)
    ex = _ring(s, list(range(p)), chunk, steps, reduce_steps, {})
    s.tails = [d for deps in ex.values() for d in deps]
    return s


def _ring_allgatherv(s: Schedule, sizes: Sequence[float]) -> Entry:
    """The ring all-gatherv: in step t rank k forwards block (k - t) mod p to k + 1, once it has
    sent step t - 1 and received that block."""
    p = len(sizes)
    if p < 2:
        return {}
    size = np.asarray(sizes, dtype=np.float64)
    t = np.repeat(np.arange(p - 1, dtype=np.int64), p)
    k = np.tile(np.arange(p, dtype=np.int64), p - 1)
    base = len(s)
    for j in range(p):  # step 0: every rank sends its own block
        s.send(j, (j + 1) % p, float(size[j]))
    if p > 2:
        t, k = t[p:], k[p:]
        prev = base + (t - 1) * p
        deps = np.stack([prev + k, prev + (k - 1) % p], axis=1)
        s.send_block(k, (k + 1) % p, size[(k - t) % p], deps, np.zeros(deps.shape))
    last = base + (p - 2) * p
    return {j: [(last + j, 0.0), (last + (j - 1) % p, 0.0)] for j in range(p)}


def _exchange(s: Schedule, p: int, rounds: Sequence[tuple[int, float, bool]], entry: Entry) -> Entry:
    """Pairwise exchange rounds (partner = i xor mask, ``size`` bytes each way, reduce or not);
    round r's message from i waits for i's round r-1 send and its receive from i's partner then.
    The first round waits for ``entry``; the later ones go in as one block of arrays."""
    if not rounds:
        return {i: list(entry.get(i, [])) for i in range(p)}
    ranks = np.arange(p, dtype=np.int64)
    mask, size, _ = rounds[0]
    base = len(s)
    for i in range(p):
        s.send(i, i ^ mask, size, entry.get(i, []))
    if len(rounds) > 1:
        prev_base = base + p * np.arange(len(rounds) - 1, dtype=np.int64)  # round r-1's first message
        prev_mask = np.array([m for m, _, _ in rounds[:-1]], dtype=np.int64)
        prev_red = np.array([s.gamma * z if red else 0.0 for _, z, red in rounds[:-1]])
        masks = np.array([m for m, _, _ in rounds[1:]], dtype=np.int64)
        sizes = np.array([z for _, z, _ in rounds[1:]])
        i = np.tile(ranks, len(rounds) - 1)
        r = np.repeat(np.arange(len(rounds) - 1), p)
        deps = np.stack([prev_base[r] + i, prev_base[r] + (i ^ prev_mask[r])], axis=1)
        delays = np.stack([np.zeros(len(i)), prev_red[r]], axis=1)
        s.send_block(i, i ^ masks[r], sizes[r], deps, delays)
    last = base + p * (len(rounds) - 1)
    mask, size, red = rounds[-1]
    delay = s.gamma * size if red else 0.0
    return {i: [(last + i, 0.0), (last + (i ^ mask), delay)] for i in range(p)}


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
    children = [_heap_children(v, p) for v in range(p)]
    up: dict[tuple[int, int], int] = {}
    port_last: dict[int, int] = {}  # parent -> last message it received
    for j in range(c):
        for v in range(p - 1, 0, -1):  # children (larger index) first; second child before first
            parent = (v - 1) // 2
            deps = [(up[(ch, j)], red) for ch in children[v]]
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
        kids = _heap_children(v, p)
        for j in range(c):
            for ch in kids:
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
        red = s.gamma * sum(chunk_of((i - d) % p) for d in range(1, p)) if reduce else 0.0
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
        else:
            ex = _ring_allgatherv(s, sizes)
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
