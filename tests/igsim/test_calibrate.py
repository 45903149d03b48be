"""``igsim calibrate``: a calibration refit on one recorded ``igrt validate`` run predicts another run
of the same testbed, measured at another time (and under another CPU load), within the targets.

The runs are real measurements committed under docs/validation-data/runs (no root needed here):
``A-<testbed>-q<ms>`` and ``B-…`` a few minutes apart, ``C-…`` with an extra busy loop running.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from igsim.cli import main as igsim_main
from igsim.net.calibration import TESTBED_DEFAULTS_NIC_125KB, Calibration
from igsim.studies import validation as v

RUNS = Path(__file__).resolve().parents[2] / "docs" / "validation-data" / "runs"
QUEUE_MS = 10  # the testbed's default shaper queue (igrt.testbed.namespaces.DEFAULT_QUEUE_S)
TESTBEDS = ("star", "two-level", "hetero", "ring")


def _report(fit_on: Path, predict: Path) -> dict:
    tb_a, cases_a, _ = v.load_measurements(v.measurement_path(fit_on))
    fit = v.fit_testbed(cases_a, tb_a)  # what igsim calibrate fits
    tb, cases, _ = v.load_measurements(v.measurement_path(predict))
    return v.build_report(cases, v.testbed_topology(tb), fit, burst_s=tb.burst_s,
                          roles=(v.CALIBRATION, v.VALIDATION))  # fmt: skip


# Pairs whose worst case misses the 10 % target on these recordings, and why (measured; the
# numbers are in docs/validation.md). strict: a pair that starts to pass must be moved out of here.
_LOAD = "one 256 KiB case much slower than the fit's run (CPU load, 1-min load average {})"
WORST_MISSES = {
    ("B", "star"): _LOAD.format("7.9-9.9: all_gather 256 KiB took 2x in all 7 back-to-back reps, -50.8 %"),
    ("C", "star"): _LOAD.format("11.4-13.9 with the busy loop: all_reduce 256 KiB -26.3 %"),
    (
        "B",
        "two-level",
    ): "broadcast 1 MiB across the uplink -16.0 % (loss stalls in a 10 ms queue, load 7.5-9.6)",
    ("C", "two-level"): _LOAD.format("12.2-13.2 with the busy loop: all_gather 256 KiB -12.9 %"),
    # the ring collectives' own alpha (split_alpha), fitted from round A at load 10.9, is 2.7 ms per
    # hop against 2.2 ms for all: the 256 KiB all-reduce goes long (B-hetero's -10.1 % became -9.9 %)
    ("B", "ring"): "all_reduce 256 KiB +12.0 % (+9.3 % with one alpha): ring alpha 2.7 ms fitted at load 10.9",
    ("C", "ring"): "all_reduce 256 KiB +12.6 % (+9.8 % with one alpha): ring alpha 2.7 ms fitted at load 10.9",
    ("C", "hetero"): _LOAD.format("12.0-12.2 with the busy loop: all_gather 256 KiB -25.8 %"),
}
MEAN_MISSES = {
    ("B", "star"): "mean 5.4 %: the -50.8 % all_gather 256 KiB case alone adds 2.4 points",
    ("C", "star"): "mean 9.4 % with the busy loop (load 11.4-13.9): the 256 KiB rings 18-26 % slow",
}


def _pairs(misses: dict) -> list:
    return [
        pytest.param(o, t, marks=pytest.mark.xfail(strict=True, reason=misses[(o, t)])) if (o, t) in misses
        else (o, t)
        for o in ("B", "C") for t in TESTBEDS
    ]  # fmt: skip


@pytest.mark.parametrize(("other", "testbed"), _pairs(MEAN_MISSES))
def test_fit_on_one_run_predicts_another_mean_within_target(other, testbed):
    rep = _report(RUNS / f"A-{testbed}-q{QUEUE_MS}", RUNS / f"{other}-{testbed}-q{QUEUE_MS}")
    d = rep["collectives_large"]  # every collective >= 256 KiB of the other run, sparse gathers included
    assert d["num_cases"] >= 10
    assert d["meets_mean"], d


@pytest.mark.parametrize(("other", "testbed"), _pairs(WORST_MISSES))
def test_fit_on_one_run_predicts_another_worst_within_target(other, testbed):
    rep = _report(RUNS / f"A-{testbed}-q{QUEUE_MS}", RUNS / f"{other}-{testbed}-q{QUEUE_MS}")
    assert rep["collectives_large"]["meets_worst"], rep["collectives_large"]


def test_shipped_default_is_the_fresh_star_fit_and_beats_the_old_one():
    """The shipped calibration is round A's star fit; on round B it predicts better than the
    calibration shipped before (fitted on 2026-11-30 under heavy load, one duplex factor only)."""
    default = v.Fit.from_calibration(Calibration.testbed_default(host_queue_bytes=0))
    tb_a, cases_a, _ = v.load_measurements(RUNS / f"A-star-q{QUEUE_MS}" / "measurements.json")
    fresh = v.fit(cases_a, v.testbed_topology(tb_a), burst_s=tb_a.burst_s)
    for op in ("all_reduce", "all_gather", "p2p"):
        assert default.factor(op) == pytest.approx(fresh.factor(op), rel=1e-9)
    old = v.Fit.from_calibration(Calibration.load(RUNS.parent / "star" / "calibration.json"))
    tb, cases, _ = v.load_measurements(RUNS / f"B-star-q{QUEUE_MS}" / "measurements.json")

    def mape(fit: v.Fit) -> float:
        return v.build_report(cases, v.testbed_topology(tb), fit, burst_s=tb.burst_s,
                              roles=(v.CALIBRATION, v.VALIDATION))["collectives_large"]["mape"]  # fmt: skip

    assert mape(default) < mape(old)


def test_calibrate_command_refits_and_checks(tmp_path, capsys):
    out = tmp_path / "cal.json"
    a, b = RUNS / "KA-ring", RUNS / "KB-ring"  # a quiet same-day pair (set K); A/B-ring-q10 ran at load 11
    rc = igsim_main(["calibrate", str(a), "-o", str(out), "--check", str(b / "measurements.json")])
    text = capsys.readouterr()
    assert rc == 0, text.out + text.err
    assert "done in" in text.out  # the wall time is printed (docs/validation.md quotes it), not asserted
    assert "collectives >= 256 KiB" in text.out and "-> met" in text.out
    assert "fitting on" in text.err  # progress on stderr
    cal = Calibration.load(out)
    tb_a = v.load_measurements(a / "measurements.json")[0]
    fit = v.fit(*_cases(a), burst_s=tb_a.burst_s, overflow_queues=v.overflow_queues(tb_a), split_alpha=True)
    assert v.Fit.from_calibration(cal).factor("all_gather") == pytest.approx(fit.factor("all_gather"))
    assert json.loads(out.read_text())["source"].startswith("igsim calibrate")
    # a checked run that misses the targets makes the exit status 1 (round B of the star: -50.8 %)
    star = [str(RUNS / f"{r}-star-q{QUEUE_MS}") for r in ("A", "B")]
    assert igsim_main(["calibrate", star[0], "-o", str(out), "--check", star[1]]) == 1
    assert "MISSED" in capsys.readouterr().out


def _cases(run: Path):
    tb, cases, _ = v.load_measurements(run / "measurements.json")
    return cases, v.testbed_topology(tb)


def test_calibrate_errors_name_the_input(tmp_path, capsys):
    assert igsim_main(["calibrate", str(tmp_path / "nope"), "-o", str(tmp_path / "c.json")]) != 0
    assert "nope: no such run folder" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert igsim_main(["calibrate", str(tmp_path / "empty"), "-o", str(tmp_path / "c.json")]) != 0
    assert "without measurements.json" in capsys.readouterr().err
    run = RUNS / f"A-star-q{QUEUE_MS}"
    assert igsim_main(["calibrate", str(run), "-o", str(tmp_path)]) != 0  # a folder, not a file
    assert "is a folder" in capsys.readouterr().err


# The quiet rounds (2026-12-02, ``igrt validate --suite``: 1-minute load average 0.4-1.4 on 2 cores):
# fitted on QA, QB measured 5-6 minutes later. With the CPU out of the way the means meet everywhere;
# these worst cases stay, in both rounds and against their own fit, so they are the model's. (The
# ring's broadcast 256 KiB, -11.5 %, was one too: the burst credit counted a second tree level that
# a 3-rank broadcast does not have; since igsim.collectives.gloo.binomial_tree it meets.)
QUIET_WORST_MISSES = {
    "two-level": "broadcast 4 MiB across the uplink -11.4 % (its own fit: -9.9 % / -11.4 %)",
    "hetero": "all_gather 256 KiB through the slow NIC -17.3 % (its own fit: -17.6 % / -17.0 %)",
}


# The same on a fresh machine two days later (2026-12-04, rounds QE and QF of one igrt validate
# --suite, load average 0.4-1.3): QE's fit predicts QF. The two-level round now has the calibration
# broadcast (so a fitted share) and meets; the slow NIC's all-gather 256 KiB misses again.
QUIET_PAIRS = (("QA", "QB"), ("QE", "QF"))
FRESH_WORST_MISSES = {"hetero": "all_gather 256 KiB through the slow NIC -14.1 % (QE's own fit: -10.8 %)"}


@pytest.mark.parametrize("pair", QUIET_PAIRS)
@pytest.mark.parametrize("testbed", TESTBEDS)
def test_on_a_quiet_machine_a_fit_predicts_a_later_run_mean_within_target(testbed, pair):
    rep = _report(RUNS / f"{pair[0]}-{testbed}-q{QUEUE_MS}", RUNS / f"{pair[1]}-{testbed}-q{QUEUE_MS}")
    assert rep["collectives_large"]["num_cases"] >= 10
    assert rep["collectives_large"]["meets_mean"], rep["collectives_large"]


@pytest.mark.parametrize(
    ("testbed", "pair"),
    [
        pytest.param(t, pair, marks=pytest.mark.xfail(strict=True, reason=misses[t])) if t in misses else (t, pair)
        for pair, misses in zip(QUIET_PAIRS, (QUIET_WORST_MISSES, FRESH_WORST_MISSES))
        for t in TESTBEDS
    ],
)  # fmt: skip
def test_on_a_quiet_machine_a_fit_predicts_a_later_run_worst_within_target(testbed, pair):
    rep = _report(RUNS / f"{pair[0]}-{testbed}-q{QUEUE_MS}", RUNS / f"{pair[1]}-{testbed}-q{QUEUE_MS}")
    assert rep["collectives_large"]["meets_worst"], rep["collectives_large"]


def test_the_shipped_default_meets_both_targets_on_a_fresh_quiet_star_run():
    """Fitted on round A (02:13, load 2.4-4.6, other work running), it predicts the quiet star run
    measured three and a half hours later."""
    tb, cases, _ = v.load_measurements(RUNS / f"QB-star-q{QUEUE_MS}" / "measurements.json")
    rep = v.build_report(cases, v.testbed_topology(tb), v.Fit.from_calibration(Calibration.testbed_default(host_queue_bytes=0)),
                         burst_s=tb.burst_s, roles=(v.CALIBRATION, v.VALIDATION))  # fmt: skip
    d = rep["collectives_large"]
    assert d["num_cases"] >= 10 and d["meets_mean"] and d["meets_worst"], d


def test_the_downstream_share_fitted_on_another_day_brings_the_quiet_two_level_pair_within_both_targets():
    """The two-level miss above is the root's send across the uplink getting less than a max-min
    share of the root's NIC. Fitted on the broadcasts of experiments.shaper_queues (2026-12-03),
    the share predicts round QB (2026-12-02) within both targets with QA's fit."""
    from dataclasses import replace

    from experiments.shaper_queues import share_transfer

    out = Path(__file__).resolve().parents[2] / "docs" / "validation-data" / "shaper-queues"
    res = share_transfer(out, RUNS / f"QA-two-level-q{QUEUE_MS}", [RUNS / f"QB-two-level-q{QUEUE_MS}"])
    assert 0.3 < res["downstream_share"] < 0.8
    rows = res["rows"]
    assert len(rows) == 3 and all(abs(r["share_error"]) < 0.10 for r in rows)
    assert sum(abs(r["share_error"]) for r in rows) < sum(abs(r["max_min_error"]) for r in rows)
    tb_a, cases_a, _ = v.load_measurements(v.measurement_path(RUNS / f"QA-two-level-q{QUEUE_MS}"))
    fit = replace(v.fit(cases_a, v.testbed_topology(tb_a), burst_s=tb_a.burst_s), downstream_share=res["downstream_share"])
    tb, cases, _ = v.load_measurements(v.measurement_path(RUNS / f"QB-two-level-q{QUEUE_MS}"))
    d = v.build_report(cases, v.testbed_topology(tb), fit, burst_s=tb.burst_s,
                       roles=(v.CALIBRATION, v.VALIDATION))["collectives_large"]  # fmt: skip
    assert d["meets_mean"] and d["meets_worst"], d


