"""Online profiling on 2 real gloo ranks: agreement, the re-plan step, conservation, planted
structure, bytes, checkpoints, and ``igrt train --online-profile`` end to end.

Oracles: every rank must hold the same plan after every re-plan (their fingerprints, returned by
each rank); Σg == Σsent + e on every step (fp64 running sums) across re-plans that move components
between important and low; the re-plan's bytes are :func:`igpolicy.online.stats_vector_bytes` plus
the agreement check, on top of the bytes the step plan accounts for; an uninterrupted run is the
reference for a resumed one; a planted structure (components with large, consistent gradients)
must come out important.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from igpolicy.config import PolicyConfig
from igpolicy.online import important_set, stats_vector_bytes
from igpolicy.plan import SyncPlan
from igpolicy.vocab import ComponentClass
from igrt.sync.checkpoint import load_sync_state, save_sync_state
from igrt.sync.state import SyncState
from igrt.sync.synchronizer import Synchronizer
from tests.igrt.dist_util import DistPool
from tests.igrt.tiny_model import TinyLM

torch.set_num_threads(1)

WINDOW, EVERY, STEPS = 3, 4, 13
CONFIG = dict(policy="importance", density=0.2, release_period=2, online_window=WINDOW, replan_every=EVERY)


@pytest.fixture(scope="module")
def pool():
    with DistPool(world_size=2) as p:
        yield p


def _tokens(rank: int, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randint(0, 50, (3, 9), generator=g)


def _classes(plan: SyncPlan) -> dict[str, str]:
    return {c.key: c.cls.value for c in plan.components}


# --------------------------------------------------------------------------- agreement, step, conservation
def _run_worker(rank: int, world: int, steps: int):
    torch.manual_seed(0)
    model = TinyLM()
    sync = Synchronizer(model, config=PolicyConfig(**CONFIG), plan=None, track_sums=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = {"rows": [], "plans": [], "gaps": [], "sending": []}
    for t in range(steps):
        model.loss(_tokens(rank, t)).backward()
        planned = sync.plan_step(t)
        row = sync.step()
        own = sum(r.bytes.metadata_bytes for r in sync.last_run.records)  # the step plan's ops' own
        out["rows"].append((row.step, row.metadata_bytes, dict(row.extra), own))
        out["plans"].append(sync.plan.fingerprint)  # the plan that the next step follows
        out["sending"].append(sorted(planned.sending_params))
        out["gaps"].append(max(sync.residuals.conservation_gap().values()))
        opt.step()
        opt.zero_grad(set_to_none=True)
    out["history"] = [(h["step"], h["fingerprint"], h["important"], h["low"]) for h in sync.online.history]
    out["classes"] = [_classes(SyncPlan.from_json(h["plan"])) for h in sync.online.history]
    out["num_components"] = len(sync.online.keys)
    sync.flush()
    sums = {n: sync.residuals.sums(n) for n in sync.params}
    out["flushed_gap"] = max(float((g - s).abs().max()) for g, s in sums.values())
    return out


def test_replans_agree_on_every_rank_at_the_configured_steps_and_conserve_gradient(pool):
    a, b = pool.run(_run_worker, args=(STEPS,), timeout_s=120)
    assert a["plans"] == b["plans"]  # every rank follows the same plan after every step
    assert a["history"] == b["history"]
    steps = [s for s, *_ in a["history"]]
    assert steps == [0, 4, 8, 12]  # the start plan, then every EVERY steps once WINDOW steps were seen
    replanned = [t for t, _, extra, _ in a["rows"] if extra.get("online_replan") == 1.0]
    assert replanned == [3, 7, 11]  # the re-plan follows step b - 1; its plan applies from step b
    assert a["classes"][0] == {k: "pinned" for k in a["classes"][0]}  # warm-up: everything every step
    assert all(len(s) == len(a["sending"][0]) for s in a["sending"][:4])  # every parameter sends before it
    # the plan changes between re-plans: components move between important and low
    moved = [
        k
        for before, after in zip(a["classes"][1:], a["classes"][2:])
        for k in before
        if before[k] != after[k]
    ]
    assert moved, a["history"]
    # conservation on every step across the re-plans, and nothing left after the flush
    assert max(a["gaps"] + b["gaps"]) < 1e-5
    assert a["flushed_gap"] < 1e-5 and b["flushed_gap"] < 1e-5
    # the re-plan's all-reduce and agreement check are counted as metadata on top of the step plan's
    nbytes = stats_vector_bytes(num_components=a["num_components"], window=WINDOW) + 2 * 16
    for t, meta, extra, own in a["rows"]:
        if t in replanned:
            assert extra["online_bytes"] == nbytes and meta == own + nbytes
        else:
            assert "online_bytes" not in extra and meta == own


# --------------------------------------------------------------------------- a disagreement is an error
def _diverge_worker(rank: int, world: int):
    import igrt.sync.online as online

    real = online.online_plan

    def skewed(**kw):  # rank 1 computes another plan from the same vector (a bug we must catch)
        plan, scores, result = real(**kw)
        if rank == 1:
            plan = SyncPlan(
                release_period=plan.release_period, components=plan.components,
                settings={**plan.settings, "skew": 1}, source=plan.source,
            )  # fmt: skip
        return plan, scores, result

    online.online_plan = skewed
    try:
        torch.manual_seed(0)
        model = TinyLM()
        sync = Synchronizer(model, config=PolicyConfig(**CONFIG), plan=None)
        for t in range(EVERY):
            model.loss(_tokens(rank, t)).backward()
            try:
                sync.step()
            except ValueError as e:
                return t, str(e)
            model.zero_grad(set_to_none=True)
        return None
    finally:
        online.online_plan = real


def test_a_plan_that_differs_between_ranks_is_an_error_on_every_rank_not_a_hang(pool):
    got = pool.run(_diverge_worker, timeout_s=60)
    for t, msg in got:
        assert t == EVERY - 1
        assert "online re-plan at step 4" in msg and "online_plan differs" in msg


# --------------------------------------------------------------------------- planted structure
PLANTED = ("0.attn_q", "1.mlp_down")


def _control_worker(rank: int, world: int, control: str):
    """The planted run under a split control; also the profiler's own plan that the control replaced."""
    import igrt.sync.online as online

    seen, derive = [], online.split_control

    def spy(plan, name, *, seed):
        seen.append((plan.to_json(), list(seed)))
        return derive(plan, name, seed=seed)

    online.split_control = spy
    try:
        plan, fingerprint = _planted_worker(rank, world, control)
    finally:
        online.split_control = derive
    return plan, fingerprint, seen


