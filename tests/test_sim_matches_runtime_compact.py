"""Compact wire widths: the simulator's replay costs exactly the bytes the runtime counted.

Like tests/test_sim_matches_runtime.py (whose plan and settings it reuses), for bucket-local
16-bit indices and 8-bit values (issue 15, item 3): the tiny GPT trains on 2 real gloo ranks with
``--record-trace`` under the ``sync`` and ``ddp-hook`` integrations, and
:func:`igsim.studies.replay.replay_run` must give, on every step and rank, the measured byte fields
and collective counts, and the same issued ops with the same encoded bytes. A second oracle ties the
bytes to the wire format itself: every logged sparse gather's encoded size is
:func:`igpolicy.wire.pairs_layout` of its capacity and bucket numel, its metadata holds the block
table and scale, and a dense all-reduce of an int8 configuration carries bf16 values.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from igpolicy.config import PolicyConfig
from igpolicy.wire import COUNT_BYTES, dense_value_bytes, pairs_layout
from igsim.studies.replay import replay_run
from tests.test_sim_matches_runtime import PERIOD, STEPS, _plan

torch.set_num_threads(1)

# (integration, policy, collective, index_bytes, value_bytes)
CASES = [
    (integration, policy, collective, ib, vb)
    for integration in ("sync", "ddp-hook")
    for policy, collective, ib, vb in (
        ("topk", "sparse", 2, 1),
        ("adtopk", "sparse", 2, 2),
        ("importance", "auto", 4, 1),
        ("importance", "sparse", 2, 1),
        ("topk", "dense", 2, 1),  # int8 configs all-reduce in bf16
    )
]


def _name(case) -> str:
    return "-".join(map(str, case))


def train_cases(ctx, root: str, cases, **config_extra) -> int:
    """Each (integration, policy, collective, index_bytes, value_bytes) case trained into ``root``."""
    from igrt.sync.synchronizer import build_param_infos, named_parameters
    from igrt.train.loop import TrainOptions, train_on_rank
    from igrt.workloads import make_workload

    plan = _plan(build_param_infos(named_parameters(make_workload("gpt", tiny=True, seed=0).model)))
    for case in cases:
        integration, policy, collective, ib, vb = case
        config = PolicyConfig(
            policy=policy, density=0.2 if collective == "auto" else 0.05, collective=collective,
            release_period=PERIOD, num_buckets=3, sparsifier="adtopk" if policy == "adtopk" else "topk",
            index_bytes=ib, value_bytes=vb, **config_extra,
        )  # fmt: skip
        options = TrainOptions(
            workload="gpt", tiny=True, config=config, steps=STEPS, batch_size=4, integration=integration,
            plan=plan if policy == "importance" else None, evaluate=False, progress=False, record_trace=True,
            out=str(Path(root) / _name(case)), ddp_bucket_cap_mb=0.02 if integration == "ddp-hook" else None,
        )  # fmt: skip
        train_on_rank(ctx, options, workload=make_workload("gpt", tiny=True, seed=0))
    return len(cases)


def _train_all(ctx, root: str) -> int:
    return train_cases(ctx, root, CASES)


def check_replay(run: Path, integration: str) -> list[dict[str, str]]:
    """The replay of ``run`` is exact (bytes and ops, every step and rank); its issued ops (no flush)."""
    rep = replay_run(run)
    s = rep.summary
    assert s["integration"] == integration and s["steps"] == STEPS
    assert s["bytes_exact"], s["byte_mismatches"][:5]
    assert s["ops_exact"], s["op_mismatch_steps"]
    for row in rep.rows:
        for f in ("values_bytes", "indices_bytes", "dense_bytes", "metadata_bytes", "num_collectives"):
            assert row[f"measured_{f}"] == row[f"predicted_{f}"], (row["step"], f)
    with (run / "ops.csv").open() as f:
        ops = [r for r in csv.DictReader(f) if r["issued"] == "1" and int(r["step"]) < STEPS]  # not the flush
    assert ops
    return ops


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    from igrt.train.launch import launch

    root = tmp_path_factory.mktemp("compact-agreement")
    launch(_train_all, nproc=2, backend="gloo", args=(str(root),), timeout_s=600)
    return root


@pytest.mark.parametrize("case", CASES, ids=[_name(c) for c in CASES])
def test_replay_costs_the_bytes_the_runtime_counted(runs, case):
    integration, _, collective, ib, vb = case
    run = runs / _name(case)
    config = json.loads((run / "summary.json").read_text())["config"]
    assert (config["index_bytes"], config["value_bytes"]) == (ib, vb)
    ops = check_replay(run, integration)
    kinds = {r["kind"] for r in ops}
    if collective != "auto":  # auto picks per bucket; the forced choices are what they say
        assert kinds - {"count_exchange"} == {
            f"{collective}_{'gather' if collective == 'sparse' else 'allreduce'}"
        }
    for r in ops:
        k, cap = int(r["k"]), int(r["capacity"])
        if r["kind"] == "sparse_gather":
            assert int(r["indices_bytes"]) == k * ib and int(r["values_bytes"]) == k * vb
            lay = pairs_layout(cap, index_bytes=ib, value_bytes=vb, numel=int(r["numel"]))
            assert int(r["wire_size_bytes"]) == lay.size_bytes
            header = COUNT_BYTES if integration == "ddp-hook" else 0  # bounded: the count in the header
            assert int(r["metadata_bytes"]) == header + lay.extra_metadata_bytes
        elif r["kind"] == "dense_allreduce":
            assert int(r["dense_bytes"]) == int(r["numel"]) * dense_value_bytes(vb)
