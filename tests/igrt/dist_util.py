"""Run functions on N gloo processes for tests, with timeouts and failures propagated.

Spawning a rank costs seconds (a fresh interpreter imports torch), so tests share a pool::

    @pytest.fixture(scope="module")
    def pool():
        with DistPool(world_size=2) as p:
            yield p

    def test_x(pool):
        outs = pool.run(worker, args=(...,), timeout_s=60)   # [worker(rank, world, ...) per rank]

Each rank runs ``fn(rank, world_size, *args)`` in a process with an initialized gloo group and
``torch.set_num_threads(1)``; return values must pickle. Any rank raising (a failed assert included)
fails the caller with every rank's traceback; a rank still busy ``grace_s`` after another failed, or
at ``timeout_s``, is reported as a hang and the pool is torn down (the next ``run`` starts a fresh
one, since the group may be half-way through a collective). ``fn`` must be a module-level function
of an importable module so the children can find it. :func:`run_distributed` is the one-shot form.
"""

from __future__ import annotations

import os
import pickle
import queue
import socket
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import torch.multiprocessing as mp

__all__ = ["DistPool", "DistributedFailure", "free_port", "run_distributed"]


class DistributedFailure(AssertionError):
    """One or more ranks failed or hung; the message holds each rank's traceback."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(rank: int, world_size: int, port: int, tasks, results) -> None:
    """A rank's loop: run (task_id, fn, args) from ``tasks`` until None, answer on ``results``."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    try:
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
        )
    except BaseException:
        results.put((-1, rank, False, traceback.format_exc()))
        return
    try:
        while True:
            task = tasks.get()
            if task is None:
                break
            task_id, fn, args = task
            try:
                out = pickle.dumps(fn(rank, world_size, *args))  # plain bytes: no shared-memory handles
                results.put((task_id, rank, True, out))
            except BaseException:
                results.put((task_id, rank, False, traceback.format_exc()))
    finally:
        dist.destroy_process_group()


class DistPool:
    """``world_size`` long-lived gloo ranks that run test functions one at a time."""

    def __init__(self, *, world_size: int = 2) -> None:
        self.world_size = world_size
        self._procs: list[Any] = []
        self._tasks: list[Any] = []
        self._results = None
        self._next_id = 0

    def __enter__(self) -> DistPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(kill=True)  # test ranks hold nothing worth a polite shutdown

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        self._results = ctx.Queue()
        self._tasks = [ctx.Queue() for _ in range(self.world_size)]
        port = free_port()
        self._procs = [
            ctx.Process(
                target=_serve, args=(r, self.world_size, port, self._tasks[r], self._results), daemon=True
            )
            for r in range(self.world_size)
        ]
        for p in self._procs:
            p.start()

    def close(self, *, kill: bool = False) -> None:
        """Stop the ranks (politely unless ``kill``); the next :meth:`run` starts fresh ones."""
        for q in self._tasks if not kill else ():
            q.put(None)
        for p in self._procs:
            p.join(timeout=0.1 if kill else 2)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        self._procs, self._tasks, self._results = [], [], None

    def run(
        self,
        fn: Callable[..., Any],
        *,
        args: Sequence[Any] = (),
        timeout_s: float = 60.0,
        grace_s: float = 10.0,
    ) -> list[Any]:
        """``[fn(rank, world_size, *args) for each rank]``, computed on the pool's ranks."""
        if not self._procs or not all(p.is_alive() for p in self._procs):
            self.close(kill=True)
            self._start()
        task_id = self._next_id
        self._next_id += 1
        for q in self._tasks:
            q.put((task_id, fn, tuple(args)))
        outs: dict[int, tuple[bool, Any]] = {}
        deadline = time.monotonic() + timeout_s
        while len(outs) < self.world_size:
            if any(not ok for ok, _ in outs.values()):  # a rank failed: the others get a short grace
                deadline = min(deadline, time.monotonic() + grace_s)
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                tid, rank, ok, out = self._results.get(timeout=min(left, 1.0))
            except queue.Empty:
                if not all(p.is_alive() for p in self._procs):
                    deadline = min(deadline, time.monotonic() + 1.0)
                continue
            if tid == -1:  # start-up failure of a rank
                outs[rank] = (False, out)
            elif tid == task_id:
                outs[rank] = (ok, out)
        failures = []
        for r in range(self.world_size):
            if r not in outs:
                failures.append(f"rank {r}: no result within the time allowed (hang or crash)")
            elif not outs[r][0]:
                failures.append(f"rank {r} raised:\n{outs[r][1]}")
        if failures:
            self.close(kill=True)
            raise DistributedFailure("\n".join(failures))
        return [pickle.loads(outs[r][1]) for r in range(self.world_size)]


def run_distributed(
    fn: Callable[..., Any],
    *,
    world_size: int = 2,
    args: Sequence[Any] = (),
    timeout_s: float = 60.0,
    grace_s: float = 10.0,
) -> list[Any]:
    """One-shot :meth:`DistPool.run` on fresh processes (``timeout_s`` includes start-up)."""
    with DistPool(world_size=world_size) as pool:
        return pool.run(fn, args=args, timeout_s=timeout_s, grace_s=grace_s)
