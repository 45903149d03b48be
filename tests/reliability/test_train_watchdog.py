"""`igrt train` names a stalled rank: one rank is frozen (SIGSTOP) mid-run; the survivor's collective
times out after --timeout and its RankWatchdog raises PeerFailure naming the frozen rank."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="uses /proc and SIGSTOP")


def _children(pid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if int(fields[1]) == pid and b"spawn_main" in cmd:
            kids.append(int(entry))
    return sorted(kids)  # the spawner starts rank 0 first


def test_a_frozen_rank_is_named_by_the_survivor(tmp_path):
    cmd = [sys.executable, "-m", "igrt", "train", "--workload", "gpt", "--tiny", "--policy", "topk",
           "--nproc", "2", "--steps", "100000", "--no-eval", "--no-progress", "--timeout", "6",
           "--out", str(tmp_path / "run")]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    frozen = None
    try:
        deadline = time.monotonic() + 120
        while len(kids := _children(proc.pid)) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, "the ranks did not start"
            time.sleep(0.5)
        time.sleep(8)  # past start-up and pre-training, into the steps
        assert proc.poll() is None
        frozen = kids[1]
        os.kill(frozen, signal.SIGSTOP)
        _, err = proc.communicate(timeout=90)
    finally:
        if frozen is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(frozen, signal.SIGCONT)
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode != 0
    assert "PeerFailure" in err and "rank 1 is dead" in err, err[-3000:]
