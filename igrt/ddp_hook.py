"""The importance policy as a DDP communication hook (overlaps communication with backward).

    ddp = DistributedDataParallel(model)
    state = ImportanceHookState(ddp, config=config, plan=plan)
    ddp.register_comm_hook(state, importance_hook)
    state.attach(optimizer)            # before optimizer.step(): unsent grads -> None, metrics row
    for batch in loader:
        with ddp.no_sync(): ...        # micro-batches: DDP accumulates locally, the hook is not called
        loss(ddp, batch).backward()    # the boundary: the hook runs per DDP bucket as grads get ready
        optimizer.step(); optimizer.zero_grad(set_to_none=True)

Design. DDP hands the hook its own buckets, which are not the buckets :func:`decide_step` packs, so
the hook keeps every *per-parameter* decision of ``decide_step`` (who sends this step, with which
k) and lets DDP's bucket boundaries decide the packing: per DDP bucket, its sending parameters
travel as one asynchronous collective (concatenated int32 indices + values, padded to the bucket's
nominal k, or the zero-filled dense sub-bucket), chosen by :func:`igpolicy.choice.choose_collective`
on that sub-bucket's nominal sizes (a pure function: every rank picks the same). So bytes per
parameter match the Synchronizer and the simulator; the number of collectives follows DDP's
buckets. A bucket with nothing to send returns an already-completed future (no collective).

Parameters are keyed by NAME (an id → name map of the module's parameters), so DDP rebuilding its
buckets after the first iteration changes nothing. Residuals, selection and averaging are the
Synchronizer's own functions (:func:`igrt.residuals.send_param`, :func:`igrt.comm.aggregate_pairs`), and the
state wraps a :class:`Synchronizer` for decisions, residuals, flush and checkpoints.

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

from igpolicy.choice import choose_collective
from igpolicy.config import PolicyConfig
from igpolicy.decide import StepDecision
from igpolicy.plan import SyncPlan
from igpolicy.vocab import CollectiveKind, ParamInfo, StepMetrics
from igrt import comm
from igrt.comm import aggregate_pairs
from igrt.residuals import send_param
from igrt.sparsifiers import Sparsifier
from igrt.synchronizer import Synchronizer

__all__ = ["ImportanceHookState", "importance_hook"]

_BOUNDED = ("topk", "adtopk", "randomk")  # sparsifiers that never return more than k indices


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
        self.sync = Synchronizer(
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
        self._decision: StepDecision | None = None
        self._pending: list[dict[str, Any]] = []  # finished steps awaiting finish_step
        self._current: dict[str, Any] | None = None

    # ------------------------------------------------------------------ step bookkeeping
    @property
    def config(self) -> PolicyConfig:
        return self.sync.config

    def _begin(self) -> dict[str, Any]:
        if self._current is None:
            t = self.sync.step_index
            self._decision = self.sync.decide(t)
            self._current = {
                "step": t,
                "decision": self._decision,
                "counter": comm.CommCounter(),
                "intervals": [],
                "bucket_bytes": [],
                "unsent": set(),
                "low_bytes": 0,
                "t0": time.perf_counter(),
                "select_s": 0.0,
            }
        return self._current

    def _end_backward(self) -> None:
        assert self._current is not None
        self._pending.append(self._current)
        self._current = None
        self.sync.step_index += 1

    def finish_step(self) -> list[StepMetrics]:
        """After backward: unsent grads -> None (or zeros) and one StepMetrics row per finished step."""
        rows = []
        for cur in self._pending:
            for name in cur["unsent"]:
                p = self.sync.params[name]
                if self.config.skip_unsent:
                    p.grad = None
                elif p.grad is not None:
                    p.grad.zero_()
            self.sync.note_sent([n for n in self.sync.params if n not in cur["unsent"]], cur["step"])
            rows.append(self._metrics(cur))
        self._pending = []
        return rows

    def state_dict(self) -> dict[str, Any]:
        """The wrapped Synchronizer's state (call between steps, after :meth:`finish_step`)."""
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

    def _metrics(self, cur: dict[str, Any]) -> StepMetrics:
        counter: comm.CommCounter = cur["counter"]
        comm_s = _union_length(cur["intervals"])
        sizes = [b for b in cur["bucket_bytes"] if b > 0]
        imbalance = max(sizes) / (sum(sizes) / len(sizes)) if sizes else 1.0
        decision: StepDecision = cur["decision"]
        row = StepMetrics(
            step=cur["step"],
            rank=self.sync.rank,
            source="real",
            policy=self.config.policy,
            values_bytes=counter.values_bytes,
            indices_bytes=counter.indices_bytes,
            dense_bytes=counter.dense_bytes,
            metadata_bytes=counter.metadata_bytes,
            num_collectives=counter.num_collectives,
            num_sending_components=len(decision.release.send),
            low_bytes=cur["low_bytes"],
            comm_s=comm_s,
            step_s=time.perf_counter() - cur["t0"],
            bucket_imbalance=imbalance,
            residual_norm=self.sync.residuals.total_norm(),
            extra={
                "select_s": cur["select_s"],
                "padding_bytes": float(counter.padding_bytes),
                "ddp_hook": 1.0,
            },
        )
        self.sync.log.append(row)
        return row


