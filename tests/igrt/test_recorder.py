"""The trace recorder against hand computations; launch; `igrt record` end to end on 2 gloo ranks."""

from __future__ import annotations

import math
import types

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from igpolicy.decide import nominal_k
from igrt.trace.recorder import TraceRecorder, jaccard
from igrt.train.launch import launch
from traces.reader import read_trace

DENSITY = 0.25  # k = 3 of the 12 weights, 1 of the 3 biases


class Known(torch.nn.Module):
    """loss = sum(w * cw) + sum(b * cb): the gradients are exactly cw and cb."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(3, 4))
        self.b = torch.nn.Parameter(torch.zeros(3))

    def forward(self, cw: torch.Tensor, cb: torch.Tensor) -> torch.Tensor:
        return (self.w * cw).sum() + (self.b * cb).sum()


def expected_row(g: np.ndarray, density: float, previous: set[int] | None) -> dict:
    """Hand computation: top-k by |g| (exact zeros never selected), norms, max, Jaccard."""
    flat = g.astype(np.float64).ravel()
    k = min(nominal_k(flat.size, density), int(np.count_nonzero(flat)))
    sel = set(np.argsort(-np.abs(flat), kind="stable")[:k].tolist())
    vals = flat[sorted(sel)]
    if previous is None or not (sel | previous):
        overlap = math.nan
    else:
        overlap = len(sel & previous) / len(sel | previous)
    return {
        "k": k,
        "grad_norm": float(np.sqrt((flat**2).sum())),
        "sel_norm": float(np.sqrt((vals**2).sum())),
        "sel_max_abs": float(np.abs(vals).max()) if k else 0.0,
        "overlap": overlap,
        "sel": sel,
    }


def run_step(model, rec, micro_grads, *, loss=None):
    """One optimizer step of ``len(micro_grads)`` micro-batches; returns end_backward's answers."""
    rec.begin_step()
    answers = []
    for cw, cb in micro_grads:
        out = model(cw, cb)
        rec.begin_backward()
        out.backward()
        answers.append(rec.end_backward())
    rec.end_step(loss=loss)
    model.zero_grad(set_to_none=True)
    return answers


def rows_by_step(trace, rank=0):
    names = trace.param_names
    p = trace.params
    out: dict[tuple[int, str], dict] = {}
    for i in range(len(p["step"])):
        if int(p["rank"][i]) != rank:
            continue
        out[(int(p["step"][i]), names[p["param"][i]])] = {
            c: p[c][i] for c in p if c not in ("step", "param", "rank")
        }
    return out


CW = [
    torch.tensor([[0.5, -4.0, 0.0, 1.0], [3.0, 0.1, -0.2, 0.0], [-2.5, 0.3, 0.0, 0.7]]),
    torch.tensor([[0.0, -1.0, 5.0, 0.2], [3.5, 0.0, 0.0, -6.0], [0.1, 0.3, 0.0, 0.7]]),
]
CB = [torch.tensor([0.0, -2.0, 1.0]), torch.tensor([0.0, 0.0, 0.0])]


def test_rows_equal_a_hand_computation(tmp_path):
    model = Known()
    with TraceRecorder(model, directory=tmp_path, density=DENSITY, workload="known") as rec:
        for cw, cb in zip(CW, CB):
            assert run_step(model, rec, [(cw, cb)], loss=1.5) == [True]
    trace = read_trace(tmp_path)
    assert trace.manifest.extra["error_feedback"] is False
    assert trace.manifest.extra["num_steps"] == 2
    assert trace.manifest.world_size == 1 and trace.manifest.sparsifier == "topk"
    rows = rows_by_step(trace)
    previous: dict[str, set[int] | None] = {"w": None, "b": None}
    for step, (cw, cb) in enumerate(zip(CW, CB)):
        for name, g in (("w", cw), ("b", cb)):
            exp = expected_row(g.numpy(), DENSITY, previous[name])
            got = rows[(step, name)]
            assert got["numel"] == g.numel()
            assert got["k"] == exp["k"]
            for col in ("grad_norm", "sel_norm", "sel_max_abs"):
                assert got[col] == pytest.approx(exp[col], rel=1e-6, abs=1e-12), (step, name, col)
            if math.isnan(exp["overlap"]):
                assert math.isnan(got["overlap"])
            else:
                assert got["overlap"] == pytest.approx(exp["overlap"])
            assert 0.0 <= got["ready_s"] < 5.0
            previous[name] = exp["sel"]
    # the selected [-4.0] keeps its sign's magnitude: a large negative gradient is selected
    assert rows[(0, "w")]["sel_max_abs"] == 4.0
    # b at step 1 is all zeros: nothing selected, overlap with {1} is 0 (not NaN)
    assert rows[(1, "b")]["k"] == 0 and rows[(1, "b")]["overlap"] == 0.0
    times = trace.step_times()
    assert np.all(times.loss == 1.5)
    assert np.all(times.forward_s >= 0) and np.all(times.backward_s >= 0) and np.all(times.optimizer_s >= 0)
    ready = trace.params["ready_s"].reshape(2, 2)
    assert np.all(ready <= times.backward_s[:, :1] + 1e-9)  # ready within the backward pass


