"""Checkpoints of ``igrt train``: one folder per checkpoint, complete before older ones go.

``save_checkpoint`` writes ``step-NNNNNN/`` with every rank's sync state and RNG state, then rank 0's
``train-state.pt`` (model, optimizer, step, run settings) last, so its presence marks a complete
checkpoint; ``load_checkpoint`` restores the newest complete one and names any mismatch. See
docs/runtime.md ("Outputs") for the layout and the resume guarantees.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from igrt.sync.checkpoint import load_sync_state, save_sync_state

__all__ = ["CHECKPOINT_FORMAT", "STATE_NAME", "barrier", "load_checkpoint", "save_checkpoint"]

STATE_NAME = "train-state.pt"
CHECKPOINT_FORMAT = "igtrain/1"
_RESUME_KEYS = ("workload", "tiny", "seed", "batch_size", "grad_accum")


def _atomic_save(obj: Any, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    tmp.replace(path)


def barrier(world_size: int) -> None:
    """``dist.barrier()`` when there is more than one rank."""
    if world_size > 1:
        dist.barrier()


def save_checkpoint(
    directory: str | Path, *, step: int, model, optimizer, sync, rank: int, world_size: int, meta: dict
) -> None:
    """Into a fresh ``directory/step-{step:06d}/``: every rank its sync state (``igsync-rank*.pt``)
    and RNG state (``rng-rank*.pt``); then rank 0 ``train-state.pt`` (model, optimizer, step, run
    settings), written last, so its presence marks a complete checkpoint; then rank 0 removes the
    older ``step-*`` folders. A crash at any moment leaves the last complete checkpoint intact.
    ``step`` is the number of steps done. Collective: every rank calls it."""
    root = Path(directory)
    d = root / f"step-{step:06d}"
    d.mkdir(parents=True, exist_ok=True)
    save_sync_state(sync, d, rank=rank)
    rng = {"step": step, "rank": rank, "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        rng["cuda"] = torch.cuda.get_rng_state()
    _atomic_save(rng, d / f"rng-rank{rank:03d}.pt")
    barrier(world_size)
    if rank == 0:
        state = {
            "format": CHECKPOINT_FORMAT,
            "step": step,
            "world_size": world_size,
            "meta": meta,
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
        }
        _atomic_save(state, d / STATE_NAME)
        for old in root.glob("step-*"):
            if old != d:
                shutil.rmtree(old, ignore_errors=True)
    barrier(world_size)


def _resolve_checkpoint(path: str | Path) -> Path:
    """The newest complete ``step-*`` checkpoint under PATH/checkpoint or PATH (or PATH itself)."""
    p = Path(path)
    for base in (p / "checkpoint", p):
        complete = sorted(d for d in base.glob("step-*") if (d / STATE_NAME).is_file())
        if complete:
            return complete[-1]
    if (p / STATE_NAME).is_file():
        return p
    raise ValueError(
        f"--resume {p}: no complete checkpoint there (step-*/{STATE_NAME} in it or in its checkpoint/)"
    )


def load_checkpoint(
    directory: str | Path, *, model, optimizer, sync, rank: int, world_size: int, meta: dict
) -> int:
    """Restore what :func:`save_checkpoint` wrote; returns the steps done. ValueError naming any
    mismatch (run settings, world size, a rank's files from another step, plan/config/params)."""
    d = _resolve_checkpoint(directory)
    state = torch.load(d / STATE_NAME, map_location="cpu", weights_only=True)
    if state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{d / STATE_NAME}: not a {CHECKPOINT_FORMAT} checkpoint")
    diffs = [
        f"{k}: checkpoint {state['meta'].get(k)!r}, now {meta.get(k)!r}"
        for k in _RESUME_KEYS
        if state["meta"].get(k) != meta.get(k)
    ]
    if diffs:
        raise ValueError(f"{d}: the checkpoint is of another run: " + "; ".join(diffs))
    if state["world_size"] != world_size:
        raise ValueError(
            f"{d}: written by {state['world_size']} ranks (residuals unflushed); resume with "
            f"--nproc {state['world_size']}"
        )
    step = int(state["step"])
    rng_path = d / f"rng-rank{rank:03d}.pt"
    if not rng_path.is_file():
        raise ValueError(f"{d}: incomplete checkpoint ({rng_path.name} is missing)")
    rng = torch.load(rng_path, map_location="cpu", weights_only=True)
    if int(rng["step"]) != step:
        raise ValueError(f"{d}: rng-rank{rank:03d}.pt is of step {rng['step']}, {STATE_NAME} of step {step}")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    load_sync_state(sync, d, rank=rank)
    if _sync_step(sync) != step:
        raise ValueError(f"{d}: the sync state of rank {rank} is at step {_sync_step(sync)}, not {step}")
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["cuda"])
    return step


def _sync_step(sync) -> int:
    return int(getattr(sync, "sync", sync).step_index)
