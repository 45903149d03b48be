"""Hugging Face Trainer integration: 2 processes under torchrun, running the snippets of docs/integrations.md.

``test_trainer_under_torchrun`` launches this file with ``python -m torch.distributed.run
--nproc-per-node 2`` (a subprocess with a timeout). Each rank, on the tiny MiniLM workload:

A. records a trace with the recording callback (snippet ``hf-record``) on plain DDP;
B. trains 4 steps (accumulation 2) with the importance hook (snippet ``hf``), checkpoints at 2 and 4;
C. resumes a copy of B's output (without checkpoint-4) from checkpoint-2 (snippet ``hf`` with
   ``resume=True``): it must start from this rank's saved residuals and end bit-identical to B;
D. audits conservation (Σg == Σsent + e per rank) with ``track_sums``.

The model and data are the tiny MiniLM workload's, prepared once by the test; dropout is off so that
B and C are deterministic. The tests in this process check what the ranks
wrote (``result-rank{r}.pt``) and the files in the checkpoints.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "integrations.md"
NUM_EXAMPLES = 64


def doc_snippet(name: str) -> str:
    """The code block that follows ``<!-- snippet: name -->`` in docs/integrations.md."""
    match = re.search(rf"<!-- snippet: {re.escape(name)} -->\s*```\w*\n(.*?)```", DOC.read_text(), re.S)
    assert match, f"docs/integrations.md has no snippet {name!r}"
    return match.group(1)


# --------------------------------------------------------------------------- what each rank runs
def _trainer(output_dir: str, *, max_steps: int, save: bool, logging_steps: int = 0):
    """A Trainer over a fresh copy of the tiny MiniLM workload's model and data (prepared once by the test)."""
    from transformers import Trainer, TrainingArguments

    prepared = torch.load("workload.pt", weights_only=False)
    args = TrainingArguments(
        output_dir=output_dir,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        max_steps=max_steps,
        learning_rate=1e-3,
        max_grad_norm=1.0,
        save_strategy="steps" if save else "no",
        save_steps=2,
        logging_strategy="steps" if logging_steps else "no",
        logging_steps=max(logging_steps, 1),
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
        ddp_backend="gloo",
        dataloader_num_workers=0,
        seed=0,
    )
    return Trainer(model=prepared["model"], args=args, train_dataset=prepared["dataset"])


def _flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()


def _rank_main(workdir: str) -> None:
    import torch.distributed as dist
    from transformers import TrainerCallback

    from igrt.integrations.hf import ImportanceGradientCallback, install_importance_gradient

    torch.set_num_threads(1)
    os.chdir(workdir)  # the snippets name plan.json and trace/ relative to the working directory
    rank = int(os.environ["RANK"])
    out: dict = {}

    # A. the recording callback on plain DDP
    trainer = _trainer("run-record", max_steps=2, save=False)
    exec(doc_snippet("hf-record"), {"trainer": trainer})
    out["record_ddp"] = type(trainer.model_wrapped).__name__

    # B. the importance hook, checkpoints at steps 2 and 4
    trainer = _trainer("run", max_steps=4, save=True)
    ns = {"trainer": trainer, "resume": None}
    exec(doc_snippet("hf"), ns)
    sync = ns["sync"]
    out["ddp"] = type(trainer.model_wrapped).__name__
    out["final"] = _flat(trainer.model)
    out["rows"] = [
        (m.values_bytes, m.indices_bytes, m.dense_bytes, m.num_sending_components) for m in sync.metrics
    ]
    out["flushed"] = sync.hook_state.sync.residuals.is_zero()

    # C. resume a copy of B's output from checkpoint-2
    dist.barrier()
    if rank == 0:
        shutil.copytree("run", "resumed")
        shutil.rmtree("resumed/checkpoint-4")
    dist.barrier()

    class Probe(TrainerCallback):  # what our callback restored, seen at the first resumed step
        def on_step_begin(self, args, state, control, **kwargs):
            if "resume_step" not in out:
                ours = next(
                    c for c in trainer.callback_handler.callbacks if isinstance(c, ImportanceGradientCallback)
                )
                s = ours.hook_state.sync
                out["resume_step"] = (state.global_step, s.step_index, str(ours.loaded_from))
                out["resume_residuals"] = {n: s.residuals.get(n).clone() for n in s.residuals.names()}

    trainer = _trainer("resumed", max_steps=4, save=True)
    trainer.add_callback(Probe())
    exec(doc_snippet("hf"), {"trainer": trainer, "resume": True})
    out["resumed_final"] = _flat(trainer.model)

    # D. conservation audit
    trainer = _trainer("run-audit", max_steps=2, save=False, logging_steps=1)
    audit = install_importance_gradient(
        trainer,
        {"policy": "importance", "plan": "plan.json", "density": 0.1},
        track_sums=True,
        flush_at_end=False,
    )
    trainer.train()
    residuals = audit.hook_state.sync.residuals
    out["gap"] = max(residuals.conservation_gap().values())
    out["held_norm"] = residuals.total_norm()
    out["log_history"] = [dict(e) for e in trainer.state.log_history]
    out["audit_wire"] = [m.wire_bytes for m in audit.metrics]
    torch.save(out, Path(workdir) / f"result-rank{rank}.pt")