def test_records_only_at_accumulation_boundaries(tmp_path):
    model = Known()
    rec = TraceRecorder(model, directory=tmp_path, density=DENSITY, grad_accum_steps=2)
    rec.begin_step()
    model(CW[0], CB[0]).backward()
    assert rec.end_backward() is False
    assert rec.step == 0  # nothing recorded after the first micro-batch
    with pytest.raises(ValueError, match="micro-batches"):
        rec.end_step()
    model(CW[1], CB[1]).backward()
    assert rec.end_backward() is True
    with pytest.raises(ValueError, match="already recorded"):
        rec.end_backward()
    rec.end_step()
    model.zero_grad(set_to_none=True)
    assert run_step(model, rec, [(CW[1], CB[1]), (CW[0], CB[0])]) == [False, True]
    rec.close()
    trace = read_trace(tmp_path)
    assert trace.num_steps == 2 and len(trace.params["step"]) == 4 and len(trace.steps["step"]) == 2
    rows = rows_by_step(trace)
    summed = (CW[0] + CW[1]).numpy()
    assert rows[(0, "w")]["grad_norm"] == pytest.approx(np.linalg.norm(summed))
    assert rows[(1, "w")]["overlap"] == 1.0  # the same summed gradient both steps
    # the loss defaults to the mean of the model's 'loss' outputs: Known returns a tensor, so NaN
    assert np.all(np.isnan(trace.steps["loss"]))


def test_evaluation_forwards_are_ignored_and_errors_are_loud(tmp_path):
    model = Known()
    rec = TraceRecorder(model, directory=tmp_path / "t", density=DENSITY)
    with torch.no_grad():
        model(CW[0], CB[0])  # no step opened by an evaluation forward
    assert not rec._in_step
    rec.close()
    with pytest.raises(ValueError, match="already holds a trace"):
        TraceRecorder(Known(), directory=tmp_path / "t")
    with pytest.raises(ValueError, match="density"):
        TraceRecorder(Known(), directory=tmp_path / "u", density=0.0)
    with pytest.raises(ValueError, match="world_size"):
        TraceRecorder(Known(), directory=tmp_path / "v", world_size=2)


@settings(max_examples=60, deadline=None)
@given(
    a=st.lists(st.integers(0, 40), max_size=20, unique=True),
    b=st.lists(st.integers(0, 40), max_size=20, unique=True),
)
def test_jaccard_matches_python_sets(a, b):
    got = jaccard(torch.tensor(sorted(a), dtype=torch.int64), torch.tensor(sorted(b), dtype=torch.int64))
    if not (set(a) | set(b)):
        assert math.isnan(got)
    else:
        assert got == pytest.approx(len(set(a) & set(b)) / len(set(a) | set(b)))
    assert math.isnan(jaccard(torch.tensor(a, dtype=torch.int64), None))


# ------------------------------------------------------------------------------ two ranks
RANK_CW = [
    torch.tensor([[9.0, -8.0, 0.0, 1.0], [0.0, 0.0, 7.0, 0.0], [0.0, 0.5, 0.0, 0.0]]),
    torch.tensor([[-9.0, 0.0, 0.0, 1.0], [0.0, 6.0, 0.0, 0.0], [0.0, 0.0, 0.0, -8.0]]),
]
RANK_CB = [torch.tensor([1.0, 0.0, 0.0]), torch.tensor([0.0, 2.0, 0.0])]


def _union_rank(ctx, directory):
    model = Known()
    with TraceRecorder(model, directory=directory, density=DENSITY, workload="known") as rec:
        run_step(model, rec, [(RANK_CW[ctx.rank], RANK_CB[ctx.rank])], loss=float(ctx.rank))
        assert rec.rank == ctx.rank and rec.world_size == 2
    return torch.get_num_threads()


def _fail_on_rank_one(ctx):
    if ctx.rank == 1:
        raise ValueError("bad input on this rank")
    torch.distributed.barrier()


def test_union_k_across_two_ranks_and_launch(tmp_path):
    threads = launch(_union_rank, nproc=2, backend="gloo", args=(str(tmp_path),), timeout_s=60)
    assert threads == {0: 1, 1: 1}  # one torch thread per rank
    trace = read_trace(tmp_path)
    assert trace.manifest.world_size == 2 and trace.ranks == (0, 1)
    sel = {
        name: [expected_row(g[r].numpy(), DENSITY, None)["sel"] for r in (0, 1)]
        for name, g in (("w", RANK_CW), ("b", RANK_CB))
    }
    names = trace.param_names
    unions = {names[c]: int(u) for c, u in zip(trace.unions["param"], trace.unions["union_k"])}
    assert unions == {name: len(s[0] | s[1]) for name, s in sel.items()}
    assert unions["w"] == 5  # {0, 1, 6} ∪ {0, 5, 11}
    for rank in (0, 1):
        rows = rows_by_step(trace, rank)
        assert rows[(0, "w")]["k"] == 3 and rows[(0, "b")]["k"] == 1
    assert sorted(trace.steps["loss"].tolist()) == [0.0, 1.0]


