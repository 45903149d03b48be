"""Run :mod:`igrt.netbench` on every rank of a testbed (or on loopback) and collect the result."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from igrt import testbed

__all__ = ["measure"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def measure(
    cases: Sequence[Mapping[str, Any]],
    *,
    spec: testbed.TestbedSpec | None,
    num_ranks: int | None = None,
    reps: int = 5,
    warmup: int = 1,
    timeout_s: float = 600.0,
) -> dict[str, Any]:
    """Time ``cases`` on real gloo processes: one per testbed namespace, or on loopback without ``spec``.

    Raises RuntimeError naming the rank whose process failed, with the tail of its stderr; a rank that
    hangs past ``timeout_s`` is killed (all ranks are) and reported.
    """
    p = spec.num_ranks if spec is not None else int(num_ranks or 2)
    port = 29500 + (os.getpid() % 1000) if spec is not None else _free_port()
    with tempfile.TemporaryDirectory(prefix="igbench-") as tmp:
        cases_path, out_path = Path(tmp) / "cases.json", Path(tmp) / "result.json"
        cases_path.write_text(json.dumps(list(cases)))
        procs = []
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
                    "OMP_NUM_THREADS": "1",
                }
                prefix = []
            cmd = [
                *prefix,
                sys.executable,
                "-m",
                "igrt.netbench",
                "--cases",
                str(cases_path),
                "--out",
                str(out_path),
                "--reps",
                str(reps),
                "--warmup",
                str(warmup),
                "--timeout-s",
                str(timeout_s),
            ]
            procs.append(
                subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            )
        deadline = time.monotonic() + timeout_s
        failed = []
        for r, proc in enumerate(procs):
            try:
                _, err = proc.communicate(timeout=max(deadline - time.monotonic(), 1.0))
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                raise RuntimeError(f"netbench rank {r} did not finish within {timeout_s:.0f} s") from None
            if proc.returncode != 0:
                failed.append(f"rank {r} exited {proc.returncode}: {err.strip()[-800:]}")
        if failed:
            raise RuntimeError("netbench failed: " + " | ".join(failed))
        return json.loads(out_path.read_text())
