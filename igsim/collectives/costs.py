"""Collective costs for the step engine: seconds per collective, cached by (op, bytes per rank).

The engine's stream runs one collective at a time, so a collective's time depends only on its
spec. Three ops: ``dense`` (all-reduce of the bucket), ``sparse`` (all-gather of equal encoded
payloads) and ``metadata`` (the int64 count exchange). How an op is costed is decided at its first
size (:meth:`CostCache.methods` says which):

- ``exact``: every distinct size by :func:`igsim.collectives.predict.predict_collective` in the
  run's mode (``exact_costs=True``).
- ``ring closed form``: a ring that would need the flow mode (mode ``flow``, or ``auto`` off a
  uniform star or ring) is costed by :mod:`igsim.collectives.rings`' contention-aware closed form
  once its certificate holds and one flow run of the op agrees with it to 1e-9
  (:func:`igsim.collectives.rings.check_ring`); O(1) per size. Otherwise the op falls back to
  the next rule.
- ``line``: ``predict_collective`` (closed form or flow) per size, and each op's time checked to
  be affine in its size: the first two sizes define a line, the next three exact evaluations must
  lie on it to 1e-9 relative; then sizes inside the range evaluated so far are read off the line,
  and a size outside it is evaluated and must lie on the line too (a collective's critical path is
  convex in its size, so a line through three points holds between them). Any miss turns the
  shortcut off for that op (``exact`` from then on). Flow times are affine in the size wherever the
  order of events does not change with it.
"""

from __future__ import annotations

import math
from typing import Any

from igsim.collectives.predict import CollectiveSpec, closed_form_exact, predict_collective
from igsim.collectives.rings import RingShape, check_ring, ring_shape, ring_terms, ring_time_s
from igsim.net.calibration import Calibration

__all__ = ["CostCache"]

_ON_LINE = 1e-9


class _Line:
    """A line through verified (size, seconds) points, trusted once ``checks`` points lie on it."""

    def __init__(self, checks: int) -> None:
        self.points: list[tuple[int, float]] = []
        self.checks = checks
        self.intercept = self.slope = 0.0
        self.lo = self.hi = 0
        self.broken = False

    @property
    def trusted(self) -> bool:
        return not self.broken and len(self.points) >= 2 + self.checks

    def covers(self, size: int) -> bool:
        return self.trusted and self.lo <= size <= self.hi

    def value(self, size: int) -> float:
        return self.intercept + self.slope * size

    def add(self, size: int, t: float) -> None:
        if self.broken:
            return
        self.points.append((size, t))
        if len(self.points) == 1:
            self.lo = self.hi = size
        elif len(self.points) == 2:
            (s0, t0), (s1, t1) = self.points
            self.slope = (t1 - t0) / (s1 - s0)
            self.intercept = t0 - self.slope * s0
        elif abs(self.value(size) - t) > _ON_LINE * max(abs(t), 1e-12):
            self.broken = True  # not affine: exact evaluations from now on
            return
        self.lo, self.hi = min(self.lo, size), max(self.hi, size)


class _RingForm:
    """A ring op costed in closed form after its check passed."""

    def __init__(self, shape_of, terms, gamma: float, description: str) -> None:
        self.shape_of, self.terms, self.gamma, self.description = shape_of, terms, gamma, description

    def time_s(self, size: int) -> float:
        return ring_time_s(self.shape_of(size), self.terms, gamma_s_per_byte=self.gamma)