def _union_length(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def _completed(tensor: torch.Tensor) -> torch.futures.Future:
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(tensor)
    return fut


def importance_hook(
    state: ImportanceHookState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: sparse, importance-scheduled averaging of one DDP bucket (see module doc)."""
    cur = state._begin()
    sync = state.sync
    decision: StepDecision = cur["decision"]
    counter: comm.CommCounter = cur["counter"]
    buffer = bucket.buffer()
    base = buffer.data_ptr()
    t_sel = time.perf_counter()
    sending = []  # (name, param, grad view, offset in buffer)
    for p, g in zip(bucket.parameters(), bucket.gradients()):
        name = state.name_of[id(p)]
        offset = (g.data_ptr() - base) // g.element_size()
        if name in decision.sending_params:
            sending.append((name, p, g, offset))
        else:
            sync.residuals.hold(name, sync.residuals.accumulate(name, g, like=p))
            cur["unsent"].add(name)
    if bucket.is_last():
        state._end_backward()
    if not sending:
        cur["select_s"] += time.perf_counter() - t_sel
        cur["bucket_bytes"].append(0)
        return _completed(buffer.zero_())

    cfg = sync.config
    ks = {name: sync.k[name] for name, *_ in sending}
    numel = sum(p.numel() for _, p, _, _ in sending)
    nnz = sum(k if k is not None else p.numel() for (_, p, _, _), k in zip(sending, ks.values()))
    if cfg.sparse:
        kind = choose_collective(
            numel=numel,
            nnz_per_rank=[nnz] * sync.world_size,
            index_bytes=cfg.index_bytes,
            value_bytes=cfg.value_bytes,
            mode=cfg.collective,
        )
    else:
        kind = CollectiveKind.DENSE_ALLREDUCE
    parts, sub_off = [], 0
    for name, p, g, offset in sending:
        idx, vals = send_param(
            sync.residuals,
            sync.sparsifier,
            name=name,
            grad=g,
            like=p,
            k=ks[name],
            step=cur["step"],
            value_dtype=sync.value_dtype,
        )
        parts.append((name, p, offset, sub_off, idx, vals))
        sub_off += p.numel()
    cur["select_s"] += time.perf_counter() - t_sel
    before = counter.wire_bytes
    if kind == CollectiveKind.DENSE_ALLREDUCE:
        fut = _launch_dense(state, parts, numel, buffer, cur)
    else:
        fut = _launch_sparse(state, parts, numel, nnz, buffer, cur)
    cur["bucket_bytes"].append(counter.wire_bytes - before)
    ib = torch.empty(0, dtype=sync.index_dtype).element_size()
    vb = torch.empty(0, dtype=sync.value_dtype).element_size()
    for name, p, _, _, idx, _ in parts:
        if sync.phases[sync.component[name]] is not None:
            if kind == CollectiveKind.DENSE_ALLREDUCE:
                cur["low_bytes"] += p.numel() * vb
            else:
                cur["low_bytes"] += (p.numel() if idx is None else idx.numel()) * (ib + vb)
    return fut


def _write_back(buffer: torch.Tensor, parts, averaged: torch.Tensor) -> torch.Tensor:
    """The bucket result: averaged values of sending parameters, zeros for the others."""
    out = torch.zeros_like(buffer)
    for _, p, offset, sub_off, _, _ in parts:
        n = p.numel()
        out[offset : offset + n].copy_(averaged[sub_off : sub_off + n])
    return out


def _launch_dense(state, parts, numel, buffer, cur) -> torch.futures.Future:
    sync = state.sync
    flat = torch.zeros(numel, dtype=sync.value_dtype, device=buffer.device)
    for _, p, _, sub_off, idx, vals in parts:
        target = flat[sub_off : sub_off + p.numel()]
        target.copy_(vals) if idx is None else target.index_copy_(0, idx, vals)
    t0 = time.perf_counter()
    work = comm.dense_all_reduce(flat, sync.group, counter=cur["counter"], async_op=True)
    world = sync.world_size

    def done(_fut=None) -> torch.Tensor:
        cur["intervals"].append((t0, time.perf_counter()))
        return _write_back(buffer, parts, flat.to(torch.float32).div_(world))

    if work is None:
        return _completed(done())
    return work.get_future().then(lambda f: done(f))


def _launch_sparse(state, parts, numel, nnz, buffer, cur) -> torch.futures.Future:
    sync = state.sync
    idx_parts, val_parts = [], []
    for _, p, _, sub_off, idx, vals in parts:
        if idx is None:
            idx = torch.arange(p.numel(), device=buffer.device)
        idx_parts.append((idx + sub_off).to(sync.index_dtype))
        val_parts.append(vals)
    idx_cat, val_cat = torch.cat(idx_parts), torch.cat(val_parts)
    counter = cur["counter"]
    t0 = time.perf_counter()
    if sync.sparsifier.name in _BOUNDED:
        capacity = nnz  # every rank knows the nominal bound: no count exchange, count in the header
        counter.metadata_bytes += 8
    else:
        counts = comm.exchange_counts(
            [idx_cat.numel()], group=sync.group, device=buffer.device, counter=counter
        )
        capacity = max(row[0] for row in counts)
    handle = comm.gather_pairs(
        idx_cat, val_cat, capacity=capacity, group=sync.group, counter=counter, async_op=True
    )

    def done(_fut=None) -> torch.Tensor:
        gathered = handle.decode() if _fut is not None else handle.wait()
        cur["intervals"].append((t0, time.perf_counter()))
        return _write_back(buffer, parts, aggregate_pairs(gathered, numel=numel, device=buffer.device))

    if handle.work is None:
        return _completed(done())
    return handle.work.get_future().then(lambda f: done(f))
