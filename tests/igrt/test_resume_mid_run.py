"""A run resumed from a checkpoint taken in the middle of training continues it bit for bit.

The tiny GPT is pre-trained in place when it is built; its last pre-training step's gradients
once stayed on the parameters and were added to post-training's first step (twice the gradient
norm at step 0, and again at the first step of every resumed run), so a run resumed from step 3
diverged from the uninterrupted one at once.
"""

from __future__ import annotations

import csv
from pathlib import Path

import torch

from igrt.cli import main
from igrt.workloads import make_workload

COLS = ("step", "rank", "values_bytes", "indices_bytes", "residual_norm", "x_loss")


def _rows(run: Path) -> list[tuple[str, ...]]:
    with (run / "metrics.csv").open() as f:
        return [tuple(r[c] for c in COLS) for r in csv.DictReader(f)]


def _train(out: Path, *extra: str) -> None:
    argv = ["train", "--workload", "gpt", "--tiny", "--policy", "topk", "--ranks", "2", "--backend", "gloo",
            "--steps", "6", "--no-eval", "--quiet", "--out", str(out), *extra]  # fmt: skip
    assert main(argv) == 0


def test_a_built_workload_holds_no_gradients() -> None:
    w = make_workload("gpt", tiny=True, seed=0)
    assert all(p.grad is None for p in w.model.parameters())


def test_resume_from_a_mid_run_checkpoint_is_bit_for_bit(tmp_path: Path) -> None:
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    _train(full, "--checkpoint-every", "3")
    _train(resumed, "--resume", str(full / "checkpoint" / "step-000003"))
    want = [r for r in _rows(full) if int(r[0]) >= 3]
    assert _rows(resumed) == want and len(want) == 6
    a, b = torch.load(full / "model.pt"), torch.load(resumed / "model.pt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
