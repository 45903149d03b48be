"""DeepSpeed ZeRO-0 integration: strict config, refusals, and 2 real gloo ranks running the doc's snippets.

The multi-process test executes the code blocks of docs/integrations.md (``snippet: deepspeed-*``)
and checks: parameters bit-equal across ranks, residuals conserved (Σg == Σsent + e per rank),
``policy=dense`` equal to DeepSpeed's own all-reduce training (the oracle), a checkpoint saved and
loaded through DeepSpeed carrying each rank's residuals (not reset: the resumed run ends
bit-identical to the uninterrupted one), a bare ``engine.load_checkpoint`` failing loudly, and a
flush leaving every residual at zero.
"""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path

import pytest
import torch

pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (pip install deepspeed==0.19.8)")

from igrt.integrations import sync_options
from igrt.integrations.deepspeed import ImportanceGradientOptimizer, prepare_config
from tests.igrt.dist_util import run_distributed

DOC = Path(__file__).resolve().parents[2] / "docs" / "integrations.md"
BASE = {"train_micro_batch_size_per_gpu": 4, "steps_per_print": 10**9}


def doc_snippet(name: str) -> str:
    """The code block that follows ``<!-- snippet: name -->`` in docs/integrations.md."""
    match = re.search(rf"<!-- snippet: {re.escape(name)} -->\s*```\w*\n(.*?)```", DOC.read_text(), re.S)
    assert match, f"docs/integrations.md has no snippet {name!r}"
    return match.group(1)


# --------------------------------------------------------------------------- configuration (no processes)
def _cfg(**section):
    return {**BASE, "importance_gradient": {"policy": "topk", "density": 0.1, **section}}


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_stages_1_to_3_are_refused_with_the_reason(stage):
    with pytest.raises(ValueError, match=rf"zero_optimization.stage={stage}.*reduces gradients itself"):
        prepare_config({**_cfg(), "zero_optimization": {"stage": stage}})


def test_zero_stage_0_passes_and_our_section_is_removed():
    ds, options, clip = prepare_config(
        {**_cfg(), "zero_optimization": {"stage": 0}, "gradient_clipping": 0.5}
    )
    assert "importance_gradient" not in ds and "gradient_clipping" not in ds
    assert options.config.policy == "topk" and options.config.density == 0.1 and clip == 0.5


def test_unknown_and_removed_keys_are_named():
    with pytest.raises(
        ValueError, match=r"unknown key 'densty'.*key 'interval' was removed: use 'release_period'"
    ):
        prepare_config(_cfg(densty=0.1, interval=4))
    with pytest.raises(ValueError, match=r"'sparse_gradients' was removed"):
        prepare_config(_cfg(sparse_gradients=True))
    with pytest.raises(ValueError, match=r"section 'importance_gradient': missing"):
        prepare_config(dict(BASE))
    with pytest.raises(ValueError, match=r"policy 'importance' needs 'plan'"):
        prepare_config(_cfg(policy="importance"))
    with pytest.raises(ValueError, match=r"no such SyncPlan file"):
        prepare_config(_cfg(policy="importance", plan="/nonexistent/plan.json"))


