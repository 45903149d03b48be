"""Online profiling: the simulator's replay follows the run's re-plans and costs exactly its bytes.

The tiny GPT trains on 2 real gloo ranks with ``--online-profile --record-trace`` (window 3, a
re-plan every 4 steps: plans from steps 0, 4 and 8); :func:`igsim.studies.replay.replay_run` reads
``plans.jsonl`` and must give, on every step and rank, the measured byte fields and collective
counts — the start plan's dense-ish steps, the re-plans' own collectives (the window's all-reduce
and the agreement check: :func:`igpolicy.online.replan_op_bytes`) on steps 3 and 7, and the new
plans' releases after them — and the same issued ops with the same encoded bytes.
"""

from __future__ import annotations

import json

import pytest

from igpolicy.online import replan_op_bytes
from igsim.studies.replay import replay_run

STEPS = 10


@pytest.fixture(scope="module")
def online_run(tmp_path_factory):
    from igrt.cli import main

    out = tmp_path_factory.mktemp("online-replay") / "run"
    argv = [
        "train", "--workload", "gpt", "--tiny", "--policy", "importance", "--online-profile",
        "--online-window", "3", "--replan-every", "4", "--release-period", "2", "--steps", str(STEPS),
        "--ranks", "2", "--backend", "gloo", "--batch-size", "4", "--no-eval", "--quiet", "--record-trace",
        "--out", str(out),
    ]  # fmt: skip
    assert main(argv) == 0
    return out


def test_the_replay_follows_the_re_plans_byte_for_byte(online_run):
    plans = [json.loads(line) for line in (online_run / "plans.jsonl").read_text().splitlines()]
    assert [p["step"] for p in plans] == [0, 4, 8]
    rep = replay_run(online_run)
    s = rep.summary
    assert s["steps"] == STEPS
    assert s["bytes_exact"], s["byte_mismatches"][:5]
    assert s["ops_exact"], s["op_mismatch_steps"]
    by_step = {r["step"]: r for r in rep.rows}
    for r in rep.rows:
        for f in ("values_bytes", "indices_bytes", "dense_bytes", "metadata_bytes", "num_collectives"):
            assert r[f"measured_{f}"] == r[f"predicted_{f}"], (r["step"], f)
    # the re-plans' collectives sit on steps 3 and 7, as the runtime counted them
    summary = json.loads((online_run / "summary.json").read_text())
    num_components = len(plans[0]["pinned"])
    extra = sum(
        b.metadata_bytes for b in replan_op_bytes(num_components=num_components, window=3, world_size=2)
    )
    assert summary["online_profile"]["replan_steps"] == [4, 8]
    for t in (3, 7):
        assert by_step[t]["predicted_metadata_bytes"] - by_step[t - 1]["predicted_metadata_bytes"] == extra
        assert by_step[t]["predicted_num_collectives"] == by_step[t - 1]["predicted_num_collectives"] + 2
    # the start plan sends every component every step; the online plans hold the low ones
    assert plans[1]["low"] and plans[2]["low"]
    start = by_step[1]["predicted_values_bytes"]
    assert max(by_step[t]["predicted_values_bytes"] for t in range(4, STEPS)) < start


def test_an_online_run_without_its_plan_history_is_refused(online_run, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(online_run, broken)
    (broken / "plans.jsonl").unlink()
    with pytest.raises(ValueError, match=r"without plans\.jsonl"):
        replay_run(broken)


def test_a_bytes_capped_online_run_keeps_every_re_plan_under_its_cap_and_replays_exactly(tmp_path):
    """``--max-share``: every re-plan's expected share is at most the cap (or, where the cap cannot be
    met, nothing unpinned is important), the cap made some component low, and the replay of the
    run's plans still costs exactly its bytes."""
    from igpolicy.plan import SyncPlan
    from igpolicy.vocab import ComponentClass
    from igrt.cli import main

    cap = 0.55
    out = tmp_path / "capped"
    argv = [
        "train", "--workload", "gpt", "--tiny", "--policy", "importance", "--online-profile",
        "--online-window", "3", "--replan-every", "4", "--release-period", "2", "--steps", "9",
        "--ranks", "2", "--backend", "gloo", "--batch-size", "4", "--no-eval", "--quiet", "--record-trace",
        "--max-share", str(cap), "--out", str(out),
    ]  # fmt: skip
    assert main(argv) == 0
    plans = [json.loads(line) for line in (out / "plans.jsonl").read_text().splitlines()]
    assert [p["step"] for p in plans] == [0, 4, 8]
    demoted = 0
    for entry in plans[1:]:
        plan = SyncPlan.from_json(entry["plan"])
        rec = plan.settings["threshold"]["max_share"]
        assert rec["cap"] == cap
        if rec["reached"]:
            assert plan.expected_share <= cap
        else:
            assert not [c for c in plan.components if c.cls == ComponentClass.IMPORTANT]
        demoted += len(rec["demoted"])
    assert demoted, "the cap must bind on this run for the test to mean something"
    s = replay_run(out).summary
    assert s["bytes_exact"], s["byte_mismatches"][:5]
    assert s["ops_exact"], s["op_mismatch_steps"]


def test_a_thinned_online_run_sends_every_component_every_step_and_replays_exactly(tmp_path):
    """``--low-mode thin``: after each re-plan the low components send every step at density / R
    (not held), so every step of one plan puts the same bytes on the wire, fewer than the start
    plan's; the replay follows the re-plans and costs exactly those bytes."""
    from igpolicy.plan import SyncPlan
    from igrt.cli import main

    out = tmp_path / "thin"
    argv = [
        "train", "--workload", "gpt", "--tiny", "--policy", "importance", "--online-profile",
        "--online-window", "3", "--replan-every", "4", "--release-period", "4", "--steps", "10",
        "--ranks", "2", "--backend", "gloo", "--batch-size", "4", "--no-eval", "--quiet", "--record-trace",
        "--low-mode", "thin", "--out", str(out),
    ]  # fmt: skip
    assert main(argv) == 0
    plans = [json.loads(line) for line in (out / "plans.jsonl").read_text().splitlines()]
    assert SyncPlan.from_json(plans[1]["plan"]).low, "the re-plan must make something low for this to mean anything"
    rep = replay_run(out)
    s = rep.summary
    assert s["bytes_exact"], s["byte_mismatches"][:5]
    assert s["ops_exact"], s["op_mismatch_steps"]
    values = {r["step"]: r["measured_values_bytes"] for r in rep.rows}
    assert values[4] < values[1]  # the low components now send k / R
    assert values[4] == values[5] == values[6] == values[7]  # ... on every step, none held
