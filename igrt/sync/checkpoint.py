"""Sync state beside a model checkpoint: one file per rank, ``igsync-rank{r:03d}.pt``.

Residuals are per rank (each rank holds what *it* has not sent yet), so each rank saves and loads
its own file. A state saved at one world size loads at another only after a ``flush()`` emptied
the residuals (``Synchronizer.load_state_dict`` raises ValueError otherwise); a rank of the new run
with no file of its own then reads any rank's (flushed, so equivalent) file.

    save_sync_state(sync, ckpt_dir, rank=rank)     # next to torch.save(model/optimizer state)
    load_sync_state(sync, ckpt_dir, rank=rank)     # after building a new Synchronizer
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

__all__ = ["load_sync_state", "save_sync_state", "sync_state_path"]


def sync_state_path(directory: str | Path, *, rank: int) -> Path:
    """``directory / igsync-rank{rank:03d}.pt``."""
    return Path(directory) / f"igsync-rank{int(rank):03d}.pt"


def _target(sync: Any) -> Any:
    """A Synchronizer, or an object holding one as ``.sync`` (the DDP hook state)."""
    return getattr(sync, "sync", sync)


def save_sync_state(sync: Any, directory: str | Path, *, rank: int) -> Path:
    """Write this rank's sync state (atomically: a temporary file, then a rename); returns the path."""
    path = sync_state_path(directory, rank=rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(_target(sync).state_dict(), tmp)
    tmp.replace(path)
    return path


def load_sync_state(sync: Any, directory: str | Path, *, rank: int) -> Path:
    """Restore this rank's sync state from ``directory``; returns the file read.

    Raises ValueError when the directory has no sync state, or when the state does not match the
    run (plan, config, parameters, sparsifier, or a world-size change without a prior flush).
    """
    path = sync_state_path(directory, rank=rank)
    if not path.exists():
        others = sorted(Path(directory).glob("igsync-rank*.pt"))
        if not others:
            raise ValueError(f"{directory}: no sync state (igsync-rank*.pt) to resume from")
        path = others[0]  # a world-size change: valid only for a flushed state, checked on load
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a truncated or foreign file
        raise ValueError(f"{path}: cannot read sync state ({e})") from None
    try:
        _target(sync).load_state_dict(state)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    return path
