"""Run a function on ``nproc`` real processes with a torch.distributed process group.

:func:`launch` either joins a group that ``torchrun`` set up (env ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``: the function runs once, in this process) or spawns ``nproc`` local processes
itself (``torch.multiprocessing``, a free localhost port, ``MASTER_ADDR=127.0.0.1``). Every rank
gets one torch thread, the group is created with a timeout (so a stuck collective fails instead of
hanging forever) and destroyed at the end (a spawned rank that succeeded then exits at once,
without interpreter finalization, where gloo threads can abort it). A failure on any rank stops
the others and is raised in the caller naming the rank that failed first (its peers' collectives
then fail too); a ``ValueError``, ``OSError``, ``OverflowError`` or ``MemoryError`` raised by a rank
stays one (so the command line reports it in one line, naming the file of an OSError).

Rendezvous: every rank of a spawned launch is on this machine, so its TCP store (hosted by rank 0)
listens on ``127.0.0.1`` only, never on every interface as ``env://`` would, and gloo talks over
``lo``. The same holds under a torchrun-style environment whose ``MASTER_ADDR`` is a loopback
address and that has no torchrun agent store (tests, ``igrt validate`` on loopback). A multi-host
launch is explicit: ``torchrun --master-addr HOST ...`` (torchrun's own store, on the address it
is given; see docs/integrations.md).

The function is called as ``fn(ctx, *args)`` with a :class:`RankContext`; its return value (which
must pickle) comes back in the dict that :func:`launch` returns, keyed by rank.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import gc
import ipaddress
import os
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from igpolicy.limits import check_count

__all__ = ["BACKENDS", "LOOPBACK", "RankContext", "launch", "resolve_backend"]

BACKENDS = ("auto", "gloo", "nccl")
LOOPBACK = "127.0.0.1"  # where a single-host launch's rendezvous store listens
_TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
# the error types a rank's failure keeps (the rest become RuntimeError with the rank's traceback)
_KEPT_ERRORS: dict[str, type[BaseException]] = {
    "ValueError": ValueError,
    "OverflowError": OverflowError,
    "MemoryError": MemoryError,
}


@dataclass(frozen=True, kw_only=True)
class RankContext:
    """Where this process stands: its rank, the group size, the backend and its device."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device
    spawned: bool  # True when launch() started this process, False under torchrun


def status_line(prog: str, message: str, *, rank: int = 0, quiet: bool = False) -> None:
    """One timestamped status line on rank 0's stderr (none with ``quiet``), safe next to a tqdm
    bar: what a command is doing during a phase that can take more than a few seconds."""
    if rank != 0 or quiet:
        return
    from tqdm import tqdm

    tqdm.write(f"{prog} {time.strftime('%H:%M:%S')} {message}", file=sys.stderr)
    sys.stderr.flush()


@contextlib.contextmanager
def status_phase(prog: str, message: str, *, rank: int = 0, quiet: bool = False, every_s: float = 5.0):
    """A :func:`status_line` for a phase, then one more every ``every_s`` seconds while it runs
    ("... still <message> (12 s)"), so a long load or set-up is never silent."""
    status_line(prog, message, rank=rank, quiet=quiet)
    if rank != 0 or quiet:
        yield
        return
    import threading

    done = threading.Event()
    t0 = time.monotonic()

    def tick() -> None:
        while not done.wait(every_s):
            status_line(prog, f"... still {message} ({time.monotonic() - t0:.0f} s)")

    ticker = threading.Thread(target=tick, name="igrt-status", daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()


def resolve_backend(backend: str, nproc: int) -> str:
    """``auto`` -> ``nccl`` when CUDA has at least ``nproc`` devices, else ``gloo``."""
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r} is not one of {', '.join(BACKENDS)}")
    if backend == "auto":
        return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= nproc else "gloo"
    if backend == "nccl" and not (torch.cuda.is_available() and torch.cuda.device_count() >= nproc):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        raise ValueError(f"backend 'nccl' needs {nproc} CUDA devices, found {count}; use gloo")
    return backend


