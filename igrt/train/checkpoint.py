"""Checkpoints of ``igrt train``: one folder per checkpoint, verified by a manifest written last.

``save_checkpoint`` writes ``step-NNNNNN/`` with every rank's sync state and RNG state and rank 0's
``train-state.pt`` (model, optimizer, step, run settings), then rank 0's ``manifest.json`` — the
size and sha256 of every file — last, so its presence marks a complete checkpoint; the newest
:data:`KEEP_CHECKPOINTS` complete ones are kept. ``load_checkpoint`` restores the newest checkpoint
whose files all match the manifest: a truncated or corrupt file, or a folder without a manifest (a
crash while it was written), is named and skipped for the one before it. Every file is written to a
``.tmp`` name and renamed; a failed write removes its ``.tmp``. See docs/runtime.md ("Outputs") and
docs/reliability.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from igrt.sync.checkpoint import load_sync_state, save_sync_state, sync_state_path

__all__ = [
    "CHECKPOINT_FORMAT",
    "KEEP_CHECKPOINTS",
    "MANIFEST_FORMAT",
    "MANIFEST_NAME",
    "STATE_NAME",
    "barrier",
    "load_checkpoint",
    "save_checkpoint",
    "verify_checkpoint",
]

STATE_NAME = "train-state.pt"
MANIFEST_NAME = "manifest.json"
CHECKPOINT_FORMAT = "igtrain/1"
MANIFEST_FORMAT = "igtrain-manifest/1"
KEEP_CHECKPOINTS = 2  # the newest complete checkpoints kept: one to fall back to if the last is broken
_RESUME_KEYS = ("workload", "tiny", "seed", "batch_size", "grad_accum")


def barrier(world_size: int) -> None:
    """``dist.barrier()`` when there is more than one rank."""
    if world_size > 1:
        dist.barrier()


@contextlib.contextmanager
def _discard_on_failure(tmp: Path) -> Iterator[None]:
    """A block whose failure removes ``tmp`` (no ``.tmp`` is left behind)."""
    try:
        yield
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def _atomic_save(obj: Any, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with _discard_on_failure(tmp):
        torch.save(obj, tmp)
        tmp.replace(path)


def _atomic_write_text(text: str, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with _discard_on_failure(tmp):
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)


def _digest(path: Path) -> dict[str, Any]:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return {"size_bytes": path.stat().st_size, "sha256": h.hexdigest()}


def _gather_to_rank0(obj: Any, *, rank: int, world_size: int) -> list[Any]:
    if world_size == 1 or not dist.is_initialized():
        return [obj]
    got: list[Any] | None = [None] * world_size if rank == 0 else None
    dist.gather_object(obj, got, dst=0)
    return got or []


def save_checkpoint(
    directory: str | Path, *, step: int, model, optimizer, sync, rank: int, world_size: int, meta: dict
) -> None:
    """Into ``directory/step-{step:06d}/``: every rank its sync state (``igsync-rank*.pt``) and RNG
    state (``rng-rank*.pt``); rank 0 ``train-state.pt`` (model, optimizer, step, run settings) and
    then ``manifest.json`` (size and sha256 of every file of every rank), written last, so its
    presence marks a complete checkpoint; then rank 0 removes all but the newest
    :data:`KEEP_CHECKPOINTS` ``step-*`` folders. A crash at any moment leaves the last complete
    checkpoints intact. ``step`` is the number of steps done. Collective: every rank calls it."""
    root = Path(directory)
    d = root / f"step-{step:06d}"
    d.mkdir(parents=True, exist_ok=True)
    if rank == 0:  # a folder of this step from a run that crashed while writing it: not complete
        with contextlib.suppress(FileNotFoundError):
            (d / MANIFEST_NAME).unlink()
    sync_path = sync_state_path(d, rank=rank)
    with _discard_on_failure(sync_path.with_name(sync_path.name + ".tmp")):
        save_sync_state(sync, d, rank=rank)
    rng = {"step": step, "rank": rank, "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        rng["cuda"] = torch.cuda.get_rng_state()
    rng_path = d / f"rng-rank{rank:03d}.pt"
    _atomic_save(rng, rng_path)
    mine = {p.name: _digest(p) for p in (sync_path, rng_path)}
    everyone = _gather_to_rank0(mine, rank=rank, world_size=world_size)  # also: every rank is done
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
        files = {name: entry for part in everyone for name, entry in part.items()}
        files[STATE_NAME] = _digest(d / STATE_NAME)
        manifest = {"format": MANIFEST_FORMAT, "step": step, "world_size": world_size, "files": files}
        _atomic_write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n", d / MANIFEST_NAME)
        # keep this one and the complete one(s) before it; never touch a newer folder (the broken
        # checkpoint a resumed run fell back from is replaced when the run gets there)
        older = sorted(p for p in root.glob("step-*") if p.name < d.name)
        complete = [p for p in older if (p / MANIFEST_NAME).is_file()]
        keep = set(complete[len(complete) - (KEEP_CHECKPOINTS - 1) :]) if KEEP_CHECKPOINTS > 1 else set()
        for old in older:
            if old not in keep:
                shutil.rmtree(old, ignore_errors=True)
    barrier(world_size)


# --------------------------------------------------------------------------- loading
def _candidates(path: str | Path) -> list[Path]:
    """Checkpoint folders under PATH/checkpoint or PATH (``step-*``, newest first), or PATH itself."""
    p = Path(path)
    for base in (p / "checkpoint", p):
        found = sorted((d for d in base.glob("step-*") if d.is_dir()), reverse=True)
        if found:
            return found
    if (p / MANIFEST_NAME).is_file() or (p / STATE_NAME).is_file():
        return [p]
    return []


def _read_manifest(d: Path) -> dict[str, Any]:
    """The manifest of ``d``; ValueError saying why it is not a usable one."""
    m = d / MANIFEST_NAME
    if not m.is_file():
        raise ValueError(f"{m} is missing (the checkpoint was not finished)")
    try:
        manifest = json.loads(m.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{m}: unreadable ({e})") from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if manifest.get("format") != MANIFEST_FORMAT or not isinstance(files, dict):
        raise ValueError(f"{m}: not a {MANIFEST_FORMAT} manifest")
    return manifest


def verify_checkpoint(d: str | Path, *, rank: int, world_size: int) -> str | None:
    """None when the files ``rank`` needs from checkpoint folder ``d`` (``train-state.pt``, its sync
    and RNG state) match ``manifest.json``; else why not, naming the file. ValueError when the
    checkpoint is of another world size (residuals cannot move between ranks)."""
    d = Path(d)
    try:
        manifest = _read_manifest(d)
    except ValueError as e:
        return str(e)
    if manifest.get("world_size") != world_size:
        raise ValueError(
            f"{d}: written by {manifest.get('world_size')} ranks (residuals unflushed); resume with "
            f"--nproc {manifest.get('world_size')}"
        )
    for name in (STATE_NAME, f"rng-rank{rank:03d}.pt", sync_state_path(d, rank=rank).name):
        path, entry = d / name, manifest["files"].get(name)
        if not isinstance(entry, dict):
            return f"{path}: not listed in {MANIFEST_NAME}"
        if not path.is_file():
            return f"{path} is missing"
        try:
            got = _digest(path)
        except OSError as e:
            return f"{path}: unreadable ({e.strerror or e})"
        if got["size_bytes"] != entry.get("size_bytes"):
            return f"{path}: {got['size_bytes']} bytes, {MANIFEST_NAME} says {entry.get('size_bytes')} (truncated?)"
        if got["sha256"] != entry.get("sha256"):
            return f"{path}: its sha256 differs from {MANIFEST_NAME} (corrupt)"
    return None


def _agree(value: Any, *, world_size: int) -> list[Any]:
    """Every rank's ``value`` on every rank (one all-gather; just [value] on one rank)."""
    if world_size == 1 or not dist.is_initialized():
        return [value]
    got: list[Any] = [None] * world_size
    dist.all_gather_object(got, value)
    return got


