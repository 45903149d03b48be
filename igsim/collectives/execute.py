"""Running a message schedule over the flow network: the executor of every collective.

:func:`execute_schedule` takes a :class:`~igsim.collectives.schedules.Schedule` (a DAG of messages
between rank indices) and sends each message over a :class:`~igsim.net.network.Network` once the
messages it depends on have arrived (plus their reduction delays). The DAG is read as arrays and
run from machine arrays (about 50 bytes a message), so a collective of millions of messages costs
the network's flows and little else: no per-message closures, dependency tuples or events besides
the flow itself.
"""

from __future__ import annotations

from array import array
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np
import simpy

from igsim.collectives.schedules import Schedule, ScheduleArrays
from igsim.net.network import Network

__all__ = ["CollectiveResult", "execute_schedule"]


@dataclass(frozen=True, kw_only=True)
class CollectiveResult:
    """``time_s`` from the collective's start until its last rank is done; the bytes each rank put
    on the wire (rank order); the number of messages."""

    time_s: float
    bytes_sent_per_rank: tuple[float, ...]
    num_messages: int


def execute_schedule(
    net: Network, sched: Schedule, names: Sequence[str]
) -> Generator[simpy.Event, object, CollectiveResult]:
    """A simpy process body (``env.process(execute_schedule(...))``): send the schedule's
    messages among the rank names ``names`` (schedule rank i is ``names[i]``), each once its
    dependencies hold; its value is a :class:`CollectiveResult`."""
    env = net.env
    t0 = env.now
    s = sched.arrays()
    del sched  # the arrays below are all that is kept while the messages flow
    count = s.num_messages
    p = len(names)
    sent = tuple(float(x) for x in np.bincount(s.src, weights=s.size, minlength=p)) if count else (0.0,) * p
    tails = s.tails
    end = t0
    if count:
        delayed = bool(s.dep_delay.any()) or any(delay for _, delay in tails)
        done = env.event()
        dag = _Dag(net, s, names, delayed=delayed)
        del s
        arrived = dag.run(done)
        del dag
        yield done
        end = env.now
        if delayed:
            end = max([end] + [arrived[m] + delay for m, delay in tails])
    if end > env.now:
        yield env.timeout(end - env.now)
    return CollectiveResult(time_s=env.now - t0, bytes_sent_per_rank=sent, num_messages=count)


def _ints(a: np.ndarray) -> array:
    out = array("q")
    out.frombytes(np.ascontiguousarray(a, dtype=np.int64).tobytes())
    return out


def _floats(a: np.ndarray) -> array:
    out = array("d")
    out.frombytes(np.ascontiguousarray(a, dtype=np.float64).tobytes())
    return out


class _Dag:
    """A schedule in compact, indexable form: 8-byte machine arrays (``array``), about 50 bytes a
    message, instead of Python objects; what :meth:`run` walks while the messages flow."""

    def __init__(self, net: Network, s: ScheduleArrays, names: Sequence[str], *, delayed: bool) -> None:
        self.net, self.delayed, self.count = net, delayed, s.num_messages
        p = len(names)
        ptr, target, delay = s.dependents()
        self.ptr, self.target = _ints(ptr), _ints(target)
        self.delays = _floats(delay) if delayed else None
        del ptr, target, delay
        counts = np.diff(s.dep_ptr)
        self.pending = _ints(counts)
        self.roots = np.flatnonzero(counts == 0).tolist()
        pairs, which = np.unique(s.src.astype(np.int64) * p + s.dst, return_inverse=True)
        handles = [net.path_handle(names[x // p], names[x % p]) for x in pairs.tolist()]
        self.route = [handles[i] for i in which.tolist()]  # one reference per message
        self.size = _floats(s.size)

    def run(self, all_done: simpy.Event) -> array:
        """Launch the roots now; ``all_done`` succeeds when the last message has arrived. Returns
        the array the arrival times are written to (only when ``delayed``: reduction delays
        between a message's arrival and its dependents' start)."""
        net, env, count = self.net, self.net.env, self.count
        ptr, target, delays, pending = self.ptr, self.target, self.delays, self.pending
        route, size, start = self.route, self.size, net.start
        left = count
        instant: list[int] = []  # messages that arrived at once, to be handled without recursion
        draining = False
        arrived = array("d", bytes(8 * count)) if self.delayed else array("d")
        ready = array("d", [env.now]) * count if self.delayed else array("d")

        def launch(m: int) -> None:
            nonlocal draining
            if start(route[m], size[m], arrive, m):
                return
            instant.append(m)
            if draining:
                return
            draining = True
            while instant:
                arrive(instant.pop())
            draining = False

        def arrive(m: int) -> None:
            nonlocal left
            for e in range(ptr[m], ptr[m + 1]):
                d = target[e]
                c = pending[d] - 1
                pending[d] = c
                if not c:
                    launch(d)
            left -= 1
            if not left:
                all_done.succeed()

        def arrive_delayed(m: int) -> None:
            nonlocal left
            now = arrived[m] = env.now
            for e in range(ptr[m], ptr[m + 1]):
                d = target[e]
                t = now + delays[e]
                if t > ready[d]:
                    ready[d] = t
                c = pending[d] - 1
                pending[d] = c
                if not c:
                    if ready[d] > now:
                        env.timeout(ready[d] - now).callbacks.append(partial(_launch_later, launch, d))
                    else:
                        launch(d)
            left -= 1
            if not left:
                all_done.succeed()

        if self.delayed:
            arrive = arrive_delayed
        # snapshot the roots first: an empty message arrives at once, which can bring another
        # message's pending count to zero while this loop runs (it is then launched by its arrival)
        for m in self.roots:
            launch(m)
        return arrived


def _launch_later(launch, m: int, _event: object) -> None:
    launch(m)
