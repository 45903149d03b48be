"""igsim.studies.step_validation: the per-policy comparison on hand-made runs."""

from __future__ import annotations

import pytest

from igsim.studies import step_validation as sv


def _rows(comm_by_step_and_rank, *, step_s=1.0, wire=100.0):
    return [
        {"step": s, "rank": r, "comm_s": c, "step_s": step_s + s, "wire_bytes": wire}
        for s, per_rank in enumerate(comm_by_step_and_rank)
        for r, c in enumerate(per_rank)
    ]


def test_compare_steps_hand_case():
    # dense: ranks wait for each other (0.9..1.0) but the network part is 0.5; the replay says 0.55
    real_dense = _rows([[9.0, 9.0], [0.5, 1.5], [0.5, 0.7]], step_s=10.0)
    sim_dense = _rows([[0.55], [0.55], [0.55]], step_s=5.0)
    real_topk = _rows([[9.0, 9.0], [0.1, 0.3], [0.1, 0.3]], step_s=2.0, wire=10.0)
    sim_topk = _rows([[0.08], [0.08], [0.08]], step_s=1.0, wire=10.0)
    rep = sv.compare_steps({"dense": (real_dense, sim_dense), "topk": (real_topk, sim_topk)}, skip_steps=1)
    d, t = rep["policies"]["dense"], rep["policies"]["topk"]
    assert d["steps"] == 2
    assert d["measured_comm_min_over_ranks_s"] == pytest.approx(0.5)
    assert d["measured_comm_mean_over_ranks_s"] == pytest.approx((1.0 + 0.6) / 2)
    assert d["error_vs_min"] == pytest.approx(0.1)
    assert t["error_vs_min"] == pytest.approx(-0.2)
    assert rep["mean_abs_error_vs_min"] == pytest.approx(0.15)
    assert d["measured_wire_bytes"] == d["predicted_wire_bytes"] == 100.0
    assert rep["kendall_tau_step"] == 1.0 and rep["kendall_tau_comm"] == 1.0
    assert "dense" in sv.format_steps(rep)


def test_compare_steps_needs_common_steps():
    with pytest.raises(ValueError, match="no step"):
        sv.compare_steps({"dense": (_rows([[1.0]]), _rows([[1.0]]))}, skip_steps=1)


def test_read_metrics_rejects_other_files(tmp_path):
    f = tmp_path / "m.csv"
    f.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="StepMetrics"):
        sv.read_metrics(f)
    f.write_text("step,rank,source,comm_s\n0,0,real,0.5\n")
    assert sv.read_metrics(f) == [{"step": 0.0, "rank": 0.0, "comm_s": 0.5}]
    with pytest.raises(ValueError, match="no such"):
        sv.read_metrics(tmp_path / "none.csv")


def test_range_flags_name_what_the_model_does_not_cover():
    base = {"world_size": 4, "backend": "gloo", "machine": {"cpu_count": 8, "load_average": [3.0, 2.0, 1.0]}}
    assert sv.range_flags(base) == []
    assert "2 ranks on gloo" in " ".join(sv.range_flags({**base, "world_size": 2}))
    assert sv.range_flags({**base, "world_size": 2, "backend": "nccl"}) == []
    assert "16 ranks on 8 cores" in " ".join(sv.range_flags({**base, "world_size": 16}))
    busy = {**base, "machine": {"cpu_count": 2, "load_average": [4.5, 4.0, 3.0]}}
    assert any(f.startswith("CPU busy: load 4.5 on 2 cores") for f in sv.range_flags(busy))
    assert sv.range_flags({"world_size": 4, "backend": "gloo"}) == []  # older summaries: nothing to judge


def test_flagged_runs_are_shown_but_left_out_of_the_means():
    # dense is within range (+10 %); topk is flagged and far off (+100 %): the mean is dense's alone
    real_dense = _rows([[9.0, 9.0], [0.5, 0.5], [0.5, 0.5]], step_s=10.0)
    sim_dense = _rows([[0.55], [0.55], [0.55]], step_s=11.0)
    real_topk = _rows([[9.0, 9.0], [0.1, 0.1], [0.1, 0.1]], step_s=2.0)
    sim_topk = _rows([[0.2], [0.2], [0.2]], step_s=4.0)
    runs = {"dense": (real_dense, sim_dense), "topk": (real_topk, sim_topk)}
    rep = sv.compare_steps(runs, skip_steps=1, flags={"topk": ["2 ranks on gloo (...)"]})
    assert rep["runs_in_range"] == 1
    assert rep["mean_abs_error_vs_min"] == pytest.approx(0.1)
    assert rep["policies"]["dense"]["step_error"] == pytest.approx(1.0 / 11.5)  # steps 1, 2: 11, 12 ms measured, 12, 13 predicted
    assert rep["mean_abs_step_error"] == pytest.approx(rep["policies"]["dense"]["step_error"])
    text = sv.format_steps(rep)
    assert "topk: outside the validated range: 2 ranks on gloo" in text
    assert "no barrier between steps" in text  # what the step time compares, on each side
    everything = sv.compare_steps(runs, skip_steps=1, flags={p: ["x"] for p in runs})
    assert everything["runs_in_range"] == 0 and "none is inside" in everything["means_over"]
    assert everything["mean_abs_error_vs_min"] == pytest.approx((0.1 + 1.0) / 2)


def test_a_run_outside_the_target_is_missed_only_when_its_own_steps_can_tell():
    # last rank: 1.0 every step (no spread) -> a prediction 20 % short is a resolved miss
    steady = _rows([[9.0, 9.0], *([[1.0, 1.2]] * 8)])
    # the same mean with wild steps (0.4 / 1.6): the prediction 20 % short lies within 2 standard errors
    wild = _rows([[9.0, 9.0], *([[0.4, 2.0], [1.6, 2.0]] * 4)])
    sim = _rows([[0.8]] * 9)
    rep = sv.compare_steps({"steady": (steady, sim), "wild": (wild, sim)}, skip_steps=1)
    s, w = rep["policies"]["steady"], rep["policies"]["wild"]
    assert s["measured_comm_min_over_ranks_s"] == pytest.approx(1.0) == w["measured_comm_min_over_ranks_s"]
    assert s["error_vs_min"] == pytest.approx(-0.2) == w["error_vs_min"]
    assert s["measured_comm_min_over_ranks_se_s"] == pytest.approx(0.0) and s["verdict_vs_min"] == "missed"
    spread = sv.last_rank_spread(wild, skip_steps=1)
    assert spread["steps"] == 8 and spread["sd_s"] == pytest.approx(0.6414, abs=1e-4)
    assert w["measured_comm_min_over_ranks_se_s"] == pytest.approx(spread["sd_s"] / 8**0.5)
    assert w["verdict_vs_min"] == "unresolved"
    # 2 standard errors at half the target (5 % of the mean): (2 * 0.6414 / 0.05) ** 2 steps
    assert w["steps_to_resolve"] == 659
    assert rep["verdicts_vs_min"] == {"met": 0, "missed": 1, "unresolved": 1}
    out = sv.format_steps(rep)
    assert "unresolved" in out and "1 met" not in out and "0 met, 1 missed, 1 unresolved" in out
    ok = sv.judge_run(1.0, 1.05, 0.5, 1.0)
    assert ok["verdict"] == "met" and ok["error"] == pytest.approx(0.05)
