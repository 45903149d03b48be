"""A byte-level GPT-2-style decoder: pre-trained briefly on Python sources, post-trained on English.

The model is transformers' ``GPT2LMHeadModel`` (so parameter names are GPT-2's:
``transformer.h.3.attn.c_attn.weight``, …) over 257 tokens: the 256 byte values plus a document
separator. Full size: 4 layers × 256 (≈ 3.3 M parameters), context 128, no dropout.

- Pre-training: ``PRETRAIN_STEPS`` AdamW steps on random windows of the standard library's ``.py``
  sources (:func:`igrt.workloads.data.stdlib_source_bytes`). The result is cached on disk (see
  :func:`cache_dir`), keyed by the configuration, the seed and a checksum of the corpus, so every
  rank and every later run loads the same weights; the write is atomic.
- Post-training (what ``train_batches`` yields): random windows of ``pydoc_data.topics``' training
  topics; the metric is the mean loss on the held-out topics (fixed, evenly spaced windows).

``tiny=True``: 2 layers × 32, context 32, a few pre-training steps in memory (no cache).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
import torch

from igrt.workloads import Workload, _check_shard, _device_of
from igrt.workloads.data import DOC_SEPARATOR, stdlib_source_bytes, topics_split

__all__ = ["GPTWorkload", "cache_dir", "pretrained_state"]

VOCAB_SIZE = 257  # bytes 0..255 and DOC_SEPARATOR
FULL = {"n_layer": 4, "n_embd": 256, "n_head": 4, "n_positions": 128}
TINY = {"n_layer": 2, "n_embd": 32, "n_head": 2, "n_positions": 32}
PRETRAIN_STEPS, PRETRAIN_BATCH, PRETRAIN_LR = 300, 16, 1e-3
TINY_PRETRAIN_STEPS = 3
POSTTRAIN_LR, TINY_LR = 3e-4, 1e-3
EVAL_WINDOWS, EVAL_BATCH = 128, 32


def cache_dir() -> Path:
    """Where pre-trained weights are cached: ``$IGRT_CACHE_DIR`` or ``~/.cache/importance-gradient``."""
    env = os.environ.get("IGRT_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "importance-gradient"


def _tokens(data: bytes) -> torch.Tensor:
    """Bytes -> int64 token ids; NUL (the corpora's document boundary) becomes DOC_SEPARATOR."""
    ids = torch.from_numpy(np.frombuffer(data, dtype=np.uint8).astype(np.int64))
    ids[ids == 0] = DOC_SEPARATOR
    return ids


@functools.lru_cache(maxsize=1)
def _pretrain_tokens() -> torch.Tensor:
    return _tokens(stdlib_source_bytes())


@functools.lru_cache(maxsize=1)
def _topic_tokens() -> tuple[torch.Tensor, torch.Tensor]:
    train, held = topics_split()
    return _tokens(train), _tokens(held)


def _windows(tokens: torch.Tensor, starts: np.ndarray, length: int) -> torch.Tensor:
    idx = torch.from_numpy(starts.astype(np.int64))[:, None] + torch.arange(length)[None, :]
    return tokens[idx]


def _build(shape: Mapping[str, int]) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=VOCAB_SIZE,
        bos_token_id=DOC_SEPARATOR,
        eos_token_id=DOC_SEPARATOR,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        **shape,
    )
    model = GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"  # the default, named so transformers does not warn about it
    return model


def _pretrain(
    model: torch.nn.Module, *, steps: int, batch_size: int, length: int, lr: float, seed: int
) -> None:
    """AdamW on random windows of the standard library's sources, linear warm-up over 10 % of steps."""
    tokens = _pretrain_tokens()
    rng = np.random.default_rng([seed, 0xC0DE])
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    warmup = max(1, steps // 10)
    model.train()
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr * min(1.0, (step + 1) / warmup)
        ids = _windows(tokens, rng.integers(0, len(tokens) - length, size=batch_size), length)
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    model.zero_grad(set_to_none=True)  # the last step's gradients must not leak into post-training's first


def pretrained_state(*, seed: int, steps: int = PRETRAIN_STEPS) -> dict[str, torch.Tensor]:
    """The full-size model's state after pre-training under ``seed``: from the cache, else trained
    now (a minute or two on 2 CPU threads) and cached atomically."""
    corpus = stdlib_source_bytes()
    key = json.dumps(
        {
            "shape": FULL,
            "vocab": VOCAB_SIZE,
            "steps": steps,
            "batch": PRETRAIN_BATCH,
            "lr": PRETRAIN_LR,
            "seed": seed,
            "corpus_bytes": len(corpus),
            "corpus_crc": zlib.crc32(corpus),
        },
        sort_keys=True,
    )
    path = cache_dir() / f"gpt-pretrained-{hashlib.sha256(key.encode()).hexdigest()[:16]}.pt"
    if path.is_file():
        return torch.load(path, map_location="cpu", weights_only=True)
    torch.manual_seed(seed)
    model = _build(FULL)
    _pretrain(
        model, steps=steps, batch_size=PRETRAIN_BATCH, length=FULL["n_positions"], lr=PRETRAIN_LR, seed=seed
    )
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    torch.save(state, tmp)
    os.replace(tmp, path)
    return state


class GPTWorkload(Workload):
    """Post-train a briefly pre-trained byte-level GPT-2 on ``pydoc_data.topics``; held-out loss."""

    def __init__(self, *, tiny: bool, seed: int) -> None:
        self.name, self.tiny, self.seed = "gpt", bool(tiny), int(seed)
        shape = TINY if self.tiny else FULL
        self.length = shape["n_positions"]
        self.lr = TINY_LR if self.tiny else POSTTRAIN_LR
        torch.manual_seed(self.seed)
        self.model = _build(shape)
        if self.tiny:
            _pretrain(
                self.model, steps=TINY_PRETRAIN_STEPS, batch_size=4, length=self.length, lr=TINY_LR, seed=seed
            )
        else:
            self.model.load_state_dict(pretrained_state(seed=self.seed))
        self.model.train()

    def train_batches(self, rank: int, world_size: int, batch_size: int) -> Iterator[dict[str, torch.Tensor]]:
        """Random windows of the training topics; rank r draws from its own generator (seed, r)."""
        _check_shard(rank, world_size, batch_size)
        tokens, _ = _topic_tokens()
        rng = np.random.default_rng([self.seed, rank, world_size])
        while True:
            ids = _windows(tokens, rng.integers(0, len(tokens) - self.length, size=batch_size), self.length)
            yield {"input_ids": ids, "labels": ids}

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module) -> dict[str, float]:
        """``loss`` (nats per predicted byte) and ``bits_per_byte`` on evenly spaced held-out windows."""
        _, tokens = _topic_tokens()
        num = min(EVAL_WINDOWS, (len(tokens) - 1) // self.length)
        starts = np.linspace(0, len(tokens) - self.length - 1, num=num).astype(np.int64)
        device = _device_of(model)
        was_training = model.training
        model.eval()
        total = 0.0
        try:
            for i in self._eval_starts(num, EVAL_BATCH):
                ids = _windows(tokens, starts[i : i + EVAL_BATCH], self.length).to(device)
                total += float(model(input_ids=ids, labels=ids).loss) * len(ids)
        finally:
            model.train(was_training)
        loss = total / num
        return {"loss": loss, "bits_per_byte": loss / math.log(2), "num_windows": float(num)}

    def optimizer(self, model: torch.nn.Module) -> torch.optim.Optimizer:
        return self._adamw(model, weight_decay=0.01)