def test_a_fresh_two_level_pair_with_the_calibration_broadcast_meets_both_targets():
    """Rounds QC and QD (2026-12-03, load average 0.05-0.3) were measured with the two-level
    calibration broadcast: QC's own fit holds the share, and it predicts QD within both targets."""
    tb_a, cases_a, _ = v.load_measurements(v.measurement_path(RUNS / f"QC-two-level-q{QUEUE_MS}"))
    assert any(c.op == "broadcast" and c.role == v.CALIBRATION for c in cases_a)
    fit = v.fit(cases_a, v.testbed_topology(tb_a), burst_s=tb_a.burst_s)
    assert 0.3 < fit.downstream_share < 0.8
    tb, cases, _ = v.load_measurements(v.measurement_path(RUNS / f"QD-two-level-q{QUEUE_MS}"))
    d = v.build_report(cases, v.testbed_topology(tb), fit, burst_s=tb.burst_s,
                       roles=(v.CALIBRATION, v.VALIDATION))["collectives_large"]  # fmt: skip
    assert d["num_cases"] >= 16 and d["meets_mean"] and d["meets_worst"], d


# The shipped calibrations of the earlier testbed, whose NIC queue was a 125 kB shaper queue
# (igsim/data/testbed_calibration*-nic-125kB.json; host_queue_bytes 0 in a measurement file picks
# them): the star's is round A's fit (above) and the ring's the quiet round QA's; the slow NIC's and
# the two-level testbed's are pooled fits of both rounds of set H (2026-12-05), the first measured
# with the shaper queues of at least 125 kB that are the testbed's default since (at 100 Mbit/s the
# 10 ms queue already held 125 kB, so the star and the ring are the testbed they were fitted on).
SHIPPED_FROM_NIC_125KB = {
    "star": ("A-star-q10",),
    "two-level": ("H-two-level", "H-two-level-b"),
    "hetero": ("H-hetero", "H-hetero-b"),
    "ring": ("QA-ring-q10",),
}
# The testbed's current shipped calibrations (igsim/data/testbed_calibration*.json, a rank's NIC queue
# 4 MiB): pooled fits of both rounds of set J (2026-12-07), the star's of round B alone (round A's
# star was timed beside other work on the 2 cores).
SHIPPED_FROM = {
    "star": ("JB-star",),
    "two-level": ("JA-two-level", "JB-two-level"),
    "hetero": ("JA-hetero", "JB-hetero"),
    "ring": ("JA-ring", "JB-ring"),
}


