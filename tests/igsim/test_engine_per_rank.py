"""The step engine on every rank's own recorded times (a replay): the last rank to reach a collective
gates it, the early ranks' waits count as their communication (as the runtime times it), and the
local sync work sits between backward and the first collective."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from igpolicy.config import PolicyConfig
from igsim.net.topology import star
from igsim.step.engine import simulate
from igsim.step.results import SPAN_KINDS
from igsim.step.workload import Workload
from tests.igsim.test_engine import make_params, make_workload

P = 3


def _replay_workload(phases: np.ndarray, local: np.ndarray | None, k: int = 50) -> Workload:
    params = make_params(num_layers=1, hidden=16)
    w = make_workload(params, T=phases.shape[0])
    k_by_rank = np.full((phases.shape[0], P, len(params)), k, dtype=np.int64)
    return dataclasses.replace(w, k_by_rank=k_by_rank, phases_by_rank=phases, local_s_by_rank=local)


def _sim(w: Workload, integration: str = "sync"):
    cfg = PolicyConfig(policy="topk", density=0.05)
    topo = star(num_ranks=P, bandwidth_bytes_per_s=1e6, latency_s=1e-4)
    return simulate(workload=w, config=cfg, plan=None, topology=topo, num_steps=w.num_recorded_steps,
                    integration=integration)  # fmt: skip


def _col(res, name):
    return np.asarray(res.columns[name], dtype=float)


def test_the_last_rank_gates_and_the_early_ones_wait():
    # rank 2 computes 0.3 s longer; rank 1 has 0.05 s more local sync work
    phases = np.array([[[0.1, 0.2, 0.01], [0.1, 0.2, 0.02], [0.2, 0.4, 0.03]]])
    local = np.array([[0.0, 0.05, 0.0]])
    res = _sim(_replay_workload(phases, local))
    comm, step, compute = _col(res, "comm_s"), _col(res, "step_s"), _col(res, "compute_s")
    net = float(np.sum(res.spans["end_s"] - res.spans["start_s"]))  # the stream's busy time
    arrive = np.array([0.3, 0.35, 0.6])  # forward + backward + local
    comm_end = float(res.spans["end_s"].max())
    assert comm_end == pytest.approx(arrive.max() + net)  # nothing starts before the last rank
    assert comm[2] == pytest.approx(net)  # the last to arrive waits only for the network
    assert comm == pytest.approx(comm_end - arrive)  # the others wait for it too
    assert step == pytest.approx(comm_end + phases[0, :, 2])
    assert compute == pytest.approx(phases[0].sum(axis=1))


def test_equal_ranks_give_the_network_time_and_no_local_work_changes_nothing():
    phases = np.tile(np.array([[0.1, 0.2, 0.01]]), (2, P, 1))
    res = _sim(_replay_workload(phases, None))
    comm = _col(res, "comm_s").reshape(2, P)
    per_step_net = [
        float(np.sum((res.spans["end_s"] - res.spans["start_s"])[res.spans["step"] == t])) for t in (0, 1)
    ]
    assert comm == pytest.approx(np.array(per_step_net)[:, None] * np.ones((1, P)))
    # without per-rank phases the same workload runs on its mean times: the same answer
    plain = dataclasses.replace(_replay_workload(phases, None), phases_by_rank=None)
    assert _col(_sim(plain), "step_s") == pytest.approx(_col(res, "step_s"))


def test_bad_per_rank_shapes_are_refused():
    phases = np.ones((1, P, 3))
    with pytest.raises(ValueError, match="phases_by_rank must have shape"):
        _replay_workload(phases[:, :, :2], None)
    with pytest.raises(ValueError, match="local_s_by_rank must be finite"):
        _replay_workload(phases, np.array([[0.0, -1.0, 0.0]]))


def test_ddp_hook_launches_each_bucket_after_its_share_of_the_selection():
    phases = np.array([[[0.1, 0.2, 0.01]] * P])
    w = _replay_workload(phases, None)
    base = _sim(w, "ddp-hook")
    slow = _sim(dataclasses.replace(w, local_s_by_rank=np.array([[0.0, 0.0, 0.08]])), "ddp-hook")
    gathers = base.spans["kind"] == SPAN_KINDS.index("sparse_gather")
    assert gathers.sum() >= 1
    # the selection is inside backward: compute does not change, the launches move later
    assert _col(slow, "compute_s") == pytest.approx(_col(base, "compute_s"))
    assert slow.spans["start_s"][gathers].min() > base.spans["start_s"][gathers].min()
    moved = slow.spans["start_s"][gathers] - base.spans["start_s"][gathers]
    assert moved.max() <= 0.08 + 1e-12  # by at most the whole selection, each by its bucket's share
    assert float(slow.spans["end_s"].max()) >= float(base.spans["end_s"].max())


def test_combine_time_ends_each_ranks_ops_after_the_wire_and_in_order():
    # topk under sync: a count exchange, then one sparse gather; rank 1 combines 0.04 s, rank 2 0.01 s
    phases = np.array([[[0.1, 0.2, 0.01]] * P])
    base = _sim(_replay_workload(phases, None))
    w = _replay_workload(phases, None)
    n_ops = len(base.spans["end_s"])
    assert n_ops == 2
    combine = np.zeros((1, P, n_ops))
    combine[0, 1, 1], combine[0, 2, 1] = 0.04, 0.01
    combine[0, 2, 0] = 0.5  # a count exchange's combine delays only that rank's next op
    res = _sim(dataclasses.replace(w, combine_s_by_rank=combine))
    # the wire is not delayed: the same op spans
    assert res.spans["end_s"] == pytest.approx(base.spans["end_s"])
    end0, end1 = base.spans["end_s"]
    done = np.array([end1, end1 + 0.04, max(end0 + 0.5, end1) + 0.01])
    arrive = 0.3
    assert _col(res, "comm_s") == pytest.approx(done - arrive)
    assert _col(res, "step_s") == pytest.approx(done + 0.01)
    assert _col(res, "exposed_comm_s") == pytest.approx(done - arrive)
    # zero combine time is the plain replay; a bad shape is refused
    zero = _sim(dataclasses.replace(w, combine_s_by_rank=np.zeros((1, P, n_ops))))
    assert _col(zero, "step_s") == pytest.approx(_col(base, "step_s"))
    with pytest.raises(ValueError, match="combine_s_by_rank must"):
        dataclasses.replace(w, combine_s_by_rank=np.zeros((1, P)))
    with pytest.raises(ValueError, match="combine_s_by_rank must be finite"):
        dataclasses.replace(w, combine_s_by_rank=-np.ones((1, P, 2)))


def test_ddp_finalize_time_delays_the_step_and_the_next_start_not_the_communication():
    # ddp-hook, 2 steps: rank 1 spends 0.15 s after its last bucket's collective before backward
    # returns (DDP's write-back); its step grows by that, its comm_s does not, and it reaches
    # step 1's collectives 0.15 s late, so the others wait for it there
    phases = np.tile(np.array([[0.1, 0.2, 0.01]]), (2, P, 1))
    w = _replay_workload(phases, None)
    base = _sim(w, "ddp-hook")
    fin = np.zeros((2, P))
    fin[0, 1] = 0.15
    res = _sim(dataclasses.replace(w, finalize_s_by_rank=fin), "ddp-hook")
    step_b, step_f = _col(base, "step_s").reshape(2, P), _col(res, "step_s").reshape(2, P)
    comm_b, comm_f = _col(base, "comm_s").reshape(2, P), _col(res, "comm_s").reshape(2, P)
    exp_b, exp_f = _col(base, "exposed_comm_s").reshape(2, P), _col(res, "exposed_comm_s").reshape(2, P)
    assert step_f[0] == pytest.approx(step_b[0] + np.array([0.0, 0.15, 0.0]))
    assert exp_f[0] == pytest.approx(exp_b[0] + np.array([0.0, 0.15, 0.0]))
    assert comm_f[0] == pytest.approx(comm_b[0])
    assert comm_f[1, [0, 2]] == pytest.approx(comm_b[1, [0, 2]] + 0.15)  # they wait for rank 1
    assert comm_f[1, 1] == pytest.approx(comm_b[1, 1])
    with pytest.raises(ValueError, match="finalize_s_by_rank must"):
        dataclasses.replace(w, finalize_s_by_rank=np.zeros((2, P, 1)))


def test_a_rank_starts_its_next_step_when_it_finished_the_last_one():
    # no barrier between steps: rank 1's long optimizer step (0.2 s more) in step 0 makes it the last
    # to reach step 1's collectives, though its step-1 compute is the same as everyone's
    phases = np.tile(np.array([[0.1, 0.2, 0.01]]), (2, P, 1))
    phases[0, 1, 2] = 0.21
    res = _sim(_replay_workload(phases, None))
    comm, step = _col(res, "comm_s").reshape(2, P), _col(res, "step_s").reshape(2, P)
    net = [float(np.sum((res.spans["end_s"] - res.spans["start_s"])[res.spans["step"] == t])) for t in (0, 1)]
    assert comm[0] == pytest.approx(np.full(P, net[0]))  # step 0: everyone starts together
    assert step[0] == pytest.approx(net[0] + 0.3 + phases[0, :, 2])
    assert comm[1, 1] == pytest.approx(net[1])  # step 1: rank 1 arrives last and waits for no one
    assert comm[1, [0, 2]] == pytest.approx(net[1] + 0.2)  # the others wait for it
    assert step[1] == pytest.approx([0.3 + 0.2 + net[1] + 0.01, 0.3 + net[1] + 0.01, 0.3 + 0.2 + net[1] + 0.01])
    # each rank's own step time, averaged over ranks and steps, is the run's period
    assert step.sum(axis=0) == pytest.approx(np.full(P, step.sum(axis=0)[0]))
