"""The soak in its short form: 80 steps of random schedules on 3 gloo ranks (benchmarks/soak.py runs 1,000).

Every 10 steps the ranks switch to a new random policy config and plan (each of the five policies
in turn; density, period, packing, buckets, collectives, wire widths and sparsifier at random) and
every step each rank draws gradients that are absent, zero, dense, sparse, tiny or huge. On every
step and rank :func:`benchmarks.soak.soak` asserts conservation (Σg == Σsent + e within the fp32
rounding bound), that each synchronized gradient is the rank average of what was sent, and that a
flush leaves zero residuals. Here: nothing hangs (hard timeout), the run covered empty payloads and
every policy, and memory stays flat (RSS growth after the first quarter below ``RSS_GROWTH_MIB``).
"""

from __future__ import annotations

from benchmarks.soak import soak
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
