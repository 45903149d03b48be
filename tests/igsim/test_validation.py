"""igsim.studies.validation: the fit recovers known parameters exactly; error statistics on hand cases."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from igsim.net.calibration import Calibration
from igsim.studies import validation as v

MiB, KiB = 1 << 20, 1 << 10
STAR = v.TestbedDescription(num_ranks=4, rate_bytes_per_s=12.5e6, burst_s=0.002)
TWO_LEVEL = v.TestbedDescription(
    num_ranks=4, rate_bytes_per_s=12.5e6, two_level=True, uplink_rate_bytes_per_s=6.25e6
)
HETERO = v.TestbedDescription(
    num_ranks=4, rate_bytes_per_s=12.5e6, slow_rank=3, slow_rate_bytes_per_s=3.125e6
)

SPECS = [  # (name, op, role, size_bytes or sizes_bytes)
    ("p2p-64B", "p2p", "calibration", 64),
    ("all_reduce-4KiB", "all_reduce", "calibration", 4 * KiB),
    ("all_gather-16KiB", "all_gather", "calibration", 16 * KiB),
    ("all_reduce-2MiB", "all_reduce", "calibration", 2 * MiB),
    ("all_gather-2MiB", "all_gather", "calibration", 2 * MiB),
    ("p2p-2MiB", "p2p", "calibration", 2 * MiB),
    ("all_reduce-1MiB", "all_reduce", "validation", 1 * MiB),
    ("reduce_scatter-1MiB", "reduce_scatter", "validation", 1 * MiB),
    ("broadcast-1MiB", "broadcast", "validation", 1 * MiB),
    ("sparse-skew", "sparse_all_gather", "validation", (8 * KiB, 16 * KiB, 0, 64 * KiB)),
]


def _cases(truth: v.Fit, tb: v.TestbedDescription) -> list[v.Case]:
    """Synthetic measurements: every case's time is the model's prediction under ``truth``."""
    topo = v.testbed_topology(tb)
    out = []
    for name, op, role, size in SPECS:
        if isinstance(size, tuple):
            size = size[-tb.num_ranks :]  # one per rank
        shape = {"sizes_bytes": size} if isinstance(size, tuple) else {"size_bytes": size}
        case = v.Case(name=name, op=op, role=role, times_s=(1.0,), **shape)
        t = v.predict_case(case, topo, truth, burst_s=tb.burst_s)
        out.append(v.Case(name=name, op=op, role=role, times_s=(t * 0.9, t, t * 1.3), **shape))
    return out


@pytest.mark.parametrize("tb", [STAR, TWO_LEVEL, HETERO], ids=["star", "two-level", "hetero"])
def test_fit_recovers_known_alpha_and_bandwidths_exactly(tb):
    truth = v.Fit(alpha_s=4.2e-4, duplex_factor=0.87, simplex_factor=0.955)
    cases = _cases(truth, tb)
    got = v.fit(cases, v.testbed_topology(tb), burst_s=tb.burst_s)
    assert got.alpha_s == pytest.approx(truth.alpha_s, rel=1e-6)
    assert got.duplex_factor == pytest.approx(truth.duplex_factor, rel=1e-6)
    assert got.simplex_factor == pytest.approx(truth.simplex_factor, rel=1e-6)
    report = v.build_report(cases, v.testbed_topology(tb), got, burst_s=tb.burst_s)
    assert all(abs(r["error"]) < 1e-5 for r in report["cases"])


def test_fit_reads_only_calibration_cases():
    truth = v.Fit(alpha_s=3e-4, duplex_factor=0.9, simplex_factor=0.95)
    cases = _cases(truth, STAR)
    spoiled = [
        c if c.role == v.CALIBRATION else v.Case(name=c.name, op=c.op, role=c.role, times_s=(9.9,),
                                                  size_bytes=c.size_bytes, sizes_bytes=c.sizes_bytes)
        for c in cases
    ]  # fmt: skip
    topo = v.testbed_topology(STAR)
    assert v.fit(spoiled, topo, burst_s=STAR.burst_s) == v.fit(cases, topo, burst_s=STAR.burst_s)


def test_fit_needs_small_and_large_cases():
    cases = [
        c for c in _cases(v.Fit(alpha_s=1e-4, duplex_factor=1, simplex_factor=1), STAR) if c.bytes > 64 * KiB
    ]
    with pytest.raises(ValueError, match="alpha"):
        v.fit(cases, v.testbed_topology(STAR))


def test_calibration_and_validation_must_be_disjoint():
    a = v.Case(name="a", op="all_reduce", role="calibration", times_s=(1.0,), size_bytes=1024)
    b = v.Case(name="b", op="all_reduce", role="validation", times_s=(1.0,), size_bytes=1024)
    with pytest.raises(ValueError, match=r"overlap.*'a', 'b'"):
        v.check_disjoint([a, b])
    v.check_disjoint(
        [a, v.Case(name="c", op="all_gather", role="validation", times_s=(1.0,), size_bytes=1024)]
    )


def test_kendall_tau_hand_cases():
    assert v.kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert v.kendall_tau([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    assert v.kendall_tau([1, 2, 3], [1, 3, 2]) == pytest.approx(1 / 3)  # 2 concordant, 1 discordant
    # tau-b with a tie on one side: C=2, D=0, ties only in y: 1 -> 2 / sqrt(3 * 2)
    assert v.kendall_tau([1, 2, 3], [1, 2, 2]) == pytest.approx(2 / math.sqrt(6))
    assert math.isnan(v.kendall_tau([1, 1], [1, 2]))
    with pytest.raises(ValueError):
        v.kendall_tau([1], [1])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), min_size=2, max_size=12))
def test_kendall_tau_matches_scipy(pairs):
    xs, ys = zip(*pairs)
    ours = v.kendall_tau(xs, ys)
    ref = stats.kendalltau(xs, ys).statistic  # tau-b
    assert (math.isnan(ours) and math.isnan(ref)) or ours == pytest.approx(ref, abs=1e-12)


def test_mape_and_report_statistics_on_hand_cases():
    assert v.mean_abs_pct_error([0.1, -0.2, 0.0]) == pytest.approx(0.1)
    cases = [
        v.Case(name="cal", op="all_reduce", role="calibration", times_s=(1.0,), size_bytes=1 * MiB),
        v.Case(name="ar1", op="all_reduce", role="validation", times_s=(1.0, 2.0, 3.0), size_bytes=2 * MiB),
        v.Case(name="ar2", op="all_reduce", role="validation", times_s=(4.0,), size_bytes=4 * MiB),
        v.Case(name="bc", op="broadcast", role="validation", times_s=(10.0,), size_bytes=512 * KiB),
        v.Case(name="bc-small", op="broadcast", role="validation", times_s=(1.0,), size_bytes=1 * KiB),
    ]
    preds = {"cal": 5.0, "ar1": 2.2, "ar2": 3.0, "bc": 10.5, "bc-small": 3.0}
    topo = v.testbed_topology(STAR)
    fit = v.Fit(alpha_s=0, duplex_factor=1, simplex_factor=1)
    rep = v.build_report(cases, topo, fit, predictor=lambda c: preds[c.name])
    rows = {r["name"]: r for r in rep["cases"]}
    assert rows["ar1"]["measured_median_s"] == 2.0 and rows["ar1"]["error"] == pytest.approx(0.1)
    assert rows["ar1"]["spread"] == pytest.approx(1.0)
    assert rows["cal"]["role"] == "calibration"
    fam = rep["families"]["all_reduce"]
    assert fam["num_cases"] == 2 and fam["mape"] == pytest.approx((0.1 + 0.25) / 2)
    assert fam["worst_case"] == "ar2" and fam["worst_error"] == pytest.approx(-0.25)
    assert fam["kendall_tau"] == 1.0
    dense = rep["dense_large"]  # >= 256 KiB: ar1, ar2, bc (not bc-small, not the calibration case)
    assert dense["num_cases"] == 3 and dense["mape"] == pytest.approx((0.1 + 0.25 + 0.05) / 3)
    assert dense["meets_mean"] is False and dense["meets_worst"] is False


def test_topologies_of_the_testbed_variants():
    two = v.testbed_topology(TWO_LEVEL)
    assert "uplink" in {two.link(u, w)["link_class"] for u, w in two.path_links("r0", "r3")}
    assert two.path("r0", "r1") == ("r0", "br0", "r1")
    het = v.testbed_topology(HETERO)
    assert het.path_bandwidth_bytes_per_s("r0", "r3") == 3.125e6


def test_load_measurements_errors_name_the_file(tmp_path):
    bad = tmp_path / "m.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match=r"m\.json"):
        v.load_measurements(bad)
    bad.write_text(
        json.dumps({"testbed": {"num_ranks": 4, "rate_bytes_per_s": 1e6, "colour": 1}, "cases": []})
    )
    with pytest.raises(ValueError, match="colour"):
        v.load_measurements(bad)
    with pytest.raises(ValueError, match="no such"):
        v.load_measurements(tmp_path / "missing.json")


def test_report_command_end_to_end(tmp_path):
    """The igsim half of `igrt validate`, as igrt runs it: a subprocess on a measurement file."""
    truth = v.Fit(alpha_s=5e-4, duplex_factor=0.9, simplex_factor=0.96)
    cases = _cases(truth, STAR)
    doc = {
        "testbed": {"num_ranks": 4, "rate_bytes_per_s": 12.5e6, "two_level": False, "uplink_rate_bytes_per_s": None,
                    "slow_rank": None, "slow_rate_bytes_per_s": None, "mtu": 1500, "burst_s": 0.002},
        "command": "synthetic",
        "cases": [{"name": c.name, "op": c.op, "role": c.role, "size_bytes": c.size_bytes,
                   "sizes_bytes": list(c.sizes_bytes), "times_s": list(c.times_s)} for c in cases],
    }  # fmt: skip
    path = tmp_path / "measurements.json"
    path.write_text(json.dumps(doc))
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "igsim.cli.validate_report", str(path), "--out", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "dense >= 256 KiB" in proc.stdout and "calib" in proc.stdout and "valid" in proc.stdout
    cal = Calibration.load(out / "calibration.json")
    assert cal.for_class("nic").alpha_s == pytest.approx(5e-4, rel=1e-6)
    assert cal.for_class("nic").effective_bandwidth_factor == pytest.approx(0.9, rel=1e-6)
    report = json.loads((out / "report.json").read_text())
    assert {r["role"] for r in report["cases"]} == {"calibration", "validation"}
    assert report["dense_large"]["mape"] < 1e-5


RING = v.TestbedDescription(num_ranks=3, rate_bytes_per_s=12.5e6, ring=True, burst_s=0.002)


@pytest.mark.parametrize("tb", [STAR, TWO_LEVEL, HETERO, RING], ids=["star", "two-level", "hetero", "ring"])
def test_per_op_fit_recovers_a_separate_all_gather_factor(tb):
    truth = v.Fit(alpha_s=3e-4, duplex_factor=0.91, simplex_factor=0.96, gather_factor=0.84)
    cases = _cases(truth, tb)
    topo = v.testbed_topology(tb)
    got = v.fit(cases, topo, burst_s=tb.burst_s)
    assert got.gather_factor == pytest.approx(0.84, rel=1e-6)
    assert got.duplex_factor == pytest.approx(0.91, rel=1e-6)
    assert got.alpha_s == pytest.approx(3e-4, rel=1e-6)
    one = v.fit(cases, topo, burst_s=tb.burst_s, per_op=False)  # the one-factor model cannot fit both
    assert one.gather_factor is None and 0.84 < one.duplex_factor < 0.91
    rep = v.build_report(cases, topo, got, burst_s=tb.burst_s)
    assert rep["collectives_large"]["mape"] < 1e-5
    assert v.build_report(cases, topo, one, burst_s=tb.burst_s)["collectives_large"]["mape"] > 1e-3


def test_fit_round_trips_through_a_calibration_file(tmp_path):
    fit = v.Fit(alpha_s=7e-4, duplex_factor=0.9, simplex_factor=0.97, gather_factor=0.85)
    topo = v.testbed_topology(STAR)
    fit.calibration(topo, source="test").save(tmp_path / "c.json")
    cal = Calibration.load(tmp_path / "c.json")
    assert cal.for_class("nic").effective_bandwidth_factor == 0.9  # what igsim simulate uses
    back = v.Fit.from_calibration(cal)
    for op in ("p2p", "all_reduce", "reduce_scatter", "all_gather", "broadcast", "sparse_all_gather"):
        assert back.factor(op) == pytest.approx(fit.factor(op), rel=1e-12)
    assert back.alpha_s == fit.alpha_s
    data = json.loads((tmp_path / "c.json").read_text())
    data["op_bandwidth_factors"]["all_gather"] = -1
    with pytest.raises(ValueError, match="op_bandwidth_factors"):
        Calibration.from_dict(data)


def test_min_statistic_fits_and_compares_the_fastest_rep():
    truth = v.Fit(alpha_s=4e-4, duplex_factor=0.88, simplex_factor=0.95)
    cases = _cases(truth, STAR)  # reps are 0.9 t, t, 1.3 t: the min is 0.9 t
    topo = v.testbed_topology(STAR)
    fast = v.fit(cases, topo, burst_s=STAR.burst_s, statistic="min")
    rep = v.build_report(cases, topo, fast, burst_s=STAR.burst_s, statistic="min")
    assert fast.duplex_factor > truth.duplex_factor  # faster reps: more bandwidth
    assert rep["statistic"] == "min" and all(r["measured_s"] == r["measured_min_s"] for r in rep["cases"])
    with pytest.raises(ValueError, match="statistic"):
        v.fit(cases, topo, statistic="mean")


def test_ring_topology_gives_each_pair_its_own_link():
    ring, star3 = (
        v.testbed_topology(RING),
        v.testbed_topology(v.TestbedDescription(num_ranks=3, rate_bytes_per_s=12.5e6)),
    )
    assert ring.path("r0", "r2") == ("r0", "r2")
    fit = v.Fit(alpha_s=0.0, duplex_factor=1.0, simplex_factor=1.0)
    bc = v.Case(name="bc", op="broadcast", role="validation", times_s=(1.0,), size_bytes=1 * MiB)
    ar = v.Case(name="ar", op="all_reduce", role="validation", times_s=(1.0,), size_bytes=1 * MiB)
    # binomial broadcast from rank 0 at p = 3: both children at once; the star shares rank 0's NIC
    assert v.predict_case(bc, ring, fit) == pytest.approx(MiB / 12.5e6)
    assert v.predict_case(bc, star3, fit) == pytest.approx(2 * MiB / 12.5e6)
    # a ring all-reduce uses one link per direction either way: the same time
    assert v.predict_case(ar, ring, fit) == pytest.approx(v.predict_case(ar, star3, fit))


def test_busy_measurements_are_flagged_by_the_step_reports_rule():
    from igsim.cli.validate_report import measurement_flags

    busy = {"testbed": {"num_ranks": 3}, "machine": {"cpu_count": 2, "load_average_after": [9.5, 8, 7]}}
    assert any("CPU busy" in f for f in measurement_flags(busy))
    quiet = {"testbed": {"num_ranks": 3}, "machine": {"cpu_count": 16, "load_average_after": [0.5, 0.5, 0.5]}}
    assert measurement_flags(quiet) == []
    assert any("2 ranks" in f for f in measurement_flags({"testbed": {"num_ranks": 2}}))


@pytest.mark.parametrize("share", [1.0, 0.8, 0.58])
def test_a_two_level_broadcast_calibration_case_fits_the_downstream_share(share):
    """On the two-level testbed the root's send across the uplink shares its NIC with the local
    one; a calibration broadcast fits that share (and is kept out of the one-way factor). Just
    below 1 the prediction is flat to 1e-5 (the remote child's alpha overlaps the end of the
    root's send instead of idling the uplink), so at 1 the fit lands within 0.01 of it."""
    truth = v.Fit(alpha_s=4.2e-4, duplex_factor=0.87, simplex_factor=0.955, downstream_share=share)
    topo = v.testbed_topology(TWO_LEVEL)
    extra = v.Case(name="broadcast-2MiB", op="broadcast", role="calibration", times_s=(1.0,), size_bytes=2 * MiB)
    t = v.predict_case(extra, topo, truth, burst_s=TWO_LEVEL.burst_s)
    cases = [*_cases(truth, TWO_LEVEL), v.Case(name=extra.name, op="broadcast", role="calibration",
                                               times_s=(t,), size_bytes=2 * MiB)]  # fmt: skip
    got = v.fit(cases, topo, burst_s=TWO_LEVEL.burst_s)
    assert got.downstream_share == pytest.approx(share, abs=1e-2 if share == 1.0 else 1e-6)
    assert got.simplex_factor == pytest.approx(truth.simplex_factor, rel=1e-6)
    report = v.build_report(cases, topo, got, burst_s=TWO_LEVEL.burst_s)
    assert all(abs(r["error"]) < (1e-3 if share == 1.0 else 1e-5) for r in report["cases"])
    assert v.Fit.from_calibration(got.calibration(topo)).downstream_share == pytest.approx(got.downstream_share)


def test_without_a_case_that_depends_on_it_the_share_stays_as_given():
    """On the star every child's path is alike: a broadcast does not depend on the share, so the
    fit keeps the value it was given and uses the broadcast for the one-way factor as before."""
    truth = v.Fit(alpha_s=4.2e-4, duplex_factor=0.87, simplex_factor=0.955)
    got = v.fit(_cases(truth, STAR), v.testbed_topology(STAR), burst_s=STAR.burst_s, downstream_share=0.7)
    assert got.downstream_share == 0.7
    assert got.simplex_factor == pytest.approx(truth.simplex_factor, rel=1e-6)


# The two-level testbed as igrt validate builds it now: a 50 Mbit/s uplink behind 100 Mbit/s rank
# links, its tbf queue 20 ms = 125 kB. A message crossing it overflows that queue from
# 125 kB / (2 x (1 - 0.5)) = 125 kB on (igsim.net.network: two messages of a connection in flight).
TWO_LEVEL_Q = v.TestbedDescription(
    num_ranks=4, rate_bytes_per_s=12.5e6, two_level=True, uplink_rate_bytes_per_s=6.25e6,
    queue_s=0.01, queue_min_bytes=125_000, queues_s={"1.25e+07": 0.01, "6.25e+06": 0.02},
)  # fmt: skip


def test_only_a_step_down_link_has_a_queue_to_overflow():
    assert v.overflow_queues(TWO_LEVEL_Q) == {"uplink": pytest.approx(125_000)}
    assert v.overflow_queues(replace(TWO_LEVEL_Q, queues_s=None)) == {"uplink": pytest.approx(125_000)}
    assert v.overflow_queues(replace(TWO_LEVEL_Q, uplink_rate_bytes_per_s=None)) == {}  # no slower uplink
    assert v.overflow_queues(STAR) == {} and v.overflow_queues(HETERO) == {}


@pytest.mark.parametrize("factor", [0.9, 0.75])
def test_a_fit_recovers_the_overflow_factor_from_cases_on_both_sides_of_the_queue(factor):
    """512 KiB rings (64 KiB segments) stay under the uplink's queue, 2 MiB ones (256 KiB) overflow
    it: together they separate the bandwidth factors from the overflow factor."""
    queues = v.overflow_queues(TWO_LEVEL_Q)
    truth = v.Fit(alpha_s=4.2e-4, duplex_factor=0.93, simplex_factor=0.96, gather_factor=0.88,
                  overflow_factor=factor, overflow_queues=queues)  # fmt: skip
    topo = v.testbed_topology(TWO_LEVEL_Q)
    extra = [v.Case(name=f"{op}-512KiB", op=op, role="calibration", times_s=(1.0,), size_bytes=512 * KiB)
             for op in ("all_reduce", "all_gather")]  # fmt: skip
    cases = _cases(truth, TWO_LEVEL_Q) + [
        replace(c, times_s=(v.predict_case(c, topo, truth, burst_s=TWO_LEVEL_Q.burst_s),)) for c in extra
    ]
    got = v.fit_testbed(cases, TWO_LEVEL_Q)
    assert got.overflow_factor == pytest.approx(factor, rel=1e-5)
    assert got.duplex_factor == pytest.approx(truth.duplex_factor, rel=1e-5)
    assert got.gather_factor == pytest.approx(truth.gather_factor, rel=1e-5)
    back = v.Fit.from_calibration(got.calibration(topo))
    assert back.overflow_factor == got.overflow_factor and back.overflow_queues == queues
    # without the overflow (the model before it) the fit cannot match both sizes
    old = v.fit_testbed(cases, TWO_LEVEL_Q, overflow=False)
    assert old.overflow_factor == 1.0 and old.overflow_queues == {}
    worst = max(abs(r["error"]) for r in v.build_report(cases, topo, old, roles=("calibration",))["cases"]
                if r["size_bytes"] >= 512 * KiB)  # fmt: skip
    assert worst > 0.02


def test_a_star_fit_has_no_overflow_term():
    truth = v.Fit(alpha_s=4.2e-4, duplex_factor=0.87, simplex_factor=0.955)
    got = v.fit_testbed(_cases(truth, STAR), STAR)
    assert got.overflow_factor == 1.0 and got.overflow_queues == {}
    assert got == v.fit(_cases(truth, STAR), v.testbed_topology(STAR), burst_s=STAR.burst_s, split_alpha=True)


def test_cases_timed_under_cpu_steal_are_flagged_and_still_counted():
    """A case with more than STEAL_FLAG_SHARE of the CPU ticks stolen over its reps is flagged; the
    target figures still count it, and the report states them without it beside."""
    mk = lambda name, size, ticks: v.Case(  # noqa: E731
        name=name, op="all_reduce", role="validation", times_s=(1.0, 1.0), size_bytes=size, cpu_ticks=ticks
    )
    cases = [
        mk("calm", 1 * MiB, ((0, 150, 200), (1, 150, 200))),  # 0.25 % stolen
        mk("stolen", 2 * MiB, ((30, 100, 200), (0, 150, 200))),  # 7.5 %
        mk("unknown", 4 * MiB, ()),  # measured before ticks were recorded: not flagged
    ]
    preds = {"calm": 1.02, "stolen": 0.7, "unknown": 1.04}
    fit = v.Fit(alpha_s=0, duplex_factor=1, simplex_factor=1)
    rep = v.build_report(cases, v.testbed_topology(STAR), fit, predictor=lambda c: preds[c.name])
    rows = {r["name"]: r for r in rep["cases"]}
    assert rows["stolen"]["cpu_steal_share"] == pytest.approx(30 / 400) and rows["stolen"]["steal_flag"]
    assert rows["calm"]["cpu_busy_share"] == pytest.approx(1 - 300 / 400) and not rows["calm"]["steal_flag"]
    assert math.isnan(rows["unknown"]["cpu_steal_share"]) and not rows["unknown"]["steal_flag"]
    d = rep["collectives_large"]
    assert d["worst_case"] == "stolen" and not d["meets_worst"] and d["steal_flagged"] == ["stolen"]
    rest = d["without_steal_flagged"]
    assert rest["num_cases"] == 2 and rest["worst_case"] == "unknown" and rest["mape"] == pytest.approx(0.03)
    from igsim.cli.validate_report import format_report

    text = format_report({**rep, "reps": 2})
    assert "1 case(s) FLAGGED" in text and "without them: mean 3.0%, worst +4.0% (unknown)" in text


@pytest.mark.parametrize("ticks", [((1, 2, 3),), ((2, 2, 3), (0, 1, 3)), ((0, 1),) * 2, ((-1, 1, 3),) * 2])
def test_cpu_ticks_must_be_one_consistent_triple_per_rep(ticks):
    with pytest.raises(ValueError, match="cpu_ticks"):
        v.Case(name="x", op="all_reduce", role="validation", times_s=(1.0, 1.0), size_bytes=1, cpu_ticks=ticks)


@pytest.mark.parametrize("tb", [STAR, HETERO], ids=["star", "hetero"])
def test_split_alpha_recovers_the_ring_collectives_alpha_apart_from_p2ps(tb):
    """Measurements made with a ring-hop alpha of 1.1 ms and a p2p / broadcast alpha of 0.3 ms: the
    split fit recovers both (and the bandwidths); the one-alpha fit cannot match both kinds."""
    truth = v.Fit(alpha_s=1.1e-3, message_alpha_s=3e-4, duplex_factor=0.9, simplex_factor=0.96)
    cases = _cases(truth, tb)
    topo = v.testbed_topology(tb)
    got = v.fit(cases, topo, burst_s=tb.burst_s, split_alpha=True)
    assert got.alpha_s == pytest.approx(1.1e-3, rel=1e-6)
    assert got.message_alpha_s == pytest.approx(3e-4, rel=1e-6)
    assert got.duplex_factor == pytest.approx(0.9, rel=1e-6)
    assert got.simplex_factor == pytest.approx(0.96, rel=1e-6)
    assert got.alpha("broadcast") == got.alpha("p2p") == got.message_alpha_s
    assert got.alpha("sparse_all_gather") == got.alpha("all_reduce") == got.alpha_s
    report = v.build_report(cases, topo, got, burst_s=tb.burst_s)
    assert all(abs(r["error"]) < 1e-5 for r in report["cases"])
    one = v.fit(cases, topo, burst_s=tb.burst_s)
    assert one.message_alpha_s is None
    small = [r for r in v.build_report(cases, topo, one, burst_s=tb.burst_s)["cases"] if r["name"] == "p2p-64B"]
    assert abs(small[0]["error"]) > 0.5  # one alpha for both: the small p2p case is far off
    # igsim calibrate's fit (fit_testbed) is the split one
    assert v.fit_testbed(cases, tb).message_alpha_s == pytest.approx(3e-4, rel=1e-6)
    assert v.fit_testbed(cases, tb, split_alpha=False).message_alpha_s is None


def test_the_message_alpha_round_trips_through_a_calibration_file(tmp_path):
    fit = v.Fit(alpha_s=9e-4, message_alpha_s=2.5e-4, duplex_factor=0.9, simplex_factor=0.97, gather_factor=0.85)
    topo = v.testbed_topology(STAR)
    fit.calibration(topo, source="test").save(tmp_path / "c.json")
    cal = Calibration.load(tmp_path / "c.json")
    assert cal.for_class("nic").alpha_s == 9e-4  # the ring collectives', every link class's
    assert cal.for_op("p2p").for_class("nic").alpha_s == 2.5e-4
    assert cal.for_op("broadcast").default.alpha_s == 2.5e-4
    assert cal.for_op("sparse_all_gather").for_class("nic").alpha_s == 9e-4
    assert cal.for_op("p2p").op_alpha_s == {}  # applied once
    back = v.Fit.from_calibration(cal)
    assert back.message_alpha_s == 2.5e-4 and back.alpha_s == 9e-4
    data = json.loads((tmp_path / "c.json").read_text())
    data["op_alpha_s"]["p2p"] = -1
    with pytest.raises(ValueError, match="op_alpha_s"):
        Calibration.from_dict(data)
    data["op_alpha_s"] = [1]
    with pytest.raises(ValueError, match="op_alpha_s must be a mapping"):
        Calibration.from_dict(data)
