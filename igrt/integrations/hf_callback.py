"""Record a gradient trace from a Hugging Face ``Trainer`` run.

    trainer.add_callback(TraceRecorderCallback(directory="trace/", density=0.01))
    trainer.train()

The callback creates a :class:`igrt.trace.recorder.TraceRecorder` on the model when training begins and
drives it from the Trainer's events: ``on_step_begin`` opens an optimizer step,
``on_pre_optimizer_step`` (after the last micro-batch's backward, after gradient clipping) records
it, ``on_step_end`` writes the step's times, ``on_train_end`` closes the trace. Forward times,
per-parameter ready times and the loss come from the recorder's hooks on the model.

What the trace observes differs from :mod:`igrt.cli.record` in two ways, both written into the
manifest's ``extra``: gradients are clipped when ``max_grad_norm > 0``, and in a multi-process run
the Trainer's DDP has already averaged them across ranks (``gradient`` says which).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch.distributed as dist
from transformers import TrainerCallback

from igrt.trace.recorder import TraceRecorder

__all__ = ["TraceRecorderCallback"]


class TraceRecorderCallback(TrainerCallback):
    """A ``TrainerCallback`` that writes a gradient trace into ``directory``.

    Keyword arguments as :class:`~igrt.trace.recorder.TraceRecorder` (``grad_accum_steps`` is taken from
    the Trainer's ``gradient_accumulation_steps``). ``recorder`` is available once training began.
    """

    def __init__(
        self,
        *,
        directory: str | Path,
        sparsifier: str = "topk",
        density: float = 0.01,
        workload: str = "",
        command: str = "",
        rows_per_part: int = 200_000,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.sparsifier = sparsifier
        self.density = float(density)
        self.workload = workload
        self.command = command
        self.rows_per_part = rows_per_part
        self.extra = dict(extra or {})
        self.recorder: TraceRecorder | None = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if model is None:
            raise ValueError("TraceRecorderCallback: the Trainer passed no model to on_train_begin")
        distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        max_grad_norm = float(getattr(args, "max_grad_norm", 0.0) or 0.0)
        extra = {
            "recorded_by": "igrt.integrations.hf_callback.TraceRecorderCallback",
            "gradient": "averaged across ranks by the Trainer's DDP" if distributed else "raw local gradient",
            "max_grad_norm": max_grad_norm,
            "clipped": max_grad_norm > 0,
            **self.extra,
        }
        self.recorder = TraceRecorder(
            model,
            directory=self.directory,
            sparsifier=self.sparsifier,
            density=self.density,
            grad_accum_steps=int(getattr(args, "gradient_accumulation_steps", 1) or 1),
            workload=self.workload or type(model).__name__,
            command=self.command,
            rows_per_part=self.rows_per_part,
            extra=extra,
        )
        return control

    def on_step_begin(self, args, state, control, **kwargs):
        self._rec().begin_step()
        return control

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self._rec().end_backward(boundary=True)
        return control

    def on_step_end(self, args, state, control, **kwargs):
        self._rec().end_step()
        return control

    def on_train_end(self, args, state, control, **kwargs):
        if self.recorder is not None:
            self.recorder.close()
        return control

    def _rec(self) -> TraceRecorder:
        if self.recorder is None:
            raise ValueError("TraceRecorderCallback: a step event arrived before on_train_begin")
        return self.recorder