def _under_torchrun() -> bool:
    return all(k in os.environ for k in _TORCHRUN_ENV)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _loopback_store(rank: int, world_size: int, port: int, timeout_s: float) -> dist.TCPStore:
    """The rendezvous store of a single-host group: rank 0 hosts it on 127.0.0.1 only (a socket
    bound there and handed to the store), the others connect to it."""
    timeout = datetime.timedelta(seconds=timeout_s)
    if rank != 0:
        return dist.TCPStore(LOOPBACK, port, world_size, is_master=False, timeout=timeout)
    # multi_tenant, as env:// does: a later group in this process on the same port shares the server
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((LOOPBACK, port))
    except OSError:  # an earlier group's store in this process serves the port (else this fails too)
        sock.close()
        return dist.TCPStore(LOOPBACK, port, world_size, is_master=True, timeout=timeout, multi_tenant=True)
    try:
        sock.listen(max(128, world_size))
        store = dist.TCPStore(LOOPBACK, port, world_size, is_master=True, timeout=timeout,
                              multi_tenant=True, master_listen_fd=sock.fileno())  # fmt: skip
    except BaseException:
        sock.close()
        raise
    sock.detach()  # the store's server owns the listening socket now
    return store


def _die_with_parent() -> None:
    """Linux: have the kernel end this rank when the launching process dies (no orphaned ranks)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _one_thread() -> None:
    torch.set_num_threads(1)
    with contextlib.suppress(RuntimeError):  # already set, or parallel work already ran here
        torch.set_num_interop_threads(1)


def _device(backend: str, local_rank: int) -> torch.device:
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def _init_group(backend: str, rank: int, world_size: int, timeout_s: float, device: torch.device) -> None:
    """The process group from the environment (``MASTER_ADDR``/``MASTER_PORT``): on a loopback
    ``MASTER_ADDR`` (and no torchrun agent store) through :func:`_loopback_store`, else ``env://``."""
    kwargs: dict[str, Any] = {}
    if device.type == "cuda":
        kwargs["device_id"] = device
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    if _is_loopback(os.environ.get("MASTER_ADDR", "")) and not agent_store:
        if os.path.exists("/sys/class/net/lo"):  # every rank is on this host: gloo on loopback too
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        port = int(os.environ["MASTER_PORT"])
        kwargs["store"] = _loopback_store(rank, world_size, port, timeout_s)
    else:
        kwargs["init_method"] = "env://"
    dist.init_process_group(
        backend=backend,
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
        **kwargs,
    )


def _spawned_main(
    index: int, fn: Callable, args: tuple, nproc: int, backend: str, port: int, timeout_s: float, queue
) -> None:
    """Entry point of a spawned rank: env, one thread, the group, ``fn``, then teardown."""
    os.environ.update(
        MASTER_ADDR=LOOPBACK,
        MASTER_PORT=str(port),
        RANK=str(index),
        WORLD_SIZE=str(nproc),
        LOCAL_RANK=str(index),
        LOCAL_WORLD_SIZE=str(nproc),
        OMP_NUM_THREADS="1",
    )
    if os.path.exists("/sys/class/net/lo"):  # every rank is on this host: keep gloo on loopback
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    _die_with_parent()
    _one_thread()
    try:
        device = _device(backend, index)
        _init_group(backend, index, nproc, timeout_s, device)
        ctx = RankContext(
            rank=index, world_size=nproc, local_rank=index, backend=backend, device=device, spawned=True
        )
        result = fn(ctx, *args)
        queue.put(("ok", index, result))
    except BaseException as e:
        info = (type(e).__name__, str(e), traceback.format_exc(), _kept_error(e), time.time())
        queue.put(("error", index, info))
        raise
    finally:
        _destroy_group()
    _exit_without_finalizing()


def _destroy_group() -> None:
    """Collect what still references the group (a DDP reducer in a reference cycle, a future's
    callback) while the interpreter is whole, then destroy it."""
    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()


def _exit_without_finalizing() -> None:
    """End a rank whose result is delivered with exit code 0, skipping interpreter finalization.

    ``destroy_process_group`` unregisters the group, but the C++ gloo group lives on while anything
    still references it (a DDP reducer, a pending future's callback); it is then destroyed during
    interpreter teardown, where its worker threads can abort the process (SIGABRT, "terminate called
    without an active exception"; pytorch/pytorch#179291; it failed two CI runs of this suite).
    The result is already written to the queue (a ``SimpleQueue`` writes synchronously), so nothing
    is lost by exiting here. A failing rank exits through the usual path (its error is queued).
    """
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)


def _run_under_torchrun(fn: Callable, args: tuple, backend: str, timeout_s: float) -> dict[int, Any]:
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    _one_thread()
    device = _device(backend, local_rank)
    owns_group = not dist.is_initialized()
    if owns_group:
        _init_group(backend, rank, world_size, timeout_s, device)
    try:
        ctx = RankContext(
            rank=rank,
            world_size=world_size,
            local_rank=local_rank,
            backend=backend,
            device=device,
            spawned=False,
        )
        return {rank: fn(ctx, *args)}
    finally:
        if owns_group:
            _destroy_group()


