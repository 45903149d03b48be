"""What PyTorch's gloo backend really does, as message schedules on igsim's flow network.

The textbook algorithms of :mod:`igsim.collectives.predict` step in lock-step rounds. Gloo's CPU/TCP
implementation differs in ways a calibrated prediction has to follow (read from gloo's
``allreduce.cc``, ``allgather.cc``, ``broadcast.cc``, ``transport/tcp/pair.cc`` and PyTorch's
``ProcessGroupGloo.cpp``):

- **Rendezvous.** A message's bytes leave only once the sender has posted the send *and* the
  receiver has posted the matching receive (the receiver notifies the sender). Here a message
  starts at the later of the two posts, then pays the path's alpha and flows.
- **all_reduce** (``gloo::allreduce``, ring): the buffer is cut into
  ``S = roundup(max(ceil(n / 1 MiB), 2p), p)`` segments; reduce-scatter, then all-gather, each
  ``S - S/p`` iterations; rank r sends to r-1 and receives from r+1; iteration i first waits for
  the send and the receive of iteration i-2, so two segments are in flight per direction.
- **reduce_scatter_tensor**: PyTorch's gloo backend clones the input, runs the all-reduce above
  on the *whole* buffer and keeps its chunk: it costs a full all-reduce of n.
- **all_gather** (``gloo::allgather``, ring): rank r sends to r+1; each rank's block travels in
  two halves; 2(p-1) iterations with the same window of two.
- **broadcast** (``gloo::broadcast``, binomial): a rank waits for its parent's message, then
  posts the sends to all its children at once (they share its link), nearest child first.
- **sparse_all_gather** (:func:`igrt.sync.comm.sparse_all_gather`): an all-gather of one int64 count
  per rank, then an all-gather of every rank's buffer padded to ``8 + 8 * k_max`` bytes
  (k = bytes // 8 int32-index / fp32-value pairs); nothing when every rank has zero pairs.
- **p2p**: one message of n bytes from rank 0 to rank 1 (the one-way half of a ping-pong).

Every rank runs its own loop (no global barrier); the collective's time is the slowest rank's
(as :mod:`igrt.testbed.netbench` measures it). A send counts as complete once its bytes start to flow (gloo
sizes the socket send buffer to the message). Reductions cost ``gamma_s_per_byte``.

>>> from igsim.net.topology import star
>>> topo = star(num_ranks=4, bandwidth_bytes_per_s=1e6, latency_s=0.0)
>>> round(predict_gloo("all_reduce", topology=topo, size_bytes=1e6), 6)  # 2 (p-1)/p n / B
1.5
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Generator, Hashable, Sequence
from dataclasses import dataclass, replace

import simpy

from igsim.net.calibration import Calibration
from igsim.net.network import Network
from igsim.net.topology import Topology

__all__ = [
    "GLOO_OPS",
    "MAX_SEGMENT_BYTES",
    "GlooResult",
    "binomial_tree",
    "burst_stages",
    "predict_gloo",
    "simulate_gloo",
    "sparse_padded_bytes",
]

GLOO_OPS = ("p2p", "all_reduce", "reduce_scatter", "all_gather", "broadcast", "sparse_all_gather")
MAX_SEGMENT_BYTES = 1024 * 1024  # gloo's AllreduceOptions kMaxSegmentSize


def sparse_padded_bytes(sizes_bytes: Sequence[float]) -> int:
    """Bytes per rank of :func:`igrt.sync.comm.sparse_all_gather`'s payload collective: an int64 count
    plus ``k_max`` (int32, fp32) pairs, k = size // 8; 0 when every rank sends nothing."""
    k_max = max((int(s) // 8 for s in sizes_bytes), default=0)
    return 8 + 8 * k_max if k_max else 0


class _Msg:
    """One gloo message: it flows once both ends have posted; ``sent`` when it starts, ``done``
    when it has arrived."""

    __slots__ = ("done", "recv_posted", "send_posted", "sent")

    def __init__(self, env: simpy.Environment):
        self.send_posted = env.event()
        self.recv_posted = env.event()
        self.sent = env.event()
        self.done = env.event()


class _Run:
    """The shared state of one prediction: the network, the ranks and the messages by key.

    Messages between the same two ranks in the same direction share one TCP stream, so they are
    carried in order: a message's bytes flow once it has paid its alpha *and* the previous one on
    that stream has arrived (its alpha overlaps the previous transfer). A receiver's
    ready-notification queues behind the data already on its own stream to the sender.
    """

    def __init__(self, topology: Topology, calibration: Calibration):
        self.env = simpy.Environment()
        no_alpha = replace(
            calibration,
            default=replace(calibration.default, alpha_s=0.0),
            link_classes={k: replace(v, alpha_s=0.0) for k, v in calibration.link_classes.items()},
        )
        self.net = Network(self.env, topology, calibration=no_alpha)
        self._alpha_net = Network(self.env, topology, calibration=calibration)
        self.names = list(topology.ranks)
        self.p = len(self.names)
        self.gamma = calibration.gamma_s_per_byte
        self.msgs: dict[tuple, _Msg] = {}
        self._last_on_stream: dict[tuple[int, int], _Msg] = {}

    def msg(self, key: tuple, src: int, dst: int, size: float) -> _Msg:
        m = self.msgs.get(key)
        if m is None:
            m = self.msgs[key] = _Msg(self.env)
            self.env.process(self._carry(m, src, dst, size))
        return m

    def _carry(self, m: _Msg, src: int, dst: int, size: float):
        yield m.recv_posted
        # The receiver's ready-notification travels on the stream dst -> src, behind any data
        # already queued there (with two ranks a ring's sends and notifications share a stream).
        ahead = self._last_on_stream.get((dst, src))
        if ahead is not None and not ahead.done.triggered:
            yield ahead.done
        yield m.send_posted
        m.sent.succeed()
        a, b = self.names[src], self.names[dst]
        before = self._last_on_stream.get((src, dst))
        self._last_on_stream[(src, dst)] = m
        alpha = self._alpha_net.path_alpha_s(a, b)
        if alpha > 0:
            yield self.env.timeout(alpha)
        if before is not None and not before.done.triggered:
            yield before.done
        yield self.net.transfer(a, b, size)
        m.done.succeed()


Loop = Generator[simpy.Event, object, None]


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _ring_all_reduce(run: _Run, r: int, n: int, elem: int, tag: str) -> Loop:
    p = run.p
    max_seg = elem * max(1, MAX_SEGMENT_BYTES // elem)
    num_seg = _round_up(max(-(-n // max_seg), 2 * p), p)
    seg = _round_up(-(-n // num_seg), elem)
    shape = (num_seg // p, seg, num_seg * seg, n)
    yield from _ring_phase(run, r, (tag, "rs"), shape, send_base=r + 1, recv_base=r + 2, reduce=True)
    yield from _ring_phase(run, r, (tag, "ag"), shape, send_base=r, recv_base=r + 1, reduce=False)


def _ring_phase(
    run: _Run,
    r: int,
    tag: tuple,
    shape: tuple[int, int, int, int],
    *,
    send_base: int,
    recv_base: int,
    reduce: bool,
) -> Loop:
    """One phase of gloo's ring all-reduce on rank r: segment ``base * per_rank + i`` goes to r-1
    at iteration i, the one from r+1 arrives; two of each in flight."""
    p, env = run.p, run.env
    per_rank, seg, total, n = shape
    send_to, recv_from = (r - 1) % p, (r + 1) % p

    def length(base: int, i: int) -> int:
        return min(seg, n - ((base * per_rank + i) * seg) % total)  # <= 0: nothing to move

    def out_msg(i: int) -> _Msg:
        return run.msg((*tag, r, i), r, send_to, length(send_base, i))

    def in_msg(i: int) -> _Msg:
        return run.msg((*tag, recv_from, i), recv_from, r, length(recv_base, i))

    iters = (p - 1) * per_rank
    for i in range(iters + 2):
        if i >= 2:
            if length(recv_base, i - 2) > 0:
                yield in_msg(i - 2).done
                if reduce and run.gamma:
                    yield env.timeout(run.gamma * length(recv_base, i - 2))
            if length(send_base, i - 2) > 0:
                yield out_msg(i - 2).sent
        if i < iters:
            if length(recv_base, i) > 0:
                in_msg(i).recv_posted.succeed()
            if length(send_base, i) > 0:
                out_msg(i).send_posted.succeed()


def _ring_all_gather(run: _Run, r: int, n_total: int, tag: str) -> Loop:
    p = run.p
    block = n_total // p
    halves = (block // 2, block - block // 2)
    send_to, recv_from = (r + 1) % p, (r - 1) % p

    def out_msg(i: int) -> _Msg:
        return run.msg((tag, r, i), r, send_to, halves[i & 1])

    def in_msg(i: int) -> _Msg:
        return run.msg((tag, recv_from, i), recv_from, r, halves[i & 1])

    steps = 2 * (p - 1)
    for i in range(steps):
        if i >= 2:
            yield out_msg(i - 2).sent
            yield in_msg(i - 2).done
        out_msg(i).send_posted.succeed()
        in_msg(i).recv_posted.succeed()
    for i in range(max(steps - 2, 0), steps):
        yield out_msg(i).sent
        yield in_msg(i).done


def binomial_tree(p: int) -> list[tuple[int | None, list[int]]]:
    """gloo's broadcast tree over virtual ranks (the root is 0): ``(parent, children)`` per vrank,
    children in the order their sends are posted. vrank v with highest set bit h receives from
    ``v - 2**h`` and sends to ``v + 2**i`` for every i > h with ``v + 2**i < p`` (the root: every
    i with ``2**i < p``), as ``gloo::broadcast`` walks its mask."""
    tree: list[tuple[int | None, list[int]]] = []
    for v in range(p):
        h = v.bit_length() - 1  # -1 for the root
        parent = None if v == 0 else v - (1 << h)
        children = [v + (1 << i) for i in range(h + 1, max(p - 1, 1).bit_length()) if v + (1 << i) < p]
        tree.append((parent, children))
    return tree


def _binomial_broadcast(run: _Run, r: int, n: int, root: int, tag: str) -> Loop:
    p = run.p
    parent, children = binomial_tree(p)[(r - root) % p]
    if parent is not None:
        src = (parent + root) % p
        m = run.msg((tag, src, r), src, r, n)
        m.recv_posted.succeed()
        yield m.done
    sends = []
    for c in children:
        peer = (c + root) % p
        m = run.msg((tag, r, peer), r, peer, n)
        m.send_posted.succeed()
        sends.append(m)
    for m in sends:
        yield m.sent


def _p2p(run: _Run, r: int, n: int, tag: str) -> Loop:
    if r in (0, 1):
        m = run.msg((tag,), 0, 1, n)
        (m.send_posted if r == 0 else m.recv_posted).succeed()
        yield m.sent if r == 0 else m.done


def _rank_loop(run: _Run, op: str, r: int, n: int, sizes: Sequence[float], elem: int, root: int) -> Loop:
    p = run.p
    if op == "all_reduce" or op == "reduce_scatter":
        yield from _ring_all_reduce(run, r, n, elem, "ar")
    elif op == "all_gather":
        yield from _ring_all_gather(run, r, n, "ag")
    elif op == "broadcast":
        yield from _binomial_broadcast(run, r, n, root, "bc")
    elif op == "sparse_all_gather":
        yield from _ring_all_gather(run, r, 8 * p, "counts")
        padded = sparse_padded_bytes(sizes)
        if padded:
            yield from _ring_all_gather(run, r, padded * p, "pairs")
    else:
        yield from _p2p(run, r, n, "p2p")


@dataclass(frozen=True, kw_only=True)
class GlooResult:
    """``time_s``: common start until the slowest rank is done (after the burst credit);
    ``bytes_on_wire``: payload bytes all messages carried; ``num_messages``."""

    time_s: float
    bytes_on_wire: float
    num_messages: int


def predict_gloo(op: str, *, topology: Topology, **kw) -> float:
    """Seconds gloo takes for ``op`` on ``topology``: :func:`simulate_gloo` (same arguments)'s time."""
    return simulate_gloo(op, topology=topology, **kw).time_s


def simulate_gloo(
    op: str,
    *,
    topology: Topology,
    calibration: Calibration | None = None,
    size_bytes: float = 0,
    sizes_bytes: Sequence[float] = (),
    element_bytes: int = 4,
    root: int = 0,
    burst_s: float = 0.0,
) -> GlooResult:
    """Run gloo's ``op`` among all ranks of an otherwise idle ``topology``.

    ``size_bytes`` is the full buffer n (all-reduce / reduce-scatter input, all-gather output,
    broadcast payload, p2p message); ``sizes_bytes`` the per-rank payloads of a sparse all-gather.
    ``burst_s``: links shaped by a token bucket let an idle link send ``burst_s`` seconds' worth of
    traffic at once; every stage that starts on idle links (:func:`burst_stages`) gains up to that
    much (no more than its busiest link's own transfer time). Raises ValueError for an unknown op,
    a negative size, or sizes that do not match the ranks.
    """
    if op not in GLOO_OPS:
        raise ValueError(f"gloo op {op!r} is not one of {', '.join(GLOO_OPS)}")
    if not (math.isfinite(size_bytes) and size_bytes >= 0):
        raise ValueError(f"gloo {op}: size_bytes={size_bytes!r} must be >= 0 and finite")
    if not (math.isfinite(burst_s) and burst_s >= 0):
        raise ValueError(f"gloo {op}: burst_s={burst_s!r} must be >= 0 and finite")
    run = _Run(topology, (calibration or Calibration()).for_op(op))
    p = run.p
    if op == "sparse_all_gather" and len(sizes_bytes) != p:
        raise ValueError(f"gloo sparse_all_gather: {len(sizes_bytes)} sizes_bytes for {p} ranks")
    if op == "p2p" and p < 2:
        raise ValueError("gloo p2p needs at least 2 ranks")
    if not 0 <= root < p:
        raise ValueError(f"gloo {op}: root={root} is not a rank below {p}")
    n = int(size_bytes)
    if op == "all_gather":
        n = n // p * p  # the measured output buffer holds p equal blocks
    if p == 1 or (n == 0 and op != "sparse_all_gather"):
        return GlooResult(time_s=0.0, bytes_on_wire=0.0, num_messages=0)
    done: list[float] = [0.0] * p

    def rank(r: int) -> Loop:
        yield from _rank_loop(run, op, r, n, sizes_bytes, element_bytes, root)
        done[r] = run.env.now

    procs = [run.env.process(rank(r)) for r in range(p)]
    run.env.run(run.env.all_of(procs))
    unfinished = [k for k, m in run.msgs.items() if not m.done.triggered]
    assert not unfinished, f"gloo {op}: messages never matched: {unfinished[:4]}"
    credit = 0.0
    if burst_s:
        names = run.names
        cap = min(run.net.path_capacity_bytes_per_s(names[i], names[(i + 1) % p]) for i in range(p))
        stages = burst_stages(op, p=p, size_bytes=n, sizes_bytes=sizes_bytes, root=root,
                              first_link=lambda a, b: run.net.route(names[a], names[b])[0][:1])  # fmt: skip
        credit = sum(min(burst_s, b / cap) for b in stages)
    return GlooResult(
        time_s=max(done) - credit, bytes_on_wire=run.net.bytes_delivered, num_messages=run.net.num_messages
    )


def burst_stages(
    op: str,
    *,
    p: int,
    size_bytes: float,
    sizes_bytes: Sequence[float] = (),
    first_link: Callable[[int, int], Hashable] | None = None,
    root: int = 0,
) -> list[float]:
    """Bytes the busiest link carries in each stage of ``op`` that starts on idle links.

    A ring keeps its links busy from start to end (one stage: all-reduce 2(p-1)/p n, all-gather
    (p-1)/p n); the sparse all-gather is two rings; p2p one message; the binomial broadcast has
    one stage per depth of :func:`binomial_tree`, in which a sender's link carries n per child it
    serves over it: ``first_link(src, dst)`` names the first link of a message's route (ranks, not
    vranks); without it every child of a sender shares the sender's link (a star).
    """
    n = float(size_bytes)
    if op in ("all_reduce", "reduce_scatter"):
        return [2 * (p - 1) / p * n]
    if op == "all_gather":
        return [(p - 1) / p * n]
    if op == "sparse_all_gather":
        return [8.0 * (p - 1), float((p - 1) * sparse_padded_bytes(sizes_bytes))]
    if op == "broadcast":  # one stage per tree depth; its busiest sender serves every child on one link
        tree = binomial_tree(p)
        busiest: dict[int, int] = {}
        for v, (_, children) in enumerate(tree):
            if not children:
                continue
            if first_link is None:
                most = len(children)
            else:
                src = (v + root) % p
                per_link = Counter(first_link(src, (c + root) % p) for c in children)
                most = max(per_link.values())
            depth = v.bit_count()
            busiest[depth] = max(busiest.get(depth, 0), most)
        return [n * busiest[d] for d in sorted(busiest)]
    return [n]
