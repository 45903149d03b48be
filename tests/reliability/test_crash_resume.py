"""kill -9 of a real training run, then resume: the final parameters equal an uninterrupted run's.

Each run is ``igrt train`` (tiny MiniLM, importance policy with a plan, AdamW, dropout, 2 gloo ranks,
a checkpoint every 4 of 8 steps), launched the way torchrun launches it: one process per rank with
``RANK`` / ``WORLD_SIZE`` / ``MASTER_*`` set, each calling ``igrt.cli.main(["train", ...])``. The
ranks are forked from a "zygote" process that imported torch, transformers and igrt and built the
workload's data once (a fresh interpreter per rank costs seconds on two shared cores).

- Reference: 8 steps uninterrupted.
- Crash between checkpoints: rank 0 parks inside the synchronization of step 6 and both ranks are
  sent SIGKILL (nothing flushed, nothing saved after step 4); ``igrt train --resume`` continues from
  the step-4 checkpoint (model, AdamW state, every rank's residuals and sync step, RNG states, data
  position) to step 8. The final ``model.pt`` equals the reference bit for bit.
- Crash inside a checkpoint: rank 0 is parked (then killed) in the middle of writing the step-8
  checkpoint, after one of its files of step 8 was written. Nothing is lost only if the step-4
  checkpoint survives; the run must resume and end equal to the reference.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import os
import signal
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.igrt.dist_util import free_port

NPROC = 2
STEPS = 8
CHECKPOINT_EVERY = 4
SEED = 3
HARD_LIMIT_S = 120.0


def _argv(plan: Path, out: Path, *, resume: Path | None = None) -> list[str]:
    argv = [
        "train", "--workload", "minilm", "--tiny", "--policy", "importance", "--plan", str(plan),
        "--density", "0.05", "--release-period", "3", "--nproc", str(NPROC), "--backend", "gloo",
        "--steps", str(STEPS), "--checkpoint-every", str(CHECKPOINT_EVERY), "--batch-size", "4",
        "--no-eval", "--no-progress", "--timeout", "60", "--seed", str(SEED), "--out", str(out),
    ]  # fmt: skip
    return [*argv, "--resume", str(resume)] if resume is not None else argv


# ----------------------------------------------------------------------------- fault injection
def _park(marker: Path) -> None:
    """Tell the test where this rank stopped, then wait for SIGKILL."""
    marker.write_text(str(os.getpid()))
    time.sleep(3600)


def _park_in_sync_step(at_step: int, marker: Path) -> None:
    from igrt.sync.synchronizer import Synchronizer

    original = Synchronizer.step

    def step(self, *args, **kwargs):
        if self.step_index == at_step:
            _park(marker)
        return original(self, *args, **kwargs)

    Synchronizer.step = step


def _park_mid_checkpoint(at_step: int, marker: Path) -> None:
    """Park at this rank's second ``torch.save`` of a state of ``at_step`` (the first one is done)."""
    original = torch.save
    seen = [0]

    def save(obj, *args, **kwargs):
        if isinstance(obj, dict) and obj.get("step") == at_step:
            seen[0] += 1
            if seen[0] == 2:
                _park(marker)
        return original(obj, *args, **kwargs)

    torch.save = save