class CostCache:
    """Collective times in seconds, cached by (op, bytes per rank); see the module docstring.

    ``exact`` evaluates every distinct size with ``predict_collective`` (no ring closed form, no
    line). ``num_evaluations`` counts ``predict_collective`` calls and ring checks.
    """

    _CHECKS = 3

    def __init__(
        self,
        *,
        topology: Any,
        calibration: Any,
        mode: str,
        world_size: int,
        dense_algorithm: str,
        sparse_algorithm: str,
        exact: bool = False,
    ) -> None:
        self.topology, self.calibration, self.mode = topology, calibration, mode
        self.world_size = world_size
        self.dense_algorithm, self.sparse_algorithm = dense_algorithm, sparse_algorithm
        self.exact = exact
        self._cache: dict[str, dict[int, float]] = {"dense": {}, "sparse": {}, "metadata": {}}
        self._dense, self._sparse = self._cache["dense"], self._cache["sparse"]
        self._lines: dict[str, _Line] = {}
        self._rings: dict[str, _RingForm] = {}
        self._methods: dict[str, str] = {}
        self._terms: dict[str, Any] = {}  # spec op -> ring_terms under its calibration
        self.num_evaluations = 0

    def dense(self, size_bytes: int) -> float:
        """An all-reduce of ``size_bytes`` per rank (the dense bucket)."""
        t = self._dense.get(size_bytes)
        return self._get("dense", int(size_bytes)) if t is None else t

    def sparse(self, size_bytes: int) -> float:
        """An all-gather of ``size_bytes`` from every rank (the encoded sparse payload)."""
        t = self._sparse.get(size_bytes)
        return self._get("sparse", int(size_bytes)) if t is None else t

    def metadata(self, num_counts: int) -> float:
        """The count exchange: an all-gather of ``num_counts`` int64 per rank."""
        return self._get("metadata", 8 * int(num_counts))

    def methods(self) -> dict[str, str]:
        """How each op costed so far was costed (``exact``, ``ring closed form (...)``, ``line``,
        ``line (broken: exact)``, ``single rank``)."""
        out = dict(self._methods)
        for op, line in self._lines.items():
            if line.broken:
                out[op] = "line (broken: exact)"
        return out

    # -- internals ------------------------------------------------------------------------------

    def _spec(self, op: str, size: int) -> CollectiveSpec:
        p = self.world_size
        if op == "dense":
            return CollectiveSpec(op="all_reduce", algorithm=self.dense_algorithm, size_bytes=size)
        if op == "sparse":
            return CollectiveSpec(
                op="sparse_all_gather",
                algorithm=self.sparse_algorithm,
                size_bytes=size,
                sizes_bytes=(size,) * p,
            )
        # the count exchange: every rank contributes ``size`` bytes of int64 counts
        return CollectiveSpec(op="all_gather", algorithm="ring", size_bytes=size * p)

    def _predict(self, op: str, size: int) -> float:
        self.num_evaluations += 1
        spec = self._spec(op, size)
        return float(
            predict_collective(spec, self.topology, calibration=self.calibration, mode=self.mode).time_s
        )

    def _get(self, op: str, size: int) -> float:
        t = self._cache[op].get(size)
        if t is not None:
            return t
        if self.world_size == 1:
            self._methods[op] = "single rank"
            t = 0.0
        elif self.exact:
            self._methods[op] = "exact"
            t = self._predict(op, size)
        else:
            t = self._shortcut(op, size)
        self._cache[op][size] = t
        return t

    def _shortcut(self, op: str, size: int) -> float:
        ring = self._rings.get(op)
        if ring is not None:
            return ring.time_s(size)
        if op not in self._methods and size > 0 and self._needs_flow(op, size):
            ring = self._try_ring(op, size)
            if ring is not None:
                self._rings[op] = ring
                self._methods[op] = ring.description
                return ring.time_s(size)
        self._methods.setdefault(op, "line")
        line = self._lines.setdefault(op, _Line(self._CHECKS))
        if line.covers(size):
            return line.value(size)
        t = self._predict(op, size)
        line.add(size, t)
        return t

    def _needs_flow(self, op: str, size: int) -> bool:
        if self.mode == "analytic":
            return False
        spec = self._spec(op, size)
        if spec.algorithm == "ideal":
            return False
        cal = (self.calibration or Calibration()).for_op(spec.op)
        return self.mode == "flow" or not closed_form_exact(spec, self.topology, cal)

    def _ring_shapes(self, op: str):
        """size -> RingShape of ``op``'s ring, in O(1) (no spec of p payload sizes per size)."""
        p = self.world_size
        if op == "dense":
            return lambda n: RingShape(steps=2 * (p - 1), reduce_steps=p - 1, chunk_bytes=n / p)
        if op == "sparse":
            return lambda n: RingShape(steps=p - 1, reduce_steps=0, chunk_bytes=float(n))
        return lambda n: RingShape(steps=p - 1, reduce_steps=0, chunk_bytes=n * p / p)

    def _try_ring(self, op: str, size: int) -> _RingForm | None:
        p = self.world_size
        spec = self._spec(op, size)
        if ring_shape(spec, p) is None:
            return None
        cal = (self.calibration or Calibration()).for_op(spec.op)  # the op's own bandwidth factor
        terms = self._terms.get(spec.op)
        if terms is None:
            terms = self._terms[spec.op] = ring_terms(self.topology, cal)
        self.num_evaluations += 1
        check = check_ring(spec, self.topology, cal, terms=terms)
        if not check.ok:
            return None

        shape_of = self._ring_shapes(op)
        assert shape_of(size) == ring_shape(spec, p)
        rel = abs(check.flow_s - check.closed_s) / max(check.flow_s, math.ulp(1.0))
        return _RingForm(
            shape_of,
            terms,
            cal.gamma_s_per_byte,
            f"ring closed form (checked against flow: {check.steps_run} of {check.steps} steps, "
            f"{check.num_messages} messages, rel. diff {rel:.1e})",
        )
