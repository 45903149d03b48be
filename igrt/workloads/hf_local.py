"""Your own model on your own data: a local Hugging Face checkpoint and a JSONL / text / CSV file.

``igrt train --model DIR --data FILE`` (workload ``hf``). The checkpoint is loaded with
``local_files_only=True`` (nothing is downloaded): ``AutoModelForSequenceClassification`` when a
``label_column`` is given, else ``AutoModelForCausalLM``; the tokenizer is ``AutoTokenizer`` from the
same directory (or ``spec.tokenizer``).

Data (docs/runtime.md, "Your own model and data"):

- ``.jsonl``: one JSON object per line; the text is ``text_column``, the label ``label_column``;
- ``.csv``: a header row, then one example per row (the same column names);
- ``.txt`` (any other suffix): one example per non-empty line (causal LM only: no labels).

Examples are split into train / held-out by a CRC-32 of their text (about ``heldout_fraction``
held out, at least one; the same split on every rank, run and machine). Causal LM: each text is
tokenized, followed by the end-of-text token, cut into windows of ``seq_len`` (the last one padded;
padding is masked out of the loss); the metric is held-out loss (nats per token) and perplexity.
Classification: texts truncated / padded to ``seq_len``; labels are the sorted distinct values of
the label column; the metric is held-out accuracy, reported with the majority-class floor (the
accuracy of always answering the most frequent training label).
"""

from __future__ import annotations

import csv
import functools
import json
import math
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from igrt.workloads import Workload, WorkloadSpec, _check_shard, _device_of

__all__ = ["HFLocalWorkload", "TextData", "describe", "read_examples"]

DEFAULT_SEQ_LEN = 128
EVAL_BATCH = 32
MAX_EVAL_WINDOWS = 512
DEFAULT_LR = 5e-5


@dataclass(frozen=True, kw_only=True)
class TextData:
    """A data file's examples split into train / held-out; ``labels`` None for causal LM."""

    path: str
    train_texts: tuple[str, ...]
    heldout_texts: tuple[str, ...]
    train_labels: tuple[str, ...] | None
    heldout_labels: tuple[str, ...] | None

    @property
    def classes(self) -> tuple[str, ...]:
        return tuple(sorted(set(self.train_labels or ()) | set(self.heldout_labels or ())))


def _rows(path: Path) -> Iterator[tuple[int, dict | str]]:
    """(line number, row) of a data file: dicts for JSONL / CSV, strings for text."""
    suffix = path.suffix.lower()
    with path.open(encoding="utf-8", newline="" if suffix == ".csv" else None) as f:
        if suffix == ".csv":
            reader = csv.DictReader(f)
            if not reader.fieldnames:
                raise ValueError(f"--data {path}: empty CSV (no header row)")
            for row in reader:
                yield reader.line_num, row
        elif suffix in (".jsonl", ".ndjson"):
            for i, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"--data {path}:{i}: not valid JSON ({e.msg})") from None
                if not isinstance(row, dict):
                    raise ValueError(f"--data {path}:{i}: expected a JSON object per line")
                yield i, row
        else:
            for i, line in enumerate(f, 1):
                if line.strip():
                    yield i, line.rstrip("\n")


def _field(path: Path, line: int, row: dict, column: str, flag: str) -> str:
    if column not in row:
        raise ValueError(f"--data {path}:{line}: no column {column!r} ({flag}; the row has {sorted(row)})")
    value = row[column]
    if value is None or isinstance(value, (dict, list)):
        raise ValueError(f"--data {path}:{line}: column {column!r} must be a string or number, got {value!r}")
    return str(value)