def _rank_main(rank: int, port: int, argv: list[str], log: str, fault: tuple | None) -> int:
    """One rank of ``igrt train``, launched as torchrun would launch it; returns its exit status."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(NPROC), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(NPROC),
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1",
    )  # fmt: skip
    if fault is not None and rank == 0:
        kind, at_step, marker = fault
        (_park_in_sync_step if kind == "sync" else _park_mid_checkpoint)(at_step, Path(marker))
    from igrt.cli import main

    return main(argv)


def _zygote(conn, plan_path: str) -> None:
    """A process that imports torch, transformers and igrt once and builds the tiny workload once
    (its data caches live per process), writes the plan, then forks a fresh rank per request:
    ("start", args) -> pid; ("wait", pid, timeout_s) / ("kill", pid) -> exit status (-signal when
    killed; None while running); ("stop",)."""
    import torch as zy_torch

    zy_torch.set_num_threads(1)
    from igrt.sync.synchronizer import build_param_infos, named_parameters
    from igrt.workloads import make_workload
    from tests.igrt.tiny_model import make_plan

    model = make_workload("minilm", tiny=True, seed=SEED).model
    make_plan(build_param_infos(named_parameters(model)), release_period=3, low_every=2).save(plan_path)
    for module in ("igrt.cli", "igrt.cli.train", "igrt.train.loop", "torch._dynamo"):  # before forking
        importlib.import_module(module)

    conn.send("ready")
    children: set[int] = set()
    while True:
        message = conn.recv()
        if message[0] == "start":
            pid = os.fork()
            if pid == 0:  # a rank: leaves only through os._exit
                code = 1
                try:
                    conn.close()
                    code = int(_rank_main(*message[1]) or 0)
                except SystemExit as e:
                    code = e.code if isinstance(e.code, int) else 1
                except BaseException:
                    import traceback

                    traceback.print_exc()
                finally:
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os._exit(code)
            children.add(pid)
            conn.send(pid)
        elif message[0] in ("wait", "kill"):
            pid = message[1]
            if message[0] == "kill":
                os.kill(pid, signal.SIGKILL)
            end = time.monotonic() + (message[2] if message[0] == "wait" else 30.0)
            status = None
            while status is None and time.monotonic() < end:
                done, raw = os.waitpid(pid, os.WNOHANG)
                if done:
                    status = -os.WTERMSIG(raw) if os.WIFSIGNALED(raw) else os.WEXITSTATUS(raw)
                    children.discard(pid)
                else:
                    time.sleep(0.02)
            conn.send(status)
        else:
            for pid in children:
                os.kill(pid, signal.SIGKILL)
            return


class _Runner:
    """Runs ``igrt train`` on NPROC ranks forked by the zygote."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.plan = tmp / "plan.json"
        ctx = mp.get_context("spawn")
        self.conn, child_conn = ctx.Pipe()
        self.zygote = ctx.Process(target=_zygote, args=(child_conn, str(self.plan)), daemon=True)
        self.zygote.start()
        assert self.conn.poll(HARD_LIMIT_S) and self.conn.recv() == "ready"

    def _ask(self, *message):
        self.conn.send(message)
        assert self.conn.poll(HARD_LIMIT_S + 30), f"the zygote did not answer {message[0]}"
        return self.conn.recv()

    def close(self) -> None:
        self.conn.send(("stop",))
        self.zygote.join(timeout=10)
        if self.zygote.is_alive():
            self.zygote.kill()

    def run(self, name: str, argv: list[str], *, fault: tuple | None = None) -> dict[int, int | None]:
        """Run the ranks to the end, or (with ``fault``) until rank 0 parks, then SIGKILL all."""
        port = free_port()
        logs = [self.tmp / f"{name}-rank{r}.log" for r in range(NPROC)]
        pids = [self._ask("start", (r, port, argv, str(logs[r]), fault)) for r in range(NPROC)]
        codes: dict[int, int | None] = {}
        end = time.monotonic() + HARD_LIMIT_S
        try:
            if fault is None:
                for r, pid in enumerate(pids):
                    codes[r] = self._ask("wait", pid, max(0.1, end - time.monotonic()))
            else:
                marker = Path(fault[2])
                while not marker.exists() and time.monotonic() < end:
                    time.sleep(0.02)
                assert marker.exists(), f"{name}: the fault was never reached:\n{logs[0].read_text()}"
        finally:  # kill -9 of every rank still running; rank 0 (parked, so it notices nothing) last
            for r, pid in reversed(list(enumerate(pids))):
                if codes.get(r) is None:
                    codes[r] = self._ask("kill", pid)
        if fault is None:
            assert codes == dict.fromkeys(range(NPROC), 0), "\n".join(
                f"--- {name} rank {r} (exit {codes[r]}):\n{logs[r].read_text()[-3000:]}" for r in range(NPROC)
            )
        return codes


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    r = _Runner(tmp_path_factory.mktemp("crash"))
    yield r
    r.close()


@pytest.fixture(scope="module")
def plan(runner) -> Path:
    return runner.plan


@pytest.fixture(scope="module")
def reference(runner, plan) -> dict[str, torch.Tensor]:
    out = runner.tmp / "reference"
    runner.run("reference", _argv(plan, out))
    return torch.load(out / "model.pt", weights_only=True)


def _assert_bitwise_equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    different = [n for n in want if not torch.equal(got[n], want[n])]
    assert not different, f"{len(different)} tensors differ from the uninterrupted run, e.g. {different[:3]}"


def test_kill_between_checkpoints_then_resume_matches_uninterrupted(runner, plan, reference) -> None:
    crashed = runner.tmp / "crashed"
    marker = runner.tmp / "parked-sync"
    codes = runner.run("crashed", _argv(plan, crashed), fault=("sync", 6, str(marker)))
    assert codes == {0: -signal.SIGKILL, 1: -signal.SIGKILL}
    assert not (crashed / "model.pt").exists()  # it really died before the end
    saved = [
        torch.load(f, weights_only=True)["step"] for f in (crashed / "checkpoint").rglob("train-state.pt")
    ]
    assert max(saved) == 4  # the last complete checkpoint is step 4's, wherever the layout keeps it
    resumed = runner.tmp / "resumed"
    runner.run("resumed", _argv(plan, resumed, resume=crashed))
    _assert_bitwise_equal(torch.load(resumed / "model.pt", weights_only=True), reference)


def test_kill_inside_a_checkpoint_keeps_the_previous_one(runner, plan, reference) -> None:
    torn = runner.tmp / "torn"
    marker = runner.tmp / "parked-checkpoint"
    runner.run("torn", _argv(plan, torn), fault=("checkpoint", 8, str(marker)))
    resumed = runner.tmp / "resumed-from-torn"
    runner.run("resumed-from-torn", _argv(plan, resumed, resume=torn))
    _assert_bitwise_equal(torch.load(resumed / "model.pt", weights_only=True), reference)