def _choose(path: str | Path, *, rank: int, world_size: int) -> Path:
    """The newest checkpoint whose files verify on every rank (rank 0's list of candidates)."""
    names = [str(d) for d in _candidates(path)]
    if world_size > 1 and dist.is_initialized():
        box = [names]
        dist.broadcast_object_list(box, src=0)
        names = box[0]
    broken: list[str] = []
    for name in names:
        try:
            verdict = ("broken", verify_checkpoint(name, rank=rank, world_size=world_size))
        except ValueError as e:  # another world size: an error on every rank, not a fallback
            verdict = ("fatal", str(e))
        verdicts = _agree(verdict, world_size=world_size)
        fatal = [why for kind, why in verdicts if kind == "fatal"]
        if fatal:
            raise ValueError(fatal[0])
        problems = [why for _, why in verdicts if why is not None]
        if not problems:
            if broken and rank == 0:
                print(f"igrt: resuming from {name}; skipped: " + "; ".join(broken), file=sys.stderr)
            return Path(name)
        broken.append(f"{Path(name).name}: {problems[0]}")
    where = f"--resume {path}"
    if not names:
        raise ValueError(f"{where}: no checkpoint there (step-*/{MANIFEST_NAME} in it or in its checkpoint/)")
    raise ValueError(f"{where}: no complete checkpoint ({'; '.join(broken)})")


def _load(path: Path) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # verified, yet unreadable: a file of another torch or another format
        raise ValueError(f"{path}: cannot read the checkpoint file ({type(e).__name__}: {e})") from None


def load_checkpoint(
    directory: str | Path, *, model, optimizer, sync, rank: int, world_size: int, meta: dict
) -> int:
    """Restore the newest checkpoint under ``directory`` whose files verify (see the module doc);
    returns the steps done. ValueError naming the broken file when none does, and naming any
    mismatch (run settings, world size, a rank's files from another step, plan/config/params).
    Collective: every rank calls it."""
    d = _choose(directory, rank=rank, world_size=world_size)
    state = _load(d / STATE_NAME)
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{d / STATE_NAME}: not a {CHECKPOINT_FORMAT} checkpoint")
    diffs = [
        f"{k}: checkpoint {state['meta'].get(k)!r}, now {meta.get(k)!r}"
        for k in _RESUME_KEYS
        if state["meta"].get(k) != meta.get(k)
    ]
    if diffs:
        raise ValueError(f"{d}: the checkpoint is of another run: " + "; ".join(diffs))
    step = int(state["step"])
    rng_path = d / f"rng-rank{rank:03d}.pt"
    rng = _load(rng_path)
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
