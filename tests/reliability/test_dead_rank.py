"""A dead or stalled rank: the survivors stop with an error naming it, in bounded time, never hang.

Three gloo ranks train a tiny model with the Synchronizer, each step's synchronization under
:meth:`igrt.train.watchdog.RankWatchdog.watch`. At step 3 one rank fails: it exits (``os._exit``) during
its forward/backward or inside its synchronization, or sleeps forever. Each survivor must raise
:class:`~igrt.train.watchdog.PeerFailure` naming exactly that rank (dead or stalled) and its process must
exit on its own, within the bound the watchdog documents: the group's timeout (for a stall) plus
``3 · interval_s`` plus the store host's ``linger_s``, plus slack for process start-up on a busy
machine. Rank 0 hosts the store; when it dies the survivors name it. With ``deadline_s`` and a group
timeout far longer than the test allows, the watchdog thread itself ends the survivors (exit code
``EXIT_CODE``, the diagnosis on stderr).

The test's own hard limit: each scenario kills every process still running after ``HARD_LIMIT_S``.
Ranks are forked from a forkserver that imported torch once (a spawn per rank costs seconds).
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from igpolicy.config import PolicyConfig
from igrt.sync.synchronizer import Synchronizer
from igrt.train.watchdog import EXIT_CODE, PeerFailure, PeerState, RankWatchdog, find_suspects
from tests.igrt.dist_util import free_port
from tests.igrt.tiny_model import TinyLM

WORLD = 3
FAULT_STEP = 3
NUM_STEPS = 6
INTERVAL_S = 0.2
SLACK_S = 6.0  # scheduling on two shared cores
HARD_LIMIT_S = 60.0


@dataclass(frozen=True, kw_only=True)
class Scenario:
    faulty: int
    fault: str  # "exit" | "sleep"
    where: str  # "compute" (before the sync point) | "sync" (inside the watched block)
    group_timeout_s: float = 3.0
    deadline_s: float | None = None


def _inject(scenario: Scenario, fault_time) -> None:
    fault_time.value = time.time()
    if scenario.fault == "exit":
        os._exit(9)
    time.sleep(3600)


def _rank_main(rank: int, port: int, scenario: Scenario, stderr_path: str, fault_time, results) -> None:
    """One rank: train until the fault; a survivor reports its PeerFailure and exits with code 3."""
    fd = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 2)
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=scenario.group_timeout_s)
    store = dist.TCPStore("127.0.0.1", port, WORLD, rank == 0, timeout=datetime.timedelta(seconds=30))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD, timeout=timeout)
    torch.manual_seed(0)
    model = TinyLM(d=8, num_layers=1)
    sync = Synchronizer(model, config=PolicyConfig(policy="topk", density=0.25, num_buckets=2), plan=None)
    wd = RankWatchdog(
        store=store, rank=rank, world_size=WORLD, interval_s=INTERVAL_S, deadline_s=scenario.deadline_s
    )
    try:
        with wd:
            for step in range(NUM_STEPS):
                faulty_now = rank == scenario.faulty and step == FAULT_STEP
                if faulty_now and scenario.where == "compute":
                    _inject(scenario, fault_time)
                gen = torch.Generator().manual_seed(100 * rank + step)
                model.loss(torch.randint(0, 50, (2, 6), generator=gen)).backward()
                with wd.watch(step):
                    if faulty_now and scenario.where == "sync":
                        _inject(scenario, fault_time)
                    sync.step()
                with torch.no_grad():  # plain SGD (torch.optim would import torch._dynamo: seconds)
                    for p in model.parameters():
                        if p.grad is not None:
                            p.add_(p.grad, alpha=-0.1)
                            p.grad = None
    except PeerFailure as e:
        results.put((rank, "failure", str(e), e.suspects, time.time()))
        sys.exit(3)
    results.put((rank, "finished", "", {}, time.time()))


@pytest.fixture(scope="module")
def ctx():
    context = mp.get_context("forkserver")
    context.set_forkserver_preload(
        ["torch", "torch.distributed", "igrt.sync.synchronizer", "tests.igrt.tiny_model"]
    )
    return context


def _run(ctx, scenario: Scenario, tmp_path: Path) -> tuple[dict[int, tuple], dict[int, int | None], float]:
    """Start the ranks, wait for the survivors' exit (hard limit), kill the rest.

    Returns ({rank: (kind, message, suspects, seconds after the fault)}, {rank: exit code}, fault time).
    """
    results = ctx.Queue()
    fault_time = ctx.Value("d", 0.0)
    port = free_port()
    procs = [
        ctx.Process(
            target=_rank_main,
            args=(r, port, scenario, str(tmp_path / f"stderr-{r}.txt"), fault_time, results),
            daemon=True,
        )
        for r in range(WORLD)
    ]
    for p in procs:
        p.start()
    survivors = [r for r in range(WORLD) if r != scenario.faulty]
    end = time.monotonic() + HARD_LIMIT_S
    try:
        for r in survivors:
            procs[r].join(timeout=max(0.1, end - time.monotonic()))
        codes = {r: procs[r].exitcode for r in range(WORLD)}
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(timeout=5)
    reports = {}
    while len(reports) < WORLD:
        try:
            rank, kind, message, suspects, t = results.get(timeout=1.0)
        except Exception:
            break
        reports[rank] = (kind, message, suspects, t - fault_time.value)
    return reports, codes, fault_time.value


SCENARIOS = {
    "rank 2 exits in backward": Scenario(faulty=2, fault="exit", where="compute"),
    "rank 2 exits inside its sync": Scenario(faulty=2, fault="exit", where="sync"),
    "rank 1 sleeps forever": Scenario(faulty=1, fault="sleep", where="compute"),
    "rank 0 (store host) exits": Scenario(faulty=0, fault="exit", where="compute"),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_survivors_name_the_failed_rank_and_exit(ctx, tmp_path, name) -> None:
    scenario = SCENARIOS[name]
    reports, codes, fault_t = _run(ctx, scenario, tmp_path)
    assert fault_t > 0, f"the fault was never injected: {reports}, {codes}"
    survivors = [r for r in range(WORLD) if r != scenario.faulty]
    logs = {r: (tmp_path / f"stderr-{r}.txt").read_text() for r in range(WORLD)}
    for r in survivors:
        assert codes[r] == 3, f"rank {r} exit code {codes[r]} (None: still running); stderr:\n{logs[r]}"
        kind, message, suspects, after_s = reports[r]
        assert kind == "failure"
        assert list(suspects) == [scenario.faulty], message
        assert f"rank {scenario.faulty} is " in message and f"rank {r}:" in message, message
        expected = (
            "stalled" if scenario.fault == "sleep" else ("unreachable" if scenario.faulty == 0 else "dead")
        )
        assert suspects[scenario.faulty].startswith(expected), message
        bound = (scenario.group_timeout_s if scenario.fault == "sleep" else 0.0) + 3 * INTERVAL_S
        bound += (4 * INTERVAL_S + 1.0) + SLACK_S  # the store host's linger, then scheduling slack
        assert 0 <= after_s <= bound, (
            f"rank {r} stopped {after_s:.1f} s after the fault (bound {bound:.1f} s)"
        )
    if scenario.fault == "exit":
        assert codes[scenario.faulty] == 9


def test_deadline_ends_survivors_when_the_backend_would_wait_longer(ctx, tmp_path) -> None:
    """Group timeout 300 s (the test allows 60): the watchdog thread ends the survivors at deadline_s."""
    scenario = Scenario(faulty=1, fault="sleep", where="compute", group_timeout_s=300.0, deadline_s=2.0)
    reports, codes, fault_t = _run(ctx, scenario, tmp_path)
    assert fault_t > 0
    for r in (0, 2):
        log = (tmp_path / f"stderr-{r}.txt").read_text()
        assert codes[r] == EXIT_CODE, f"rank {r} exit code {codes[r]}; stderr:\n{log}"
        assert "rank 1 is stalled" in log and f"exiting with code {EXIT_CODE}" in log, log
        assert f"rank {2 - r} is" not in log, log  # the other survivor is never blamed
        assert r not in reports  # no PeerFailure: the process was ended from the watchdog thread


# ----------------------------------------------------------------------------- the pure part
def test_find_suspects_prefers_dead_ranks_and_names_laggards() -> None:
    alive = [PeerState(rank=r, reached=5, alive=True) for r in range(4)]
    assert find_suspects(alive, step=5, rank=0) == {}
    lagging = [*alive[:3], PeerState(rank=3, reached=4, alive=True)]
    assert list(find_suspects(lagging, step=5, rank=0)) == [3]
    assert "stalled" in find_suspects(lagging, step=5, rank=0)[3]
    dead_and_lagging = [alive[0], PeerState(rank=1, reached=5, alive=False), alive[2], lagging[3]]
    found = find_suspects(dead_and_lagging, step=5, rank=0)
    assert list(found) == [1] and found[1].startswith("dead")
    # a rank never blames itself, even when its own counters look dead or behind
    assert find_suspects([PeerState(rank=0, reached=-1, alive=False), alive[1]], step=5, rank=0) == {}
    # a survivor that already diagnosed the failure and exited is not to blame
    gone = [alive[0], PeerState(rank=1, reached=5, alive=False, left=True), alive[2]]
    assert find_suspects(gone, step=5, rank=0) == {}
    never = find_suspects([alive[0], PeerState(rank=1, reached=-1, alive=True)], step=0, rank=0)
    assert "no step yet" in never[1]


def test_watchdog_rejects_bad_settings() -> None:
    store = dist.HashStore()
    with pytest.raises(ValueError, match="interval_s"):
        RankWatchdog(store=store, rank=0, world_size=1, interval_s=0)
    with pytest.raises(ValueError, match="deadline_s"):
        RankWatchdog(store=store, rank=0, world_size=1, deadline_s=-1)
    with pytest.raises(ValueError, match="outside world_size"):
        RankWatchdog(store=store, rank=2, world_size=2)
