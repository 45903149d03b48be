"""A training run's own trace (``igrt train --record-trace``): what a replay of that run needs.

Per step and rank, in the trace format of :mod:`traces` (``RUN/trace/``):

- ``steps``: the run's own ``forward_s`` / ``backward_s`` (summed over micro-batches) and
  ``optimizer_s``, and the loss;
- ``params``: ``ready_s`` — when each gradient became ready in the step's last backward pass
  (a post-accumulate-grad hook; seconds since that pass began) — and ``k``, the entries the
  parameter *sent* this step (the selected pairs; every entry for a dense send; 0 when it held).

The norms and overlaps of a profiling trace are not computed (they would cost the run time it
measures): ``grad_norm`` / ``sel_norm`` / ``sel_max_abs`` are 0 and ``overlap`` NaN, and the
manifest says so (``extra["k"] == "sent"``), so such a trace is for replays, not for profiling.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch

from igpolicy.config import PolicyConfig
from igpolicy.vocab import ParamInfo
from traces.schema import RUN_TRACE_K, Manifest
from traces.writer import TraceWriter, write_manifest

__all__ = ["RunTraceRecorder"]


class RunTraceRecorder:
    """Records one rank's steps of a training run into ``directory`` (rank 0 writes the manifest)."""

    def __init__(
        self,
        directory: str | Path,
        *,
        rank: int,
        world_size: int,
        params: Mapping[str, torch.nn.Parameter],
        infos: Sequence[ParamInfo],
        config: PolicyConfig,
        workload: str,
        grad_accum: int,
        command: str = "",
    ) -> None:
        self.directory = Path(directory)
        self.rank = rank
        self.names = [i.name for i in infos]
        self.numel = np.array([i.numel for i in infos], dtype=np.int64)
        self._ready: dict[str, float] = {}
        self._armed_at: float | None = None
        self._handles = [p.register_post_accumulate_grad_hook(self._hook(n)) for n, p in params.items()]
        self.writer = TraceWriter(self.directory, rank=rank, rows_per_part=50_000)
        if rank == 0:
            write_manifest(
                self.directory,
                Manifest(
                    workload=workload,
                    params=tuple(infos),
                    world_size=world_size,
                    sparsifier=config.sparsifier,
                    density=config.density,
                    grad_accum_steps=grad_accum,
                    torch_version=torch.__version__,
                    command=command,
                    extra={"k": RUN_TRACE_K, "source": "igrt train --record-trace", "policy": config.policy},
                ),
            )

    def _hook(self, name: str):
        def hook(_p: torch.Tensor) -> None:
            if self._armed_at is not None:
                self._ready[name] = time.perf_counter() - self._armed_at

        return hook

    def arm(self) -> None:
        """Call right before the step's last backward pass: ready times count from here."""
        self._ready = {}
        self._armed_at = time.perf_counter()

    def end_step(
        self,
        *,
        step: int,
        forward_s: float,
        backward_s: float,
        optimizer_s: float,
        loss: float,
        sent_k: Mapping[str, int],
    ) -> None:
        """Write the step's rows (``sent_k``: entries each parameter sent; absent = 0)."""
        self._armed_at = None
        n = len(self.names)
        ready = np.array([min(self._ready.get(nm, backward_s), backward_s) for nm in self.names])
        k = np.array([int(sent_k.get(nm, 0)) for nm in self.names], dtype=np.int64)
        self.writer.add_param_rows(
            step=np.full(n, step),
            param=self.names,
            numel=self.numel,
            k=np.minimum(k, self.numel),
            grad_norm=np.zeros(n),
            sel_norm=np.zeros(n),
            sel_max_abs=np.zeros(n),
            overlap=np.full(n, np.nan),
            ready_s=np.maximum(ready, 0.0),
        )
        self.writer.add_step_row(
            step=step, forward_s=forward_s, backward_s=backward_s, optimizer_s=optimizer_s, loss=loss
        )

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self.writer.close()
