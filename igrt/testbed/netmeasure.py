"""Run one process per rank — in the testbed's namespaces or on loopback — and collect the result.

:func:`run_ranks` starts ``python -m MODULE ARGS`` once per rank with the torch.distributed
environment (``MASTER_ADDR/PORT``, ``RANK``, ``WORLD_SIZE``, one thread) and waits for all of them;
:func:`measure` uses it to time cases with :mod:`igrt.testbed.netbench`.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from igrt.testbed import namespaces as testbed

__all__ = ["measure", "random_port", "run_ranks"]

_PORTS = (20_000, 60_000)  # rendezvous ports in a testbed's rank-0 namespace: below the ephemeral range


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def random_port() -> int:
    """An unpredictable port for a rendezvous inside a testbed's (fresh, empty) rank-0 namespace."""
    return _PORTS[0] + secrets.randbelow(_PORTS[1] - _PORTS[0])


def run_ranks(
    module_args: Sequence[str],
    *,
    spec: testbed.TestbedSpec | None,
    num_ranks: int | None = None,
    timeout_s: float = 600.0,
    what: str = "rank process",
    port: int | None = None,
    follow: bool = True,
) -> None:
    """Run ``python -m <module_args>`` on every rank and wait: inside each rank's namespace of
    ``spec``, or on loopback (``num_ranks`` processes) without it.

    Each rank's output goes to a temporary file (no pipe can fill up and stall a rank). Raises
    RuntimeError naming the rank whose process failed, with the tail of its output; a rank still
    running after ``timeout_s`` is killed (all ranks are) and reported. ``port``: the rendezvous port
    (default: a random one in the testbed, a free one chosen by the kernel on loopback). ``follow``:
    copy rank 0's output to this process's stderr as it comes (its status lines and progress), so a
    long measurement is never silent.
    """
    p = spec.num_ranks if spec is not None else int(num_ranks or 2)
    if port is None:
        port = random_port() if spec is not None else _free_port()
    with tempfile.TemporaryDirectory(prefix="igranks-") as tmp:
        procs, logs = [], []
        for r in range(p):
            if spec is not None:
                env = {**os.environ, **testbed.rank_env(spec, r, port=port)}
                prefix = testbed.exec_args(spec, r)
            else:
                env = {
                    **os.environ,
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(port),
                    "RANK": str(r),
                    "WORLD_SIZE": str(p),
                    "LOCAL_RANK": "0",
                    "OMP_NUM_THREADS": "1",
                }
                prefix = []
            log = open(Path(tmp) / f"rank{r}.log", "w+")  # noqa: SIM115 - closed below
            logs.append(log)
            cmd = [*prefix, sys.executable, "-m", *module_args]
            procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, text=True))
        try:
            deadline = time.monotonic() + timeout_s
            failed = []
            shown = 0  # bytes of rank 0's log already copied to stderr
            started = heard = time.monotonic()
            while any(proc.poll() is None for proc in procs) and time.monotonic() < deadline:
                if follow:
                    now_shown = _copy_new(Path(tmp) / "rank0.log", shown)
                    now = time.monotonic()
                    if now_shown != shown:
                        shown, heard = now_shown, now
                    elif now - heard >= 5.0:  # ranks starting (imports, rendezvous) say nothing yet
                        sys.stderr.write(f"... {what}: {p} rank(s) running ({now - started:.0f} s)\n")
                        sys.stderr.flush()
                        heard = now
                time.sleep(0.25)
            if follow:
                _copy_new(Path(tmp) / "rank0.log", shown)
            for r, proc in enumerate(procs):
                try:
                    proc.wait(timeout=max(deadline - time.monotonic(), 1.0))
                except subprocess.TimeoutExpired:
                    raise RuntimeError(f"{what}: rank {r} did not finish within {timeout_s:.0f} s") from None
                if proc.returncode != 0:
                    logs[r].seek(0)
                    failed.append(f"rank {r} exited {proc.returncode}: {logs[r].read().strip()[-800:]}")
            if failed:
                raise RuntimeError(f"{what} failed: " + " | ".join(failed))
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            for log in logs:
                log.close()


def _copy_new(path: Path, shown: int) -> int:
    """Write what ``path`` gained since byte ``shown`` to stderr; returns the new offset."""
    try:
        with open(path, "rb") as f:
            f.seek(shown)
            data = f.read()
    except OSError:
        return shown
    if data:
        sys.stderr.write(data.decode(errors="replace"))
        sys.stderr.flush()
    return shown + len(data)


def measure(
    cases: Sequence[Mapping[str, Any]],
    *,
    spec: testbed.TestbedSpec | None,
    num_ranks: int | None = None,
    reps: int = 5,
    warmup: int = 1,
    timeout_s: float = 600.0,
    interleave: bool = False,
) -> dict[str, Any]:
    """Time ``cases`` on real gloo processes: one per testbed namespace, or on loopback without ``spec``.

    ``interleave``: the reps in rounds over all cases (see :func:`igrt.testbed.netbench.run_cases`).
    Returns rank 0's :mod:`igrt.testbed.netbench` JSON (``world_size``, ``host``, ``results``). Errors as
    :func:`run_ranks`.
    """
    with tempfile.TemporaryDirectory(prefix="igbench-") as tmp:
        cases_path, out_path = Path(tmp) / "cases.json", Path(tmp) / "result.json"
        cases_path.write_text(json.dumps(list(cases)))
        args = ["igrt.testbed.netbench", "--cases", str(cases_path), "--out", str(out_path), "--reps", str(reps),
                "--warmup", str(warmup), "--timeout-s", str(timeout_s)] + (["--interleave"] if interleave else [])  # fmt: skip
        run_ranks(args, spec=spec, num_ranks=num_ranks, timeout_s=timeout_s, what="netbench")
        return json.loads(out_path.read_text())