def _planted_worker(rank: int, world: int, control: str = ""):
    torch.manual_seed(0)
    model = TinyLM()
    config = PolicyConfig(policy="importance", density=0.1, release_period=2, online_window=6, replan_every=6,
                          online_control=control, low_mode="thin" if control else "hold")  # fmt: skip
    sync = Synchronizer(model, config=config, plan=None)
    fixed = {
        n: torch.randn(p.shape, generator=torch.Generator().manual_seed(7))
        for n, p in model.named_parameters()
    }
    for t in range(6):
        g = torch.Generator().manual_seed(100 * rank + t)
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            p.grad = 5.0 * fixed[name] + 0.1 * noise if sync.component[name] in PLANTED else 0.05 * noise
        sync.step()
    if control:
        return sync.plan.to_json(), sync.online.history[-1]["fingerprint"]
    return sorted(important_set(sync.plan)), sorted(sync.plan.low), sync.plan.fingerprint


def test_components_with_large_consistent_gradients_come_out_important(pool):
    (imp, low, fa), (_, _, fb) = pool.run(_planted_worker, timeout_s=60)
    assert fa == fb
    assert set(PLANTED) <= set(imp), (imp, low)
    assert len(low) >= len(imp)  # the noise components are held, not all sent


@pytest.mark.parametrize("control", ["swapped", "random", "all_low"])
def test_a_split_control_replaces_the_replan_alike_on_every_rank(pool, control):
    from igpolicy.controls import split_control

    (a, fa, seen_a), (b, fb, seen_b) = pool.run(_control_worker, args=(control,), timeout_s=60)
    assert a == b and fa == fb and seen_a == seen_b  # every rank derived the same control plan
    plan = SyncPlan.from_json(a)
    [(own, seed)] = seen_a  # one re-plan (step 6), its seed: the run's seed and the boundary
    assert seed == [0, 6] and plan.fingerprint == fa
    real = SyncPlan.from_json(own)
    assert plan.source["control"].startswith(control) and plan.source["derived_from"] == real.fingerprint
    assert set(PLANTED) <= important_set(real)  # the profiler found the planted structure ...
    imp = important_set(plan)
    if control == "all_low":
        assert not imp
    else:  # ... and the control, size-matched, is never its choice
        assert imp and imp != important_set(real)
    if control == "swapped":  # the lowest-scored instead: the planted components are thinned
        assert not set(PLANTED) & imp
    assert split_control(real, control, seed=seed).fingerprint == fa  # igpolicy.controls' derivation