def _queue_bytes(tb: v.TestbedDescription) -> tuple[float, ...]:
    """Each shaped rate's queue in bytes: what the testbed's shapers held, however it was set."""
    rates = {tb.rate_bytes_per_s, tb.uplink_rate_bytes_per_s, tb.slow_rate_bytes_per_s} - {None}
    return tuple(round(max(tb.queue_s * r, tb.queue_min_bytes)) for r in sorted(rates))


@pytest.mark.parametrize("nic_queue", ["4MiB", "125kB"])
@pytest.mark.parametrize("testbed", TESTBEDS)
def test_each_topology_ships_the_fit_of_its_named_runs(testbed, nic_queue):
    names = (SHIPPED_FROM if nic_queue == "4MiB" else SHIPPED_FROM_NIC_125KB)[testbed]
    runs = [v.measurement_path(RUNS / r) for r in names]
    tb, cases, _ = v.pool_measurements(runs)
    assert tb.host_queue_bytes == (4 * 2**20 if nic_queue == "4MiB" else 0)
    shipped = Calibration.testbed_default(testbed, host_queue_bytes=tb.host_queue_bytes)
    for run in runs:
        assert str(run.relative_to(RUNS.parents[2])) in shipped.source
    assert v.testbed_kind(tb) == testbed
    # the files of the earlier testbed are kept as they were shipped: fitted before queue overflow
    # fitted before the ring collectives got their own alpha (split_alpha): kept as shipped, since sets
    # K to O were measured blind for them
    own = v.fit_testbed(cases, tb, overflow=nic_queue == "4MiB", split_alpha=False)
    default = v.Fit.from_calibration(shipped)
    for op in ("all_reduce", "all_gather", "p2p"):
        assert default.factor(op) == pytest.approx(own.factor(op), rel=1e-9)
    # the fit settles each value to rtol 1e-9 per round (v.fit), so a refit agrees to about that
    assert default.downstream_share == pytest.approx(own.downstream_share, rel=1e-8)
    assert default.overflow_factor == pytest.approx(own.overflow_factor, rel=1e-9)
    assert default.overflow_queues == own.overflow_queues


