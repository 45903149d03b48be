"""netbench records, per rep, the machine's CPU ticks over it (stolen, idle, total): what the
validation report uses to flag cases timed while the hypervisor held the CPUs."""

from __future__ import annotations

import pytest

from igrt.train.launch import launch

REPS = 3


def _time_cases(ctx, interleave: bool) -> list[dict]:
    from igrt.testbed.netbench import run_cases

    cases = [
        {"name": "ar", "op": "all_reduce", "size_bytes": 1 << 16},
        {"name": "sparse", "op": "sparse_all_gather", "sizes_bytes": [4096, 8192]},
    ]
    return run_cases(cases, reps=REPS, warmup=1, interleave=interleave)


def test_cpu_ticks_reads_proc_stat() -> None:
    from igrt.testbed.netbench import cpu_ticks

    t = cpu_ticks()
    if t is None:
        pytest.skip("no /proc/stat")
    stolen, idle, total = t
    assert stolen >= 0 and idle >= 0 and stolen + idle <= total and total > 0


@pytest.mark.parametrize("interleave", [False, True])
def test_every_rep_records_its_cpu_ticks(interleave: bool) -> None:
    from igrt.testbed.netbench import cpu_ticks

    if cpu_ticks() is None:
        pytest.skip("no /proc/stat")
    for results in launch(_time_cases, nproc=2, backend="gloo", args=(interleave,), timeout_s=120).values():
        for r in results:
            assert len(r["cpu_ticks"]) == len(r["times_s"]) == REPS, r
            assert all(len(t) == 3 and t[0] >= 0 and t[0] + t[1] <= t[2] for t in r["cpu_ticks"]), r