# --------------------------------------------------------------------------- checkpoint and resume
def _resume_worker(rank: int, world: int, directory: str, *, cut: int, steps: int):
    def make():
        torch.manual_seed(0)
        model = TinyLM()
        sync = Synchronizer(model, config=PolicyConfig(**CONFIG), plan=None)
        return model, sync, torch.optim.SGD(model.parameters(), lr=0.1)

    def run(model, sync, opt, start, stop, grads):
        for t in range(start, stop):
            model.loss(_tokens(rank, t)).backward()
            sync.step()
            grads.append({n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()})
            opt.step()
            opt.zero_grad(set_to_none=True)

    ref_model, ref_sync, ref_opt = make()
    ref: list = []
    run(ref_model, ref_sync, ref_opt, 0, steps, ref)
    model, sync, opt = make()
    got: list = []
    run(model, sync, opt, 0, cut, got)
    save_sync_state(sync, directory, rank=rank)
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, Path(directory) / f"m{rank}.pt")
    model2, sync2, opt2 = make()
    load_sync_state(sync2, directory, rank=rank)
    saved = torch.load(Path(directory) / f"m{rank}.pt", weights_only=True)
    model2.load_state_dict(saved["model"])
    opt2.load_state_dict(saved["opt"])
    run(model2, sync2, opt2, cut, steps, got)
    same = all(
        (a[n] is None and b[n] is None) or (a[n] is not None and b[n] is not None and torch.equal(a[n], b[n]))
        for a, b in zip(ref, got)
        for n in a
    )
    return (
        same,
        [h["fingerprint"] for h in ref_sync.online.history],
        [h["fingerprint"] for h in sync2.online.history],
    )


def _resume_entry(rank: int, world: int, directory: str):
    # cut inside a window (steps 5..7 profile the re-plan at 8), after one re-plan
    return _resume_worker(rank, world, directory, cut=6, steps=STEPS)


def test_a_resumed_run_continues_the_online_profile_bit_for_bit(pool, tmp_path):
    for same, ref, got in pool.run(_resume_entry, args=(str(tmp_path),), timeout_s=120):
        assert same
        assert ref == got and len(ref) == 4


def test_a_state_without_online_profiling_does_not_load_into_an_online_run(tmp_path):
    model = TinyLM()
    plain = Synchronizer(model, config=PolicyConfig(policy="topk", density=0.2), plan=None)
    sd = plain.state_dict()
    online = Synchronizer(TinyLM(), config=PolicyConfig(**CONFIG), plan=None)
    with pytest.raises(ValueError, match="does not match this run"):  # the config digest differs first
        online.load_state_dict(sd)
    sd_online = online.state_dict()
    del sd_online["online"]
    with pytest.raises(ValueError, match="no online-profiling state"):
        Synchronizer(TinyLM(), config=PolicyConfig(**CONFIG), plan=None).load_state_dict(sd_online)


def test_the_ddp_hook_state_refuses_online_profiling():
    with pytest.raises(ValueError, match="not in the DDP hook"):
        SyncState(TinyLM(), config=PolicyConfig(**CONFIG), plan=None)


def test_an_offline_plan_is_the_start_plan_of_an_online_run():
    from igrt.sync.synchronizer import build_param_infos, named_parameters
    from tests.igrt.tiny_model import make_plan

    model = TinyLM()
    plan = make_plan(build_param_infos(named_parameters(model)), release_period=2)
    sync = Synchronizer(model, config=PolicyConfig(**CONFIG), plan=plan)
    assert sync.plan is plan and sync.online.history[0]["fingerprint"] == plan.fingerprint
    assert any(c.cls == ComponentClass.LOW for c in plan.components) and sync.plan_step(
        0
    ).sending_params != set(sync.params)


# --------------------------------------------------------------------------- igrt train end to end
def test_igrt_train_online_profile_writes_the_plan_history_and_summary(tmp_path):
    from igrt.cli import main

    out = tmp_path / "run"
    argv = [
        "train", "--workload", "gpt", "--tiny", "--policy", "importance", "--online-profile",
        "--online-window", "3", "--replan-every", "4", "--steps", "9", "--ranks", "2", "--backend", "gloo",
        "--batch-size", "4", "--no-eval", "--quiet", "--out", str(out),
    ]  # fmt: skip
    assert main(argv) == 0
    plans = [json.loads(line) for line in (out / "plans.jsonl").read_text().splitlines()]
    assert [p["step"] for p in plans] == [0, 4, 8]
    assert not plans[0]["important"] and not plans[0]["low"]  # the start plan pins everything
    final = SyncPlan.load(out / "online-plan.json")
    assert final.fingerprint == plans[-1]["fingerprint"] and final.source["window"] == [5, 8]
    summary = json.loads((out / "summary.json").read_text())
    online = summary["online_profile"]
    assert online["num_replans"] == 2 and online["replan_steps"] == [4, 8]
    assert online["final_important"] == plans[-1]["important"]
    assert summary["config"]["replan_every"] == 4 and summary["config"]["catch_up"] is True
    rows = list(_csv(out / "metrics.csv"))
    replan_rows = [r for r in rows if r.get("x_online_replan") == "1.0"]
    assert sorted({int(r["step"]) for r in replan_rows}) == [3, 7]
    per_step = online["profiling_bytes_per_step"]
    assert per_step == pytest.approx(sum(float(r["x_online_bytes"]) for r in replan_rows) / 2 / 9)
    assert all(int(r["metadata_bytes"]) >= float(r["x_online_bytes"]) for r in replan_rows)