def test_the_current_testbed_is_the_default_and_a_negative_nic_queue_is_refused():
    assert Calibration.testbed_default().source == Calibration.testbed_default(host_queue_bytes=4 * 2**20).source
    assert "JB-star" in Calibration.testbed_default().source
    assert "A-star-q10" in Calibration.testbed_default(host_queue_bytes=0).source
    with pytest.raises(ValueError, match="host_queue_bytes must be >= 0, got -1"):
        Calibration.testbed_default("ring", host_queue_bytes=-1)


def test_a_pooled_fit_refuses_runs_of_two_testbeds():
    with pytest.raises(ValueError, match=r"another testbed than .*a pooled fit needs one testbed"):
        v.pool_measurements([v.measurement_path(RUNS / "H-hetero"), v.measurement_path(RUNS / "H-two-level")])
    with pytest.raises(ValueError, match=r"queue_s 0\.01 vs 0\.1"):  # the same slow NIC at 100 ms queues
        v.pool_measurements([v.measurement_path(RUNS / "A-hetero-q100"), v.measurement_path(RUNS / "A-hetero-q10")])


def test_the_pooled_calibrate_command_names_every_run(tmp_path, capsys):
    out = tmp_path / "c.json"
    runs = [str(RUNS / r) for r in SHIPPED_FROM_NIC_125KB["hetero"]]
    assert igsim_main(["calibrate", *runs, "-o", str(out), "--check", runs[1]]) == 0
    assert " + " in capsys.readouterr().err
    assert all(r in Calibration.load(out).source for r in runs)