@pytest.mark.parametrize(
    ("extra", "pattern"),
    [
        ({"fp16": {"enabled": True}}, r"fp16.enabled=true is not supported"),
        ({"bf16": {"enabled": True}}, r"bf16.enabled=true is not supported"),
        ({"torch_autocast": {"enabled": True}}, r"torch_autocast"),
        ({"optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}, r"'optimizer' section is not supported"),
        ({"communication_data_type": "fp16"}, r"communication_data_type='fp16' tunes DeepSpeed's own"),
        ({"prescale_gradients": True}, r"prescale_gradients"),
        ({"gradient_predivide_factor": 2.0}, r"gradient_predivide_factor"),
    ],
)
def test_settings_that_would_be_ignored_or_wrapped_are_refused(extra, pattern):
    with pytest.raises(ValueError, match=pattern):
        prepare_config({**_cfg(), **extra})


def test_config_file_path_resolves_the_plan_beside_it(tmp_path):
    from igrt.sync.synchronizer import build_param_infos, named_parameters
    from tests.igrt.tiny_model import TinyLM, make_plan

    make_plan(build_param_infos(named_parameters(TinyLM())), release_period=2).save(tmp_path / "plan.json")
    path = tmp_path / "ds.json"
    import json

    path.write_text(json.dumps(_cfg(policy="importance", plan="plan.json")))
    _, options, _ = prepare_config(path)
    assert options.plan is not None and options.plan_path == tmp_path / "plan.json"


def test_unbound_optimizer_and_closures_raise():
    model = torch.nn.Linear(3, 2)
    opt = ImportanceGradientOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        config=sync_options({"policy": "dense"}).config,
        plan=None,
    )
    assert opt.param_groups is opt.optimizer.param_groups  # an LR scheduler on it drives the wrapped one
    with pytest.raises(ValueError, match="not bound"):
        opt.step()
    with pytest.raises(ValueError, match="closures"):
        opt.step(lambda: 0.0)
    with pytest.raises(ValueError, match=r"torch\.optim\.Optimizer"):
        ImportanceGradientOptimizer(object(), config=opt.config, plan=None)


# --------------------------------------------------------------------------- 2 real ranks
def _batches(rank: int, n: int, *, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(10_000 * seed + 100 * rank)
    return [torch.randint(0, 50, (4, 9), generator=g) for _ in range(n)]


def _flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()


def _residuals(sync) -> dict[str, torch.Tensor]:
    return {n: sync.residuals.get(n).clone() for n in sync.residuals.names()}


def _ds_worker(rank: int, world: int, workdir: str) -> dict:
    import deepspeed

    # The CPU accelerator would JIT-compile a shared-memory all-reduce op (minutes) that neither
    # DeepSpeed's training path nor ours uses; DeepSpeed keeps this dict editable for that purpose.
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world)
    )
    os.chdir(workdir)  # the snippets name plan.json and ckpt/ relative to the working directory
    import igrt.integrations.deepspeed as igds
    from tests.igrt.tiny_model import TinyLM

    def loss_fn(engine, batch):
        return engine.module.loss(batch)

    def fresh(seed: int) -> TinyLM:
        torch.manual_seed(seed)
        return TinyLM()

    out: dict = {}
    batches = _batches(rank, 8, seed=1)  # 8 micro-batches = 4 optimizer steps (accumulation 2)

    # 1. the documented set-up and loop, with a checkpoint after 2 steps
    ns = {"model": fresh(0), "batches": batches[:4], "loss_fn": loss_fn}
    exec(doc_snippet("deepspeed-init"), ns)
    exec(doc_snippet("deepspeed-loop"), ns)
    engine, optimizer = ns["engine"], ns["optimizer"]
    assert engine.enable_backward_allreduce is False and engine.optimizer is optimizer
    exec(doc_snippet("deepspeed-save"), ns)
    out["saved_residuals"] = _residuals(optimizer.sync)
    ns["batches"] = batches[4:]
    exec(doc_snippet("deepspeed-loop"), ns)
    out["uninterrupted"] = _flat(engine.module)
    out["steps"] = optimizer.sync.step_index
    out["rows"] = [(r.values_bytes, r.indices_bytes, r.dense_bytes) for r in optimizer.sync.log]

    # 2. resume from the checkpoint in a fresh engine (different init: everything must come from the files)
    ns2 = {"model": fresh(7), "batches": batches[4:], "loss_fn": loss_fn}
    exec(doc_snippet("deepspeed-init"), ns2)
    exec(doc_snippet("deepspeed-load"), ns2)
    opt2 = ns2["optimizer"]
    out["loaded_step"] = opt2.sync.step_index
    loaded = _residuals(opt2.sync)
    out["loaded_equal"] = loaded.keys() == out["saved_residuals"].keys() and all(
        torch.equal(loaded[n], out["saved_residuals"][n]) for n in loaded
    )
    exec(doc_snippet("deepspeed-loop"), ns2)
    out["resumed"] = _flat(ns2["engine"].module)
    exec(doc_snippet("deepspeed-flush"), ns2)
    out["flushed_zero"] = opt2.sync.residuals.is_zero()
    out["after_flush"] = _flat(ns2["engine"].module)

    # 3. the engine's own load_checkpoint alone leaves the residuals behind: the next step says so
    ns3 = {"model": fresh(7), "batches": batches[4:6], "loss_fn": loss_fn}
    exec(doc_snippet("deepspeed-init"), ns3)
    ns3["engine"].load_checkpoint("ckpt")
    try:
        exec(doc_snippet("deepspeed-loop"), ns3)
        out["bare_load_error"] = None
    except ValueError as e:
        out["bare_load_error"] = str(e)

    # 4. oracle: policy dense through our optimizer == DeepSpeed's own all-reduce training, with an
    # LR schedule on the wrapper and gradient clipping (ours after the sync, DeepSpeed's after its
    # all-reduce: the same averaged gradient)
    def schedule(opt):
        return torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step))

    def sgd(params):
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)

    cfg = {**BASE, "gradient_accumulation_steps": 2, "gradient_clipping": 0.05}
    ours, _, _, sched = igds.initialize(
        model=fresh(3),
        optimizer=sgd,
        config={**cfg, "importance_gradient": {"policy": "dense"}},
        lr_scheduler=schedule,
    )
    ref_model = fresh(3)
    ref, _, _, ref_sched = deepspeed.initialize(
        model=ref_model, optimizer=sgd(ref_model.parameters()), config=cfg, lr_scheduler=schedule
    )
    for batch in batches:
        for engine in (ours, ref):
            engine.backward(engine.module.loss(batch))
            engine.step()
    out["dense_ours"], out["dense_ref"], out["init"] = _flat(ours.module), _flat(ref.module), _flat(fresh(3))
    out["lrs"] = (sched.get_last_lr()[0], ref_sched.get_last_lr()[0])

    # 5. conservation audit: Σg == Σsent + e per rank on every step, and zero residuals after a flush
    audited, audit_opt, _, _ = igds.initialize(
        model=fresh(5),
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3),
        config={**cfg, "importance_gradient": {"policy": "importance", "plan": "plan.json", "density": 0.1}},
        track_sums=True,
    )
    gaps = []
    for batch in batches:
        audited.backward(audited.module.loss(batch))
        audited.step()
        gaps.append(max(audit_opt.sync.residuals.conservation_gap().values(), default=0.0))
    out["held_norm"] = audit_opt.sync.residuals.total_norm()
    audit_opt.flush()
    gaps.append(max(audit_opt.sync.residuals.conservation_gap().values(), default=0.0))
    out["gaps"], out["audit_flushed"] = gaps, audit_opt.sync.residuals.is_zero()
    return out


