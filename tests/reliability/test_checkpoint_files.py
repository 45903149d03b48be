"""Truncated and corrupt checkpoint files (issue 17, item 5).

A checkpoint is complete when its ``manifest.json`` (size and sha256 of every file, written last)
is there and every file matches it. Resume takes the newest checkpoint that verifies and names the
broken file of any newer one it skips; with none left it is a one-line error naming the file, never
a traceback. A failed write leaves no ``.tmp`` behind. The unit tests run one rank in this process
(no process group); the end-to-end test runs ``igrt train`` as a one-rank torchrun job in this
process, and its resumed run must equal the uninterrupted one bit for bit.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from igpolicy.config import PolicyConfig
from igrt.sync.synchronizer import Synchronizer
from igrt.train.checkpoint import MANIFEST_NAME, STATE_NAME, load_checkpoint, save_checkpoint
from tests.igrt.tiny_model import TinyLM

torch.set_num_threads(1)
META = {"workload": "tiny", "tiny": True, "seed": 0, "batch_size": 3, "grad_accum": 1}


def _build(seed: int = 0):
    torch.manual_seed(seed)
    model = TinyLM()
    sync = Synchronizer(model, config=PolicyConfig(policy="topk", density=0.1, seed=1), plan=None)
    return model, sync, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _train_and_save(root: Path, steps: int, *, every: int = 2):
    model, sync, opt = _build()
    for t in range(steps):
        opt.zero_grad(set_to_none=True)
        model.loss(torch.randint(0, 50, (3, 9), generator=torch.Generator().manual_seed(t))).backward()
        sync.step()
        opt.step()
        if (t + 1) % every == 0:
            save_checkpoint(root, step=t + 1, model=model, optimizer=opt, sync=sync, rank=0, world_size=1, meta=META)
    return model


def _load(root: Path) -> int:
    model, sync, opt = _build(seed=5)
    return load_checkpoint(root, model=model, optimizer=opt, sync=sync, rank=0, world_size=1, meta=META)


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_checkpoint_folder_holds_a_manifest_of_every_file(tmp_path) -> None:
    _train_and_save(tmp_path, 4)
    kept = sorted(p.name for p in tmp_path.glob("step-*"))
    assert kept == ["step-000002", "step-000004"]  # the newest two: one to fall back to
    manifest = json.loads((tmp_path / "step-000004" / MANIFEST_NAME).read_text())
    names = {p.name for p in (tmp_path / "step-000004").iterdir()} - {MANIFEST_NAME}
    assert set(manifest["files"]) == names == {STATE_NAME, "rng-rank000.pt", "igsync-rank000.pt"}
    for name, entry in manifest["files"].items():
        assert entry["size_bytes"] == (tmp_path / "step-000004" / name).stat().st_size
        assert len(entry["sha256"]) == 64
    assert not list(tmp_path.rglob("*.tmp"))


@pytest.mark.parametrize("broken", [STATE_NAME, "rng-rank000.pt", "igsync-rank000.pt"])
@pytest.mark.parametrize("damage", [_truncate, _flip], ids=["truncated", "flipped"])
def test_a_broken_newest_checkpoint_falls_back_to_the_one_before_naming_the_file(
    tmp_path, capsys, broken, damage
) -> None:
    _train_and_save(tmp_path, 4)
    damage(tmp_path / "step-000004" / broken)
    assert _load(tmp_path) == 2
    err = capsys.readouterr().err
    assert "resuming from" in err and "step-000002" in err and f"step-000004/{broken}" in err


def test_a_checkpoint_without_its_manifest_is_incomplete(tmp_path, capsys) -> None:
    _train_and_save(tmp_path, 4)
    (tmp_path / "step-000004" / MANIFEST_NAME).unlink()  # a crash before the manifest was written
    assert _load(tmp_path) == 2
    assert "manifest.json is missing" in capsys.readouterr().err


def test_no_checkpoint_that_verifies_is_a_value_error_naming_the_files(tmp_path) -> None:
    _train_and_save(tmp_path, 4)
    _truncate(tmp_path / "step-000004" / STATE_NAME)
    _truncate(tmp_path / "step-000002" / "igsync-rank000.pt")
    with pytest.raises(ValueError) as info:
        _load(tmp_path)
    message = str(info.value)
    assert "no complete checkpoint" in message
    assert f"step-000004/{STATE_NAME}" in message and "step-000002/igsync-rank000.pt" in message
    assert "truncated" in message


def test_a_failed_write_leaves_no_tmp_file(tmp_path, monkeypatch) -> None:
    model, sync, opt = _build()
    original = torch.save

    def save_then_fail(obj, f, *args, **kwargs):  # half a file, then the disk is full
        original(obj, f, *args, **kwargs)
        Path(f).write_bytes(Path(f).read_bytes()[:100])
        raise OSError(28, "No space left on device", str(f))

    monkeypatch.setattr(torch, "save", save_then_fail)
    with pytest.raises(OSError):
        save_checkpoint(tmp_path, step=1, model=model, optimizer=opt, sync=sync, rank=0, world_size=1, meta=META)
    monkeypatch.setattr(torch, "save", original)
    assert not list(tmp_path.rglob("*.tmp")), list(tmp_path.rglob("*"))
    assert not list(tmp_path.rglob(MANIFEST_NAME))
    with pytest.raises(ValueError, match="no complete checkpoint"):
        _load(tmp_path)


def test_the_project_state_loads_with_weights_only_and_a_pickle_payload_is_refused(tmp_path) -> None:
    """Our own files are tensors and plain containers (torch.load(weights_only=True) reads them); a
    train-state.pt that carries a pickled object is refused even with a matching manifest."""
    _train_and_save(tmp_path, 2)
    d = tmp_path / "step-000002"
    for f in d.glob("*.pt"):
        torch.load(f, weights_only=True)
    marker = tmp_path / "pwned"
    torch.save({"format": "igtrain/1", "x": _Payload(str(marker))}, d / STATE_NAME)
    manifest = json.loads((d / MANIFEST_NAME).read_text())
    import hashlib

    data = (d / STATE_NAME).read_bytes()
    manifest["files"][STATE_NAME] = {"size_bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (d / MANIFEST_NAME).write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="cannot read the checkpoint file"):
        _load(tmp_path)
    assert not marker.exists()


class _Payload:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (Path(self.path).write_text, ("code ran",))


# ----------------------------------------------------------------------------- igrt train end to end
ARGV = ["train", "--workload", "minilm", "--tiny", "--policy", "topk", "--nproc", "1", "--backend", "gloo",
        "--steps", "4", "--checkpoint-every", "2", "--batch-size", "4", "--no-eval", "--no-progress"]  # fmt: skip


@pytest.fixture
def one_rank_here(monkeypatch):
    from tests.igrt.dist_util import free_port

    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": str(free_port())}.items():  # fmt: skip
        monkeypatch.setenv(k, v)


def test_igrt_train_resumes_from_the_newest_checkpoint_that_verifies(tmp_path, capsys, one_rank_here) -> None:
    from igrt.cli import main

    full = tmp_path / "full"
    assert main([*ARGV, "--out", str(full)]) == 0
    crashed = tmp_path / "crashed"
    shutil.copytree(full / "checkpoint", crashed / "checkpoint")
    _truncate(crashed / "checkpoint" / "step-000004" / STATE_NAME)
    (crashed / "checkpoint" / "step-000004" / STATE_NAME).with_suffix(".pt.tmp").write_bytes(b"")
    capsys.readouterr()
    resumed = tmp_path / "resumed"
    assert main([*ARGV, "--out", str(resumed), "--resume", str(crashed)]) == 0
    err = capsys.readouterr().err
    assert f"step-000004/{STATE_NAME}" in err and "truncated" in err
    assert json.loads((resumed / "summary.json").read_text())["start_step"] == 2
    a = torch.load(full / "model.pt", weights_only=True)
    b = torch.load(resumed / "model.pt", weights_only=True)
    assert all(torch.equal(a[k], b[k]) for k in a)
    # every checkpoint broken: one line naming the file, exit 2
    _truncate(crashed / "checkpoint" / "step-000002" / "rng-rank000.pt")
    assert main([*ARGV, "--out", str(tmp_path / "again"), "--resume", str(crashed)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "step-000002/rng-rank000.pt" in err and "no complete checkpoint" in err
