"""``igrt train`` end to end on 2 real gloo ranks (tiny MiniLM): outputs, bytes, DDP, resume, errors.

Every run goes through ``igrt.cli.main(["train", ...])``. Oracles: the pure decisions of
:func:`igpolicy.decide.decide_step` bound the bytes each rank may put on the wire; plain
``DistributedDataParallel`` is the reference for the dense policy; an uninterrupted run is the
reference for a resumed one.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import torch

from igpolicy.config import PolicyConfig
from igpolicy.decide import decide_step, nominal_k, release_phases
from igpolicy.plan import ComponentPlan, SyncPlan
from igpolicy.vocab import ComponentClass, ComponentId, StepMetrics
from igrt.cli import main
from tests.igrt.dist_util import free_port, run_distributed

torch.set_num_threads(1)

STEPS, BATCH, PERIOD, SEED = 6, 4, 2, 0
LOW_KINDS = {"embedding", "mlp_up", "mlp_down", "attn_v", "attn_o"}
_RUNS: dict[tuple[str, str], Path] = {}


@pytest.fixture(scope="module")
def infos():
    from igrt.sync.synchronizer import build_param_infos, named_parameters
    from igrt.workloads import make_workload

    return build_param_infos(named_parameters(make_workload("minilm", tiny=True, seed=SEED).model))


@pytest.fixture(scope="module")
def plan_path(infos, tmp_path_factory) -> Path:
    """Embedding, MLPs, V and O projections low (two phases); the rest important."""
    comps, j = [], 0
    for key in sorted({i.component for i in infos}):
        if ComponentId.from_key(key).kind.value in LOW_KINDS:
            comps.append(
                ComponentPlan(key=key, score=0.1, cls=ComponentClass.LOW, phase=j % PERIOD, expected_bytes=8)
            )
            j += 1
        else:
            comps.append(ComponentPlan(key=key, score=1.0, cls=ComponentClass.IMPORTANT))
    return SyncPlan(release_period=PERIOD, components=tuple(comps)).save(
        tmp_path_factory.mktemp("plan") / "p.json"
    )


def _argv(policy: str, plan: Path, out: Path, *extra: str, steps: int = STEPS) -> list[str]:
    return [
        "train",
        "--workload",
        "minilm",
        "--tiny",
        "--policy",
        policy,
        "--plan",
        str(plan),
        "--ranks",
        "2",
        "--backend",
        "gloo",
        "--steps",
        str(steps),
        "--batch-size",
        str(BATCH),
        "--release-period",
        str(PERIOD),
        "--seed",
        str(SEED),
        "--out",
        str(out),
        "--no-progress",
        *extra,
    ]


def _run(policy: str, integration: str, plan: Path, tmp_path_factory) -> Path:
    """One cached run per (policy, integration)."""
    key = (policy, integration)
    if key not in _RUNS:
        out = tmp_path_factory.mktemp(f"{policy}-{integration}")
        evals = (
            ["--eval-every", "3"] if key == ("importance", "sync") else ["--no-eval"]
        )  # evaluation is slow
        extra = ["--integration", integration, *evals]
        if integration == "ddp-hook":
            extra += ["--grad-accum-steps", "2"]
        assert main(_argv(policy, plan, out, *extra)) == 0
        _RUNS[key] = out
    return _RUNS[key]


def _rows(out: Path) -> list[dict[str, str]]:
    with (out / "metrics.csv").open() as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames[: len(StepMetrics.columns())]) == StepMetrics.columns()
        return list(reader)


CASES = [
    ("dense", "sync"),
    ("topk", "sync"),
    ("adtopk", "sync"),
    ("importance", "sync"),
    ("periodic", "sync"),
    ("importance", "ddp-hook"),
]


@pytest.mark.parametrize(("policy", "integration"), CASES)
def test_each_policy_writes_consistent_metrics_summary_and_checkpoint(
    policy, integration, infos, plan_path, tmp_path_factory
):
    out = _run(policy, integration, plan_path, tmp_path_factory)
    rows = _rows(out)
    assert sorted((int(r["step"]), int(r["rank"])) for r in rows) == [
        (t, r) for t in range(STEPS) for r in (0, 1)
    ]
    config = PolicyConfig(policy=policy, release_period=PERIOD, seed=SEED)
    phases = release_phases(
        plan=SyncPlan.load(plan_path), config=config, component_keys=[i.component for i in infos]
    )
    numel = sum(i.numel for i in infos)
    k_of = {i.name: nominal_k(i.numel, config.density) for i in infos}
    for r in rows:
        b = {
            k: int(r[k])
            for k in ("values_bytes", "indices_bytes", "dense_bytes", "metadata_bytes", "wire_bytes")
        }
        assert r["source"] == "real" and r["policy"] == policy
        assert (
            b["wire_bytes"] == b["values_bytes"] + b["indices_bytes"] + b["dense_bytes"] + b["metadata_bytes"]
        )
        assert math.isfinite(float(r["x_loss"])) and float(r["step_s"]) >= float(r["exposed_comm_s"]) >= 0
        decision = decide_step(step=int(r["step"]), config=config, params=infos, world_size=2, phases=phases)
        assert int(r["num_sending_components"]) == len(decision.release.send)
        if policy == "dense":
            assert b["dense_bytes"] == 4 * numel and b["values_bytes"] == b["indices_bytes"] == 0
            continue
        # int32 indices and fp32 values: one of each per pair, at most the nominal k of every sender
        assert b["dense_bytes"] == 0 and b["values_bytes"] == b["indices_bytes"]
        assert b["values_bytes"] <= 4 * sum(k_of[n] for n in decision.sending_params)
        assert (b["values_bytes"] > 0) == bool(decision.sending_params)
        assert int(r["low_bytes"]) <= b["values_bytes"] + b["indices_bytes"]
        if policy in ("topk", "adtopk"):
            assert int(r["low_bytes"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    mean_wire = sum(int(r["wire_bytes"]) for r in rows) / len(rows)
    assert summary["stats"]["bytes_per_step"]["wire_bytes"] == pytest.approx(mean_wire)
    assert summary["config"]["policy"] == policy and summary["world_size"] == 2
    assert summary["plan"]["fingerprint"] == SyncPlan.load(plan_path).fingerprint
    assert summary["flush_bytes_per_rank"]["dense_bytes"] == 4 * numel  # every residual, fp32, once
    assert math.isfinite(summary["final_loss"])
    if (policy, integration) == ("importance", "sync"):  # the one run with held-out evaluation
        history = summary["eval"]["history"]
        assert [e["step"] for e in history] == [0, 3, STEPS, STEPS]  # the last two: before, after the flush
        assert history[2].get("before_flush") and history[3].get("after_flush")
        assert summary["eval"]["final"] == history[3]
        assert history[2]["loss"] != history[3]["loss"]  # the flush moved the model: the two are not one
        assert 0.0 <= summary["eval"]["final"]["accuracy"] <= 1.0
        assert json.loads((out / "eval.json").read_text()) == summary["eval"]["history"]
    ckpt = sorted((out / "checkpoint").glob("step-*"))[-1]  # the newest (and only) complete one
    names = {p.name for p in ckpt.iterdir()}
    assert {
        "train-state.pt",
        "igsync-rank000.pt",
        "igsync-rank001.pt",
        "rng-rank000.pt",
        "rng-rank001.pt",
    } <= names
    assert set(torch.load(out / "model.pt")) == {f"{n}" for n in torch.load(ckpt / "train-state.pt")["model"]}


def test_importance_and_periodic_send_fewer_bytes_than_topk(plan_path, tmp_path_factory):
    wire = {
        p: json.loads((_run(p, "sync", plan_path, tmp_path_factory) / "summary.json").read_text())["stats"][
            "bytes_per_step"
        ]["wire_bytes"]
        for p in ("topk", "importance", "periodic")
    }
    assert wire["importance"] < wire["topk"]
    assert wire["periodic"] < wire["topk"]


def _ddp_reference(rank: int, world_size: int, steps: int, batch_size: int, seed: int) -> dict:
    """Plain DDP on the same workload, data shards and per-rank seeds as ``igrt train``."""
    from torch.nn.parallel import DistributedDataParallel

    from igrt.train.loop import rank_seed
    from igrt.workloads import make_workload

    w = make_workload("minilm", tiny=True, seed=seed)
    torch.manual_seed(rank_seed(seed, rank))
    ddp = DistributedDataParallel(w.model)
    opt = w.optimizer(w.model)
    batches = w.train_batches(rank, world_size, batch_size)
    for _ in range(steps):
        w.loss(ddp, next(batches)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {k: v.detach().clone() for k, v in w.model.state_dict().items()}


def test_dense_policy_with_the_synchronizer_trains_like_ddp(plan_path, tmp_path_factory):
    out = _run("dense", "sync", plan_path, tmp_path_factory)
    ours = torch.load(out / "model.pt")
    ref = run_distributed(_ddp_reference, world_size=2, args=(STEPS, BATCH, SEED), timeout_s=120)
    # DDP pre-divides by the world size, we divide the sum: with 2 ranks both are exact in fp32,
    # so only summation order could differ; the tolerance allows a few ulps over 6 AdamW steps.
    for name, value in ref[0].items():
        torch.testing.assert_close(ours[name], value, rtol=1e-6, atol=1e-7, msg=name)


def test_resume_reproduces_the_uninterrupted_run_bit_for_bit(plan_path, tmp_path_factory):
    full = _run("importance", "sync", plan_path, tmp_path_factory)
    first, second = tmp_path_factory.mktemp("first3"), tmp_path_factory.mktemp("resumed")
    assert main(_argv("importance", plan_path, first, "--no-eval", steps=3)) == 0
    assert main(_argv("importance", plan_path, second, "--no-eval", "--resume", str(first))) == 0
    a, b = torch.load(full / "model.pt"), torch.load(second / "model.pt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    want = [r for r in _rows(full) if int(r["step"]) >= 3]
    got = _rows(second)
    cols = ("step", "rank", "values_bytes", "indices_bytes", "low_bytes", "residual_norm", "x_loss")
    assert [[r[c] for c in cols] for r in got] == [[r[c] for c in cols] for r in want]
    assert json.loads((second / "summary.json").read_text())["start_step"] == 3


def test_a_plan_that_does_not_match_the_model_refuses_to_start(plan_path, tmp_path, capsys):
    plan = SyncPlan.load(plan_path)
    kept = tuple(c for c in plan.components if c.key != "1.attn_q")
    bad = SyncPlan(
        release_period=PERIOD,
        components=(*kept, ComponentPlan(key="7.attn_q", score=1.0, cls=ComponentClass.IMPORTANT)),
    )
    path = bad.save(tmp_path / "bad.json")
    out = tmp_path / "out"
    assert main(_argv("topk", path, out)) == 2
    err = capsys.readouterr().err
    assert "does not match the model" in err and "'1.attn_q'" in err and "'7.attn_q'" in err
    assert "Traceback" not in err and not (out / "metrics.csv").exists()


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        ({"densty": 0.1}, "unknown key 'densty'"),
        ({"interval": 4}, "key 'interval' was removed: use 'release_period'"),
    ],
)
def test_a_bad_config_key_is_a_user_error_naming_the_key(config, needle, plan_path, tmp_path, capsys):
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(config))
    assert main([*_argv("topk", plan_path, tmp_path / "out"), "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert needle in err and str(path) in err and "Traceback" not in err


def test_importance_without_a_plan_is_a_user_error(tmp_path, capsys):
    argv = ["train", "--workload", "minilm", "--tiny", "--policy", "importance", "--out", str(tmp_path)]
    assert main(argv) == 2
    assert "needs --plan" in capsys.readouterr().err


def test_under_torchrun_the_command_runs_in_this_process(plan_path, tmp_path, monkeypatch):
    """torchrun sets RANK/WORLD_SIZE/LOCAL_RANK: launch() joins that group instead of spawning."""
    env = {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert main([*_argv("topk", plan_path, tmp_path, "--no-eval", steps=2)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["world_size"] == 1 and len(_rows(tmp_path)) == 2