def test_an_unknown_topology_has_no_shipped_calibration():
    with pytest.raises(ValueError, match="no shipped calibration for testbed 'mesh'"):
        Calibration.testbed_default("mesh")


# Each shipped calibration on the quiet rounds measured on its own testbed (the same queue in bytes
# on every shaped rate): the star's and the ring's, whose 100 Mbit/s queues held 125 kB before the
# 125 kB floor too. The quiet two-level and slow-NIC rounds ran 10 ms queues on 25 and 50 Mbit/s
# links, another testbed than the pooled set-H fits, and are left out. Worst cases missed there:
SHIPPED_WORST_MISSES: dict[tuple[str, str], str] = {}  # the quiet star and ring rounds all meet


def _same_queues(run: str, testbed: str) -> bool:
    """Whether ``run`` was measured on the testbed the shipped calibration was fitted on (the same
    queue in bytes on every shaped rate): each shipped calibration is judged on its own testbed."""
    def queues(name: str) -> tuple[float, ...]:
        return _queue_bytes(v.load_measurements(v.measurement_path(RUNS / name))[0])

    return queues(run) == queues(SHIPPED_FROM_NIC_125KB[testbed][0])


SHIPPED_RUNS = [(r, t) for t in TESTBEDS for r in ("QB", "QD", "QE", "QF")
                if (RUNS / f"{r}-{t}-q{QUEUE_MS}" / "measurements.json").exists()
                and _same_queues(f"{r}-{t}-q{QUEUE_MS}", t)]  # fmt: skip


def _shipped_report(run: str, testbed: str, capsys) -> dict:
    """``igsim validate-report --calibration default``: the testbed is read from the measurement file."""
    rc = igsim_main(["validate-report", str(RUNS / f"{run}-{testbed}-q{QUEUE_MS}" / "measurements.json"),
                     "--calibration", "default", "--json"])  # fmt: skip
    assert rc == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["collectives_large"]["num_cases"] >= 16
    return rep["collectives_large"]


def test_the_quiet_rounds_of_every_topology_are_committed():
    assert {t for _, t in SHIPPED_RUNS} == {"star", "ring"} and len(SHIPPED_RUNS) >= 6, SHIPPED_RUNS


@pytest.mark.parametrize(("run", "testbed"), SHIPPED_RUNS)
def test_each_shipped_calibration_predicts_the_quiet_rounds_mean_within_target(run, testbed, capsys):
    d = _shipped_report(run, testbed, capsys)
    assert d["meets_mean"], d


@pytest.mark.parametrize(
    ("run", "testbed"),
    [
        pytest.param(r, t, marks=pytest.mark.xfail(strict=True, reason=SHIPPED_WORST_MISSES[(r, t)]))
        if (r, t) in SHIPPED_WORST_MISSES else (r, t)
        for r, t in SHIPPED_RUNS
    ],
)  # fmt: skip
def test_each_shipped_calibration_predicts_the_quiet_rounds_worst_within_target(run, testbed, capsys):
    d = _shipped_report(run, testbed, capsys)
    assert d["meets_worst"], d


# Set I: one igrt validate --suite of 2026-12-06 (11:55-12:06, 1-min load 0.2-0.7, the 125 kB queue
# testbed of every topology), measured after every shipped calibration above was committed (00a405f),
# so out of sample for all four. Misses with the measured numbers (docs/validation.md, set I):
SUITE_I = [(r, t) for r in ("IA", "IB") for t in TESTBEDS]
_STAR_AG = "all_gather 1 MiB {}: its median 81 ms against 75-76 ms two days earlier, all_gather 4 MiB unchanged"
SUITE_I_SHIPPED_WORST_MISSES = {
    ("IA", "star"): _STAR_AG.format("-12.8 %"),
    ("IB", "star"): _STAR_AG.format("-13.4 %"),
    ("IA", "two-level"): "reduce_scatter 1 MiB across the uplink -13.1 % (its own fit: -15.3 %, the skewed 2 MiB gather)",
    ("IB", "two-level"): "reduce_scatter 1 MiB across the uplink -15.3 % (its reps spread 60 %)",
    ("IB", "ring"): "sparse gather skew 512 KiB -13.4 %: 102 ms against IA's 92 ms six minutes earlier",
}
SUITE_I_TRANSFER_WORST_MISSES = {  # IA's own fit predicts IB
    "star": _STAR_AG.format("-13.2 %"),
    "two-level": "reduce_scatter 1 MiB -15.9 % (mean 5.2 % missed too)",
    "ring": "sparse gather skew 512 KiB -13.8 %, broadcast 1 MiB 97 ms against IA's 86 ms",
}
# (the two-level mean, 5.2 % before the uplink's queue overflow was modelled, meets since: 4.x %)
SUITE_I_TRANSFER_MEAN_MISSES: dict[str, str] = {}


