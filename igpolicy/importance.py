"""Importance scores of Transformer components, from per-step sparsifier statistics.

A trace records, per parameter and step, the L2 norm of the entries the sparsifier selected, how
many it selected (k) and how much the selected index set overlaps the previous step's (Jaccard).
:func:`component_stats_from_params` groups parameters into components; :func:`score_components`
turns a component's history into one score in [0, 1]: how *large* its selected gradient is for its
size (magnitude), and how *consistently* it matters (persistence above the per-step median, and
stability of the selected coordinates). The threshold that splits scores into important and low is
:mod:`igpolicy.thresholds`' business; the plan is built in :mod:`igpolicy.profile`.

With ``persistence_weight=1, overlap_weight=0, normalise="minmax"`` the score is the prototype's
(0.7 × min-max-normalised mean + 0.3 × fraction of steps above the per-step median).

**Ties.** A profile's important set must not depend on floating-point rounding, so every place
that compares magnitudes follows one rule: means are summed with :func:`math.fsum` (correctly
rounded, so the same values in any step order give the same bits), and values within a relative
``TIE_RTOL`` of their sorted neighbour are one tie (:func:`_merge_near_ties`), both across components
before normalising and within a step before the median comparison. Scores are therefore invariant to
a common scale of the norms and to the order of components and steps, also on exact ties.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from scipy.stats import rankdata

__all__ = [
    "NORMALISERS",
    "SIZE_NORMS",
    "TIE_RTOL",
    "ComponentStats",
    "ImportanceConfig",
    "ImportanceScores",
    "component_stats_from_params",
    "score_components",
]

NORMALISERS = ("minmax", "rank", "log_minmax")
SIZE_NORMS = ("numel", "selected")  # what a component's selected norm is divided (under a root) by
_LOG_FLOOR = 1e-12  # log_minmax: values below this fraction of the largest are raised to it
TIE_RTOL = 1e-9  # magnitudes closer than this relative gap to their sorted neighbour are tied


def _frozen_array(value: object, *, dtype: type) -> np.ndarray:
    arr = np.array(value, dtype=dtype, copy=True)
    arr.setflags(write=False)
    return arr


@dataclass(frozen=True, kw_only=True)
class ImportanceConfig:
    """How per-step statistics become one score per component (see :func:`score_components`).

    Weights are non-negative and finite; each pair is normalised by its sum, so only ratios matter
    (the defaults are the prototype's 0.7 / 0.3, consistency split evenly). ``window`` is a half-open
    range ``(start, stop)`` of recorded step rows (0-based) to score over; None means all rows.
    ``normalise`` maps the raw magnitudes of all components onto [0, 1]: ``minmax``, ``rank``
    (average ranks of ties, evenly spaced) or ``log_minmax`` (min-max of the logarithm); for all
    three, magnitudes within a relative ``TIE_RTOL`` of each other are ties (see the module docstring).
    ``size_norm`` is what the selected norm is made size-free by: ``numel`` (sqrt of the component's
    entries, the prototype's) or ``selected`` (sqrt of the entries the sparsifier selected that step:
    the RMS of what the component sent, so a row-sparse embedding is not diluted by its untouched
    rows; needs ``ComponentStats.selected``).
    """

    magnitude_weight: float = 0.7
    consistency_weight: float = 0.3
    persistence_weight: float = 0.5
    overlap_weight: float = 0.5
    window: tuple[int, int] | None = None
    normalise: str = "minmax"
    size_norm: str = "numel"

    def __post_init__(self) -> None:
        for name in ("magnitude_weight", "consistency_weight", "persistence_weight", "overlap_weight"):
            w = getattr(self, name)
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0:
                raise ValueError(f"importance config: {name}={w!r} must be a finite number >= 0")
        if self.magnitude_weight + self.consistency_weight <= 0:
            raise ValueError("importance config: magnitude_weight + consistency_weight must be > 0")
        if self.persistence_weight + self.overlap_weight <= 0:
            raise ValueError("importance config: persistence_weight + overlap_weight must be > 0")
        if self.normalise not in NORMALISERS:
            raise ValueError(
                f"importance config: normalise={self.normalise!r} is not one of {', '.join(NORMALISERS)}"
            )
        if self.size_norm not in SIZE_NORMS:
            raise ValueError(
                f"importance config: size_norm={self.size_norm!r} is not one of {', '.join(SIZE_NORMS)}"
            )
        if self.window is not None:
            w = self.window
            ok = (
                isinstance(w, (tuple, list))
                and len(w) == 2
                and all(isinstance(x, int) and not isinstance(x, bool) for x in w)
                and 0 <= w[0] < w[1]
            )
            if not ok:
                raise ValueError(
                    f"importance config: window={w!r} must be (start, stop) integers with 0 <= start < stop"
                )
            object.__setattr__(self, "window", (int(w[0]), int(w[1])))

    def to_dict(self) -> dict[str, object]:
        return {
            "magnitude_weight": float(self.magnitude_weight),
            "consistency_weight": float(self.consistency_weight),
            "persistence_weight": float(self.persistence_weight),
            "overlap_weight": float(self.overlap_weight),
            "window": None if self.window is None else list(self.window),
            "normalise": self.normalise,
            # recorded only when not the default, so plans profiled before it keep their fingerprint
            **({"size_norm": self.size_norm} if self.size_norm != "numel" else {}),
        }


@dataclass(frozen=True, kw_only=True, eq=False)
class ComponentStats:
    """Per-step statistics of C components over T recorded steps (arrays are read-only copies).

    - ``sel_norm`` [T, C]: L2 norm of the sparsifier-selected entries, >= 0, finite.
    - ``numel`` [C]: number of gradient entries of the component, integer >= 1.
    - ``overlap`` [T, C]: Jaccard index of the selected index sets of steps t-1 and t, in [0, 1];
      NaN where undefined (step 0, or nothing selected in either step).
    - ``grad_norm`` [T, C] (optional): L2 norm of the full gradient, >= 0, kept for reports.
    - ``selected`` [T, C] (optional): entries the sparsifier selected (Σ k over the component's
      parameters), >= 0; what ``ImportanceConfig(size_norm="selected")`` divides by.
    """

    keys: tuple[str, ...]
    sel_norm: np.ndarray
    numel: np.ndarray
    overlap: np.ndarray
    grad_norm: np.ndarray | None = None
    selected: np.ndarray | None = None

    def __post_init__(self) -> None:
        keys = tuple(self.keys)
        if not keys:
            raise ValueError("component stats: need at least one component (keys is empty)")
        if not all(isinstance(k, str) for k in keys):
            raise ValueError(f"component stats: keys must be strings, got {keys!r}")
        dupes = sorted({k for k in keys if keys.count(k) > 1})
        if dupes:
            raise ValueError(f"component stats: duplicate component keys {dupes}")
        object.__setattr__(self, "keys", keys)
        C = len(keys)
        sel = _frozen_array(self.sel_norm, dtype=np.float64)
        if sel.ndim != 2 or sel.shape[1] != C or sel.shape[0] < 1:
            raise ValueError(f"component stats: sel_norm must have shape [T >= 1, {C}], got {sel.shape}")
        T = sel.shape[0]
        _check_nonneg_finite(sel, "sel_norm", keys)
        object.__setattr__(self, "sel_norm", sel)

        numel = np.asarray(self.numel)
        if numel.shape != (C,):
            raise ValueError(f"component stats: numel must have shape [{C}], got {numel.shape}")
        bad = [k for k, n in zip(keys, numel.tolist()) if not _is_count(n)]
        if bad:
            raise ValueError(f"component stats: numel must be integers >= 1; bad for {bad}")
        object.__setattr__(self, "numel", _frozen_array(numel, dtype=np.int64))

        ov = _frozen_array(self.overlap, dtype=np.float64)
        if ov.shape != (T, C):
            raise ValueError(f"component stats: overlap must have shape [{T}, {C}], got {ov.shape}")
        defined = ~np.isnan(ov)
        if np.any(np.isinf(ov)) or np.any((ov[defined] < 0) | (ov[defined] > 1)):
            bad_cols = np.unique(np.nonzero(np.isinf(ov) | (defined & ((ov < 0) | (ov > 1))))[1])
            raise ValueError(
                f"component stats: overlap must be in [0, 1] or NaN; bad for {[keys[i] for i in bad_cols]}"
            )
        object.__setattr__(self, "overlap", ov)

        if self.grad_norm is not None:
            gn = _frozen_array(self.grad_norm, dtype=np.float64)
            if gn.shape != (T, C):
                raise ValueError(f"component stats: grad_norm must have shape [{T}, {C}], got {gn.shape}")
            _check_nonneg_finite(gn, "grad_norm", keys)
            object.__setattr__(self, "grad_norm", gn)
        if self.selected is not None:
            sk = _frozen_array(self.selected, dtype=np.float64)
            if sk.shape != (T, C):
                raise ValueError(f"component stats: selected must have shape [{T}, {C}], got {sk.shape}")
            _check_nonneg_finite(sk, "selected", keys)
            object.__setattr__(self, "selected", sk)

    @property
    def num_steps(self) -> int:
        return int(self.sel_norm.shape[0])

    @property
    def num_components(self) -> int:
        return len(self.keys)


def _is_count(n: object) -> bool:
    """True for an integer >= 1 (an integral float counts; a bool does not)."""
    if isinstance(n, bool) or not isinstance(n, (int, float, np.integer, np.floating)):
        return False
    return math.isfinite(n) and float(n).is_integer() and n >= 1


def _check_nonneg_finite(arr: np.ndarray, name: str, keys: tuple[str, ...]) -> None:
    bad = ~np.isfinite(arr) | (arr < 0)
    if np.any(bad):
        cols = np.unique(np.nonzero(bad)[1])
        raise ValueError(
            f"component stats: {name} must be finite and >= 0; bad for {[keys[i] for i in cols]}"
        )


def component_stats_from_params(
    *,
    param_component: Mapping[str, str],
    param_numel: Mapping[str, int],
    sel_norm: Mapping[str, np.ndarray],
    overlap: Mapping[str, np.ndarray],
    k: Mapping[str, np.ndarray],
    grad_norm: Mapping[str, np.ndarray] | None = None,
) -> ComponentStats:
    """Aggregate per-parameter histories (each a length-T array) into per-component statistics.

    Per component c with parameters P(c) and step t:
    ``sel_norm[t, c] = sqrt(Σ_p sel_norm_p[t]²)`` (and the same for ``grad_norm``),
    ``numel[c] = Σ_p numel_p``, ``overlap[t, c] = Σ_p k_p[t]·J_p[t] / Σ_p k_p[t]`` over the
    parameters whose Jaccard J_p[t] is defined (NaN when that weight is 0), ``selected[t, c] =
    Σ_p k_p[t]``. Every mapping must name
    exactly the parameters of ``param_component``; components come out sorted by key.
    """
    names = sorted(param_component)
    if not names:
        raise ValueError("component stats: param_component is empty")
    series = {"sel_norm": sel_norm, "overlap": overlap, "k": k}
    if grad_norm is not None:
        series["grad_norm"] = grad_norm
    for what, mapping in [("param_numel", param_numel), *series.items()]:
        missing, extra = sorted(set(names) - set(mapping)), sorted(set(mapping) - set(names))
        if missing or extra:
            raise ValueError(
                f"component stats: {what} does not match param_component: "
                f"missing {missing or 'none'}, unknown {extra or 'none'}"
            )
    T = None
    arrays: dict[str, dict[str, np.ndarray]] = {what: {} for what in series}
    for what, mapping in series.items():
        for name in names:
            a = np.asarray(mapping[name], dtype=np.float64)
            if a.ndim != 1:
                raise ValueError(f"component stats: {what}[{name!r}] must be 1-D, got shape {a.shape}")
            if T is None:
                T = a.shape[0]
            if a.shape[0] != T:
                raise ValueError(f"component stats: {what}[{name!r}] has {a.shape[0]} steps, expected {T}")
            if what == "overlap":
                if np.any(np.isinf(a) | (a < 0) | (a > 1)):
                    raise ValueError(f"component stats: overlap[{name!r}] must be in [0, 1] or NaN")
            elif not np.all(np.isfinite(a)) or np.any(a < 0):
                raise ValueError(f"component stats: {what}[{name!r}] must be finite and >= 0")
            arrays[what][name] = a
    kk = arrays["k"]

    keys = sorted(set(param_component.values()))
    col = {key: i for i, key in enumerate(keys)}
    C = len(keys)
    sq = np.zeros((T, C))
    gsq = np.zeros((T, C))
    num = np.zeros((T, C))
    den = np.zeros((T, C))
    selected = np.zeros((T, C))
    numel = np.zeros(C, dtype=np.int64)
    for name in names:
        c = col[param_component[name]]
        n = param_numel[name]
        if not _is_count(n):
            raise ValueError(f"component stats: param_numel[{name!r}]={n!r} must be an integer >= 1")
        numel[c] += int(n)
        sq[:, c] += arrays["sel_norm"][name] ** 2
        if grad_norm is not None:
            gsq[:, c] += arrays["grad_norm"][name] ** 2
        selected[:, c] += kk[name]
        j = arrays["overlap"][name]
        defined = ~np.isnan(j)
        w = np.where(defined, kk[name], 0.0)
        num[:, c] += np.where(defined, w * np.nan_to_num(j), 0.0)
        den[:, c] += w
    with np.errstate(invalid="ignore", divide="ignore"):
        ov = np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)
    return ComponentStats(
        keys=tuple(keys),
        sel_norm=np.sqrt(sq),
        numel=numel,
        overlap=ov,
        grad_norm=np.sqrt(gsq) if grad_norm is not None else None,
        selected=selected,
    )


@dataclass(frozen=True, kw_only=True, eq=False)
class ImportanceScores:
    """Per-component scores (arrays [C], aligned with ``keys``), each in [0, 1] except
    ``raw_magnitude`` (mean of sel_norm / sqrt(numel or selected) over the window, in gradient units)."""

    keys: tuple[str, ...]
    raw_magnitude: np.ndarray
    magnitude: np.ndarray
    persistence: np.ndarray
    overlap: np.ndarray
    consistency: np.ndarray
    score: np.ndarray
    num_steps: int
    config: ImportanceConfig = field(default_factory=ImportanceConfig)

    def as_dict(self) -> dict[str, float]:
        """{component key: score}."""
        return {k: float(s) for k, s in zip(self.keys, self.score)}

    def table(self) -> list[dict[str, object]]:
        """One row per component (for reports), highest score first, ties by key."""
        order = sorted(range(len(self.keys)), key=lambda i: (-self.score[i], self.keys[i]))
        return [
            {
                "key": self.keys[i],
                "score": float(self.score[i]),
                "magnitude": float(self.magnitude[i]),
                "raw_magnitude": float(self.raw_magnitude[i]),
                "persistence": float(self.persistence[i]),
                "overlap": float(self.overlap[i]),
                "consistency": float(self.consistency[i]),
            }
            for i in order
        ]


def _merge_near_ties(x: np.ndarray) -> np.ndarray:
    """Replace each run of near-equal values along the last axis by the run's smallest value.

    Sorted ascending, a value starts a new run when it exceeds its predecessor by more than
    ``TIE_RTOL`` times itself (x finite, >= 0); runs chain, so the result depends only on the
    multiset of values along the axis, and a common scale of x scales the result (up to rounding
    far below the tolerance). Values that are already distinct by more than the tolerance pass
    through unchanged.
    """
    order = np.argsort(x, axis=-1, kind="stable")
    xs = np.take_along_axis(x, order, axis=-1)
    starts = np.ones(xs.shape, dtype=bool)
    starts[..., 1:] = (xs[..., 1:] - xs[..., :-1]) > TIE_RTOL * xs[..., 1:]
    first = np.maximum.accumulate(np.where(starts, np.arange(xs.shape[-1]), 0), axis=-1)
    out = np.empty_like(x)
    np.put_along_axis(out, order, np.take_along_axis(xs, first, axis=-1), axis=-1)
    return out


def _normalise(x: np.ndarray, how: str) -> np.ndarray:
    """Map x (finite, >= 0) onto [0, 1]; near ties (``TIE_RTOL``) map to one value, and a constant
    input (one tie) maps to 0.5 (no information)."""
    x = _merge_near_ties(x)
    if how == "rank":
        if x.size == 1:
            return np.full(1, 0.5)
        return (rankdata(x, method="average") - 1.0) / (x.size - 1)
    if how == "log_minmax":
        top = float(np.max(x))
        if top <= 0:
            return np.full(x.shape, 0.5)
        x = np.log(np.maximum(x, top * _LOG_FLOOR))
    lo, hi = float(np.min(x)), float(np.max(x))
    if not hi > lo:
        return np.full(x.shape, 0.5)
    return np.clip((x - lo) / (hi - lo), 0.0, 1.0)


def _column_sums(x: np.ndarray) -> np.ndarray:
    """Sum of each column of a [W, C] array by math.fsum: correctly rounded, so it does not depend on
    the row order (equal multisets of values give equal bits)."""
    return np.array([math.fsum(col) for col in x.T.tolist()], dtype=np.float64)


def score_components(stats: ComponentStats, config: ImportanceConfig | None = None) -> ImportanceScores:
    """Score every component of ``stats`` over ``config.window`` (all rows when None).

    With z[t, c] = sel_norm[t, c] / sqrt(numel[c]) (selected norm per √entry, so a large matrix is
    not important merely for being large; with ``size_norm="selected"``, sel_norm[t, c] /
    sqrt(selected[t, c]), 0 where nothing was selected) over the W window rows:

    - ``raw_magnitude[c] = mean_t z[t, c]``; ``magnitude = normalise(raw_magnitude)`` across components
      (minmax: (x - min)/(max - min); rank: (average rank - 1)/(C - 1); log_minmax: minmax of
      log(max(x, 1e-12·max x)); a constant input gives 0.5 everywhere).
    - ``persistence[c] = (1/W) Σ_t [z[t, c] > median_c' z[t, c']]`` (strictly above the per-step
      median over components; with one component it is 0).
    - ``overlap[c] = nanmean_t overlap[t, c]``, 0 where it is undefined at every window row.
    - ``consistency = (w_p·persistence + w_o·overlap) / (w_p + w_o)``.
    - ``score = (w_m·magnitude + w_c·consistency) / (w_m + w_c)``, in [0, 1].

    Raises ValueError when the window does not lie inside the T recorded rows, or when
    ``size_norm="selected"`` and the statistics carry no ``selected`` counts.
    """
    config = config or ImportanceConfig()
    T = stats.num_steps
    if config.window is None:
        rows = slice(0, T)
    else:
        start, stop = config.window
        if stop > T:
            raise ValueError(
                f"importance window {config.window!r} reaches past the {T} recorded steps (rows 0..{T - 1})"
            )
        rows = slice(start, stop)
    # compute in key order, so a score does not depend (even in its last bit) on the column order
    order = np.array(sorted(range(stats.num_components), key=stats.keys.__getitem__), dtype=np.int64)
    back = np.empty_like(order)
    back[order] = np.arange(order.size)
    sel, numel = np.ascontiguousarray(stats.sel_norm[rows][:, order]), stats.numel[order]
    if config.size_norm == "selected":
        if stats.selected is None:
            raise ValueError("importance size_norm='selected' needs ComponentStats.selected (the per-step k)")
        k = np.ascontiguousarray(stats.selected[rows][:, order])
        z = np.where(k > 0, sel / np.sqrt(np.maximum(k, 1.0)), 0.0)
    else:
        z = sel / np.sqrt(numel.astype(np.float64))[None, :]
    W = z.shape[0]
    raw = _column_sums(z) / W
    magnitude = _normalise(raw, config.normalise)
    tied = _merge_near_ties(z)
    persistence = np.count_nonzero(tied > np.median(tied, axis=1, keepdims=True), axis=0) / W
    ov = stats.overlap[rows][:, order]
    defined = ~np.isnan(ov)
    counts = defined.sum(axis=0)
    overlap = np.where(counts > 0, _column_sums(np.where(defined, ov, 0.0)) / np.maximum(counts, 1), 0.0)
    wp, wo = float(config.persistence_weight), float(config.overlap_weight)
    consistency = (wp * persistence + wo * overlap) / (wp + wo)
    wm, wc = float(config.magnitude_weight), float(config.consistency_weight)
    score = np.clip((wm * magnitude + wc * consistency) / (wm + wc), 0.0, 1.0)
    assert np.all(np.isfinite(score)), "scores must be finite"
    return ImportanceScores(
        keys=stats.keys,
        raw_magnitude=_frozen_array(raw[back], dtype=np.float64),
        magnitude=_frozen_array(magnitude[back], dtype=np.float64),
        persistence=_frozen_array(persistence[back], dtype=np.float64),
        overlap=_frozen_array(overlap[back], dtype=np.float64),
        consistency=_frozen_array(consistency[back], dtype=np.float64),
        score=_frozen_array(score[back], dtype=np.float64),
        num_steps=W,
        config=config,
    )
