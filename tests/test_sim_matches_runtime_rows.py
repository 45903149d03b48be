"""Row-sparse embeddings: the simulator's replay costs exactly the bytes the runtime counted.

Like tests/test_sim_matches_runtime_compact.py, with ``row_sparse_embeddings=True`` (issue 15,
item 3): the tiny GPT (token embedding ``transformer.wte.weight``, 257 x 32) trains on 2 real gloo
ranks with ``--record-trace`` under the ``sync`` and ``ddp-hook`` integrations, and
:func:`igsim.studies.replay.replay_run` must give, on every step and rank, the measured byte fields
and collective counts, and the same issued ops with the same encoded bytes. A second oracle ties
the bytes to the wire format: an op carrying the embedding has index bytes = rows x ROW_ID_BYTES
plus its pairs' indices, and its encoded size is the rows section plus the pairs section.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from igpolicy.wire import ROW_ID_BYTES, encoded_rows_bytes, nominal_k, pairs_layout
from tests.test_sim_matches_runtime_compact import _name, check_replay, train_cases

torch.set_num_threads(1)

EMB, VOCAB, DIM = "transformer.wte.weight", 257, 32

# (integration, policy, collective, index_bytes, value_bytes)
CASES = [
    (integration, policy, collective, ib, vb)
    for integration in ("sync", "ddp-hook")
    for policy, collective, ib, vb in (
        ("topk", "sparse", 4, 4),
        ("importance", "sparse", 2, 1),
        ("adtopk", "sparse", 4, 2),
    )
]


def _train_all(ctx, root: str) -> int:
    return train_cases(ctx, root, CASES, row_sparse_embeddings=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    from igrt.train.launch import launch

    root = tmp_path_factory.mktemp("rows-agreement")
    launch(_train_all, nproc=2, backend="gloo", args=(str(root),), timeout_s=600)
    return root


@pytest.mark.parametrize("case", CASES, ids=[_name(c) for c in CASES])
def test_replay_costs_the_bytes_the_runtime_counted(runs, case):
    integration, _, _, ib, vb = case
    run = runs / _name(case)
    config = json.loads((run / "summary.json").read_text())["config"]
    assert config["row_sparse_embeddings"] is True
    ops = check_replay(run, integration)
    density = 0.2 if case[2] == "auto" else 0.05
    rows = min(-(-nominal_k(VOCAB * DIM, density) // DIM), VOCAB)
    row_ops = 0
    for r in ops:
        if r["kind"] != "sparse_gather":
            continue
        k, cap, numel = int(r["k"]), int(r["capacity"]), int(r["numel"])
        assert int(r["values_bytes"]) == k * vb
        if int(r["indices_bytes"]) == k * ib:  # pairs only
            assert (
                int(r["wire_size_bytes"])
                == pairs_layout(cap, index_bytes=ib, value_bytes=vb, numel=numel).size_bytes
            )
            continue
        row_ops += 1  # carries the embedding: its rows section, then the other parameters' pairs
        pairs_k, pairs_cap = k - rows * DIM, cap - rows * DIM
        assert pairs_k >= 0 and int(r["indices_bytes"]) == rows * ROW_ID_BYTES + pairs_k * ib
        size = encoded_rows_bytes(rows, dim=DIM, value_bytes=vb)
        if numel > VOCAB * DIM:
            size += pairs_layout(pairs_cap, index_bytes=ib, value_bytes=vb, numel=numel).size_bytes
        assert int(r["wire_size_bytes"]) == size
    assert row_ops, "the embedding never travelled as rows"