def test_igrt_train_resumes_an_online_run_from_its_checkpoint(tmp_path):
    """A run cut at step 6, inside the window of the re-plan at 8 (steps 5..7), resumes from its
    checkpoint with the plan history and the window: the plans before the cut are the uninterrupted
    run's, and the re-plan at 8 runs on a complete window (step 5 came from the checkpoint; without
    it every rank would skip that re-plan). The resumed run is the uninterrupted one bit for bit:
    its rows, its plans and its final model."""
    import shutil

    from igrt.cli import main

    def argv(out: Path, *extra: str) -> list[str]:
        return [
            "train", "--workload", "gpt", "--tiny", "--policy", "importance", "--online-profile",
            "--online-window", "3", "--replan-every", "4", "--steps", "9", "--ranks", "2", "--backend", "gloo",
            "--batch-size", "4", "--no-eval", "--quiet", "--checkpoint-every", "3", "--out", str(out), *extra,
        ]  # fmt: skip

    full = tmp_path / "full"
    assert main(argv(full)) == 0
    cut = tmp_path / "cut"
    shutil.copytree(full / "checkpoint" / "step-000006", cut / "step-000006")
    resumed = tmp_path / "resumed"
    assert main(argv(resumed, "--resume", str(cut))) == 0
    plans = [
        [json.loads(line) for line in (out / "plans.jsonl").read_text().splitlines()]
        for out in (full, resumed)
    ]
    assert [p["step"] for p in plans[1]] == [0, 4, 8]
    assert [p["fingerprint"] for p in plans[1][:2]] == [p["fingerprint"] for p in plans[0][:2]]
    rows = [r for r in _csv(resumed / "metrics.csv") if r["step"] == "7"]
    assert len(rows) == 2 and all(
        r["x_online_replan"] == "1.0" for r in rows
    )  # not skipped: the window came back
    assert {int(r["step"]) for r in _csv(resumed / "metrics.csv")} == {6, 7, 8}
    assert [(p["step"], p["fingerprint"]) for p in plans[1]] == [(p["step"], p["fingerprint"]) for p in plans[0]]
    cols = ("step", "rank", "values_bytes", "indices_bytes", "metadata_bytes", "residual_norm", "x_loss")
    want = [[r[c] for c in cols] for r in _csv(full / "metrics.csv") if int(r["step"]) >= 6]
    assert [[r[c] for c in cols] for r in _csv(resumed / "metrics.csv")] == want
    a, b = torch.load(full / "model.pt"), torch.load(resumed / "model.pt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _csv(path: Path):
    import csv

    with path.open() as f:
        yield from csv.DictReader(f)


def test_igrt_train_refuses_online_profiling_under_the_ddp_hook(tmp_path):
    from igrt.cli import main

    argv = [
        "train", "--workload", "gpt", "--tiny", "--policy", "importance", "--online-profile",
        "--integration", "ddp-hook", "--steps", "2", "--out", str(tmp_path / "r"),
    ]  # fmt: skip
    assert main(argv) != 0


def test_missing_plan_message_names_online_profiling():
    from igrt.train.loop import TrainOptions

    with pytest.raises(ValueError, match="--online-profile"):
        TrainOptions(workload="gpt", config=PolicyConfig(policy="importance"), steps=2)
    with pytest.raises(ValueError, match="not ddp-hook"):
        TrainOptions(workload="gpt", config=PolicyConfig(**CONFIG), steps=2, integration="ddp-hook")


def test_a_config_section_with_online_profiling_needs_no_plan():
    from igrt.integrations import sync_options

    opts = sync_options({"policy": "importance", "online_window": 2, "replan_every": 2})
    assert opts.plan is None and opts.config.online_profiling
    with pytest.raises(ValueError, match="or online profiling"):
        sync_options({"policy": "importance"})