# --------------------------------------------------------------------------- the test
def _prepare(directory: Path) -> None:
    """The tiny MiniLM workload (model without dropout, 64 examples) and a plan over its components.

    Built once here: the workload's docstring dataset takes seconds per process to build.
    """
    from igrt.sync.synchronizer import build_param_infos, named_parameters
    from igrt.workloads import make_workload
    from tests.igrt.tiny_model import make_plan

    workload = make_workload("minilm", tiny=True, seed=0)
    model = workload.model
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0  # deterministic, so that a resumed run can be compared bit for bit
    batch = next(workload.train_batches(0, 1, NUM_EXAMPLES))
    dataset = [{k: v[i] for k, v in batch.items()} for i in range(NUM_EXAMPLES)]
    torch.save({"model": model, "dataset": dataset}, directory / "workload.pt")
    make_plan(build_param_infos(named_parameters(model)), release_period=2).save(directory / "plan.json")


@pytest.mark.slow
def test_trainer_under_torchrun(tmp_path):
    pytest.importorskip("accelerate", reason="the Trainer needs accelerate (pip install accelerate)")
    _prepare(tmp_path)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
        "GLOO_SOCKET_IFNAME": "lo",
        "TOKENIZERS_PARALLELISM": "false",
    }
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", __file__, str(tmp_path)]
    proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    r0, r1 = (torch.load(tmp_path / f"result-rank{r}.pt", weights_only=False) for r in (0, 1))

    # A: a trace of 2 steps from both ranks, recorded under DDP
    from traces.reader import read_trace

    trace = read_trace(tmp_path / "trace")
    assert r0["record_ddp"] == "DistributedDataParallel"
    assert trace.num_steps == 2 and trace.ranks == (0, 1)

    # B: the hook ran on the DDP wrapper, sparse on the wire, low components held on some steps
    assert r0["ddp"] == "DistributedDataParallel"
    for r in (r0, r1):
        steps, flush = r["rows"][:4], r["rows"][4:]
        assert all(v > 0 and i > 0 and d == 0 for v, i, d, _ in steps)
        assert len({n for *_, n in steps}) > 1  # the importance schedule changes who sends
        assert len(flush) == 1 and flush[0][2] > 0 and r["flushed"]  # on_train_end sent the residuals
    assert torch.equal(r0["final"], r1["final"])

    # the per-rank state sits in the Trainer's checkpoints, and differs between ranks
    for step in (2, 4):
        names = {p.name for p in (tmp_path / "run" / f"checkpoint-{step}").iterdir()}
        assert {"igsync-rank000.pt", "igsync-rank001.pt", "optimizer.pt"} <= names, names
    saved = [  # {name: residual} of each rank at step 2
        torch.load(tmp_path / "run" / "checkpoint-2" / f"igsync-rank{r:03d}.pt", weights_only=True)[
            "residuals"
        ]["residuals"]
        for r in (0, 1)
    ]
    assert saved[0].keys() == saved[1].keys()
    assert any(not torch.equal(saved[0][n], saved[1][n]) for n in saved[0])

    # C: resumed from checkpoint-2 with this rank's residuals (not reset) and ended where B ended
    for rank, r in enumerate((r0, r1)):
        global_step, sync_step, loaded_from = r["resume_step"]
        assert global_step == sync_step == 2
        assert loaded_from.endswith(f"resumed/checkpoint-2/igsync-rank{rank:03d}.pt")
        res = r["resume_residuals"]
        assert res.keys() == saved[rank].keys()
        assert all(torch.equal(res[n], saved[rank][n]) for n in res)
    assert torch.equal(r0["resumed_final"], r0["final"])
    assert torch.equal(r1["resumed_final"], r0["final"])

    # D: Σg == Σsent + e on every rank (fp32 rounding only), with mass held back
    for r in (r0, r1):
        assert r["held_norm"] > 0 and r["gap"] < 1e-5

    # the Trainer's own logs carry the sync figures: one training line a step, this rank's bytes
    for r in (r0, r1):
        lines = [e for e in r["log_history"] if "loss" in e]
        assert len(lines) == 2, r["log_history"]
        assert [e["ig_wire_bytes"] for e in lines] == pytest.approx(r["audit_wire"])
        assert all(0 < e["ig_density"] < 1 and e["ig_skipped_steps"] == 0 for e in lines)
        assert all(e["ig_low_bytes"] >= 0 and e["ig_low_release_steps"] in (0, 1) for e in lines)


