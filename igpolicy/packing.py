"""Packing payload blocks into buckets: DDP order, round robin, LPT and Karmarkar–Karp.

A bucket travels as one collective, so the largest bucket sets the step's communication time when
buckets go out side by side. :func:`pack` is the public entry point; :func:`partition` is the
balanced number-partitioning workhorse it shares with the release schedules
(:func:`igpolicy.schedule.assign_phases`).

Determinism: every method first sorts its input into a canonical order (by block name), so every
rank — whatever order it listed its parameters in — computes the same plan. Sizes are integers
(bytes) and all arithmetic is exact.

Bucket numbering: bucket 0 holds the block with the highest ``order`` (the gradient that becomes
ready first in backward); buckets are numbered by descending maximum ``order``, ties by the name of
their first block. Within a bucket blocks are in descending ``order`` (wire order), ties by name.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections.abc import Sequence

import numpy as np

from igpolicy.vocab import Bucket, PackingPlan, PayloadBlock

__all__ = ["PACKING_METHODS", "pack", "partition"]

PACKING_METHODS = ("ddp", "round_robin", "lpt", "kk")
PARTITION_METHODS = ("lpt", "kk")

# Local search: at most this many improving moves/swaps after Karmarkar–Karp.
_LOCAL_SEARCH_MAX_STEPS = 256

# One subset inside a Karmarkar–Karp partial partition: (sum, count, head, tail); the members form a
# linked list through ``nxt`` (head/tail are item indices, -1 when empty). Tuples sort by (sum, count).
_Subset = tuple[int, int, int, int]
_EMPTY: _Subset = (0, 0, -1, -1)


def pack(
    blocks: Sequence[PayloadBlock],
    *,
    method: str = "kk",
    num_buckets: int | None = None,
    bucket_cap_bytes: int = 25 * 2**20,
) -> PackingPlan:
    """Pack ``blocks`` into buckets; deterministic (ties broken by block name), every block exactly once.

    - ``ddp``: walk blocks by descending ``order`` (reverse registration, as DDP does), start a new
      bucket when adding a block would pass ``bucket_cap_bytes`` (a block larger than the cap gets a
      bucket of its own). ``num_buckets`` is ignored.
    - ``round_robin``: blocks by descending ``order`` dealt to buckets in turn.
    - ``lpt``: largest block first onto the currently lightest bucket.
    - ``kk``: Karmarkar–Karp largest differencing (multi-way), refined by local search; when that
      is not provably optimal, LPT refined the same way is tried too and the lower largest bucket
      wins, so ``kk`` is never worse than ``lpt`` (see :func:`partition`).

    For the balanced methods the bucket count is ``num_buckets`` or ceil(total / bucket_cap_bytes),
    at least 1 and at most len(blocks). Within a bucket, blocks are in descending ``order``.
    Empty ``blocks`` gives a plan with no buckets. Raises ValueError for an unknown method.

    Buckets are numbered by descending largest ``order`` (bucket 0 is ready first in backward); no
    bucket is empty. Block names must be unique (ValueError otherwise). Zero-size blocks are placed
    like any other.

    >>> bs = [PayloadBlock(name=f"p{i}", component="norm", size_bytes=s, order=i)
    ...       for i, s in enumerate([5, 4, 3, 3, 3])]
    >>> plan = pack(bs, method="kk", num_buckets=2)
    >>> sorted(b.size_bytes for b in plan.buckets), plan.lower_bound_bytes
    ([9, 9], 9)
    """
    if method not in PACKING_METHODS:
        raise ValueError(f"packing method {method!r} is not one of {', '.join(PACKING_METHODS)}")
    if num_buckets is not None and int(num_buckets) < 1:
        raise ValueError(f"packing: num_buckets must be >= 1 or None, got {num_buckets!r}")
    if int(bucket_cap_bytes) < 1:
        raise ValueError(f"packing: bucket_cap_bytes must be >= 1, got {bucket_cap_bytes!r}")
    ordered = sorted(blocks, key=lambda b: b.name)
    for a, b in itertools.pairwise(ordered):
        if a.name == b.name:
            raise ValueError(f"packing: block name {a.name!r} appears more than once")
    if not ordered:
        return PackingPlan(method=method, buckets=(), imbalance=1.0, lower_bound_bytes=0)

    sizes = [int(b.size_bytes) for b in ordered]
    if method == "ddp":
        groups = _ddp(ordered, int(bucket_cap_bytes))
    else:
        total = sum(sizes)
        count = int(num_buckets) if num_buckets is not None else math.ceil(total / int(bucket_cap_bytes))
        count = min(max(count, 1), len(ordered))
        if method == "round_robin":
            wire = _wire_order(ordered, range(len(ordered)))
            groups = [wire[i::count] for i in range(count)]
        else:
            groups = partition(sizes, num_parts=count, method=method)
    return _plan(method, ordered, groups)


def partition(sizes: Sequence[int], *, num_parts: int, method: str = "kk") -> list[list[int]]:
    """Split item indices 0..len(sizes)-1 into ``num_parts`` lists of (nearly) equal total size.

    ``lpt`` places the largest item first onto the lightest part (Graham: largest part <= (4/3 -
    1/(3·num_parts)) · optimum). ``kk`` runs the multi-way Karmarkar–Karp largest differencing method,
    whose largest and smallest parts differ by at most the largest item, then a local search that
    moves or swaps items between the heaviest part and a lighter one while that lowers the heaviest
    part (bounded number of steps). So for both: largest part <= total/num_parts + largest item.

    Deterministic for a given sequence: equal sizes are ordered by index, so callers make the
    index order canonical (e.g. sorted by name). A part is empty only when there are fewer items
    than parts. Sizes are non-negative integers (bytes). Raises ValueError on bad arguments.

    >>> partition([8, 7, 6, 5, 4], num_parts=2)
    [[0, 1], [2, 3, 4]]
    """
    if method not in PARTITION_METHODS:
        raise ValueError(f"partition method {method!r} is not one of {', '.join(PARTITION_METHODS)}")
    if int(num_parts) < 1:
        raise ValueError(f"partition: num_parts must be >= 1, got {num_parts!r}")
    sizes = [int(s) for s in sizes]
    if any(s < 0 for s in sizes):
        raise ValueError("partition: sizes must be >= 0")
    k = int(num_parts)
    if not sizes:
        return [[] for _ in range(k)]
    arr = np.asarray(sizes, dtype=np.int64)
    order = np.argsort(-arr, kind="stable").tolist()  # largest first, ties by index
    if k == 1:
        return [sorted(order)]
    if method == "lpt":
        return _lpt(sizes, order, k)
    best = _local_search(arr, _karmarkar_karp(sizes, order, k), max_steps=_LOCAL_SEARCH_MAX_STEPS)
    if _largest(arr, best) > max(-(-sum(sizes) // k), max(sizes)):
        # Largest differencing is not better than LPT on every input (about 1 in 1000 small random
        # cases is worse even after local search): unless it is provably optimal, refine LPT's
        # packing too and keep the lower largest part (ties to Karmarkar–Karp).
        other = _local_search(arr, _lpt(sizes, order, k), max_steps=_LOCAL_SEARCH_MAX_STEPS)
        if _largest(arr, other) < _largest(arr, best):
            best = other
    return _fill_empty(best, sizes)


def _largest(sizes: np.ndarray, groups: list[list[int]]) -> int:
    return max(int(sizes[g].sum()) if g else 0 for g in groups)


# ------------------------------------------------------------------ methods
def _ddp(ordered: list[PayloadBlock], cap_bytes: int) -> list[list[int]]:
    groups: list[list[int]] = []
    current: list[int] = []
    current_bytes = 0
    for i in _wire_order(ordered, range(len(ordered))):
        size = ordered[i].size_bytes
        if current and current_bytes + size > cap_bytes:
            groups.append(current)
            current, current_bytes = [], 0
        current.append(i)
        current_bytes += size
    groups.append(current)
    return groups


def _lpt(sizes: list[int], order: list[int], k: int) -> list[list[int]]:
    # (load, count, part): the lightest part, then the emptiest, then the lowest index
    heap = [(0, 0, j) for j in range(k)]
    groups: list[list[int]] = [[] for _ in range(k)]
    for i in order:
        load, count, j = heap[0]
        groups[j].append(i)
        heapq.heapreplace(heap, (load + sizes[i], count + 1, j))
    return groups


def _karmarkar_karp(sizes: list[int], order: list[int], k: int) -> list[list[int]]:
    """Multi-way largest differencing: repeatedly combine the two partial partitions with the largest
    spread (max - min subset sum), pairing the largest subsets of one with the smallest of the other.

    A single item stays a plain index until it is combined, and subsets are linked lists, so a
    combination costs O(log k) (item into partition) or O(k log k) (partition with partition).
    """
    nxt = [-1] * len(sizes)

    def join(a: _Subset, b: _Subset) -> _Subset:
        if a[1] == 0:
            return b
        if b[1] == 0:
            return a
        nxt[a[3]] = b[2]
        return (a[0] + b[0], a[1] + b[1], a[2], b[3])

    def as_partition(x: int | list[_Subset]) -> list[_Subset]:
        if isinstance(x, int):
            return [_EMPTY] * (k - 1) + [(sizes[x], 1, x, x)]
        return x

    # heap of (-spread, sequence, item index | subsets ascending by (sum, count))
    heap: list[tuple[int, int, int | list[_Subset]]] = [(-sizes[i], seq, i) for seq, i in enumerate(order)]
    heapq.heapify(heap)
    seq = len(heap)
    while len(heap) > 1:
        _, _, x = heapq.heappop(heap)
        _, _, y = heapq.heappop(heap)
        if isinstance(x, int) and isinstance(y, int):
            merged = [_EMPTY] * (k - 2) + sorted([(sizes[x], 1, x, x), (sizes[y], 1, y, y)])
        elif isinstance(x, int) or isinstance(y, int):
            item, parts = (x, y) if isinstance(x, int) else (y, x)
            assert isinstance(item, int) and isinstance(parts, list)
            smallest = parts.pop(0)
            bisect.insort(parts, join(smallest, (sizes[item], 1, item, item)))
            merged = parts
        else:
            assert isinstance(x, list) and isinstance(y, list)
            merged = sorted(join(a, b) for a, b in zip(x, reversed(y)))
        heapq.heappush(heap, (-(merged[-1][0] - merged[0][0]), seq, merged))
        seq += 1
    groups = []
    for _, _, head, _ in as_partition(heap[0][2]):
        members = []
        while head != -1:
            members.append(head)
            head = nxt[head]
        groups.append(members)
    return groups


def _local_search(sizes: np.ndarray, groups: list[list[int]], *, max_steps: int) -> list[list[int]]:
    """Lower the heaviest part by moving one item to the lightest part or swapping one item with any
    lighter part; take the step whose two touched parts end lowest; stop when no step lowers the
    heaviest part (or after ``max_steps``). Each step lowers (max load, parts at max) lexicographically.
    """
    loads = np.array([int(sizes[g].sum()) if g else 0 for g in groups], dtype=np.int64)
    # per part: member indices sorted by (size, index), and their sizes
    members = [np.array(sorted(g, key=lambda i: (int(sizes[i]), i)), dtype=np.int64) for g in groups]
    vals = [sizes[m] for m in members]
    floor = -(-int(loads.sum()) // len(groups))  # the largest part is at least this: stop there
    for _ in range(max_steps):
        h = int(np.argmax(loads))
        if int(loads[h]) <= floor:
            break
        best = _best_step(h, loads, vals)
        if best is None:
            break
        j, x_pos, y_pos = best
        x = int(members[h][x_pos])
        members[h] = np.delete(members[h], x_pos)
        if y_pos is not None:
            y = int(members[j][y_pos])
            members[j] = np.delete(members[j], y_pos)
            _insert(members, h, y, sizes)
            loads[h] += sizes[y]
            loads[j] -= sizes[y]
        _insert(members, j, x, sizes)
        loads[h] -= sizes[x]
        loads[j] += sizes[x]
        vals[h], vals[j] = sizes[members[h]], sizes[members[j]]
    assert int(loads.sum()) == int(sizes.sum())
    return [sorted(m.tolist()) for m in members]


def _best_step(h: int, loads: np.ndarray, vals: list[np.ndarray]) -> tuple[int, int, int | None] | None:
    """(partner part, position of the item leaving h, position of the item coming back or None)."""
    top = int(loads[h])
    xs = vals[h]
    if len(xs) == 0:
        return None
    best_cost, best = top, None
    # move: one item of h onto the lightest part; best when it carries half the gap
    j = int(np.argmin(loads))
    gap = top - int(loads[j])
    if j != h and gap > 0:
        pos = _closest(xs, gap / 2.0)
        for p in pos:
            d = int(xs[p])
            cost = max(top - d, top - gap + d)
            if 0 < d < gap and cost < best_cost:
                best_cost, best = cost, (j, p, None)
    # swap: x from h with a smaller y from a lighter part j
    for j in np.argsort(loads, kind="stable").tolist():
        gap = top - int(loads[j])
        ys = vals[j]
        if j == h or gap <= 1 or len(ys) == 0:
            continue
        # for each x, the y nearest to x - gap/2 (the two neighbours of the insertion point)
        at = np.searchsorted(ys, xs - gap / 2.0)
        for cand in (np.minimum(at, len(ys) - 1), np.maximum(at - 1, 0)):
            d = xs - ys[cand]
            ok = (d > 0) & (d < gap)
            if not ok.any():
                continue
            cost = np.where(ok, np.maximum(top - d, top - gap + d), np.iinfo(np.int64).max)
            p = int(np.argmin(cost))
            if int(cost[p]) < best_cost:
                best_cost, best = int(cost[p]), (j, p, int(cand[p]))
    return best


def _closest(sorted_vals: np.ndarray, target: float) -> tuple[int, ...]:
    at = int(np.searchsorted(sorted_vals, target))
    return tuple(p for p in (at - 1, at) if 0 <= p < len(sorted_vals))


def _insert(members: list[np.ndarray], part: int, item: int, sizes: np.ndarray) -> None:
    """Insert ``item`` into part ``part``, keeping members sorted by (size, index)."""
    m = members[part]
    vals = sizes[m]
    lo = int(np.searchsorted(vals, sizes[item], side="left"))
    hi = int(np.searchsorted(vals, sizes[item], side="right"))
    at = lo + int(np.searchsorted(m[lo:hi], item))
    members[part] = np.insert(m, at, item)


def _fill_empty(groups: list[list[int]], sizes: list[int]) -> list[list[int]]:
    """Give every empty part the smallest item of a part holding two or more (never raises the max)."""
    groups = [list(g) for g in groups]
    for g in groups:
        if g:
            continue
        donors = [d for d in groups if len(d) >= 2]
        if not donors:
            break
        donor = min(donors, key=lambda d: min((sizes[i], i) for i in d))
        item = min(donor, key=lambda i: (sizes[i], i))
        donor.remove(item)
        g.append(item)
    return groups


# ------------------------------------------------------------------ the plan
def _wire_rank(blocks: Sequence[PayloadBlock]) -> np.ndarray:
    """rank[i] = position of block i in wire order (descending ``order``, ties by name).

    ``blocks`` are sorted by name, so a stable sort on -order breaks ties by name.
    """
    orders = np.fromiter((b.order for b in blocks), dtype=np.int64, count=len(blocks))
    rank = np.empty(len(blocks), dtype=np.int64)
    rank[np.argsort(-orders, kind="stable")] = np.arange(len(blocks))
    return rank


def _wire_order(blocks: Sequence[PayloadBlock], indices) -> list[int]:
    idx = np.fromiter(indices, dtype=np.int64)
    return idx[np.argsort(_wire_rank(blocks)[idx], kind="stable")].tolist()


def _plan(method: str, blocks: list[PayloadBlock], groups: list[list[int]]) -> PackingPlan:
    rank = _wire_rank(blocks)
    sizes = np.fromiter((b.size_bytes for b in blocks), dtype=np.int64, count=len(blocks))
    wired = []
    for g in groups:
        if g:
            idx = np.asarray(g, dtype=np.int64)
            wired.append(idx[np.argsort(rank[idx], kind="stable")])
    wired.sort(key=lambda idx: int(rank[idx[0]]))  # bucket 0 holds the first block in wire order
    buckets = tuple(
        Bucket(
            index=n,
            block_names=tuple(blocks[i].name for i in idx.tolist()),
            size_bytes=int(sizes[idx].sum()),
        )
        for n, idx in enumerate(wired)
    )
    total = int(sizes.sum())
    assert sum(len(b.block_names) for b in buckets) == len(blocks)
    assert sum(b.size_bytes for b in buckets) == total
    lower = max(-(-total // len(buckets)), int(sizes.max()))
    biggest = max(b.size_bytes for b in buckets)
    imbalance = biggest * len(buckets) / total if total > 0 else 1.0
    return PackingPlan(method=method, buckets=buckets, imbalance=imbalance, lower_bound_bytes=lower)