def _xfail_if(missed: dict, key, *values):
    """``values`` as one parametrize entry, a strict xfail carrying the measured reason where ``key`` missed."""
    if key in missed:
        return pytest.param(*values, marks=pytest.mark.xfail(strict=True, reason=missed[key]))
    return values if len(values) > 1 else values[0]


def _set_i_shipped(run: str, testbed: str, capsys, calibration: str = "default") -> dict:
    rc = igsim_main(["validate-report", str(RUNS / f"{run}-{testbed}" / "measurements.json"),
                     "--calibration", calibration, "--json"])  # fmt: skip
    assert rc == 0
    d = json.loads(capsys.readouterr().out)["collectives_large"]
    assert d["num_cases"] >= 16
    return d


def test_set_i_is_the_125_kB_queue_testbed_of_every_shipped_calibration():
    for run, testbed in SUITE_I:
        tb = v.load_measurements(v.measurement_path(RUNS / f"{run}-{testbed}"))[0]
        assert v.testbed_kind(tb) == testbed and tb.queue_min_bytes == 125000
        assert _queue_bytes(tb) == _queue_bytes(
            v.load_measurements(v.measurement_path(RUNS / SHIPPED_FROM_NIC_125KB[testbed][0]))[0]
        ), (run, testbed)


@pytest.mark.parametrize(("run", "testbed"), SUITE_I)
def test_each_shipped_calibration_predicts_set_i_mean_within_target(run, testbed, capsys):
    assert _set_i_shipped(run, testbed, capsys)["meets_mean"]


@pytest.mark.parametrize(("run", "testbed"), [_xfail_if(SUITE_I_SHIPPED_WORST_MISSES, k, *k) for k in SUITE_I])
def test_each_shipped_calibration_predicts_set_i_worst_within_target(run, testbed, capsys):
    assert _set_i_shipped(run, testbed, capsys)["meets_worst"]


@pytest.mark.parametrize("testbed", [_xfail_if(SUITE_I_TRANSFER_MEAN_MISSES, t, t) for t in TESTBEDS])
def test_set_i_round_a_fit_predicts_round_b_mean_within_target(testbed):
    assert _report(RUNS / f"IA-{testbed}", RUNS / f"IB-{testbed}")["collectives_large"]["meets_mean"]


@pytest.mark.parametrize("testbed", [_xfail_if(SUITE_I_TRANSFER_WORST_MISSES, t, t) for t in TESTBEDS])
def test_set_i_round_a_fit_predicts_round_b_worst_within_target(testbed):
    assert _report(RUNS / f"IA-{testbed}", RUNS / f"IB-{testbed}")["collectives_large"]["meets_worst"]


# Set J (2026-12-07): the same suite with a rank's own NIC queue at 4 MiB (igrt testbed's
# host_queue_bytes), predicted by the files fitted on the 125 kB NIC queues, which were the shipped
# ones when set J was measured (the current shipped files are fitted on set J itself). JA-star is left
# out: its all-reduce 8 MiB and the all-gathers after it were timed beside other work on the 2 cores.
SET_J_WORST_MISSES = {
    ("JA", "two-level"): "skewed sparse gather 2 MiB -21.0 %",
    ("JB", "two-level"): "reduce_scatter 1 MiB -11.2 % (-15.3 % in set I)",
}
SET_J = [(r, t) for r in ("JA", "JB") for t in TESTBEDS if (r, t) != ("JA", "star")]


def test_set_j_ran_with_4_mib_nic_queues_and_set_i_without():
    for run, testbed in SET_J:
        tb = v.load_measurements(v.measurement_path(RUNS / f"{run}-{testbed}"))[0]
        assert v.testbed_kind(tb) == testbed and tb.host_queue_bytes == 4 * 2**20
    assert v.load_measurements(v.measurement_path(RUNS / "IA-star"))[0].host_queue_bytes == 0


@pytest.mark.parametrize(("run", "testbed"), [_xfail_if(SET_J_WORST_MISSES, (r, t), r, t) for r, t in SET_J])
def test_each_nic_125kB_calibration_predicts_set_j_within_both_targets(run, testbed, capsys):
    d = _set_i_shipped(run, testbed, capsys, calibration=str(TESTBED_DEFAULTS_NIC_125KB[testbed]))
    assert d["meets_mean"], d["mape"]
    assert d["meets_worst"], (d["worst_case"], d["worst_error"])


# Set K (2026-12-07 07:03-07:15, 1-min load 0.5-2.6 with nothing else running), the same suite on the
# 4 MiB NIC queues, measured after the set-J fits were committed as the shipped files (d659f5a): out
# of sample for them. The two-level worst cases (all-reduce 1 MiB -12.1 %, reduce-scatter 4 MiB -10.1 %
# with the file fitted before the uplink's queue overflow was modelled) meet since that model (its
# factor refitted on set J alone; set K showed the misses it was built for, so for that model element
# set K is not blind: set L is, docs/validation.md).
SET_K_SHIPPED_WORST_MISSES: dict[tuple[str, str], str] = {}
SET_K = [(r, t) for r in ("KA", "KB") for t in TESTBEDS]


