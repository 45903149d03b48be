"""Dead and stalled ranks: the survivors name the rank at fault, within a bounded time, never hang.

A collective on gloo fails when a peer is gone — at once when the peer's process died (connection
reset), after the process group's ``timeout`` when the peer lives but is stuck — and its message
names a socket address, not a rank. :class:`RankWatchdog` keeps two counters per rank in the process
group's key-value store (the TCP store hosted by rank 0), so that every survivor can say who failed:

- ``reached``: the last step whose synchronization this rank entered (set by :meth:`~RankWatchdog.watch`);
- ``alive``: incremented every ``interval_s`` seconds by a background thread while the process lives.

When the block under ``watch(step)`` raises a ``RuntimeError`` (how torch.distributed reports a failed
collective), the watchdog samples the ``alive`` counters over ``3 · interval_s`` and raises
:class:`PeerFailure` naming every dead rank (its counter stood still) or, when none died, every live
rank that has not entered the synchronization of ``step`` (stalled). A failure that no peer explains
is re-raised unchanged. When the store does not answer, rank 0, which hosts it, is named.

With ``deadline_s`` the thread also ends the process — the diagnosis on stderr, exit code
:data:`EXIT_CODE` — when a watched block runs longer than ``deadline_s`` seconds: the guard for
backends or calls that have no timeout of their own. A survivor therefore stops within
``min(group timeout, deadline_s) + 3 · interval_s`` seconds of the fault (plus ``linger_s`` on the
store's host, which waits for the others to read the store before it exits and takes the store down).

Example (every rank)::

    dist.init_process_group("gloo", ..., timeout=timedelta(seconds=30))
    with RankWatchdog(interval_s=0.5) as wd:
        for step in range(num_steps):
            loss(model, batch).backward()
            with wd.watch(step):
                sync.step()
            optimizer.step()
"""

from __future__ import annotations

import contextlib
import datetime
import os
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch.distributed as dist

__all__ = ["EXIT_CODE", "PeerFailure", "PeerState", "RankWatchdog", "find_suspects", "run_number"]

EXIT_CODE = 75  # EX_TEMPFAIL: a peer failed, this rank did nothing wrong
_PREFIX = "igrt/watchdog"


class PeerFailure(RuntimeError):
    """Another rank died or stalled. ``suspects`` maps each rank at fault to what was seen."""

    def __init__(self, message: str, *, step: int, suspects: dict[int, str]) -> None:
        super().__init__(message)
        self.step = step
        self.suspects = dict(suspects)


@dataclass(frozen=True, kw_only=True)
class PeerState:
    """What the store says about one rank: the last sync it entered (-1: none), whether it lives,
    and whether it left after diagnosing a failure itself (a survivor, never a suspect)."""

    rank: int
    reached: int
    alive: bool
    left: bool = False


def find_suspects(states: Sequence[PeerState], *, step: int, rank: int) -> dict[int, str]:
    """{rank: reason} for the ranks to blame for a failed synchronization of ``step`` on ``rank``.

    Dead ranks explain any failure, so when there are some only they are named; otherwise every
    live rank that has not entered the synchronization of ``step`` is (stalled). Ranks that left
    after diagnosing the failure themselves are survivors, never suspects. Empty when every other
    rank lives (or left) and has reached ``step``: the failure is not a peer's.
    """

    def last(s: PeerState) -> str:
        return f"step {s.reached}" if s.reached >= 0 else "no step yet"

    others = [s for s in states if s.rank != rank and not s.left]
    dead = {
        s.rank: f"dead (its heartbeat stopped; the last synchronization it entered: {last(s)})"
        for s in others
        if not s.alive
    }
    if dead:
        return dead
    return {
        s.rank: f"stalled (alive, but it has not entered the synchronization of step {step}; "
        f"the last it entered: {last(s)})"
        for s in others
        if s.reached < step
    }


