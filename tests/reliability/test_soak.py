"""The soak in its short forms: 80 steps of random schedules on 3 gloo ranks, and 40 steps with a
kill -9 of one rank and a resume (benchmarks/soak.py runs 1,000 with two kills).

Every 10 steps the ranks switch to a new random policy config and plan (each of the five policies
in turn; density, period, packing, buckets, collectives, wire widths and sparsifier at random) and
every step each rank draws gradients that are absent, zero, dense, sparse, tiny or huge. On every
step and rank :func:`benchmarks.soak.soak` asserts conservation (Σg == Σsent + e within the fp32
rounding bound), that each synchronized gradient is the rank average of what was sent, and that a
flush leaves zero residuals. Here: nothing hangs (hard timeout), the run covered empty payloads and
every policy, and memory stays flat (RSS growth after the first quarter below ``RSS_GROWTH_MIB``).
"""

from __future__ import annotations

import json

import pytest

from benchmarks.soak import SoakResult, crash_soak, soak, verify_run
from igpolicy.config import POLICIES
from tests.igrt.dist_util import run_distributed

STEPS = 80
SEGMENT_STEPS = 10
RSS_GROWTH_MIB = 16.0  # 1,000 steps grow by about 3 MiB (docs/reliability.md); a leak per step would show


def test_short_soak_on_three_ranks() -> None:
    results = run_distributed(soak, world_size=3, args=(STEPS, 11, SEGMENT_STEPS), timeout_s=240.0)
    for r in results:
        assert r.steps == STEPS and r.segments == STEPS // SEGMENT_STEPS
        assert set(r.policies) == set(POLICIES)
        assert r.max_gap_over_bound <= 1.0
        assert r.empty_steps > 0, "the run never produced an empty payload"
        assert r.nonfinite_steps > 0 and r.skipped_steps > 0, "no non-finite step was injected and skipped"
        assert r.skipped_steps == results[0].skipped_steps  # skipped on every rank alike
        assert r.rss_end_mib - r.rss_mark_mib <= RSS_GROWTH_MIB, (r.rss_mark_mib, r.rss_end_mib)


# ----------------------------------------------------------------------------- kill -9 and resume
CRASH_STEPS = 40
CRASH_SEED = 2  # NaN / inf on steps 3, 18, 20, 24 and 39: three of them fall in the steps done again


def test_soak_killed_and_resumed_loses_nothing(tmp_path) -> None:
    """40 steps on 3 gloo ranks, a checkpoint every 8 steps; the last rank gets SIGKILL once rank 0
    has logged 23 steps; the run resumes from the newest complete checkpoint to step 40. Every
    step is in every rank's log once, in order; the steps cut back and done again came out the same;
    every row equals an uninterrupted run's; the figures cover all 40 steps."""
    phases, results, counts = crash_soak(
        tmp_path, steps=CRASH_STEPS, nproc=3, seed=CRASH_SEED, segment_steps=SEGMENT_STEPS, checkpoint_every=8,
        kills=[(23, [2])], reference=True, phase_timeout_s=240.0,
    )  # fmt: skip
    killed, resumed = phases[0], phases[1]
    # the launcher raised: for the killed rank, or for a survivor whose collective failed first
    assert killed.killed == "rank 2" and killed.killed_at >= 23 and killed.error.startswith("RuntimeError")
    assert resumed.started_at in (16, 24) and resumed.started_at <= killed.killed_at
    for r in results.values():
        assert r.steps == CRASH_STEPS and r.segments == CRASH_STEPS // SEGMENT_STEPS
        assert r.resumed_from == (resumed.started_at,)
        assert r.nonfinite_steps == 5 and r.skipped_steps == results[0].skipped_steps > 0
        assert r.max_gap_over_bound <= 1.0
    assert counts["rows"] == 3 * CRASH_STEPS and counts["compared"] == 3 * CRASH_STEPS
    # rank 0 had logged killed_at steps when the kill was sent, so at least its rows from the resume
    # point on were cut back and done again; the other ranks may lag rank 0 by a step or more
    assert counts["redone"] >= killed.killed_at - resumed.started_at


def test_verify_run_names_a_lost_or_duplicated_step(tmp_path) -> None:
    """The oracle itself: a log missing a step, or holding one twice, is refused naming it."""
    rows = [{"step": s, "segment": 0, "injected": False, "skipped": False, "empty": False, "residual_sum": 0.0}
            for s in range(4)]  # fmt: skip
    result = SoakResult(
        rank=0, steps=4, segments=1, wall_s=1.0, max_gap=0.0, max_gap_over_bound=0.0, max_wire_error=0.0,
        empty_steps=0, nonfinite_steps=0, skipped_steps=0, rss_mark_mib=0.0, rss_end_mib=0.0, mark_step=1,
        policies=("topk",),
    )  # fmt: skip
    log = tmp_path / "steps-rank000.jsonl"
    for broken, message in (
        (rows[:2] + rows[3:], r"lost steps \[2\]"),
        (rows[:3] + rows[2:], r"duplicated \[2\]"),
    ):
        log.write_text("".join(json.dumps(r) + "\n" for r in broken))
        with pytest.raises(AssertionError, match=message):
            verify_run(tmp_path, steps=4, nproc=1, results={0: result})
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert verify_run(tmp_path, steps=4, nproc=1, results={0: result})["rows"] == 4