def test_set_k_ran_with_4_mib_nic_queues_after_the_set_j_fits_were_shipped():
    for run, testbed in SET_K:
        tb, _, raw = v.load_measurements(v.measurement_path(RUNS / f"{run}-{testbed}"))
        assert v.testbed_kind(tb) == testbed and tb.host_queue_bytes == 4 * 2**20
        assert raw["date"] >= "2026-12-07 07:03", raw["date"]  # d659f5a: 2026-12-07 07:02


# Set L (2026-12-07 10:31-10:43, 1-min load 0.1-1.0, nothing else running): a collectives-only suite
# measured after the uplink's queue overflow was modelled and the two-level file refitted on set J
# (2336b87, 10:29): blind for every shipped file and for that model. One miss, with its numbers:
SET_L = [(r, t) for r in ("LA", "LB") for t in TESTBEDS]
SET_L_SHIPPED_WORST_MISSES = {
    ("LA", "ring"): "broadcast 4 MiB -29.6 %: reps 355-586 ms, against 349-360 ms in every rep of "
                    "JA, JB, KA, KB and LB (cause not found)",
}  # fmt: skip


def test_set_l_ran_after_the_overflow_model_was_shipped():
    for run, testbed in SET_L + SET_M:
        tb, _, raw = v.load_measurements(v.measurement_path(RUNS / f"{run}-{testbed}"))
        assert v.testbed_kind(tb) == testbed and tb.host_queue_bytes == 4 * 2**20
        assert raw["date"] >= "2026-12-07 10:31", raw["date"]  # 2336b87: 2026-12-07 10:29
    assert Calibration.testbed_default("two-level").for_class("uplink").overflows


@pytest.mark.parametrize("run", ["LA", "LB", "MA", "MB"])
def test_without_the_overflow_the_two_level_file_misses_set_l(run, tmp_path, capsys):
    """The same pooled set-J fit without the overflow term (``--no-overflow``, the model before it)
    misses the worst case on both rounds of set L, where the shipped file meets it."""
    old = tmp_path / "old.json"
    runs = [str(RUNS / r) for r in SHIPPED_FROM["two-level"]]
    assert igsim_main(["calibrate", *runs, "--no-overflow", "-o", str(old)]) == 0
    capsys.readouterr()
    assert not Calibration.load(old).for_class("uplink").overflows
    before = _set_i_shipped(run, "two-level", capsys, calibration=str(old))
    after = _set_i_shipped(run, "two-level", capsys)
    assert not before["meets_worst"] and after["meets_worst"], (before, after)
    assert abs(after["worst_error"]) < abs(before["worst_error"]) and after["mape"] < before["mape"]


# Set M (2026-12-07 11:25-11:37, load 0.4-1.8, nothing else running, CPU steal 20 s): the same
# suite again, 40 minutes after set L. Round B's slow-NIC and ring runs have slow, spread reps in a
# few cases (ring sparse gather zero 512 KiB 118-169 ms against 89-94 ms in round A):
SET_M = [(r, t) for r in ("MA", "MB") for t in TESTBEDS]
SET_M_SHIPPED_MEAN_MISSES = {("MB", "ring"): "mean 6.0 %: the zero-skew 512 KiB sparse gather -36.2 % alone adds 1.8 points"}
SET_M_SHIPPED_WORST_MISSES = {
    ("MA", "star"): "broadcast 1 MiB +10.2 % (missed by 0.2 point)",
    ("MB", "hetero"): "all_gather 1 MiB -19.4 %: reps 328-423 ms against 289-329 ms (one 486) in round A",
    ("MB", "ring"): "sparse gather zero 512 KiB -36.2 %: reps 118-169 ms against 89-94 ms in round A",
}
SET_M_TRANSFER_MISSES = {"hetero": "all_gather 1 MiB -20.8 % (mean 5.3 %)", "ring": "sparse gather zero 512 KiB -36.4 % (mean 6.1 %)"}

# Set N (2026-12-07 13:37-13:49, load 0.3-1.7, CPU steal 28.8 s): the set-L suite with every case's
# reps interleaved across cases (``igrt validate --suite --interleave``), to test whether the slow,
# contiguous windows of sets L and M were an artefact of running a case's reps back to back. Blind for
# every shipped file. The mean meets on all 8 runs; the worst case misses on 4 (docs/validation.md,
# set N), so interleaving is not the default:
SET_N = [(r, t) for r in ("NA", "NB") for t in TESTBEDS]
SET_N_SHIPPED_WORST_MISSES = {
    ("NA", "hetero"): "sparse gather zero 512 KiB -10.2 % (missed by 0.2 point)",
    ("NB", "star"): "all_reduce 8 MiB -11.1 % (round A: -9.7 %, met)",
    ("NB", "hetero"): "reduce_scatter 1 MiB -12.8 %",
    ("NB", "ring"): "sparse gather zero 2 MiB -19.8 % (round A's worst: -3.4 %)",
}
SET_N_TRANSFER_WORST_MISSES = {  # NA's own fit predicts NB
    "star": "all_reduce 8 MiB -10.2 % (mean 3.5 %)",
    "ring": "sparse gather zero 2 MiB -19.4 % (mean 1.9 %)",
}