def _kept_error(e: BaseException) -> tuple | None:
    """What it takes to raise ``e`` again in the launcher: (kind, args), or None (a RuntimeError)."""
    if isinstance(e, OSError):
        return ("OSError", (e.errno, e.strerror or str(e), e.filename, e.filename2))
    for name, kind in _KEPT_ERRORS.items():
        if isinstance(e, kind):
            return (name, (str(e),))
    return None


def _raise_rank_error(errors: dict[int, tuple], index: int, fallback: BaseException) -> None:
    """Raise the first error in time (a rank that failed first makes its peers' collectives fail)."""
    if errors:
        index = min(errors, key=lambda r: (errors[r][4], r))
    info = errors.get(index)
    if info is None:
        raise RuntimeError(f"rank {index} failed: {fallback}") from None
    name, message, tb, kept, _ = info
    if kept is not None and kept[0] == "OSError":
        errno, strerror, filename, filename2 = kept[1]
        if errno is None:
            raise OSError(f"rank {index}: {strerror}") from None
        raise OSError(errno, f"rank {index}: {strerror}", filename, None, filename2) from None
    if kept is not None:
        raise _KEPT_ERRORS[kept[0]](f"rank {index}: {kept[1][0]}") from None
    raise RuntimeError(
        f"rank {index} failed with {name}: {message}\n--- rank {index} traceback ---\n{tb}"
    ) from None


def launch(
    fn: Callable[..., Any],
    *,
    nproc: int,
    backend: str = "auto",
    args: tuple = (),
    timeout_s: float = 600.0,
) -> dict[int, Any]:
    """Run ``fn(ctx, *args)`` on every rank; returns ``{rank: return value}``.

    - Under torchrun (``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` set) ``fn`` runs here once, in the
      existing process group (created from the environment when none exists); ``nproc`` is ignored
      in favour of ``WORLD_SIZE`` and only this rank's result is returned.
    - Otherwise ``nproc`` processes are spawned on this machine. ``fn`` and ``args`` must pickle
      (``fn`` a module-level function).

    ``backend``: ``gloo``, ``nccl`` or ``auto`` (nccl when CUDA has >= nproc devices). ``timeout_s``:
    the process group's timeout, seconds — a collective that waits longer fails on that rank.
    Raises ValueError (bad arguments, ``nproc`` above ``igpolicy.limits.MAX_LOCAL_RANKS``), the
    ValueError, OSError, OverflowError or MemoryError a rank raised (its message prefixed ``rank N:``),
    or RuntimeError (any other failure, with the failing rank and its traceback).
    """
    if _under_torchrun():
        world_size = int(os.environ["WORLD_SIZE"])
        return _run_under_torchrun(
            fn, tuple(args), resolve_backend(backend, min(world_size, nproc)), timeout_s
        )
    check_count(nproc, what="nproc", limit="MAX_LOCAL_RANKS")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
    backend = resolve_backend(backend, nproc)
    spawn_ctx = mp.get_context("spawn")
    queue = spawn_ctx.SimpleQueue()
    context = mp.start_processes(
        _spawned_main,
        args=(fn, tuple(args), nproc, backend, _free_port(), float(timeout_s), queue),
        nprocs=nproc,
        join=False,
        start_method="spawn",
    )
    results: dict[int, Any] = {}
    errors: dict[int, tuple] = {}

    def drain() -> None:
        while not queue.empty():
            status, index, payload = queue.get()
            (results if status == "ok" else errors)[index] = payload

    try:
        while not context.join(timeout=0.2):
            drain()
    except mp.ProcessRaisedException as e:
        drain()
        _raise_rank_error(errors, e.error_index, e)
    except mp.ProcessExitedException as e:
        drain()
        if errors:
            _raise_rank_error(errors, e.error_index, e)
        raise RuntimeError(f"rank {e.error_index} exited with code {e.exit_code} ({e})") from None
    except BaseException:
        for process in context.processes:
            if process.is_alive():
                process.terminate()
        raise
    drain()
    missing = sorted(set(range(nproc)) - set(results))
    if missing:
        raise RuntimeError(f"ranks {missing} exited without a result")
    return dict(sorted(results.items()))