@functools.lru_cache(maxsize=4)
def read_examples(
    path: str, *, text_column: str = "text", label_column: str | None = None, heldout_fraction: float = 0.1
) -> TextData:
    """Read and split a data file (see the module doc); ValueError naming the file, line and column."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"--data {path}: no such file")
    texts: list[str] = []
    labels: list[str] = []
    for line, row in _rows(p):
        if isinstance(row, str):
            if label_column is not None:
                raise ValueError(f"--data {path}: a text file has no columns; use .jsonl or .csv for --label-column")
            texts.append(row)
            continue
        texts.append(_field(p, line, row, text_column, "--text-column"))
        if label_column is not None:
            labels.append(_field(p, line, row, label_column, "--label-column"))
    if len(texts) < 2:
        raise ValueError(f"--data {path}: {len(texts)} examples; need >= 2 (some to train on, some held out)")
    units = [zlib.crc32(f"{i}\0{t}".encode()) / 2**32 for i, t in enumerate(texts)]
    held = {i for i, u in enumerate(units) if u < heldout_fraction}
    if not held:
        held = {int(np.argmin(units))}
    if len(held) == len(texts):
        held.discard(int(np.argmax(units)))
    train_idx = [i for i in range(len(texts)) if i not in held]
    held_idx = sorted(held)
    lab = labels if label_column is not None else None
    data = TextData(
        path=str(path),
        train_texts=tuple(texts[i] for i in train_idx),
        heldout_texts=tuple(texts[i] for i in held_idx),
        train_labels=tuple(lab[i] for i in train_idx) if lab is not None else None,
        heldout_labels=tuple(lab[i] for i in held_idx) if lab is not None else None,
    )
    if lab is not None and len(data.classes) < 2:
        raise ValueError(f"--data {path}: column {label_column!r} has {len(data.classes)} distinct label(s); need >= 2")
    return data


def _data(spec: WorkloadSpec) -> TextData:
    return read_examples(
        str(spec.data),
        text_column=spec.text_column,
        label_column=spec.label_column,
        heldout_fraction=spec.heldout_fraction,
    )


def _check_model_dir(spec: WorkloadSpec) -> Path:
    path = Path(str(spec.model))
    if not (path / "config.json").is_file():
        raise ValueError(f"--model {path}: not a Hugging Face checkpoint directory (no config.json)")
    return path


def describe(spec: WorkloadSpec) -> str:
    """Check the model directory and the data file; a one-line note for the user."""
    path = _check_model_dir(spec)
    data = _data(spec)
    task = f"classification of {spec.label_column!r} ({len(data.classes)} classes)" if spec.label_column else "causal LM"
    return (
        f"hf: {path} ({task}), data {data.path}: {len(data.train_texts)} train / "
        f"{len(data.heldout_texts)} held-out examples"
    )


def _load_tokenizer(spec: WorkloadSpec):
    from transformers import AutoTokenizer

    from igrt.workloads.minilm import _quiet_transformers

    where = spec.tokenizer or spec.model
    try:
        with _quiet_transformers():
            tok = AutoTokenizer.from_pretrained(str(where), local_files_only=True)
    except (OSError, ValueError) as e:
        raise ValueError(f"--tokenizer {where}: cannot load a tokenizer from it ({e})") from None
    if tok.pad_token is None:
        fallback = tok.eos_token or tok.unk_token
        if fallback is None:
            raise ValueError(f"--tokenizer {where}: has no pad, end-of-text or unknown token to pad with")
        tok.pad_token = fallback
    return tok


def _max_positions(config) -> int | None:
    for key in ("n_positions", "max_position_embeddings", "n_ctx", "max_seq_len"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


class HFLocalWorkload(Workload):
    """A local checkpoint trained on a local file (see the module doc)."""

    def __init__(self, spec: WorkloadSpec, *, seed: int) -> None:
        from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

        from igrt.workloads.minilm import _quiet_transformers

        self.name, self.tiny, self.seed, self.spec = "hf", False, int(seed), spec
        self.lr = DEFAULT_LR
        path = _check_model_dir(spec)
        self.data = _data(spec)
        self.classify = spec.label_column is not None
        self.tokenizer = _load_tokenizer(spec)
        torch.manual_seed(self.seed)  # a new classification head's initialisation
        try:
            with _quiet_transformers():
                if self.classify:
                    classes = self.data.classes
                    self.model = AutoModelForSequenceClassification.from_pretrained(
                        str(path),
                        local_files_only=True,
                        num_labels=len(classes),
                        id2label=dict(enumerate(classes)),
                        label2id={c: i for i, c in enumerate(classes)},
                        ignore_mismatched_sizes=True,
                    )
                else:
                    self.model = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True)
        except (OSError, ValueError) as e:
            raise ValueError(f"--model {path}: cannot load it as a {'classifier' if self.classify else 'causal LM'} ({e})") from None
        if not self.classify and getattr(self.model, "loss_type", "") is None:
            self.model.loss_type = "ForCausalLM"  # the default, named so transformers does not warn
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        limit = _max_positions(self.model.config)
        self.seq_len = int(spec.seq_len or min(DEFAULT_SEQ_LEN, limit or DEFAULT_SEQ_LEN))
        if limit is not None and self.seq_len > limit:
            raise ValueError(f"--seq-len {self.seq_len} is longer than the model's {limit} positions")
        _ = self._tensors  # tokenize now, while the caller says "loading the model and data"
        self.model.train()

    # ------------------------------------------------------------------ tensors
    def _windows(self, texts: tuple[str, ...]) -> dict[str, torch.Tensor]:
        """Causal LM: every text's tokens + end-of-text, cut into ``seq_len`` windows (last padded)."""
        tok, n = self.tokenizer, self.seq_len
        eos = tok.eos_token_id
        rows = []
        for ids in tok(list(texts), add_special_tokens=True)["input_ids"]:
            ids = [*ids, eos] if eos is not None else list(ids)
            rows += [ids[i : i + n] for i in range(0, len(ids), n) if len(ids[i : i + n]) >= 2]
        if not rows:
            raise ValueError(f"--data {self.data.path}: no text of two or more tokens")
        ids = torch.full((len(rows), n), int(tok.pad_token_id), dtype=torch.long)
        mask = torch.zeros(len(rows), n, dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r)
            mask[i, : len(r)] = 1
        return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}

    def _classified(self, texts: tuple[str, ...], labels: tuple[str, ...]) -> dict[str, torch.Tensor]:
        out = self.tokenizer(
            list(texts), padding="max_length", truncation=True, max_length=self.seq_len, return_tensors="pt"
        )
        index = {c: i for i, c in enumerate(self.data.classes)}
        batch = {k: out[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in out}
        batch["labels"] = torch.tensor([index[y] for y in labels], dtype=torch.long)
        return batch

    @functools.cached_property
    def _tensors(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """(train, held-out) tensors, tokenized once."""
        d = self.data
        if self.classify:
            return self._classified(d.train_texts, d.train_labels), self._classified(d.heldout_texts, d.heldout_labels)
        return self._windows(d.train_texts), self._windows(d.heldout_texts)

    # ------------------------------------------------------------------ the Workload surface
    def train_batches(self, rank: int, world_size: int, batch_size: int) -> Iterator[dict[str, torch.Tensor]]:
        """Epochs over the training examples (windows), reshuffled per epoch under the seed; rank r
        takes every world_size-th of the permutation; a shard smaller than a batch is repeated."""
        _check_shard(rank, world_size, batch_size)
        train, _ = self._tensors
        n = len(train["input_ids"])
        epoch = 0
        while True:
            perm = np.random.default_rng([self.seed, epoch]).permutation(n)[rank::world_size]
            if len(perm) == 0:
                perm = np.array([rank % n])
            if len(perm) < batch_size:
                perm = np.resize(perm, batch_size)
            for start in range(0, len(perm) - batch_size + 1, batch_size):
                idx = torch.from_numpy(perm[start : start + batch_size])
                yield {k: v[idx] for k, v in train.items()}
            epoch += 1

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module) -> dict[str, float]:
        """Causal LM: ``loss`` (nats per token) and ``perplexity``. Classification: ``accuracy``,
        ``loss`` and ``majority_floor``. Both over the held-out split (at most 512 windows)."""
        _, held = self._tensors
        num = min(len(held["input_ids"]), MAX_EVAL_WINDOWS)
        device = _device_of(model)
        was_training = model.training
        model.eval()
        loss_sum, correct, count = 0.0, 0, 0
        try:
            for i in self._eval_starts(num, EVAL_BATCH):
                batch = {k: v[i : min(i + EVAL_BATCH, num)].to(device) for k, v in held.items()}
                labels = batch.pop("labels")
                logits = model(**batch).logits.float()
                if self.classify:
                    correct += int((logits.argmax(-1) == labels).sum())
                    loss_sum += float(torch.nn.functional.cross_entropy(logits, labels, reduction="sum"))
                    count += len(labels)
                else:
                    target = labels[:, 1:]
                    loss_sum += float(
                        torch.nn.functional.cross_entropy(
                            logits[:, :-1].reshape(-1, logits.shape[-1]), target.reshape(-1),
                            ignore_index=-100, reduction="sum",
                        )
                    )  # fmt: skip
                    count += int((target != -100).sum())
        finally:
            model.train(was_training)
        loss = loss_sum / max(count, 1)
        if not self.classify:
            return {"loss": loss, "perplexity": math.exp(min(loss, 50.0)), "num_tokens": float(count)}
        majority = Counter(self.data.train_labels).most_common(1)[0][0]
        floor = sum(y == majority for y in self.data.heldout_labels[:num]) / num
        return {"accuracy": correct / count, "loss": loss, "majority_floor": floor, "num_examples": float(count)}

    def optimizer(self, model: torch.nn.Module) -> torch.optim.Optimizer:
        return self._adamw(model, weight_decay=0.01)