def test_options_are_validated_before_training():
    pytest.importorskip("transformers")
    from igrt.integrations.hf import ImportanceGradientCallback

    with pytest.raises(ValueError, match=r"unknown key 'densty'"):
        ImportanceGradientCallback(None, {"policy": "topk", "densty": 0.1})
    with pytest.raises(ValueError, match=r"'balance' was removed: use 'packing'"):
        ImportanceGradientCallback(None, {"policy": "topk", "balance": True})


def _begin(trainer, *, load_best_model_at_end: bool = False):
    """Call on_train_begin of a callback for a stand-in Trainer (no processes); returns the callback."""
    import types

    from igrt.integrations.hf import ImportanceGradientCallback

    callback = ImportanceGradientCallback(trainer, {"policy": "topk", "density": 0.1})
    args = types.SimpleNamespace(output_dir="unused", load_best_model_at_end=load_best_model_at_end)
    callback.on_train_begin(args, types.SimpleNamespace(global_step=0), None)
    return callback


@pytest.mark.parametrize(
    ("mode", "pattern"), [("is_deepspeed_enabled", r"DeepSpeed mode"), ("is_fsdp_enabled", r"FSDP")]
)
def test_deepspeed_and_fsdp_trainers_are_refused(mode, pattern):
    import types

    pytest.importorskip("transformers")
    with pytest.raises(ValueError, match=pattern):
        _begin(types.SimpleNamespace(model_wrapped=torch.nn.Linear(2, 2), **{mode: True}))


def test_flush_with_load_best_model_is_refused_and_one_process_is_a_warned_no_op():
    import types

    pytest.importorskip("transformers")
    trainer = types.SimpleNamespace(model_wrapped=torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match=r"load_best_model_at_end"):
        _begin(trainer, load_best_model_at_end=True)
    with pytest.warns(UserWarning, match=r"nothing to synchronize"):
        callback = _begin(trainer)
    assert callback.hook_state is None and callback.metrics == []


if __name__ == "__main__":  # one rank under torchrun
    sys.path.insert(0, str(ROOT))
    _rank_main(sys.argv[1])