def test_launch_names_the_failing_rank():
    with pytest.raises(ValueError, match="rank 1: bad input"):
        launch(_fail_on_rank_one, nproc=2, backend="gloo", timeout_s=30)


# ------------------------------------------------------------------------------ igrt record
@pytest.mark.slow
@pytest.mark.parametrize("workload", ["minilm", "gpt"])
def test_igrt_record_tiny_two_ranks(tmp_path, workload, capsys):
    from igrt.cli import main

    out = tmp_path / workload
    argv = ["record", "--workload", workload, "--tiny", "--ranks", "2", "--steps", "3", "-o", str(out)]
    argv += ["--batch-size", "4", "--no-progress", "--density", "0.05"]
    if workload == "gpt":
        argv += ["--no-eval", "--sparsifier", "adtopk"]
    assert main(argv) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    trace = read_trace(out)
    m = trace.manifest
    assert m.world_size == 2 and m.command.startswith(f"igrt record --workload {workload}")
    assert m.sparsifier == ("adtopk" if workload == "gpt" else "topk")
    num_params = len(m.params)
    assert len(trace.params["step"]) == 3 * 2 * num_params
    assert len(trace.unions["step"]) == 3 * num_params and trace.num_steps == 3
    numel = trace.params["numel"]
    k = trace.params["k"]
    assert np.all(k <= np.array([nominal_k(int(n), 0.05) for n in numel]))
    # union over ranks: at least each rank's k, at most their sum
    k_by = {
        (int(s), int(r), int(p)): int(v)
        for s, r, p, v in zip(*(trace.params[c] for c in ("step", "rank", "param", "k")))
    }
    for s, p, u in zip(trace.unions["step"], trace.unions["param"], trace.unions["union_k"]):
        k0, k1 = k_by[(int(s), 0, int(p))], k_by[(int(s), 1, int(p))]
        assert max(k0, k1) <= u <= k0 + k1
    assert np.all(np.isfinite(trace.params["grad_norm"])) and np.all(
        trace.params["sel_norm"] <= trace.params["grad_norm"] + 1e-6
    )
    if workload == "minilm":
        assert set(m.extra["eval_after"]) >= {"accuracy", "loss"}
    assert main(argv) == 2  # the directory already holds a trace: a user error, no traceback


# ------------------------------------------------------------------------------ HF callback
def test_hf_callback_follows_the_trainer_event_order(tmp_path):
    """Drive the callback in the order Trainer calls it (2 micro-batches per step, clipping on)."""
    from transformers import TrainerControl, TrainerState

    from igrt.integrations.hf_callback import TraceRecorderCallback

    model = Known()
    cb = TraceRecorderCallback(directory=tmp_path, density=DENSITY, workload="known")
    args = types.SimpleNamespace(gradient_accumulation_steps=2, max_grad_norm=1.0)
    state, control = TrainerState(), TrainerControl()
    cb.on_train_begin(args, state, control, model=model)
    for _ in range(3):
        cb.on_step_begin(args, state, control)
        for cw, cb_ in zip(CW, CB):
            model(cw, cb_).backward()  # the forward hook closes the previous micro-batch
        cb.on_pre_optimizer_step(args, state, control)
        cb.on_step_end(args, state, control)
        model.zero_grad(set_to_none=True)
    cb.on_train_end(args, state, control)
    trace = read_trace(tmp_path)
    assert trace.num_steps == 3 and trace.manifest.grad_accum_steps == 2
    assert trace.manifest.extra["clipped"] is True
    rows = rows_by_step(trace)
    assert rows[(2, "w")]["grad_norm"] == pytest.approx(np.linalg.norm((CW[0] + CW[1]).numpy()))
    assert np.all(trace.steps["backward_s"] >= 0)


def test_hf_trainer_run(tmp_path):
    pytest.importorskip("accelerate", reason="transformers' Trainer needs accelerate, which is not installed")
    from transformers import Trainer, TrainingArguments

    from igrt.integrations.hf_callback import TraceRecorderCallback
    from igrt.workloads import make_workload

    w = make_workload("gpt", tiny=True, seed=0)
    batches = w.train_batches(0, 1, 1)
    data = [{k: v[0] for k, v in next(batches).items()} for _ in range(8)]
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=3,
        per_device_train_batch_size=2,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        gradient_accumulation_steps=2,
    )
    trainer = Trainer(model=w.model, args=args, train_dataset=data)
    trainer.add_callback(TraceRecorderCallback(directory=tmp_path / "trace", density=0.05))
    trainer.train()
    trace = read_trace(tmp_path / "trace")
    assert trace.num_steps == 3 and np.all(np.isfinite(trace.steps["loss"]))
