"""Record a gradient trace from real training: what the sparsifier would select, step by step.

:class:`TraceRecorder` hooks a model and, at every gradient-accumulation boundary, applies the
runtime's own sparsifier (:mod:`igrt.sync.sparsifiers`, k = :func:`igpolicy.decide.nominal_k`) to each
parameter's gradient and writes one ``params`` row per parameter (see :mod:`traces.schema` for the
columns), one ``steps`` row of phase times, and — under torch.distributed — one ``unions`` row per
parameter (rank 0) with the size of the union of all ranks' selected index sets.

The recorder observes the *raw* local gradient: ``u = g_t`` (there is no residual, ``e = 0``; the
manifest's ``extra`` says ``error_feedback: false``). Pass it the plain module, not a
DistributedDataParallel wrapper (whose gradients are already averaged), and average gradients
yourself after :meth:`TraceRecorder.end_backward` if the ranks must stay in step.

Protocol, per optimizer step (``begin_step`` and ``begin_backward`` are optional)::

    rec.begin_step()
    for batch in micro_batches:            # grad_accum_steps of them
        loss = model(**batch).loss         # forward time from module hooks
        rec.begin_backward()               # else the backward starts when the forward returned
        loss.backward()                    # ready times from per-parameter hooks
        rec.end_backward()                 # the grad_accum_steps-th call records the step
    rec.begin_optimizer()                  # optional: excludes e.g. an all-reduce from optimizer_s
    optimizer.step()
    rec.end_step(loss=float(loss))         # writes the steps row
    ...
    rec.close()                            # or use the recorder as a context manager

Forward passes with gradients disabled (evaluation) are ignored. Recording time itself is kept
out of the phase times and reported as ``record_s_mean`` in the manifest's ``extra``.

Rows reach the disk in commits of whole steps (:class:`traces.writer.TraceWriter`): after
``end_step`` once ``commit_every_steps`` steps or ``commit_every_s`` seconds have passed since the
last commit, and at ``close``. A crash (even ``kill -9``) loses at most the steps since the last
commit; ``read_trace(..., complete_prefix=True)`` reads the steps complete on every rank.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from igpolicy.components import map_parameters, param_infos
from igpolicy.decide import nominal_k
from igrt.sync.sparsifiers import Sparsifier, make_sparsifier
from traces.schema import MANIFEST_NAME, Manifest, part_files
from traces.writer import TraceWriter, write_manifest

__all__ = ["TraceRecorder", "jaccard"]


def jaccard(current: torch.Tensor, previous: torch.Tensor | None) -> float:
    """|A ∩ B| / |A ∪ B| of two sets of unique indices; NaN without a previous set or when both are empty."""
    if previous is None:
        return math.nan
    inter = (
        int(torch.isin(current, previous, assume_unique=True).sum()) if len(current) and len(previous) else 0
    )
    union = len(current) + len(previous) - inter
    return math.nan if union == 0 else inter / union


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class TraceRecorder:
    """Hooks ``model`` and writes its gradient trace into ``directory`` (see the module docstring).

    - ``sparsifier``: a name for :func:`igrt.sync.sparsifiers.make_sparsifier` or a sparsifier object;
      ``density`` in (0, 1]: k = nominal_k(numel, density) per parameter.
    - ``grad_accum_steps``: micro-batches per optimizer step; only the last one's backward records.
    - ``rank`` / ``world_size`` / ``group``: default to the torch.distributed group when one is
      initialised, else 0 / 1. Each rank writes its own part files; rank 0 writes the manifest.
    - ``rows_per_part``: at most this many rows per Parquet part.
    - ``commit_every_steps`` / ``commit_every_s``: the commit interval (None: no such trigger; with
      both None, rows are written at ``close`` only — one part per table for a shipped trace).
    - ``extra``: merged into the manifest's ``extra``.

    ``params`` holds the recorded parameters as ``ParamInfo`` (component keys from
    :func:`igpolicy.components.param_infos`); ``component_report`` lists names no rule recognised.
    Raises ValueError when ``directory`` already holds this rank's parts (or, on rank 0, a manifest).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        directory: str | Path,
        sparsifier: str | Sparsifier = "topk",
        density: float = 0.01,
        grad_accum_steps: int = 1,
        rank: int | None = None,
        world_size: int | None = None,
        group: Any = None,
        workload: str = "",
        command: str = "",
        rows_per_part: int = 200_000,
        commit_every_steps: int | None = 100,
        commit_every_s: float | None = 30.0,
        seed: int = 0,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            raise ValueError(
                "TraceRecorder: pass the plain module, not DDP (its gradients are already averaged)"
            )
        if not (0.0 < float(density) <= 1.0):
            raise ValueError(f"TraceRecorder: density must be in (0, 1], got {density!r}")
        if int(grad_accum_steps) < 1:
            raise ValueError(f"TraceRecorder: grad_accum_steps must be >= 1, got {grad_accum_steps!r}")
        distributed = dist.is_available() and dist.is_initialized()
        self.rank = int(rank if rank is not None else (dist.get_rank(group) if distributed else 0))
        self.world_size = int(
            world_size if world_size is not None else (dist.get_world_size(group) if distributed else 1)
        )
        if self.world_size > 1 and not distributed:
            raise ValueError(
                f"TraceRecorder: world_size={self.world_size} needs an initialised torch.distributed group"
            )
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"TraceRecorder: rank {self.rank} is not in [0, world_size={self.world_size})")
        self.group = group
        self.directory = Path(directory)
        self.density = float(density)
        self.grad_accum_steps = int(grad_accum_steps)
        self.sparsifier = (
            make_sparsifier(sparsifier, seed=seed, rank=self.rank)
            if isinstance(sparsifier, str)
            else sparsifier
        )
        self._check_directory()

        self._named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if not self._named:
            raise ValueError("TraceRecorder: the model has no trainable parameters")
        names = [n for n, _ in self._named]
        self.params = param_infos([(n, tuple(p.shape), _dtype_name(p.dtype)) for n, p in self._named])
        self.component_report = map_parameters(names).report()
        self._k = [nominal_k(p.numel(), self.density) for _, p in self._named]
        numels = torch.tensor([p.numel() for _, p in self._named], dtype=torch.int64)
        self._offsets = torch.cumsum(numels, 0) - numels  # flat index space for the union all-gather
        self._ends = torch.cumsum(numels, 0)
        self._device = self._named[0][1].device
        self._previous: dict[str, torch.Tensor] = {}

        self._manifest = Manifest(
            workload=workload,
            params=tuple(self.params),
            world_size=self.world_size,
            sparsifier=self.sparsifier.name,
            density=self.density,
            grad_accum_steps=self.grad_accum_steps,
            torch_version=torch.__version__,
            command=command,
            extra={
                "error_feedback": False,
                "gradient": "raw local gradient, before cross-rank averaging",
                **dict(extra or {}),
            },
        )
        self._writer = TraceWriter(
            self.directory,
            rank=self.rank,
            rows_per_part=rows_per_part,
            commit_every_steps=commit_every_steps,
            commit_every_s=commit_every_s,
        )
        if self.rank == 0:
            write_manifest(self.directory, self._manifest)

        self.step = 0  # recorded optimizer steps so far (the next step's id)
        self._record_s: list[float] = []
        self._closed = False
        self._reset_step_state()
        self._handles = [p.register_post_accumulate_grad_hook(self._ready_hook(n)) for n, p in self._named]
        self._handles.append(model.register_forward_pre_hook(self._forward_pre_hook))
        self._handles.append(model.register_forward_hook(self._forward_hook))

    # ------------------------------------------------------------------------------ public API
    def begin_step(self) -> None:
        """Start an optimizer step (implicit at its first forward or ``end_backward`` when not called)."""
        self._check_open()
        if self._in_step:
            raise ValueError("TraceRecorder.begin_step(): the previous step was not ended with end_step()")
        self._reset_step_state()
        self._in_step = True
        self._step_t0 = self._now()

    def begin_backward(self) -> None:
        """Mark the start of this micro-batch's backward pass (ready times count from here)."""
        self._ensure_step()
        self._open_backward(self._now())

    def end_backward(self, *, boundary: bool | None = None) -> bool:
        """Call after a micro-batch's backward; records the step at the accumulation boundary.

        The boundary is the ``grad_accum_steps``-th micro-batch of the step (a forward that starts
        while a backward is open closes that micro-batch implicitly), or this call when ``boundary``
        is True (a trainer that knows its boundaries). Returns True when this call recorded the
        step. Raises ValueError when the step was already recorded.
        """
        self._ensure_step()
        if self._recorded:
            raise ValueError(
                f"TraceRecorder.end_backward(): step {self.step - 1} was already recorded "
                f"({self.grad_accum_steps} micro-batch(es)); call end_step() after the optimizer step"
            )
        self._close_backward(self._now())
        if not (boundary or (boundary is None and self._micro >= self.grad_accum_steps)):
            return False
        t0 = time.perf_counter()
        self._record()
        self._record_s.append(time.perf_counter() - t0)
        self._recorded = True
        self._opt_t0 = self._now()
        return True

    def begin_optimizer(self) -> None:
        """Optional: the optimizer phase starts now (default: when recording finished)."""
        self._opt_t0 = self._now()

    def end_step(self, loss: float | None = None) -> None:
        """End the optimizer step and write its ``steps`` row.

        ``loss`` defaults to the mean of the ``loss`` outputs the model's forward returned in this
        step (NaN when there were none).
        """
        self._check_open()
        if not self._recorded:
            raise ValueError(
                f"TraceRecorder.end_step(): the step has {self._micro} of {self.grad_accum_steps} micro-batches; "
                "call end_backward() after each backward"
            )
        if loss is None:
            loss = float(np.mean(self._losses)) if self._losses else math.nan
        self._writer.add_step_row(
            step=self.step - 1,
            forward_s=self._forward_s,
            backward_s=self._backward_s,
            optimizer_s=max(0.0, self._now() - self._opt_t0),
            loss=float(loss),
        )
        self._in_step = False

    @property
    def record_s(self) -> tuple[float, ...]:
        """Seconds spent recording each step so far (selection, statistics, the union all-gather)."""
        return tuple(self._record_s)

    def add_extra(self, values: Mapping[str, Any]) -> None:
        """Merge ``values`` (JSON-able) into the manifest's ``extra``; written by rank 0 at close."""
        self._manifest = _replace_extra(self._manifest, {**self._manifest.extra, **dict(values)})

    def close(self) -> None:
        """Remove the hooks, write the remaining rows and (rank 0) the final manifest."""
        if self._closed:
            return
        self._closed = True
        for h in self._handles:
            h.remove()
        self._writer.close()
        if self.rank == 0:
            extra = dict(self._manifest.extra)
            extra["num_steps"] = self.step
            if self._record_s:
                extra["record_s_mean"] = float(np.mean(self._record_s))
            write_manifest(self.directory, _replace_extra(self._manifest, extra))

    def __enter__(self) -> TraceRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------ the step
    def _record(self) -> None:
        """Select, measure and buffer one row per parameter; all-gather the index sets for unions."""
        step = self.step
        n = len(self._named)
        cols = {c: np.zeros(n) for c in ("grad_norm", "sel_norm", "sel_max_abs", "overlap", "ready_s")}
        ks = np.zeros(n, dtype=np.int64)
        selected = []
        base = self._last_bwd_start  # the start of the step's last backward pass
        for i, (name, p) in enumerate(self._named):
            g = p.grad
            if g is None:  # unused this step: nothing to select, nothing ready
                idx = torch.empty(0, dtype=torch.int64, device=self._device)
                norm = sel = mx = 0.0
            else:
                u = (g.to_dense() if g.is_sparse else g).detach().flatten().float()
                idx = self.sparsifier.select(u, self._k[i], step=step, key=name)
                vals = u[idx]
                norm = float(torch.linalg.vector_norm(u, dtype=torch.float64))
                sel = float(torch.linalg.vector_norm(vals, dtype=torch.float64)) if len(idx) else 0.0
                mx = float(vals.abs().max()) if len(idx) else 0.0
            ks[i] = len(idx)
            cols["grad_norm"][i], cols["sel_norm"][i], cols["sel_max_abs"][i] = norm, sel, mx
            cols["overlap"][i] = jaccard(idx, self._previous.get(name))
            ready = self._ready.get(name)
            cols["ready_s"][i] = math.nan if ready is None or base is None else max(0.0, ready - base)
            self._previous[name] = idx
            selected.append(idx)
        self._writer.add_param_rows(
            step=np.full(n, step, dtype=np.int64),
            param=[name for name, _ in self._named],
            numel=np.array([p.numel() for _, p in self._named], dtype=np.int64),
            k=ks,
            **cols,
        )
        if self.world_size > 1:
            union_k = self._union_sizes(selected)
            if self.rank == 0:
                self._writer.add_union_rows(
                    step=np.full(n, step, dtype=np.int64),
                    param=[name for name, _ in self._named],
                    union_k=union_k,
                )
        self.step += 1

    def _union_sizes(self, selected: list[torch.Tensor]) -> np.ndarray:
        """|∪_ranks S_r| per parameter: all-gather every rank's flat (offset) indices, then count."""
        offsets = self._offsets.to(self._device)
        local = torch.cat([idx + offsets[i] for i, idx in enumerate(selected)])
        size = torch.tensor([local.numel()], dtype=torch.int64, device=self._device)
        sizes = [torch.zeros_like(size) for _ in range(self.world_size)]
        dist.all_gather(sizes, size, group=self.group)
        counts = [int(s) for s in sizes]
        longest = max(counts)
        padded = torch.full((longest,), -1, dtype=torch.int64, device=self._device)
        padded[: local.numel()] = local
        gathered = [torch.empty_like(padded) for _ in range(self.world_size)]
        dist.all_gather(gathered, padded, group=self.group)
        everything = torch.cat([g[:c] for g, c in zip(gathered, counts)]).cpu()
        unique = torch.unique(everything)
        owner = torch.searchsorted(self._ends, unique, right=True)
        return torch.bincount(owner, minlength=len(self._named)).numpy().astype(np.int64)

    # ------------------------------------------------------------------------------ hooks
    def _ready_hook(self, name: str):
        def hook(_param: torch.Tensor) -> None:
            if self._in_step:
                now = time.perf_counter()
                self._ready[name] = now
                self._bwd_last = now

        return hook

    def _forward_pre_hook(self, _module: torch.nn.Module, _args: Any) -> None:
        if not torch.is_grad_enabled() or self._closed:
            return
        self._ensure_step()
        self._close_backward(None)
        self._fwd_t0 = self._now()

    def _forward_hook(self, _module: torch.nn.Module, _args: Any, output: Any) -> None:
        if not torch.is_grad_enabled() or self._closed or self._fwd_t0 is None:
            return
        now = self._now()
        self._forward_s += now - self._fwd_t0
        self._fwd_t0 = None
        loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
        if isinstance(loss, torch.Tensor) and loss.numel() == 1:
            self._losses.append(float(loss.detach()))
        self._open_backward(now)

    # ------------------------------------------------------------------------------ plumbing
    def _reset_step_state(self) -> None:
        self._in_step = False
        self._recorded = False
        self._micro = 0
        self._forward_s = 0.0
        self._backward_s = 0.0
        self._losses: list[float] = []
        self._ready: dict[str, float] = {}
        self._fwd_t0: float | None = None
        self._bwd_start: float | None = None
        self._last_bwd_start: float | None = None
        self._bwd_last: float | None = None
        self._last_t_end: float | None = None
        self._step_t0 = self._opt_t0 = time.perf_counter()

    def _ensure_step(self) -> None:
        self._check_open()
        if not self._in_step:
            self.begin_step()

    def _open_backward(self, t: float) -> None:
        self._bwd_start = t
        self._bwd_last = None
        self._ready = {}

    def _close_backward(self, t_end: float | None) -> None:
        """Close the open micro-batch backward at ``t_end`` (or its last ready hook)."""
        if self._bwd_start is None:
            if t_end is not None:  # end_backward() with no forward hook since the last micro-batch
                start = self._last_t_end if self._last_t_end is not None else self._step_t0
                self._backward_s += max(0.0, t_end - start)
                self._last_bwd_start = start
                self._last_t_end = t_end
                self._micro += 1
            return
        end = t_end if t_end is not None else self._bwd_last
        if end is None:  # a forward without a backward (e.g. grad enabled but no loss.backward())
            self._bwd_start = None
            return
        self._backward_s += max(0.0, end - self._bwd_start)
        self._last_bwd_start = self._bwd_start
        self._last_t_end = end
        self._bwd_start = None
        self._micro += 1

    def _now(self) -> float:
        if self._device.type == "cuda":
            torch.cuda.synchronize(self._device)
        return time.perf_counter()

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"TraceRecorder for {self.directory} is closed")

    def _check_directory(self) -> None:
        if not self.directory.is_dir():
            return
        if self.rank == 0 and (self.directory / MANIFEST_NAME).exists():
            raise ValueError(
                f"{self.directory} already holds a trace ({MANIFEST_NAME}); record into a new directory"
            )
        for path in part_files(self.directory, rank=self.rank)[:1]:
            raise ValueError(f"{self.directory} already holds rank {self.rank}'s part {path.name}")


def _replace_extra(manifest: Manifest, extra: dict[str, Any]) -> Manifest:
    return dataclasses.replace(manifest, extra=extra)
