"""The RQ1–RQ5 studies' quick modes, as CI smoke tests with property checks on what they write.

Each study's ``main([... "--quick"])`` runs in this process (tiny models, one in-process rank, no
testbed) into a temporary folder; the traces and training runs are cached in one folder shared by
the whole module, so a trace recorded for RQ1 is reused by RQ5. The checks are properties that hold
whatever the numbers are: bytes ordering between policies, packings that move the same bytes,
a release period of 1 that is Top-k, statistics in their ranges, every promised file present.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("experiments-cache")


def _run(module: str, out: Path, cache: Path, *extra: str) -> dict:
    import importlib

    main = importlib.import_module(f"experiments.{module}").main
    assert main(["--quick", "--out", str(out), "--cache", str(cache), *extra]) == 0
    meta = json.loads((out / "meta.json").read_text())
    assert meta["quick"] is True and meta["wall_s"] >= 0
    return meta


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _num(x: str) -> float:
    return float(x) if x not in ("", None) else math.nan


def test_rq1_stability(tmp_path: Path, cache: Path) -> None:
    meta = _run("rq1_stability", tmp_path, cache)
    pairs = _rows(tmp_path / "pairs.csv")
    assert {r["comparison"] for r in pairs} == {"seeds", "windows", "workloads"}
    for r in pairs:
        assert 0.0 <= _num(r["jaccard"]) <= 1.0
        s = _num(r["spearman"])
        assert math.isnan(s) or -1.0 <= s <= 1.0
        assert int(r["important_a"]) <= int(r["num_components"])
    thresholds = _rows(tmp_path / "thresholds.csv")
    assert {r["method"] for r in thresholds} == {
        "knee",
        "otsu",
        "gmm",
        "kmeans2",
        "percentile",
        "fixed_ratio",
    }
    for r in thresholds:
        assert 1 <= int(r["num_important"]) <= int(r["num_components"])
        assert 0.0 <= _num(r["low_byte_share"]) <= 1.0
    assert set(meta["summary"]["pairs"]) == {"seeds", "windows", "workloads"}
    for name in ("rq1_jaccard.png", "rq1_thresholds.png", "rq1_membership.png"):
        assert (tmp_path / name).stat().st_size > 0


def test_rq2_partition(tmp_path: Path, cache: Path) -> None:
    _run("rq2_partition", tmp_path, cache)
    rows = _rows(tmp_path / "rq2_table.csv")
    methods = [r["method"] for r in rows]
    assert methods == ["Top-k+EF", "knee", "otsu", "gmm", "kmeans2", "percentile", "fixed_ratio"]
    topk = rows[0]
    for r in rows[1:]:
        # the importance policy never moves more bytes than Top-k+EF at the same density
        assert 0.0 < _num(r["bytes_vs_topk"]) <= 1.0 + 1e-9
        assert int(r["num_important"]) + int(r["num_low"]) >= 1
        assert math.isfinite(_num(r["quality_mean"]))
    assert _num(topk["bytes_vs_topk"]) == 1.0
    assert (tmp_path / "rq2_partition.png").stat().st_size > 0


def test_rq3_release(tmp_path: Path, cache: Path) -> None:
    _run("rq3_release", tmp_path, cache)
    rows = _rows(tmp_path / "rq3_table.csv")
    by = {(r["variant"], int(r["release_period"])): r for r in rows}
    topk, r1 = by["topk", 1], by["staggered", 1]
    # R = 1 sends every component every step: the importance policy is Top-k+EF, bit for bit
    assert _num(r1["bytes_per_step"]) == _num(topk["bytes_per_step"])
    assert _num(r1["quality"]) == _num(topk["quality"])
    assert ("drop_held", 1) not in by and ("all_at_once", 1) not in by
    stag, burst, drop = by["staggered", 4], by["all_at_once", 4], by["drop_held", 4]
    # the same components send the same bytes over a period; only their timing differs
    assert _num(stag["bytes_per_step"]) == pytest.approx(_num(burst["bytes_per_step"]))
    assert _num(drop["bytes_per_step"]) == _num(stag["bytes_per_step"])
    assert _num(burst["peak_to_median"]) > _num(stag["peak_to_median"])  # the burst is a traffic spike
    assert _num(stag["bytes_vs_topk"]) < 1.0
    assert (tmp_path / "rq3_release.png").stat().st_size > 0


def test_rq4_packing(tmp_path: Path, cache: Path) -> None:
    _run("rq4_packing", tmp_path, cache)
    rows = _rows(tmp_path / "rq4_table.csv")
    cases = {(r["case"], r["overlap"]) for r in rows}
    assert len(cases) == 3
    for case in cases:
        rs = {r["packing"]: r for r in rows if (r["case"], r["overlap"]) == case}
        assert set(rs) == {"ddp", "round_robin", "lpt", "kk"}
        # packing moves blocks between buckets, never payload on or off the wire (only the 8-byte
        # count per bucket varies with the number of buckets)
        assert len({_num(r["payload_bytes"]) for r in rs.values()}) == 1
        for r in rs.values():
            metadata = _num(r["wire_bytes"]) - _num(r["payload_bytes"])  # 8 bytes per sparse bucket
            assert metadata >= 0
            if r["overlap"] in ("False", "0"):  # the DDP hook uses DDP's buckets, not the packing's
                assert metadata <= 8 * _num(r["num_buckets"]) + 1e-9
        for r in rs.values():
            assert _num(r["imbalance_mean"]) >= 1.0 - 1e-9 and _num(r["gap_to_lower_bound"]) >= -1e-9
        # KK (refined, never worse than LPT) reaches a largest bucket no larger than LPT's
        assert _num(rs["kk"]["gap_to_lower_bound"]) <= _num(rs["lpt"]["gap_to_lower_bound"]) + 1e-9
    assert (tmp_path / "rq4_packing.png").stat().st_size > 0


def test_rq5_end_to_end(tmp_path: Path, cache: Path) -> None:
    meta = _run("rq5_end_to_end", tmp_path, cache, "--zero-unsent", "--catch-up", "--equal-bytes")
    rows = _rows(tmp_path / "rq5_table.csv")
    for wl in ("minilm", "gpt"):
        by = {r["policy"]: r for r in rows if r["workload"] == wl}
        assert {"dense", "Top-k+EF", "ADTopk+EF", "importance"} <= set(by)
        dense, topk, imp = (_num(by[p]["bytes_per_step"]) for p in ("dense", "Top-k+EF", "importance"))
        assert dense > topk > imp > 0
        if "importance, head pinned" in by:  # pinning sends one more component every step
            assert imp <= _num(by["importance, head pinned"]["bytes_per_step"]) <= topk
        # a zero gradient for unsent parameters changes the optimizer, not what goes on the wire
        assert _num(by["importance, zero grads for unsent"]["bytes_per_step"]) == imp
        assert _num(by["importance, catch-up"]["bytes_per_step"]) == imp  # catch-up too
        (thin,) = (r for p, r in by.items() if p.startswith("Top-k+EF at equal bytes"))
        # a lower density sized to the importance policy's expected bytes, not the importance split
        assert _num(thin["bytes_per_step"]) < topk
        assert _num(thin["bytes_per_step"]) == pytest.approx(imp, rel=0.25)
        # igsim replays the same decisions: its bytes match the measured ones for the always-send policies
        for p in ("dense", "Top-k+EF"):
            assert _num(by[p]["sim_bytes_per_step"]) == pytest.approx(_num(by[p]["bytes_per_step"]), rel=0.05)
    targets = json.loads((tmp_path / "targets.json").read_text())
    assert len(targets) == 6 and all(t["met"] in (True, False, None) for t in targets)
    assert meta["targets"] == targets
    extra = _rows(tmp_path / "extrapolation.csv")
    assert {r["policy"] for r in extra} == {"dense", "topk", "adtopk", "importance"}
    for name in ("rq5_end_to_end.png", "rq5_extrapolation.png", "plans/minilm.json", "plans/gpt.json"):
        assert (tmp_path / name).stat().st_size > 0
