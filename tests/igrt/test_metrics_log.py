"""``MetricsLog``: len(), indexing (``log[-1]``) and iteration, here after a real DDP-hook step."""

from __future__ import annotations

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from igpolicy.config import PolicyConfig
from igpolicy.vocab import StepMetrics
from igrt.integrations.ddp_hook import ImportanceHookState, importance_hook
from igrt.sync.metrics import MetricsLog
from tests.igrt.dist_util import run_distributed
from tests.igrt.tiny_model import TinyLM

torch.set_num_threads(1)


def test_metrics_log_is_a_sequence() -> None:
    log = MetricsLog()
    rows = [StepMetrics(step=s, rank=0, source="real", policy="dense") for s in range(3)]
    for r in rows:
        log.append(r)
    assert len(log) == 3 and log[-1] is rows[-1] and log[0] is rows[0] and list(log) == rows


def _hook_worker(rank: int, world: int):
    torch.manual_seed(0)
    ddp = DDP(TinyLM())
    state = ImportanceHookState(ddp, config=PolicyConfig(policy="topk", density=0.1), plan=None)
    ddp.register_comm_hook(state, importance_hook)
    for t in range(2):
        tokens = torch.randint(0, 50, (3, 9), generator=torch.Generator().manual_seed(100 * rank + t))
        logits = ddp(tokens[:, :-1])
        torch.nn.functional.cross_entropy(logits.reshape(-1, 50), tokens[:, 1:].reshape(-1)).backward()
        (finished,) = state.finish_step()
        last = state.sync.log[-1]
        assert len(state.sync.log) == t + 1
        assert last.step == t and last.rank == rank and last == finished
        assert last.wire_bytes > 0 and last.num_collectives >= 1
        ddp.zero_grad(set_to_none=True)
    return [r.step for r in state.sync.log]


def test_log_minus_one_after_a_ddp_hook_step() -> None:
    assert run_distributed(_hook_worker, world_size=2, timeout_s=90) == [[0, 1], [0, 1]]