@pytest.mark.slow
def test_two_ranks_doc_snippets_checkpoint_and_dense_oracle(tmp_path):
    from igrt.sync.synchronizer import build_param_infos, named_parameters
    from tests.igrt.tiny_model import TinyLM, make_plan

    make_plan(build_param_infos(named_parameters(TinyLM())), release_period=2).save(tmp_path / "plan.json")
    r0, r1 = run_distributed(_ds_worker, world_size=2, args=(str(tmp_path),), timeout_s=150)

    tag_dir = tmp_path / "ckpt" / "global_step2"
    assert (tmp_path / "ckpt" / "latest").read_text() == "global_step2"
    files = {p.name for p in tag_dir.iterdir()}
    assert {"mp_rank_00_model_states.pt", "igsync-rank000.pt", "igsync-rank001.pt"} <= files, files
    for r in (r0, r1):
        assert r["steps"] == 4 and r["loaded_step"] == 2
        assert r["loaded_equal"], "the resumed run must start from this rank's saved residuals"
        assert r["flushed_zero"]
        assert r["bare_load_error"] is not None and "load_checkpoint" in r["bare_load_error"]
        sparse = [v + i for v, i, _ in r["rows"]]
        assert all(b > 0 for b in sparse) and all(d == 0 for _, _, d in r["rows"])  # sparse on the wire
    # the same model on both ranks, after training, after resuming, after the flush, in the oracle
    for key in ("uninterrupted", "resumed", "after_flush", "dense_ours", "dense_ref"):
        assert torch.equal(r0[key], r1[key]), key
    # residuals are per rank (they differ) and were restored, not reset: the resume is bit-identical
    assert any(
        not torch.equal(r0["saved_residuals"][n], r1["saved_residuals"][n]) for n in r0["saved_residuals"]
    )
    assert any(float(e.abs().max()) > 0 for e in r0["saved_residuals"].values())
    assert torch.equal(r0["resumed"], r0["uninterrupted"])
    assert not torch.equal(r0["after_flush"], r0["resumed"])  # the flush applied the held mass
    # policy dense through our optimizer reproduces DeepSpeed's all-reduce training
    torch.testing.assert_close(r0["dense_ours"], r0["dense_ref"], rtol=1e-5, atol=1e-6)
    assert not torch.equal(r0["dense_ours"], r0["init"])  # it trained
    assert r0["lrs"][0] == r0["lrs"][1] == pytest.approx(0.1 / 5)  # the schedule drove the wrapped SGD
    # Σg == Σsent + e on every rank and step (fp64 audit; fp32 rounding only), zero after the flush
    for r in (r0, r1):
        assert r["held_norm"] > 0 and r["audit_flushed"]
        assert max(r["gaps"]) < 1e-5, r["gaps"]


def test_copy_of_config_is_not_mutated():
    cfg = {**_cfg(), "gradient_clipping": 1.0}
    before = copy.deepcopy(cfg)
    prepare_config(cfg)
    assert cfg == before