# Set O (2026-12-07 17:03-17:15, load 0.1-1.2, nothing else running, CPU steal 3.4 s over the suite
# against 28.8 s in set N): the set-L suite back to back again, the first with each rep's CPU ticks
# recorded (netbench.cpu_ticks). Blind for every shipped file: both targets met on all 8 runs, and
# OA's own fit meets both on OB on all four testbeds.
SET_O = [(r, t) for r in ("OA", "OB") for t in TESTBEDS]


# Sets K to O, the fresh suites on the 4 MiB NIC queues, each judged the same way
SETS_KL = SET_K + SET_L + SET_M + SET_N + SET_O
SETS_KL_WORST_MISSES = {**SET_K_SHIPPED_WORST_MISSES, **SET_L_SHIPPED_WORST_MISSES, **SET_M_SHIPPED_WORST_MISSES,
                        **SET_N_SHIPPED_WORST_MISSES}  # fmt: skip
TRANSFER_MISSES = {"M": SET_M_TRANSFER_MISSES, "N": SET_N_TRANSFER_WORST_MISSES}


@pytest.mark.parametrize(("run", "testbed"), [_xfail_if(SET_M_SHIPPED_MEAN_MISSES, k, *k) for k in SETS_KL])
def test_each_shipped_calibration_predicts_sets_k_to_o_mean_within_target(run, testbed, capsys):
    assert _set_i_shipped(run, testbed, capsys)["meets_mean"]


@pytest.mark.parametrize(("run", "testbed"), [_xfail_if(SETS_KL_WORST_MISSES, k, *k) for k in SETS_KL])
def test_each_shipped_calibration_predicts_sets_k_to_o_worst_within_target(run, testbed, capsys):
    d = _set_i_shipped(run, testbed, capsys)
    assert d["meets_worst"], (d["worst_case"], d["worst_error"])


@pytest.mark.parametrize(
    ("suite", "testbed"),
    [_xfail_if(TRANSFER_MISSES.get(suite, {}), t, suite, t) for suite in "KLMNO" for t in TESTBEDS],
)
def test_sets_k_to_o_round_a_fit_predicts_round_b_within_both_targets(suite, testbed):
    d = _report(RUNS / f"{suite}A-{testbed}", RUNS / f"{suite}B-{testbed}")["collectives_large"]
    assert d["num_cases"] >= 16 and d["meets_mean"] and d["meets_worst"], d


def test_set_n_interleaved_its_reps_after_set_m():
    for run, testbed in SET_N:
        tb, _, raw = v.load_measurements(v.measurement_path(RUNS / f"{run}-{testbed}"))
        assert v.testbed_kind(tb) == testbed and tb.host_queue_bytes == 4 * 2**20
        assert raw["interleaved"] is True and raw["date"] >= "2026-12-07 13:37", raw["date"]


def test_set_o_recorded_every_reps_cpu_ticks():
    for run, testbed in SET_O:
        tb, cases, raw = v.load_measurements(v.measurement_path(RUNS / f"{run}-{testbed}"))
        assert v.testbed_kind(tb) == testbed and tb.host_queue_bytes == 4 * 2**20 and not raw["interleaved"]
        assert raw["date"] >= "2026-12-07 17:03", raw["date"]
        assert all(len(c.cpu_ticks) == len(c.times_s) for c in cases)


def test_set_o_cases_timed_under_most_cpu_steal_were_predicted_within_3_percent(capsys):
    """The steal flag marks what the host did, not an error: set O's flagged cases (up to 17 % of the
    CPU stolen, OB-ring's zero-skew 2 MiB gather) were all predicted within 3 %."""
    flagged = []
    for run, testbed in SET_O:
        d = _set_i_shipped(run, testbed, capsys)
        rc = igsim_main(["validate-report", str(RUNS / f"{run}-{testbed}" / "measurements.json"),
                         "--calibration", "default", "--json"])  # fmt: skip
        assert rc == 0
        rows = json.loads(capsys.readouterr().out)["cases"]
        flagged += [r for r in rows if r["steal_flag"] and r["name"] in d["steal_flagged"]]
    assert len(flagged) == 4 and max(r["cpu_steal_share"] for r in flagged) > 0.15
    assert all(abs(r["error"]) < 0.03 for r in flagged), [(r["name"], r["error"]) for r in flagged]
