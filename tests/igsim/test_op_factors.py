"""A calibration's per-op bandwidth factors reach every costed collective, the step engine's too.

``op_bandwidth_factors`` (e.g. the testbed fit's all-gather factor) are applied by
:meth:`igsim.net.calibration.Calibration.for_op`, which both :func:`igsim.collectives.predict.predict_collective`
(the step engine's costs) and :func:`igsim.collectives.gloo.simulate_gloo` (the validation cases) call:
one rule, so a replayed sparse gather runs at the rate the validation fitted for gathers.
"""

from __future__ import annotations

import pytest

from igsim.collectives.costs import CostCache
from igsim.collectives.gloo import predict_gloo
from igsim.collectives.predict import CollectiveSpec, predict_collective
from igsim.net.calibration import Calibration, LinkCalibration
from igsim.net.topology import ring, star
from igsim.studies import validation as v

RATE = 12.5e6


def _cal(link_factor: float, ops: dict[str, float] | None = None, *, absolute: float | None = None) -> Calibration:
    link = LinkCalibration(alpha_s=4e-4, effective_bandwidth_factor=link_factor,
                           effective_bandwidth_bytes_per_s=absolute)  # fmt: skip
    return Calibration(link_classes={"nic": link}, default=link, op_bandwidth_factors=ops or {})


def test_for_op_scales_every_link_class_and_is_idempotent():
    cal = _cal(0.9, {"all_gather": 0.8, "sparse_all_gather": 0.8})
    g = cal.for_op("sparse_all_gather")
    assert g.for_class("nic").effective_bandwidth_factor == pytest.approx(0.72)
    assert g.default.effective_bandwidth_factor == pytest.approx(0.72)
    assert g.op_bandwidth_factors == {}
    assert g.for_op("sparse_all_gather") == g  # applying it twice changes nothing
    assert cal.for_op("all_reduce").for_class("nic").effective_bandwidth_factor == pytest.approx(0.9)
    assert _cal(0.9).for_op("all_gather") is not None
    plain = _cal(0.9)
    assert plain.for_op("all_gather") is plain
    absolute = _cal(1.0, {"all_gather": 0.5}, absolute=1e7).for_op("all_gather")
    assert absolute.for_class("nic").capacity_bytes_per_s(RATE) == pytest.approx(5e6)


@pytest.mark.parametrize("mode", ["auto", "flow", "analytic"])
@pytest.mark.parametrize("topo", [star(num_ranks=4, bandwidth_bytes_per_s=RATE, latency_s=2e-5), ring(num_ranks=3, bandwidth_bytes_per_s=RATE, latency_s=2e-5)],
                         ids=["star", "ring"])  # fmt: skip
def test_a_sparse_gather_costs_the_same_with_the_op_factor_as_with_the_link_factor_times_it(mode, topo):
    p = topo.num_ranks
    spec = CollectiveSpec(op="sparse_all_gather", algorithm="ring", size_bytes=71176, sizes_bytes=(71176,) * p)
    with_op = predict_collective(spec, topo, calibration=_cal(0.92, {"sparse_all_gather": 0.9}), mode=mode).time_s
    folded = predict_collective(spec, topo, calibration=_cal(0.92 * 0.9), mode=mode).time_s
    ignored = predict_collective(spec, topo, calibration=_cal(0.92), mode=mode).time_s
    assert with_op == pytest.approx(folded, rel=1e-12)
    assert with_op > ignored * 1.05  # the factor is not left out (the old replay's mistake)
    dense = CollectiveSpec(op="all_reduce", algorithm="ring", size_bytes=4 * 2**20)
    assert predict_collective(dense, topo, calibration=_cal(0.92, {"sparse_all_gather": 0.9}), mode=mode).time_s == \
        pytest.approx(predict_collective(dense, topo, calibration=_cal(0.92), mode=mode).time_s, rel=1e-12)


@pytest.mark.parametrize("mode", ["auto", "flow"])
@pytest.mark.parametrize("exact", [False, True])
def test_the_step_engines_costs_apply_the_gather_factor_to_gathers_and_count_exchanges(mode, exact):
    topo = star(num_ranks=4, bandwidth_bytes_per_s=RATE, latency_s=2e-5)
    ops = {"all_gather": 0.9, "sparse_all_gather": 0.85}

    def costs(cal: Calibration) -> CostCache:
        return CostCache(topology=topo, calibration=cal, mode=mode, world_size=4, dense_algorithm="ring",
                         sparse_algorithm="ring", exact=exact)  # fmt: skip

    with_op, sparse_folded, meta_folded = costs(_cal(0.92, ops)), costs(_cal(0.92 * 0.85)), costs(_cal(0.92 * 0.9))
    plain = costs(_cal(0.92))
    for n in (8, 4096, 71176, 2**20, 3 * 2**20):  # enough sizes for the ring form and the line to engage
        assert with_op.sparse(n) == pytest.approx(sparse_folded.sparse(n), rel=1e-9)
        assert with_op.metadata(max(n // 8, 1)) == pytest.approx(meta_folded.metadata(max(n // 8, 1)), rel=1e-9)
        assert with_op.dense(n) == pytest.approx(plain.dense(n), rel=1e-9)


def test_a_validation_case_and_the_saved_calibration_predict_the_same_gather():
    """The fit's own prediction of a case (``predict_case``) and gloo's model under the calibration
    the fit saves for igsim give one time: the op factor is applied in one place."""
    topo = star(num_ranks=4, bandwidth_bytes_per_s=RATE, latency_s=2e-5)
    fit_ = v.Fit(alpha_s=5e-4, duplex_factor=0.92, simplex_factor=0.96, gather_factor=0.83)
    saved = Calibration.from_dict(fit_.calibration(topo).to_dict())
    for op, kw in (("all_gather", {"size_bytes": 2**20}), ("sparse_all_gather", {"sizes_bytes": [8, 4096, 65536, 0]}),
                   ("all_reduce", {"size_bytes": 2**20}), ("broadcast", {"size_bytes": 2**20})):  # fmt: skip
        case = v.Case(name=op, op=op, role=v.VALIDATION, size_bytes=kw.get("size_bytes", 0),
                      sizes_bytes=tuple(kw.get("sizes_bytes", ())), times_s=(1.0,))  # fmt: skip
        assert v.predict_case(case, topo, fit_) == pytest.approx(
            predict_gloo(op, topology=topo, calibration=saved, **kw), rel=1e-12
        )
