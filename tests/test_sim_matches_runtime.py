"""The simulator and the runtime execute the same step plan: identical ops, bytes and collectives.

Every case trains the tiny GPT on 2 real gloo ranks with ``--record-trace`` (one process set for
all cases, ``igrt.train.loop.train_on_rank`` per case) and replays the run with
:func:`igsim.studies.replay.replay_run`. Oracle: for every step and rank, the StepMetrics byte fields and
collective count of the replay equal the measured ones, and every step's issued ops (kind, DDP or
plan bucket, encoded bytes) are the same list. The DDP hook runs with a small ``bucket_cap_mb``
so DDP really splits the model into several buckets and rebuilds them after step 0; under
``deepspeed`` a DeepSpeed ZeRO-0 engine runs, its optimizer syncs with the Synchronizer.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from igpolicy.config import PolicyConfig
from igpolicy.plan import ComponentPlan, SyncPlan
from igpolicy.vocab import ComponentClass, ComponentId
from igsim.studies.replay import load_run, replay_run

torch.set_num_threads(1)

STEPS, PERIOD = 6, 3
LOW_KINDS = {"embedding", "mlp_up", "mlp_down", "attn_o"}
POLICIES = ("dense", "topk", "adtopk", "importance")
COLLECTIVES = ("sparse", "dense", "auto")


def _plan(infos) -> SyncPlan:
    comps, j = [], 0
    for key in sorted({i.component for i in infos}):
        if ComponentId.from_key(key).kind.value in LOW_KINDS:
            comps.append(ComponentPlan(key=key, score=0.1, cls=ComponentClass.LOW, phase=j % PERIOD, expected_bytes=8))
            j += 1
        else:
            comps.append(ComponentPlan(key=key, score=1.0, cls=ComponentClass.IMPORTANT))
    return SyncPlan(release_period=PERIOD, components=tuple(comps))


def _cases():
    for integration in ("sync", "ddp-hook", "deepspeed"):
        for policy in POLICIES:
            for collective in COLLECTIVES if policy != "dense" else ("auto",):
                yield integration, policy, collective


CASES = list(_cases())
# issue 15's method options on: small vectors sent whole, a warm-up, a fresh component (ln_f stands
# in for a new head), through the same step plans; (name, integration, policy, collective, options)
METHOD = {"dense_small_numel": 128, "warmup_steps": 2, "fresh_patterns": ("transformer.ln_f.*",)}
METHOD_CASES = [
    ("method-sync-importance-auto", "sync", "importance", "auto", METHOD),
    ("method-ddp-hook-importance-sparse", "ddp-hook", "importance", "sparse", METHOD),
    ("method-deepspeed-importance-sparse", "deepspeed", "importance", "sparse", METHOD),
    ("method-sync-topk-sparse", "sync", "topk", "sparse", {"dense_small_numel": 128}),
    # low components thinned (every step at density / R) instead of held
    ("thin-sync-importance-sparse", "sync", "importance", "sparse", {"low_mode": "thin"}),
    ("thin-ddp-hook-importance-sparse", "ddp-hook", "importance", "sparse", {"low_mode": "thin"}),
]


def _train_all(ctx, root: str) -> int:
    from igrt.sync.synchronizer import build_param_infos, named_parameters
    from igrt.train.loop import TrainOptions, train_on_rank
    from igrt.workloads import make_workload

    infos = build_param_infos(named_parameters(make_workload("gpt", tiny=True, seed=0).model))
    plan = _plan(infos)
    for integration, policy, collective in CASES:
        # density 0.2 puts "auto" near the sparse/dense crossover (1/p = 0.5 on 2 ranks, per bucket)
        config = PolicyConfig(
            policy=policy, density=0.2 if collective == "auto" else 0.05, collective=collective,
            release_period=PERIOD, num_buckets=3, sparsifier="adtopk" if policy == "adtopk" else "topk",
        )  # fmt: skip
        options = TrainOptions(
            workload="gpt", tiny=True, config=config, steps=STEPS, batch_size=4, integration=integration,
            plan=plan if policy == "importance" else None, evaluate=False, progress=False, record_trace=True,
            out=str(Path(root) / f"{integration}-{policy}-{collective}"),
            ddp_bucket_cap_mb=0.02 if integration == "ddp-hook" else None,
        )  # fmt: skip
        train_on_rank(ctx, options, workload=make_workload("gpt", tiny=True, seed=0))
    for name, integration, policy, collective, extra in METHOD_CASES:
        config = PolicyConfig(
            policy=policy, density=0.05, collective=collective, release_period=PERIOD, num_buckets=3, **extra
        )
        fresh_infos = build_param_infos(
            named_parameters(make_workload("gpt", tiny=True, seed=0).model), fresh=config.fresh_patterns
        )
        options = TrainOptions(
            workload="gpt", tiny=True, config=config, steps=STEPS, batch_size=4, integration=integration,
            plan=_plan(fresh_infos) if policy == "importance" else None, evaluate=False, progress=False,
            record_trace=True, out=str(Path(root) / name),
            ddp_bucket_cap_mb=0.02 if integration == "ddp-hook" else None,
        )  # fmt: skip
        train_on_rank(ctx, options, workload=make_workload("gpt", tiny=True, seed=0))
    return len(CASES) + len(METHOD_CASES)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    from igrt.train.launch import launch

    root = tmp_path_factory.mktemp("agreement")
    launch(_train_all, nproc=2, backend="gloo", args=(str(root),), timeout_s=600)
    return root


@pytest.mark.parametrize(("integration", "policy", "collective"), CASES)
def test_replay_matches_the_run_op_for_op(runs, integration, policy, collective):
    run = runs / f"{integration}-{policy}-{collective}"
    rep = replay_run(run)
    s = rep.summary
    assert s["integration"] == integration and s["steps"] == STEPS
    assert s["bytes_exact"], s["byte_mismatches"][:5]
    assert s["ops_exact"], s["op_mismatch_steps"]
    assert s["num_ops_measured"] > 0
    for row in rep.rows:
        for f in ("values_bytes", "indices_bytes", "dense_bytes", "metadata_bytes", "num_collectives"):
            assert row[f"measured_{f}"] == row[f"predicted_{f}"], (row["step"], f)
    if integration == "ddp-hook":  # DDP really split and rebuilt its buckets
        assert max(r["predicted_num_collectives"] for r in rep.rows[1:]) > 1


@pytest.mark.parametrize("case", METHOD_CASES, ids=[c[0] for c in METHOD_CASES])
def test_replay_matches_the_run_with_the_method_options(runs, case):
    import csv

    name, integration, _, collective, extra = case
    rep = replay_run(runs / name)
    s = rep.summary
    assert s["integration"] == integration and s["steps"] == STEPS
    assert s["bytes_exact"], s["byte_mismatches"][:5]
    assert s["ops_exact"], s["op_mismatch_steps"]
    with (runs / name / "ops.csv").open() as f:
        ops = list(csv.DictReader(f))
    per_step = [sum(int(r["values_bytes"]) + int(r["dense_bytes"]) for r in ops
                    if int(r["step"]) == t and r["rank"] == "0") for t in range(STEPS)]  # fmt: skip
    if "warmup_steps" in extra:  # the warm-up sends every component: more than any later step
        w = extra["warmup_steps"]
        assert min(per_step[:w]) > max(per_step[w:]), per_step
    config = json.loads((runs / name / "summary.json").read_text())["config"]
    assert {key: config[key] for key in extra} == {key: list(v) if isinstance(v, tuple) else v for key, v in extra.items()}
    if extra.get("low_mode") == "thin":  # nothing is held: every step puts the same entries on the wire
        assert len(set(per_step)) == 1, per_step
        with (runs / f"{integration}-importance-{collective}" / "ops.csv").open() as f:  # the same run, held
            held_ops = list(csv.DictReader(f))
        held = [sum(int(r["values_bytes"]) + int(r["dense_bytes"]) for r in held_ops
                    if int(r["step"]) == t and r["rank"] == "0") for t in range(STEPS)]  # fmt: skip
        assert len(set(held)) > 1 and sum(per_step) < sum(held) * 1.5, (per_step, held)


def test_the_suite_covers_both_kinds_of_collective(runs):
    """Across the cases, sparse gathers, dense all-reduces and count exchanges all ran."""
    import csv

    kinds = set()
    for integration, policy, collective in CASES:
        with (runs / f"{integration}-{policy}-{collective}" / "ops.csv").open() as f:
            kinds |= {r["kind"] for r in csv.DictReader(f)}
    assert kinds == {"count_exchange", "sparse_gather", "dense_allreduce"}


@pytest.mark.parametrize("integration", ["sync", "ddp-hook"])
def test_every_rank_times_its_combine_work_and_the_replay_reads_it(runs, integration):
    """The runtime times each issued op's combine work (decode, index-add, divide) on every rank;
    the replay takes those times as inputs, op for op, and a run without them (an older op log)
    replays as before."""
    import csv

    from igsim.studies.replay import combine_s, run_workload

    run = runs / f"{integration}-topk-sparse"
    with (run / "ops.csv").open() as f:
        ops = list(csv.DictReader(f))
    issued = [r for r in ops if int(r["issued"]) and int(r["step"]) < STEPS]  # not the flush
    by_kind = {k: [float(r["combine_s"]) for r in issued if r["kind"] == k] for k in {r["kind"] for r in issued}}
    assert min(by_kind["sparse_gather"]) > 0  # every sparse gather's index-add took time
    assert max(by_kind.get("count_exchange", [0.0])) == 0  # a count exchange has nothing to combine
    inputs = load_run(run)
    w = run_workload(inputs)
    c = w.combine_s_by_rank
    assert c.shape[:2] == (STEPS, 2) and c.sum() == pytest.approx(sum(float(r["combine_s"]) for r in issued))
    rows = {(int(r["step"]), int(r["rank"])): r for r in csv.DictReader((run / "metrics.csv").open())}
    for (t, rank), row in rows.items():  # the metrics carry each rank's step total
        if t >= STEPS:
            continue
        assert float(row["x_combine_s"]) == pytest.approx(c[t, rank].sum(), abs=1e-9)
    old = dataclasses.replace(inputs, ops=[{k: v for k, v in r.items() if k != "combine_s"} for r in ops])
    assert combine_s(old, STEPS) is None


def test_the_ddp_hook_times_its_finalize_and_the_replay_reads_it(runs):
    """Under the DDP hook every rank records the time from the end of its communication and of
    backward's own work to backward's return (``x_finalize_s``), inside its exposed time; the
    replay takes it per rank and step, and runs under sync have none."""
    import csv

    from igsim.studies.replay import finalize_s, run_workload

    run = runs / "ddp-hook-topk-sparse"
    rows = [r for r in csv.DictReader((run / "metrics.csv").open()) if int(r["step"]) < STEPS]
    fin = np.array([float(r["x_finalize_s"]) for r in rows])
    assert np.all(fin >= 0) and fin.max() > 0
    assert all(float(r["x_finalize_s"]) <= float(r["exposed_comm_s"]) + 1e-9 for r in rows)
    w = run_workload(load_run(run))
    assert w.finalize_s_by_rank.shape == (STEPS, 2)
    for r in rows:
        assert w.finalize_s_by_rank[int(r["step"]), int(r["rank"])] == pytest.approx(float(r["x_finalize_s"]))
    assert finalize_s(load_run(runs / "sync-topk-sparse"), STEPS) is None


def test_importance_releases_are_staggered_in_the_replay(runs):
    rep = replay_run(runs / "sync-importance-sparse")
    low = [r["predicted_values_bytes"] for r in rep.rows]
    assert len(set(low[:PERIOD])) > 1  # different phases send different components


def test_bad_run_folders_are_one_clear_error(runs, tmp_path):
    with pytest.raises(ValueError, match=r"no summary\.json"):
        load_run(tmp_path)
    src = runs / "sync-topk-sparse"
    broken = tmp_path / "old"
    broken.mkdir()
    summary = json.loads((src / "summary.json").read_text())
    (broken / "summary.json").write_text(json.dumps({**summary, "summary_format": "igrt-train/1"}))
    with pytest.raises(ValueError, match="another version"):
        load_run(broken)
    (broken / "summary.json").write_text(json.dumps({**summary, "record_trace": False}))
    with pytest.raises(ValueError, match="--record-trace"):
        load_run(broken)
    imp = runs / "sync-importance-sparse"
    other = tmp_path / "imp"
    other.mkdir()
    for name in ("summary.json", "ops.csv", "metrics.csv"):
        (other / name).write_bytes((imp / name).read_bytes())
    (other / "trace").mkdir()
    plan = SyncPlan.load(imp / "plan.json")
    dataclasses.replace(plan, release_period=PERIOD + 1).save(other / "plan.json")
    with pytest.raises(ValueError, match="does not match the run"):
        load_run(other)
