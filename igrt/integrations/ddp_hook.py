"""The importance policy as a DDP communication hook (overlaps communication with backward).

    ddp = DistributedDataParallel(model)
    state = ImportanceHookState(ddp, config=config, plan=plan)
    ddp.register_comm_hook(state, importance_hook)
    state.attach(optimizer)            # before optimizer.step(): unsent grads -> None, metrics row
    for batch in loader:
        with ddp.no_sync(): ...        # micro-batches: DDP accumulates locally, the hook is not called
        loss(ddp, batch).backward()    # the boundary: the hook runs per DDP bucket as grads get ready
        optimizer.step(); optimizer.zero_grad(set_to_none=True)
    state.sync.log[-1]                 # the last step's StepMetrics row

Design. DDP hands the hook its own buckets. Per DDP bucket the ops are
:func:`igpolicy.step_plan.bucket_ops`'s (through the state's :class:`~igpolicy.planner.StepPlanner`):
the bucket's parameters that send this step travel as one asynchronous collective, a bounded
sparsifier's gather padded to the nominal k with the count in its header, others after a count
exchange, a dense sub-bucket as one all-reduce; :class:`igrt.sync.executor.Executor` performs them. A
bucket with nothing to send returns an already-completed future (no collective). The step plan of
a whole step is :func:`igpolicy.step_plan.build_step_plan` over DDP's buckets as seen
(``StepRun.ddp_buckets``), which the simulator predicts with :func:`igpolicy.step_plan.ddp_buckets`.

Parameters are keyed by NAME (an id → name map of the module's parameters), so DDP rebuilding its
buckets after the first iteration changes nothing. The state wraps a
:class:`~igrt.sync.state.SyncState` for decisions, residuals, flush and checkpoints, and uses only its
public methods.

The hook cannot set a gradient to None (DDP writes every bucket back), so unsent parameters come
back as zeros and :meth:`ImportanceHookState.finish_step` sets them to None afterwards
(``config.skip_unsent``); :meth:`attach` runs it as an optimizer step pre-hook. The step counter
advances when DDP's last bucket of a backward is launched.

(No ``from __future__ import annotations`` here: DDP checks the hook's annotations as objects.)
"""

import time
from typing import Any

import torch
import torch.distributed as dist

from igpolicy.config import PolicyConfig
from igpolicy.plan import SyncPlan
from igpolicy.step_plan import CollectiveOp, OpKind
from igpolicy.vocab import ParamInfo, StepMetrics
from igrt.sync.executor import StepRun, union_length
from igrt.sync.metrics import PhaseTimer
from igrt.sync.sparsifiers import Sparsifier
from igrt.sync.state import SyncState

__all__ = ["ImportanceHookState", "importance_hook"]


