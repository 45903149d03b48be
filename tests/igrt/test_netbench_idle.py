"""netbench's cold cases: ``idle_s`` leaves the connections idle before each rep, outside its time."""

from __future__ import annotations

import time

from igrt.train.launch import launch

IDLE, REPS = 0.3, 3


def _time_cases(ctx) -> tuple[list[dict], float]:
    from igrt.testbed.netbench import run_cases

    cases = [
        {"name": "warm", "op": "p2p", "size_bytes": 4096},
        {"name": "cold", "op": "all_gather", "size_bytes": 4096, "idle_s": IDLE},
    ]
    t0 = time.monotonic()
    results = run_cases(cases, reps=REPS, warmup=0)
    return results, time.monotonic() - t0


def test_a_cold_case_idles_before_each_rep_and_does_not_time_the_idle() -> None:
    for results, wall in launch(_time_cases, nproc=2, backend="gloo", timeout_s=120).values():
        by_name = {r["name"]: r for r in results}
        assert by_name["cold"]["idle_s"] == IDLE and len(by_name["cold"]["times_s"]) == REPS
        assert all(t < IDLE for r in results for t in r["times_s"])  # the idle is not timed
        assert REPS * IDLE <= wall < REPS * IDLE + 5.0  # ... but it was spent, once per rep
