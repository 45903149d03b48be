"""The flow-level network: messages as flows sharing directed links max-min fairly.

A message of ``size_bytes`` from ``src`` to ``dst`` first waits its per-message latency
``alpha = path latency + calibration alpha`` (no bandwidth is used meanwhile), then becomes a *flow*
over the directed links of its path. Every directed link's capacity (nominal bandwidth x the
calibration's factor for its class) is shared among the flows crossing it by max-min fairness,
computed by progressive filling. The message completes when its last byte has been delivered; its
completion is a simpy event. Bytes flow cut-through: an uncontended message takes exactly
``alpha + size_bytes / bottleneck_capacity``.

Rates are recomputed incrementally: when flows start or end, only the flows connected to them
(through shared links, transitively) are re-filled, and only flows whose rate changed get a new
completion time. All starts and ends at one simulated instant are batched into one recomputation,
run after every other event of that instant (a simpy event of lower priority).

Deterministic: flows are kept in insertion order and ties are broken by link index.

**Queue overflow** (a calibration's ``queue_bytes`` / ``overflow_factor`` per link class): a link that
is slower than an earlier link of a message's path drains slower than the message arrives, so its
queue grows by ``(1 - c / c_in)`` of every byte that reaches it (``c`` its capacity, ``c_in`` the
fastest capacity before it on the path). With :data:`IN_FLIGHT` messages of a connection in flight
at once, a message of ``m`` bytes overflows a queue of ``Q`` bytes when ``IN_FLIGHT · m · (1 - c /
c_in) >= Q``; such a message then occupies its links for ``m / overflow_factor`` bytes (TCP's loss
recovery: retransmissions and stalls), while only ``m`` count as delivered.

>>> import simpy
>>> from igsim.net.topology import star
>>> env = simpy.Environment()
>>> net = Network(env, star(num_ranks=2, bandwidth_bytes_per_s=1e9, latency_s=1e-6))
>>> done = net.transfer("r0", "r1", 1e6)
>>> env.run(done)  # the value is the message size
1000000.0
>>> round(env.now, 9)
0.001002
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import simpy

from igsim.net.calibration import Calibration
from igsim.net.topology import Topology

__all__ = ["FlowInfo", "Network"]

IN_FLIGHT = 2  # messages of one connection in flight at once: gloo's ring and all-gather keep two
_NORMAL = 1  # simpy's priority of a timeout
_LATE = 2  # runs after every NORMAL (1) and URGENT (0) event scheduled for the same instant


# The hot path schedules its own small event objects instead of simpy Timeouts: ``env.step`` only
# needs ``callbacks`` (called with the event) and ``_ok``. Each is scheduled exactly where a
# Timeout used to be, so the event order, and every result, is unchanged. None of them is ever
# handed out (``transfer`` returns a real simpy event), so nothing else adds callbacks to them.
# The two hottest schedule calls are inlined: ``heappush(env._queue, (env._now + delay,
# priority, next(env._eid), event))`` is simpy 4's ``Environment.schedule`` (a test checks it).
heappush = heapq.heappush


class _Flow:
    """One message. Scheduled as an event itself for the end of its latency (``callbacks``), and
    again for its end when it gets its first rate alone on its links; a flow once bytes move
    (``fid`` set, ``rate`` > 0). On arrival ``done(tag)`` is called."""

    __slots__ = ("callbacks", "cap", "done", "dst", "fid", "last_s", "links", "rate", "remaining", "size",
                 "src", "tag", "version", "weight")  # fmt: skip
    _ok = True

    def __init__(self, src: str, dst: str, path: tuple, size: float, done: Callable[[Any], object], tag: Any):
        self.src = src
        self.dst = dst
        # cap: the bottleneck capacity, its rate when alone; weight: its share weight (Network docs)
        self.links, _, self.cap, self.weight, overflow_bytes, overflow_factor = path
        self.size = size  # delivered; remaining: the link work, more when the message overflows a queue
        self.remaining = size / overflow_factor if size >= overflow_bytes else size
        self.rate = 0.0
        self.last_s = 0.0
        self.version = 0
        self.done = done
        self.tag = tag
        self.fid = -1


class _Finish:
    """The event "``flow`` delivers its last byte at the rate it got in ``version``"."""

    __slots__ = ("callbacks", "flow", "version")
    _ok = True

    def __init__(self, callbacks: tuple, flow: _Flow, version: int):
        self.callbacks = callbacks
        self.flow = flow
        self.version = version


class _Recompute:
    """The late event that re-fills the rates of the flows touched at this instant."""

    __slots__ = ("callbacks",)
    _ok = True


@dataclass(frozen=True, kw_only=True)
class FlowInfo:
    """A snapshot of one active flow (for tests and tracing)."""

    fid: int
    src: str
    dst: str
    rate_bytes_per_s: float
    remaining_bytes: float
    links: tuple[tuple[str, str], ...]


class Network:
    """Flows over a :class:`~igsim.net.topology.Topology` inside one simpy environment.

    ``transfer(src, dst, size_bytes)`` returns an event that succeeds (value: ``size_bytes``) when
    the message has arrived. Counters: ``num_messages``, ``bytes_delivered``, ``num_recomputes``
    (batched rate recomputations) and ``num_rate_updates`` (flows whose rate changed).
    """

    def __init__(self, env: simpy.Environment, topology: Topology, *, calibration: Calibration | None = None):
        self.env = env
        self.topology = topology
        self.calibration = calibration or Calibration()
        self._link_index: dict[tuple[str, str], int] = {}
        self._link_names: list[tuple[str, str]] = []
        self._capacity: list[float] = []
        self._class_alpha: dict[frozenset[str], float] = {}  # link classes of a path -> calibration alpha
        self._latency: list[float] = []
        self._class: list[str] = []
        for u, v, data in topology.graph.edges(data=True):
            cap = self.calibration.capacity_bytes_per_s(data["link_class"], data["bandwidth_bytes_per_s"])
            for a, b in ((u, v), (v, u)):
                self._link_index[(a, b)] = len(self._link_names)
                self._link_names.append((a, b))
                self._capacity.append(cap)
                self._latency.append(data["latency_s"])
                self._class.append(data["link_class"])
        self._on_link: list[dict[int, _Flow]] = [{} for _ in self._link_names]
        self._weighted = self.calibration.downstream_share != 1.0  # else plain max-min (the fast fill)
        self._routes: dict[tuple[str, str], tuple[tuple[int, ...], float, float]] = {}  # + bottleneck
        self._num_active = 0  # flows with bytes moving
        self._dirty: set[int] = set()
        self._pending = False
        self._next_fid = 0
        self._start_cb = (self._start,)
        self._finish_cb = (self._finish,)
        self._finish_alone_cb = (self._finish_alone,)
        self._recompute_cb = (self._recompute,)
        self._recompute_event = _Recompute()  # at most one is pending at a time: reused
        self.num_messages = 0
        self.bytes_delivered = 0.0
        self.num_recomputes = 0
        self.num_rate_updates = 0

    # -- routes ---------------------------------------------------------------------------------

    def route(self, src: str, dst: str) -> tuple[tuple[int, ...], float]:
        """(directed link indices, alpha_s) of a message from ``src`` to ``dst``; cached."""
        return self._route(src, dst)[:2]

    def _route(self, src: str, dst: str) -> tuple[tuple[int, ...], float, float, float, float, float]:
        """:meth:`route` plus the bottleneck capacity (``inf`` without links), the flow's share
        weight (the calibration's ``downstream_share`` when a link of the path is slower than
        another link of it, else 1), and the smallest message that overflows a queue on the way
        with that queue's ``overflow_factor`` (``inf``, 1 when none can: the module docstring)."""
        key = (src, dst)
        r = self._routes.get(key)
        if r is None:
            links = tuple(self._link_index[h] for h in self.topology.path_links(src, dst))
            # = topology.path_latency_s (the same sum, in the same order) + the calibration's alpha
            latency = float(sum(self._latency[i] for i in links))
            classes = frozenset(self._class[i] for i in links)
            extra = self._class_alpha.get(classes)
            if extra is None:
                extra = self._class_alpha[classes] = self.calibration.message_alpha_s(classes)
            alpha = latency + extra
            cap = min((self._capacity[i] for i in links), default=float("inf"))
            top = max((self._capacity[i] for i in links), default=cap)
            weight = self.calibration.downstream_share if cap < top * (1 - 1e-9) else 1.0
            r = self._routes[key] = (links, alpha, cap, weight, *self._overflow(links))
        return r

    def _overflow(self, links: tuple[int, ...]) -> tuple[float, float]:
        """(smallest overflowing message, its factor) over the step-down links of a path."""
        smallest, factor = float("inf"), 1.0
        fastest = 0.0
        for i in links:
            c = self._capacity[i]
            link = self.calibration.for_class(self._class[i])
            if link.overflows and c < fastest * (1 - 1e-9):
                m = link.queue_bytes / (IN_FLIGHT * (1 - c / fastest))
                if m < smallest:
                    smallest, factor = m, link.overflow_factor
            fastest = max(fastest, c)
        return smallest, factor

    def link_capacity_bytes_per_s(self, link: int) -> float:
        """The capacity of directed link ``link`` (an index of :meth:`route`), calibrated."""
        return self._capacity[link]

    def link_name(self, link: int) -> tuple[str, str]:
        """The ``(u, v)`` of directed link ``link``."""
        return self._link_names[link]

    def path_alpha_s(self, src: str, dst: str) -> float:
        """Latency a message pays before its bytes flow: path latency + calibration alpha."""
        return self.route(src, dst)[1]

    def path_capacity_bytes_per_s(self, src: str, dst: str) -> float:
        """Uncontended rate of a flow from ``src`` to ``dst`` (its bottleneck link capacity)."""
        return self._route(src, dst)[2]

    # -- messages -------------------------------------------------------------------------------

    def transfer(self, src: str, dst: str, size_bytes: float) -> simpy.Event:
        """Send ``size_bytes`` from ``src`` to ``dst``; the event succeeds on arrival.

        ``size_bytes`` may be 0 (the message still pays alpha) and fractional. ``src == dst``
        arrives at once.
        """
        done = self.env.event()
        if size_bytes < 0:
            raise ValueError(f"transfer {src}->{dst}: size_bytes={size_bytes!r} must be >= 0")
        if not self.start(self._routes.get((src, dst)) or self._route(src, dst), float(size_bytes),
                          done.succeed, size_bytes, src, dst):  # fmt: skip
            done.succeed(size_bytes)
        return done

    def send(self, src: str, dst: str, size_bytes: float, on_arrival: Callable[[], object]) -> None:
        """Like :meth:`transfer`, but calls ``on_arrival()`` at arrival instead of triggering an
        event (one simpy event less per message)."""
        if size_bytes < 0:
            raise ValueError(f"transfer {src}->{dst}: size_bytes={size_bytes!r} must be >= 0")
        path = self._routes.get((src, dst)) or self._route(src, dst)
        if not self.start(path, float(size_bytes), _call, on_arrival, src, dst):
            on_arrival()

    def path_handle(self, src: str, dst: str) -> tuple:
        """The cached route of ``src -> dst``, opaque: what :meth:`start` takes."""
        return self._routes.get((src, dst)) or self._route(src, dst)

    def start(self, path: tuple, size: float, done: Callable[[Any], object], tag: Any,
              src: str = "", dst: str = "") -> bool:  # fmt: skip
        """The hot path of :meth:`send`: a message of ``size`` bytes (a float >= 0, unchecked) over
        ``path`` (from :meth:`path_handle`); ``done(tag)`` is called on arrival. Returns False,
        without calling ``done``, when the message arrives at once (no links, or nothing to wait
        for); the caller handles that arrival itself (no recursion through long chains of empty
        messages). ``src`` and ``dst`` only label the flow for :meth:`flows`."""
        self.num_messages += 1
        links, alpha = path[0], path[1]
        if not links or (size == 0 and alpha == 0):
            return False
        flow = _Flow(src, dst, path, size, done, tag)
        if alpha > 0:
            flow.callbacks = self._start_cb
            env = self.env
            heappush(env._queue, (env._now + alpha, _NORMAL, next(env._eid), flow))  # = env.schedule
        else:
            self._start(flow)
        return True

    def _start(self, flow: _Flow) -> None:
        """The latency is over: the message's bytes start to flow (or it arrives, if empty)."""
        size = flow.size
        if size == 0:
            flow.done(flow.tag)
            return
        fid = flow.fid = self._next_fid
        self._next_fid = fid + 1
        flow.last_s = self.env.now
        self._num_active += 1
        on_link = self._on_link
        links = flow.links
        for li in links:
            if on_link[li]:
                for lj in links:
                    on_link[lj][fid] = flow
                self._mark(links)
                return
        # alone on every link: its rate is its bottleneck capacity, no recomputation needed; the
        # flow itself is the event of its end (it is in the event queue at most once at a time)
        for li in links:
            on_link[li][fid] = flow
        rate = flow.rate = flow.cap
        flow.version = 1
        self.num_rate_updates += 1
        flow.callbacks = self._finish_alone_cb
        env = self.env
        heappush(env._queue, (env._now + flow.remaining / rate, _NORMAL, next(env._eid), flow))  # = env.schedule

    def _finish_alone(self, flow: _Flow) -> None:
        """The end of a flow that started alone (:meth:`_arrive`, inlined: the hot path)."""
        if flow.version != 1:
            return
        fid = flow.fid
        self._num_active -= 1
        on_link = self._on_link
        shared = False
        for li in flow.links:
            on = on_link[li]
            del on[fid]
            if on:
                shared = True
        self.bytes_delivered += flow.size
        flow.rate = 0.0
        flow.version = -1
        if shared:
            self._mark(flow.links)
        flow.done(flow.tag)

    def _finish(self, event: _Finish) -> None:
        flow = event.flow
        if flow.version == event.version:
            self._arrive(flow)
        # else: superseded by a rate change

    def _arrive(self, flow: _Flow) -> None:
        fid = flow.fid
        self._num_active -= 1
        on_link = self._on_link
        shared = False
        for li in flow.links:
            on = on_link[li]
            del on[fid]
            if on:
                shared = True
        self.bytes_delivered += flow.size
        flow.rate = 0.0
        flow.version = -1
        if shared:
            self._mark(flow.links)
        flow.done(flow.tag)

    def _mark(self, links: tuple[int, ...]) -> None:
        self._dirty.update(links)
        if not self._pending:
            self._pending = True
            event = self._recompute_event
            event.callbacks = self._recompute_cb
            self.env.schedule(event, _LATE)

    # -- max-min fair rates ---------------------------------------------------------------------

    def _recompute(self, _event: _Recompute) -> None:
        self._pending = False
        dirty, self._dirty = self._dirty, set()
        flows, links = self._component(dirty)
        if not flows:
            return
        self.num_recomputes += 1
        if len(flows) == 1:
            (flow,) = flows
            rates = {flow.fid: flow.cap}
        elif self._weighted:
            rates = self._fill_weighted(flows, links)
        else:
            rates = self._fill(flows, links)
        env = self.env
        now = env._now
        queue, eid, finish_cb = env._queue, env._eid, self._finish_cb
        updates = 0
        for flow in flows:
            new = rates[flow.fid]
            old = flow.rate
            if new == old:
                continue
            updates += 1
            if old:
                left = flow.remaining - old * (now - flow.last_s)
                flow.remaining = left if left > 0.0 else 0.0
            flow.last_s = now
            flow.rate = new
            version = flow.version = flow.version + 1
            heappush(
                queue, (now + flow.remaining / new, _NORMAL, next(eid), _Finish(finish_cb, flow, version))
            )
        self.num_rate_updates += updates

    def _component(self, links: set[int]) -> tuple[list[_Flow], set[int]]:
        """Every active flow connected to ``links`` through shared links, in flow-id order, and
        ``links`` itself, grown by every link those flows use (each flow on one of them is in the
        list)."""
        on_link = self._on_link
        seen_links = links  # the caller's set, grown in place
        stack = list(links)
        found: dict[int, _Flow] = {}
        while stack:
            for fid, flow in on_link[stack.pop()].items():
                if fid in found:
                    continue
                found[fid] = flow
                for lj in flow.links:
                    if lj not in seen_links:
                        seen_links.add(lj)
                        stack.append(lj)
        if len(found) < 2:
            return list(found.values()), seen_links
        return [found[k] for k in sorted(found)], seen_links

    def _fill(self, flows: list[_Flow], links: set[int]) -> dict[int, float]:
        """Progressive filling: the max-min fair rate of each of ``flows``, a connected component
        that holds every flow on each of ``links`` (the links they use, and maybe idle ones)."""
        on_link = self._on_link
        remaining, count, rates = self._fill_start(flows, links)
        # the link offering the smallest fair share saturates first: its flows get that share
        heap = [(remaining[li] / n, li, n) for li, n in count.items() if n]
        heapq.heapify(heap)
        heappop, heappush = heapq.heappop, heapq.heappush
        while heap:
            _, li, n = heappop(heap)
            if count[li] != n or n == 0:
                continue  # stale entry
            share = remaining[li] / n
            for fid, flow in on_link[li].items():
                if fid in rates:
                    continue
                rates[fid] = share
                for lj in flow.links:
                    if lj == li:
                        continue
                    left = remaining[lj] - share
                    remaining[lj] = left = left if left > 0.0 else 0.0
                    c = count[lj] - 1
                    count[lj] = c
                    if c:
                        heappush(heap, (left / c, lj, c))
            count[li] = 0
        return rates

    def _fill_start(
        self, flows: list[_Flow], links: set[int]
    ) -> tuple[dict[int, float], dict[int, int], dict[int, float]]:
        """What both fills start from: per used link its capacity left and its flows still without
        a rate, and the rates of the flows alone on all their links (their bottleneck capacity;
        their links then count no flow)."""
        cap, on_link = self._capacity, self._on_link
        remaining: dict[int, float] = {}
        count: dict[int, int] = {}  # flows on the link still without a rate
        for li in links:
            n = len(on_link[li])
            if n:
                count[li] = n
                remaining[li] = cap[li]
        rates: dict[int, float] = {}
        for flow in flows:
            for li in flow.links:
                if count[li] != 1:
                    break
            else:
                rates[flow.fid] = flow.cap
                for li in flow.links:
                    count[li] = 0
        return remaining, count, rates

    def _fill_weighted(self, flows: list[_Flow], links: set[int]) -> dict[int, float]:
        """:meth:`_fill` with share weights: on the link that saturates first, each unfixed flow
        gets ``weight x level``, the level that fills the link (``remaining / sum of weights``).
        With every weight 1 the levels are :meth:`_fill`'s shares (it is used only when the
        calibration's ``downstream_share`` is below 1)."""
        on_link = self._on_link
        remaining, count, rates = self._fill_start(flows, links)
        wsum = {li: sum(f.weight for f in on_link[li].values()) for li in count}
        heap = [(remaining[li] / wsum[li], li, n) for li, n in count.items() if n]
        heapq.heapify(heap)
        while heap:
            _, li, n = heapq.heappop(heap)
            if count[li] != n or n == 0:
                continue  # stale entry
            level = remaining[li] / wsum[li]
            for fid, flow in on_link[li].items():
                if fid in rates:
                    continue
                rate = rates[fid] = flow.weight * level
                for lj in flow.links:
                    if lj == li:
                        continue
                    remaining[lj] = left = max(remaining[lj] - rate, 0.0)
                    c = count[lj] = count[lj] - 1
                    w = wsum[lj] = wsum[lj] - flow.weight
                    if c:
                        heapq.heappush(heap, (left / w if w > 0 else 0.0, lj, c))
            count[li] = 0
        return rates

    # -- introspection --------------------------------------------------------------------------

    @property
    def num_active_flows(self) -> int:
        return self._num_active

    def flows(self) -> list[FlowInfo]:
        """The active flows (bytes moving now), in start order, with their current rates."""
        now = self.env.now
        out = []
        active = {fid: f for on in self._on_link for fid, f in on.items()}
        for fid in sorted(active):
            f = active[fid]
            out.append(
                FlowInfo(
                    fid=fid,
                    src=f.src,
                    dst=f.dst,
                    rate_bytes_per_s=f.rate,
                    remaining_bytes=max(0.0, f.remaining - f.rate * (now - f.last_s)),
                    links=tuple(self._link_names[i] for i in f.links),
                )
            )
        return out

    def link_load(self) -> dict[tuple[str, str], tuple[float, float]]:
        """Directed link -> (sum of flow rates on it, its capacity), for links carrying flows."""
        out = {}
        for li, on in enumerate(self._on_link):
            if on:
                out[self._link_names[li]] = (sum(f.rate for f in on.values()), self._capacity[li])
        return out


def _call(function: Callable[[], object]) -> object:
    return function()