class ImportanceHookState:
    """Everything the hook keeps between calls; checkpoint it with :attr:`sync` (``state_dict``)."""

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        config: PolicyConfig,
        plan: SyncPlan | None,
        group: dist.ProcessGroup | None = None,
        sparsifier: Sparsifier | None = None,
        param_infos: list[ParamInfo] | None = None,
        track_sums: bool = False,
    ) -> None:
        module = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
        self.sync = SyncState(
            module,
            config=config,
            plan=plan,
            group=group,
            sparsifier=sparsifier,
            param_infos=param_infos,
            track_sums=track_sums,
            sync_cuda_timing=False,
        )
        self.name_of: dict[int, str] = {id(p): n for n, p in self.sync.params.items()}
        self._pending: list[StepRun] = []  # finished backward passes awaiting finish_step
        self._current: StepRun | None = None

    # ------------------------------------------------------------------ step bookkeeping
    @property
    def config(self) -> PolicyConfig:
        return self.sync.config

    def _begin(self) -> StepRun:
        if self._current is None:
            self._current = StepRun(step=self.sync.step_index, timer=PhaseTimer())
        return self._current

    def _end_backward(self) -> None:
        assert self._current is not None
        self._pending.append(self._current)
        self._current = None
        self.sync.advance_step()

    def last_launch_s(self) -> float | None:
        """perf_counter time of the latest collective launch of the backward passes not yet finished
        by :meth:`finish_step` (None when they launched nothing)."""
        starts = [a for run in self._pending for a, _ in run.intervals]
        return max(starts) if starts else None

    def backward_done_s(self) -> float | None:
        """perf_counter time the last bucket's hook of the backward passes not yet finished returned
        (the end of backward's own work: every bucket ready, selected and launched), else the latest
        collective launch, else None."""
        done = [run.hooks_done_s for run in self._pending if run.hooks_done_s is not None]
        return max(done) if done else self.last_launch_s()

    def comm_done_s(self) -> float | None:
        """perf_counter time the last collective of those backward passes completed (its combine
        included: a completion callback records it), or None when they launched nothing."""
        ends = [b for run in self._pending for _, b in run.intervals]
        return max(ends) if ends else None

    def finish_step(self) -> list[StepMetrics]:
        """After backward: unsent grads -> None (or zeros) and one StepMetrics row per finished step."""
        rows = []
        pending, self._pending = self._pending, []
        for run in pending:
            self.sync.executor.finish_nonfinite(run)  # may raise (nonfinite='error'), on every rank alike
            for name, p in self.sync.params.items():
                if name in run.results:
                    continue
                if self.config.skip_unsent or run.skipped:  # a skipped step applies nothing
                    p.grad = None
                elif p.grad is not None:
                    p.grad.zero_()
            self.sync.note_sent([n for n in self.sync.params if n in run.results], run.step)
            rows.append(self._metrics(run))
        return rows

    def state_dict(self) -> dict[str, Any]:
        """The wrapped sync state's ``state_dict`` (call between steps, after :meth:`finish_step`)."""
        if self._pending or self._current is not None:
            raise ValueError("ImportanceHookState.state_dict: call finish_step() (or optimizer.step()) first")
        return self.sync.state_dict()

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self._pending, self._current = [], None
        self.sync.load_state_dict(sd)

    def attach(self, optimizer: torch.optim.Optimizer):
        """Run :meth:`finish_step` before every ``optimizer.step()``; returns the hook handle."""

        def pre_hook(*_: Any) -> None:
            self.finish_step()

        handle = optimizer.register_step_pre_hook(pre_hook)
        self.sync.attach_optimizer(optimizer)  # catch-up's hooks run after finish_step's (config.catch_up)
        return handle

    def _metrics(self, run: StepRun) -> StepMetrics:
        sizes = [
            r.bytes.values_bytes + r.bytes.indices_bytes + r.bytes.dense_bytes + r.bytes.metadata_bytes
            for r in run.records
            if r.op.kind != OpKind.COUNT_EXCHANGE
        ]
        sync = self.sync
        decision = sync.decide(run.step)
        components = {i.component for i in sync.infos}
        row = run.metrics(
            rank=sync.rank,
            policy=self.config.policy,
            comm_s=union_length(run.intervals),
            exposed_comm_s=0.0,  # the caller knows when backward ended (train: backward_done_s)
            step_s=time.perf_counter() - run.t0,
            num_sending_components=len(decision.release.send & components),
            bucket_imbalance=max(sizes) / (sum(sizes) / len(sizes)) if sizes else 1.0,
            residual_norm=sync.residuals.total_norm(),
            extra={"ddp_hook": 1.0, "num_ddp_buckets": float(len(run.ddp_buckets)), **run.nonfinite_extra()},
        )
        sync.record(row, run)
        return row


def importance_hook(
    state: ImportanceHookState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: sparse, importance-scheduled averaging of one DDP bucket (see module doc)."""
    run = state._begin()
    sync = state.sync
    buffer = bucket.buffer()
    base = buffer.data_ptr()
    names, views, offsets = [], {}, {}
    for p, g in zip(bucket.parameters(), bucket.gradients()):
        name = state.name_of[id(p)]
        names.append(name)
        views[name] = g
        offsets[name] = (g.data_ptr() - base) // g.element_size()
    run.ddp_buckets.append(tuple(names))
    ops = sync.planner.ddp_bucket_ops(run.step, bucket=len(run.ddp_buckets) - 1, names=names)
    sending = set(ops[-1].param_names) if ops else set()
    with run.timer.phase("check"):  # one fused NaN / inf check of the bucket before its residuals
        bad = sync.executor.screen(names, views.__getitem__, run)
    run.poison_pending = run.poison_pending or bool(bad)
    poison = run.poison_pending and bool(ops)  # the first op after a non-finite bucket tells every rank
    if poison:
        run.poison_pending = False

    def grads(name: str) -> torch.Tensor | None:
        return None if name in bad else views[name]

    with run.timer.phase("hold"):
        for name in names:
            if name not in sending:
                sync.hold(name, grads(name))
    last = bucket.is_last()
    if last:
        state._end_backward()

    def write_back(op: CollectiveOp, acc: torch.Tensor) -> torch.Tensor:
        """The bucket result: averaged values of sending parameters, zeros for the others."""
        out = torch.zeros_like(buffer)
        sub = 0
        for name, n in zip(op.param_names, op.param_numel):
            out[offsets[name] : offsets[name] + n].copy_(acc[sub : sub + n])
            run.results[name] = acc[sub : sub + n]
            sub += n
        return out

    fut = sync.executor.launch_bucket(ops, grads, run, write_back=write_back, empty=buffer.zero_, poison=poison)
    if last:
        run.hooks_done_s = time.perf_counter()
    return fut