def _default_store() -> dist.Store:
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(
            "RankWatchdog: torch.distributed is not initialized; pass store=, rank=, world_size="
        )
    from torch.distributed import distributed_c10d

    return distributed_c10d._get_default_store()


def run_number(name: str, world_size: int, *, store: dist.Store | None = None) -> int:
    """The 1-based number of this run among the runs called ``name`` in this process group.

    Every rank calls it once per run, in the same order; the store's counter then puts run n's
    calls in ((n-1)·W, n·W], so each rank computes the same n without a collective (a run's
    collectives keep any rank from reaching run n+1 before every rank has counted run n).
    """
    value = int((store if store is not None else _default_store()).add(f"{name}/runs", 1))
    return -(-value // int(world_size))


class RankWatchdog:
    """Heartbeats and progress marks of one rank in a shared store; see the module docstring.

    ``store`` (default: the default process group's store), ``rank`` and ``world_size`` (default:
    the default group's) must describe the group whose collectives :meth:`watch` guards.
    ``interval_s``: heartbeat period, seconds. ``deadline_s``: None, or the longest a watched block
    may run before the thread ends the process. ``store_host_rank``: the rank whose process serves
    the store (rank 0 under ``env://``, ``tcp://`` and torchrun). ``linger_s``: how long the store's
    host waits, after a failure, for the other survivors to finish their diagnosis (default
    ``4 · interval_s + 1``). Use as a context manager (or call :meth:`start` and :meth:`close`).
    """

    def __init__(
        self,
        *,
        store: dist.Store | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        interval_s: float = 0.5,
        deadline_s: float | None = None,
        store_host_rank: int = 0,
        linger_s: float | None = None,
        prefix: str = _PREFIX,
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"RankWatchdog: interval_s must be > 0, got {interval_s!r}")
        if deadline_s is not None and not deadline_s > 0:
            raise ValueError(f"RankWatchdog: deadline_s must be > 0 or None, got {deadline_s!r}")
        base = store if store is not None else _default_store()
        self.rank = dist.get_rank() if rank is None else int(rank)
        self.world_size = dist.get_world_size() if world_size is None else int(world_size)
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"RankWatchdog: rank {self.rank} is outside world_size {self.world_size}")
        self.interval_s = float(interval_s)
        self.deadline_s = deadline_s
        self.store_host_rank = store_host_rank
        self.linger_s = 4 * self.interval_s + 1.0 if linger_s is None else float(linger_s)
        self.prefix = prefix
        op_timeout = datetime.timedelta(seconds=max(2.0, 4 * self.interval_s))
        self._store = base.clone()  # this thread's client
        self._beat_store = base.clone()  # the heartbeat thread's client: clients are not shared
        for s in (self._store, self._beat_store):
            s.set_timeout(op_timeout)
        self._reached = -1
        self._watching: tuple[int, float] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._beat_store.add(self._key("alive", self.rank), 1)
        self._store.add(self._key("reached", self.rank), 0)  # counters hold reached + 1

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> RankWatchdog:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._beat, name=f"igrt-watchdog-r{self.rank}", daemon=True
            )
            self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.interval_s + 1)
            self._thread = None

    def __enter__(self) -> RankWatchdog:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the guard
    @contextlib.contextmanager
    def watch(self, step: int) -> Iterator[None]:
        """Mark that this rank entered the synchronization of ``step``; name the peer if it fails.

        Raises :class:`PeerFailure` (chained to the collective's error) when a peer explains a
        ``RuntimeError`` raised inside the block; re-raises the error unchanged otherwise.
        """
        step = int(step)
        try:
            self._store.add(self._key("reached", self.rank), step - self._reached)
            self._reached = step
        except RuntimeError as e:
            raise self._failure(step, e, self._diagnose(self._store, step)) from e
        self._watching = (step, time.monotonic())
        try:
            yield
        except PeerFailure:
            raise
        except RuntimeError as e:
            suspects = self._diagnose(self._store, step)
            self._linger(self._store, suspects)
            if not suspects:
                raise
            raise self._failure(step, e, suspects) from e
        finally:
            self._watching = None

    def diagnose(self, step: int) -> dict[int, str]:
        """{rank: reason} for the peers that would explain a failure at ``step`` now (takes 3 · interval_s)."""
        return self._diagnose(self._store, int(step))

    # ------------------------------------------------------------------ workhorses
    def _key(self, what: str, rank: int) -> str:
        return f"{self.prefix}/{what}/{rank}"

    def _read(self, store: dist.Store, what: str) -> list[int]:
        return [int(store.add(self._key(what, r), 0)) for r in range(self.world_size)]  # never waits

    def _diagnose(self, store: dist.Store, step: int) -> dict[int, str]:
        try:
            before = self._read(store, "alive")
            for _ in range(3):  # keep beating: the diagnosis may run on the heartbeat thread itself
                time.sleep(self.interval_s)
                store.add(self._key("alive", self.rank), 1)
            after = self._read(store, "alive")
            reached = [v - 1 for v in self._read(store, "reached")]
            left = [v > 0 for v in self._read(store, "done")]
        except RuntimeError as e:  # DistStoreError / DistNetworkError: the store's host is gone
            if self.rank == self.store_host_rank:
                return {}
            return {
                self.store_host_rank: "unreachable (it hosts the rendezvous store, which no longer "
                f"answers: {_first_line(e)}); presumed dead"
            }
        states = [
            PeerState(rank=r, reached=reached[r], alive=after[r] > before[r], left=left[r])
            for r in range(self.world_size)
        ]
        return find_suspects(states, step=step, rank=self.rank)

    def _failure(self, step: int, error: BaseException, suspects: dict[int, str]) -> PeerFailure:
        blame = "; ".join(f"rank {r} is {why}" for r, why in sorted(suspects.items()))
        message = (
            f"rank {self.rank}: the synchronization of step {step} failed because a peer failed: {blame} "
            f"[collective error: {_first_line(error)}]"
        )
        return PeerFailure(message, step=step, suspects=suspects)

    def _linger(self, store: dist.Store, suspects: dict[int, str]) -> None:
        """Say this rank is done reading (a survivor, not to be blamed); the store's host then waits
        up to ``linger_s`` for the other survivors to be done, so that its exit does not take the
        store away from them mid-diagnosis."""
        with contextlib.suppress(RuntimeError):
            store.add(self._key("done", self.rank), 1)
            if self.rank != self.store_host_rank:
                return
            waiting = [r for r in range(self.world_size) if r != self.rank and r not in suspects]
            end = time.monotonic() + self.linger_s
            while waiting and time.monotonic() < end:
                waiting = [r for r in waiting if store.add(self._key("done", r), 0) == 0]
                time.sleep(0.05)

    def _beat(self) -> None:
        key = self._key("alive", self.rank)
        while not self._stop.wait(self.interval_s):
            with contextlib.suppress(RuntimeError):  # the store's host died: the main thread names it
                self._beat_store.add(key, 1)
            watching = self._watching
            if self.deadline_s is not None and watching is not None:
                step, since = watching
                if time.monotonic() - since > self.deadline_s:
                    self._expire(step)

    def _expire(self, step: int) -> None:
        """The watched block outlived ``deadline_s``: report on stderr and end the process."""
        suspects = self._diagnose(self._beat_store, step)
        error = TimeoutError(f"the synchronization of step {step} ran past deadline_s={self.deadline_s} s")
        if suspects:
            message = str(self._failure(step, error, suspects))
        else:
            message = f"rank {self.rank}: {error}; no peer is dead or behind"
        sys.stderr.write(f"igrt watchdog: {message}; exiting with code {EXIT_CODE}\n")
        sys.stderr.flush()
        self._linger(self._beat_store, suspects)
        os._exit(EXIT_CODE)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__
