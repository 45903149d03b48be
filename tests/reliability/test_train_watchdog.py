"""`igrt train` names a stalled rank: one rank is frozen (SIGSTOP) mid-run; the survivor's collective
times out after --timeout and its RankWatchdog raises PeerFailure naming the frozen rank."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
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
           "--nproc", "2", "--steps", "100000", "--no-eval", "--timeout", "6",
           "--out", str(tmp_path / "run")]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    chunks: list[bytes] = []  # stderr as it comes: rank 0's progress bar, then the diagnosis
    reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: proc.stderr.read1(4096), b"")))
    reader.start()
    frozen = None
    try:
        deadline = time.monotonic() + 180
        while b"/100000" not in b"".join(chunks[-4:]) or len(kids := _children(proc.pid)) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, "training did not start"
            time.sleep(0.5)
        time.sleep(2)
        frozen = kids[1]
        os.kill(frozen, signal.SIGSTOP)
        try:  # the survivor's diagnosis ends ~10 s after the freeze (timeout 6 s + 3 heartbeats)
            proc.wait(timeout=25)
        except subprocess.TimeoutExpired:  # the spawner's SIGTERM waits for the frozen rank: thaw it
            os.kill(frozen, signal.SIGCONT)
            proc.wait(timeout=90)
    finally:
        if frozen is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(frozen, signal.SIGCONT)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(timeout=10)
    err = b"".join(chunks).decode(errors="replace")
    assert proc.returncode != 0
    assert "PeerFailure" in err and "rank 1 is dead" in err, err[-3000:]
