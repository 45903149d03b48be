"""Adaptive thresholds: split 1-D importance scores into important and low.

:func:`split_scores` is the one entry point; each method is a private workhorse. Every method sees
only the *sorted* scores, so the result does not depend on the input order, and every method returns
a threshold inside [min, max] with the tie rule **important = score >= threshold**: components tied
at the threshold are all important, and a higher score is never less important than a lower one.
Cut-based methods (knee, otsu, kmeans2, fixed_ratio) return the smallest important score itself as
the threshold, so the split is exact in floating point.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["METHODS", "ThresholdResult", "method_params", "split_scores"]


@dataclass(frozen=True, kw_only=True, eq=False)
class ThresholdResult:
    """A split of scores: ``important[i]`` is ``scores[i] >= threshold``, aligned with the input.

    ``params`` are the method's effective parameters (defaults filled in); ``details`` what the
    method found (e.g. the fitted mixture); ``keys`` names the scores where the caller knows them.
    """

    method: str
    threshold: float
    important: np.ndarray
    params: Mapping[str, Any] = field(default_factory=dict)
    details: Mapping[str, Any] = field(default_factory=dict)
    keys: tuple[str, ...] | None = None

    @property
    def num_important(self) -> int:
        return int(np.count_nonzero(self.important))


# ------------------------------------------------------------------ methods on sorted scores
# Each takes the ascending sorted scores rescaled to the unit interval, u = (s - s[0]) / (s[-1] - s[0])
# (length >= 2, u[0] = 0, u[-1] = 1), so no method overflows and each is invariant to an affine
# change of the scores. Cut methods return the index j of the first important score; gmm returns
# its threshold on the unit scale.


def _knee(u: np.ndarray, *, curve: str) -> tuple[int, dict[str, Any]]:
    """Kneedle on the descending curve y_i = u[C-1-i] at x_i = i/(C-1) (the unit square).

    The difference curve is d_i = y_i - (1 - x_i) (curve minus its chord). A convex curve (few high
    scores, a long low tail) bends below the chord: its knee max(-d) is the *first low* score. A
    concave one (a high plateau, a few low) bends above: its knee max(d) is the *last important*
    score. ``curve="auto"`` takes the larger bend (the convex one on a tie). A straight line has no
    knee; then the cut is the largest gap between consecutive scores (the highest such gap on a tie).
    Like Kneedle itself this is sensitive to noise inside a cluster: where consecutive scores of one
    cluster differ by more than 1/(C-1) of the range, the knee can move into that cluster by a few
    points. Otsu, kmeans2 and gmm do not have this weakness.
    """
    C = u.size
    y = u[::-1]
    x = np.arange(C) / (C - 1)
    d = y - (1.0 - x)
    below, above = float(np.max(-d)), float(np.max(d))
    use_convex = {"convex": True, "concave": False}.get(curve, below >= above)
    bend = below if use_convex else above
    if bend > 0:
        if use_convex:
            num_important = int(np.argmax(-d))  # knee is the first low one
        else:
            num_important = int(np.argmax(d)) + 1  # knee is the last important one
    else:
        gaps = np.diff(u)
        num_important = C - 1 - int(np.flatnonzero(gaps == gaps.max())[-1])
    num_important = min(max(num_important, 1), C)
    return C - num_important, {"curve": "convex" if use_convex else "concave", "bend": bend}


def _between_class_variance(u: np.ndarray) -> np.ndarray:
    """v[j-1] for the cut {u[:j]} | {u[j:]}, j = 1..C-1: w0·w1·(μ0 - μ1)² with class fractions w."""
    C = u.size
    j = np.arange(1, C)
    csum = np.cumsum(u)[:-1]
    mu0 = csum / j
    mu1 = (csum[-1] + u[-1] - csum) / (C - j)
    return (j / C) * ((C - j) / C) * (mu0 - mu1) ** 2


def _best_cut(objective: np.ndarray, u: np.ndarray, *, maximise: bool) -> int:
    """Index j of the first important score at the best cut; only cuts between distinct values."""
    valid = u[1:] > u[:-1]
    obj = np.where(valid, objective if maximise else -objective, -np.inf)
    return int(np.argmax(obj)) + 1  # earliest cut among equals


def _otsu(u: np.ndarray) -> tuple[int, dict[str, Any]]:
    """Otsu: the cut of the sorted scores maximising the between-class variance, every cut tried."""
    v = _between_class_variance(u)
    j = _best_cut(v, u, maximise=True)
    return j, {"between_class_variance_unit": float(v[j - 1])}


def _kmeans2(u: np.ndarray) -> tuple[int, dict[str, Any]]:
    """Exact 1-D 2-means: the cut minimising the within-cluster sum of squares, every cut tried.

    (Total = within + between, so this is the same optimum as Otsu; it is computed independently,
    on centred prefix sums, and the tests hold each as the other's oracle.)
    """
    c = u - u.mean()
    C = u.size
    j = np.arange(1, C)
    p1, p2 = np.cumsum(c)[:-1], np.cumsum(c * c)[:-1]
    t1, t2 = p1[-1] + c[-1], p2[-1] + c[-1] ** 2
    sse = np.maximum((p2 - p1**2 / j) + ((t2 - p2) - (t1 - p1) ** 2 / (C - j)), 0.0)
    k = _best_cut(sse, u, maximise=False)
    return k, {"sse_unit": float(sse[k - 1])}


def _gauss_logpdf(x: np.ndarray, mean: float, var: float) -> np.ndarray:
    return -0.5 * (np.log(2 * np.pi * var) + (x - mean) ** 2 / var)


def _gmm(u: np.ndarray, *, max_iter: int, tol: float) -> tuple[float, dict[str, Any]]:
    """Two-component Gaussian mixture by EM (on the unit scale).

    Initialised from the Otsu split (class means, variances, fractions) — deterministic. Variances
    are floored at 1e-6 (of the unit range) so a cluster of equal scores cannot collapse. Stops when
    the mean log-likelihood improves by less than ``tol``. The threshold is where the weighted
    densities (so the posteriors) are equal, the root of a quadratic between the two means; when
    there is none there, the midpoint of the means.
    """
    var_floor = 1e-6
    j = _best_cut(_between_class_variance(u), u, maximise=True)
    w = np.array([j, u.size - j], dtype=np.float64) / u.size
    mu = np.array([u[:j].mean(), u[j:].mean()])
    var = np.maximum(np.array([u[:j].var(), u[j:].var()]), var_floor)
    prev_ll, ll, num_iter = -np.inf, -np.inf, 0
    while num_iter < max_iter:
        num_iter += 1
        logp = np.stack([np.log(w[i]) + _gauss_logpdf(u, mu[i], var[i]) for i in range(2)])
        top = logp.max(axis=0)
        lse = top + np.log(np.exp(logp - top).sum(axis=0))
        resp = np.exp(logp - lse)
        ll = float(lse.mean())
        nk = np.maximum(resp.sum(axis=1), 1e-12)
        w = np.maximum(nk / u.size, 1e-12)
        mu = (resp @ u) / nk
        var = np.maximum((resp * (u[None, :] - mu[:, None]) ** 2).sum(axis=1) / nk, var_floor)
        if ll - prev_ll < tol:
            break
        prev_ll = ll
    if mu[0] > mu[1]:
        mu, var, w = mu[::-1], var[::-1], w[::-1]
    t = _equal_posterior(mu=mu, var=var, w=w)
    return t, {
        "means_unit": [float(m) for m in mu],
        "stds_unit": [float(math.sqrt(v)) for v in var],
        "weights": [float(v) for v in w],
        "num_iter": num_iter,
        "log_likelihood_unit": ll,
    }


def _equal_posterior(*, mu: np.ndarray, var: np.ndarray, w: np.ndarray) -> float:
    """The x in [mu0, mu1] where w0·N(x; mu0, var0) = w1·N(x; mu1, var1) (midpoint if none)."""
    a = 0.5 / var[1] - 0.5 / var[0]
    b = mu[0] / var[0] - mu[1] / var[1]
    c = (
        0.5 * mu[1] ** 2 / var[1]
        - 0.5 * mu[0] ** 2 / var[0]
        + math.log(w[0] / w[1])
        - 0.5 * math.log(var[0] / var[1])
    )
    # log w0 N0 - log w1 N1 = a x² + b x + c   (positive where the low component wins)
    if abs(a) < 1e-12:
        roots = [-c / b] if b != 0 else []
    else:
        disc = b * b - 4 * a * c
        roots = [] if disc < 0 else [(-b - math.sqrt(disc)) / (2 * a), (-b + math.sqrt(disc)) / (2 * a)]
    inside = [r for r in roots if mu[0] <= r <= mu[1]]
    if not inside:
        return float(0.5 * (mu[0] + mu[1]))
    return float(min(inside))


# ------------------------------------------------------------------------------ dispatch


def _check_number(params: Mapping[str, Any], name: str, ok: Callable[[float], bool], rule: str) -> None:
    v = params[name]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not ok(v):
        raise ValueError(f"threshold parameter {name}={v!r} must be {rule}")


# method -> its parameters with their defaults
METHODS: dict[str, dict[str, Any]] = {
    "knee": {"curve": "auto"},
    "otsu": {},
    "gmm": {"max_iter": 200, "tol": 1e-10},
    "kmeans2": {},
    "percentile": {"q": 75.0},
    "fixed_ratio": {"ratio": 0.25},
}


def method_params(method: str, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``params`` with the method's defaults filled in, validated.

    Raises ValueError for an unknown method, an unknown parameter or a value out of range.
    """
    if method not in METHODS:
        raise ValueError(f"unknown threshold method {method!r} (one of {', '.join(METHODS)})")
    params = dict(params or {})
    unknown = sorted(set(params) - set(METHODS[method]))
    if unknown:
        allowed = ", ".join(METHODS[method]) or "none"
        raise ValueError(f"threshold method {method}: unknown parameter(s) {unknown} (allowed: {allowed})")
    full = {**METHODS[method], **params}
    if method == "knee" and full["curve"] not in ("auto", "convex", "concave"):
        raise ValueError(f"threshold method knee: curve={full['curve']!r} must be auto, convex or concave")
    if method == "gmm":
        _check_number(full, "max_iter", lambda v: v >= 1 and float(v).is_integer(), "an integer >= 1")
        _check_number(full, "tol", lambda v: v > 0, "a number > 0")
    if method == "percentile":
        _check_number(full, "q", lambda v: 0 <= v <= 100, "in [0, 100]")
    if method == "fixed_ratio":
        _check_number(full, "ratio", lambda v: 0 < v <= 1, "in (0, 1]")
    return full


def split_scores(scores: ArrayLike, *, method: str, **params: Any) -> ThresholdResult:
    """Split ``scores`` into important (score >= threshold) and low with an adaptive threshold.

    Methods and parameters (defaults in :data:`METHODS`):

    - ``knee``: Kneedle on the descending sorted scores (``curve`` auto | convex | concave).
    - ``otsu``: maximise the between-class variance over every cut of the sorted scores.
    - ``gmm``: two-Gaussian mixture by EM, threshold where the posteriors are equal
      (``max_iter``, ``tol``).
    - ``kmeans2``: exact optimal 1-D 2-means (minimum within-cluster sum of squares).
    - ``percentile``: threshold = the q-th percentile (numpy's linear interpolation); with distinct
      scores, C - ceil(q/100 · (C-1)) are important.
    - ``fixed_ratio``: the ceil(ratio · C) highest scores are important (more on ties at the cut).

    Equal scores everywhere: every component is important (threshold = that score).
    Raises ValueError for fewer than two scores, NaN or infinite scores, an unknown method, or an
    unknown or out-of-range parameter.

    >>> split_scores([0.9, 0.1, 0.85, 0.05, 0.12], method="otsu").important.tolist()
    [True, False, True, False, False]
    """
    full = method_params(method, params)
    try:
        x = np.asarray(scores, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError("threshold: scores must be a 1-D sequence of numbers") from None
    if x.ndim != 1:
        raise ValueError(f"threshold: scores must be 1-D, got shape {x.shape}")
    if x.size < 2:
        raise ValueError(f"threshold: need at least two scores to split, got {x.size}")
    if not np.all(np.isfinite(x)):
        bad = np.flatnonzero(~np.isfinite(x)).tolist()
        raise ValueError(f"threshold: scores must be finite; NaN or infinite at positions {bad}")
    s = np.sort(x)
    with np.errstate(over="ignore"):
        span = float(s[-1] - s[0])
    if not math.isfinite(span):
        raise ValueError("threshold: the range of the scores overflows a float")
    details: dict[str, Any] = {}
    if method == "percentile":
        threshold = float(np.clip(np.percentile(s, full["q"]), s[0], s[-1]))
    elif method == "fixed_ratio":
        n = min(x.size, max(1, math.ceil(full["ratio"] * x.size - 1e-9)))
        threshold, details = float(s[x.size - n]), {"num_requested": n}
    elif span == 0:
        threshold, details = float(s[0]), {"reason": "all scores are equal"}
    elif method == "gmm":
        t, details = _gmm((s - s[0]) / span, max_iter=int(full["max_iter"]), tol=float(full["tol"]))
        threshold = min(max(float(s[0]) + t * span, float(s[0])), float(s[-1]))
        details["means"] = [float(s[0]) + m * span for m in details["means_unit"]]
        details["stds"] = [sd * span for sd in details["stds_unit"]]
    else:
        cut = {"knee": lambda u: _knee(u, curve=full["curve"]), "otsu": _otsu, "kmeans2": _kmeans2}[method]
        j, details = cut((s - s[0]) / span)
        threshold = float(s[j])
        details["cut_index"] = j
    important = x >= threshold
    important.setflags(write=False)
    return ThresholdResult(
        method=method, threshold=threshold, important=important, params=full, details=details
    )
