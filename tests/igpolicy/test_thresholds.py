"""Adaptive thresholds: known splits, exact counts, order invariance, and properties of every method."""

from __future__ import annotations

import doctest
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import igpolicy.thresholds as thresholds
from igpolicy.thresholds import METHODS, split_scores

CLUSTER_METHODS = ("knee", "otsu", "gmm", "kmeans2")
ALL_METHODS = tuple(METHODS)

scores_strategy = st.lists(
    st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False), min_size=2, max_size=40
)
wide_scores_strategy = st.lists(
    st.one_of(
        st.floats(min_value=-1e300, max_value=1e300, allow_nan=False, allow_infinity=False),
        st.sampled_from([0.0, 1.0, 5e-324, 1e-300]),
    ),
    min_size=2,
    max_size=40,
)
method_strategy = st.sampled_from(ALL_METHODS)


def _bimodal(rng: np.random.Generator, num_high: int, num_low: int, *, lo=0.1, hi=0.9, spread=0.03):
    x = np.concatenate(
        [hi + spread * rng.standard_normal(num_high), lo + spread * rng.standard_normal(num_low)]
    )
    truth = np.arange(x.size) < num_high
    perm = rng.permutation(x.size)
    return x[perm], truth[perm]


@pytest.mark.parametrize("method", CLUSTER_METHODS)
@pytest.mark.parametrize("sizes", [(3, 20), (20, 3), (10, 10), (1, 25), (25, 1), (1, 1), (2, 5), (6, 40)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cluster_methods_recover_well_separated_bimodal_split(method, sizes, seed):
    rng = np.random.default_rng(seed)
    x, truth = _bimodal(rng, *sizes, spread=0.005)
    result = split_scores(x, method=method)
    assert result.important.tolist() == truth.tolist()
    assert x[~truth].max() < result.threshold <= x[truth].min()


@pytest.mark.parametrize("method", ["otsu", "gmm", "kmeans2"])
def test_variance_based_methods_recover_noisier_clusters(method):
    # spread 0.05 around 0.1 / 0.9: Kneedle may move by a point here (documented), these may not
    for seed in range(40):
        rng = np.random.default_rng(seed)
        for sizes in [(3, 30), (30, 3), (12, 12), (1, 40)]:
            x, truth = _bimodal(rng, *sizes, spread=0.05)
            assert split_scores(x, method=method).important.tolist() == truth.tolist()


@pytest.mark.parametrize("method", CLUSTER_METHODS)
def test_cluster_methods_are_affine_invariant(method):
    x, truth = _bimodal(np.random.default_rng(7), 4, 12)
    base = split_scores(x, method=method)
    for scale, shift in [(1e-6, 0.0), (1e4, -3.0), (2.5, 1e3)]:
        other = split_scores(x * scale + shift, method=method)
        assert other.important.tolist() == base.important.tolist() == truth.tolist()


def test_knee_on_hand_checked_curves():
    # a few large scores and a long flat tail: the knee is the first score of the tail
    r = split_scores([10, 1, 0.5, 0.3, 0.2, 0.1], method="knee")
    assert r.important.tolist() == [True, False, False, False, False, False]
    assert r.details["curve"] == "convex"
    # a high plateau and one low score: the knee is the last score of the plateau
    r = split_scores([1.0, 0.98, 0.99, 0.97, 0.0], method="knee")
    assert r.important.tolist() == [True, True, True, True, False]
    assert r.details["curve"] == "concave"
    # two scores, and a straight line: no bend, the largest gap (the highest one on a tie) decides
    assert split_scores([0.2, 0.7], method="knee").important.tolist() == [False, True]
    assert split_scores([4.0, 1.0, 3.0, 2.0], method="knee").important.tolist() == [True, False, False, False]
    assert split_scores([0.0, 1.0, 2.0, 10.0], method="knee", curve="convex").num_important == 1


def test_knee_curve_parameter_forces_the_side():
    x = [10, 9.9, 9.8, 5, 0.2, 0.1, 0.0]
    convex = split_scores(x, method="knee", curve="convex")
    concave = split_scores(x, method="knee", curve="concave")
    assert convex.details["curve"] == "convex" and concave.details["curve"] == "concave"
    # symmetric bends: the middle score 5 is the last of the high side seen from the tail (convex)
    # and the first of the low side seen from the plateau (concave)
    assert convex.num_important == 4 and convex.threshold == 5
    assert concave.num_important == 3 and concave.threshold == 9.8


@pytest.mark.parametrize("C", [5, 11, 12, 40])
@pytest.mark.parametrize("q", [0, 10, 25, 50, 60, 75, 90, 100])
def test_percentile_gives_the_exact_count(C, q):
    x = np.random.default_rng(C).permutation(C).astype(float)
    result = split_scores(x, method="percentile", q=q)
    expected = C - math.ceil(Fraction(q, 100) * (C - 1))
    assert result.num_important == expected
    assert result.threshold == pytest.approx(np.percentile(x, q))


@pytest.mark.parametrize("C", [2, 7, 16, 33])
def test_fixed_ratio_keeps_exactly_that_many(C):
    x = np.random.default_rng(C).permutation(C).astype(float) * 0.1
    for k in range(1, C + 1):
        result = split_scores(x, method="fixed_ratio", ratio=k / C)
        assert result.num_important == k
        assert np.sort(x[result.important]).tolist() == np.sort(x)[C - k :].tolist()
    assert split_scores(x, method="fixed_ratio", ratio=0.5 / C).num_important == 1  # at least one


def test_ties_at_the_threshold_are_important():
    x = [0.1, 0.5, 0.5, 0.5, 0.9]
    result = split_scores(x, method="fixed_ratio", ratio=0.4)  # asks for 2, three tie at 0.5
    assert result.important.tolist() == [False, True, True, True, True]
    for method in ALL_METHODS:
        result = split_scores([0.3, 0.3, 0.3], method=method)
        assert result.important.all() and result.threshold == 0.3


def test_gmm_threshold_is_where_weighted_densities_are_equal():
    x, truth = _bimodal(np.random.default_rng(3), 8, 30, spread=0.08, lo=0.2, hi=0.7)
    r = split_scores(x, method="gmm")
    (m0, m1), (s0, s1), (w0, w1) = r.details["means"], r.details["stds"], r.details["weights"]
    assert m0 < r.threshold < m1
    t = r.threshold

    def dens(m, s, w):
        return w * math.exp(-0.5 * ((t - m) / s) ** 2) / s

    assert dens(m0, s0, w0) == pytest.approx(dens(m1, s1, w1), rel=1e-6)
    assert m0 == pytest.approx(x[~truth].mean(), abs=0.05) and m1 == pytest.approx(x[truth].mean(), abs=0.05)
    assert w1 == pytest.approx(8 / 38, abs=0.05)
    assert 1 <= r.details["num_iter"] <= r.params["max_iter"]


def _cut_sse(s: np.ndarray, j: int) -> float:
    return float(((s[:j] - s[:j].mean()) ** 2).sum() + ((s[j:] - s[j:].mean()) ** 2).sum())


@settings(max_examples=150, deadline=None)
@given(scores_strategy)
def test_otsu_and_kmeans2_find_the_brute_force_optimum(values):
    x = np.array(values)
    s = np.sort(x)
    cuts = [j for j in range(1, s.size) if s[j] > s[j - 1]]
    if not cuts:
        return
    best = min(_cut_sse(s, j) for j in cuts)
    tol = 1e-9 * max(1.0, float(((s - s.mean()) ** 2).sum()))
    for method in ("otsu", "kmeans2"):
        r = split_scores(x, method=method)
        j = s.size - r.num_important
        assert _cut_sse(s, j) <= best + tol


@settings(max_examples=300, deadline=None)
@given(wide_scores_strategy, method_strategy, st.randoms(use_true_random=False))
def test_every_method_gives_a_monotone_partition_inside_the_range(values, method, rnd):
    x = np.array(values)
    with np.errstate(over="ignore"):
        if not np.isfinite(x.max() - x.min()):
            return  # a range that overflows is an error, tested below
    result = split_scores(x, method=method)
    imp = result.important
    assert imp.dtype == bool and imp.shape == x.shape
    assert x.min() <= result.threshold <= x.max()
    assert imp.tolist() == (x >= result.threshold).tolist()
    assert imp.any()  # the highest score is always important
    if (~imp).any():
        assert x[imp].min() > x[~imp].max()  # a higher score is never less important
    # the input order does not matter
    perm = list(range(x.size))
    rnd.shuffle(perm)
    permuted = split_scores(x[perm], method=method)
    assert permuted.threshold == result.threshold
    assert permuted.important.tolist() == imp[perm].tolist()


def test_params_are_filled_with_defaults_and_reported():
    r = split_scores([0.1, 0.2, 0.9], method="gmm", tol=1e-8)
    assert r.params == {"max_iter": 200, "tol": 1e-8}
    assert r.method == "gmm"
    assert thresholds.method_params("percentile") == {"q": 75.0}


@pytest.mark.parametrize(
    ("scores", "kwargs", "match"),
    [
        ([0.5], {"method": "otsu"}, "at least two"),
        ([], {"method": "otsu"}, "at least two"),
        ([0.1, float("nan"), 0.3], {"method": "otsu"}, r"NaN or infinite at positions \[1\]"),
        ([0.1, float("inf")], {"method": "knee"}, "finite"),
        ([[0.1, 0.2]], {"method": "knee"}, "1-D"),
        (["a", "b"], {"method": "knee"}, "numbers"),
        ([-1.7e308, 1.7e308], {"method": "otsu"}, "overflows"),
        ([0.1, 0.2], {"method": "elbow"}, "unknown threshold method 'elbow'"),
        ([0.1, 0.2], {"method": "otsu", "q": 50}, r"unknown parameter\(s\) \['q'\]"),
        ([0.1, 0.2], {"method": "percentile", "q": 101}, "q=101"),
        ([0.1, 0.2], {"method": "percentile", "q": float("nan")}, "q=nan"),
        ([0.1, 0.2], {"method": "fixed_ratio", "ratio": 0}, r"ratio=0 must be in \(0, 1\]"),
        ([0.1, 0.2], {"method": "fixed_ratio", "ratio": True}, "ratio=True"),
        ([0.1, 0.2], {"method": "gmm", "max_iter": 0}, "max_iter=0"),
        ([0.1, 0.2], {"method": "gmm", "max_iter": 2.5}, "max_iter=2.5"),
        ([0.1, 0.2], {"method": "gmm", "tol": -1.0}, "tol=-1.0"),
        ([0.1, 0.2], {"method": "knee", "curve": "wavy"}, "curve='wavy'"),
    ],
)
def test_bad_input_is_a_clear_value_error(scores, kwargs, match):
    with pytest.raises(ValueError, match=match):
        split_scores(scores, **kwargs)


def test_result_is_read_only_and_docstring_example_runs():
    r = split_scores([0.2, 0.8], method="otsu")
    with pytest.raises(ValueError):
        r.important[0] = True
    assert doctest.testmod(thresholds).failed == 0
