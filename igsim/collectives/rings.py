"""Rings on any topology: a contention-aware closed form, when it is exact, and its check.

In a ring schedule (all-reduce, all-gather, reduce-scatter, equal-payload or padded sparse
all-gather) rank k sends to rank k+1 in every step, one message at a time: step t's message leaves
once k's own step t-1 message and k-1's have arrived. Over the p *ring flows* k -> k+1 (rank
order) of a topology, with ``alpha_k`` the path latency plus the calibration's α and ``n_l`` the
number of ring flows crossing directed link ``l``:

- ``α* = max_k alpha_k`` (the worst path latency),
- ``B* = min_l capacity_l / n_l`` (the tightest link, shared by its ring flows).

S steps of ``c`` bytes, the first R of them reduced at γ s/byte, then take (:func:`ring_time_s`)

    T = S (α* + c / B*) + γ c (min(S - 1, R) + [S <= R])

which is the uniform-star closed form (:func:`igsim.collectives.analytic.ring_all_reduce_s` and
its kin) with α* and B*.

**Upper bound, any topology.** A rank has at most one message in flight, so at most ``n_l`` ring
flows cross link l at any time, and max-min sharing gives every flow at least the fair share of
its tightest link, ``>= B*``. Each message therefore takes at most α* + c/B*, and the step recursion
of the schedule bounds the flow-mode time by T.

**Exact** (:attr:`RingTerms.exact_without_reduction`): some link ``L`` with ``capacity_L / n_L =
B*`` is crossed only by flows whose latency is α*. Those flows start their bytes at the same
instant, each gets at least B* and together at most ``capacity_L``, so each gets exactly B* and
takes exactly α* + c/B*; they end together, so (their neighbours never being later) they start the
next step together, and by induction every step takes exactly α* + c/B*: T is the flow-mode time
when nothing is reduced (γ = 0 or R = 0). With reductions the chain through neighbours counts, and
T is exact when *every* ring flow is such a flow (:attr:`RingTerms.exact`; all ranks then move in
lock-step, as on a uniform star). On a leaf-spine in rank order only the leaf-boundary hops cross
the spines and the rank links bound every flow; with ranks interleaved across leaves every hop
shares an oversubscribed uplink.

Before the step engine trusts the closed form for a (topology, op) it runs the op's ring in flow
mode once (:func:`check_ring`) and requires both the certificate and agreement to 1e-9; otherwise it
falls back to the flow mode. The flow run is capped at ``max_messages`` (the first
``max_messages // p`` steps of the ring, at least 2; the induction above carries the rest), so
the check costs O(p), not the O(p²) messages of a whole ring.

>>> from igsim.net.topology import leaf_spine
>>> topo = leaf_spine(num_ranks=16, ranks_per_leaf=4, num_spines=2, bandwidth_bytes_per_s=1e9,
...                   latency_s=1e-6, oversubscription=4.0)
>>> terms = ring_terms(topo)
>>> terms.alpha_s, terms.bandwidth_bytes_per_s, terms.exact_without_reduction
(4e-06, 500000000.0, True)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import simpy

from igsim.collectives.execute import execute_schedule
from igsim.collectives.schedules import ring_schedule
from igsim.net.calibration import Calibration
from igsim.net.network import Network
from igsim.net.topology import Topology

if TYPE_CHECKING:
    from igsim.collectives.predict import CollectiveSpec

__all__ = ["RingCheck", "RingShape", "RingTerms", "check_ring", "ring_shape", "ring_terms", "ring_time_s"]

_SAME = 1e-12  # relative: two latencies or fair shares this close are the same
_AGREE = 1e-9  # relative: the flow check's tolerance (the flow mode sums floats differently)


@dataclass(frozen=True, kw_only=True)
class RingTerms:
    """α* and B* of the ring flows of a topology, and whether the closed form with them is exact.

    - ``alpha_s``: the largest path latency (+ calibration α) of the ring flows.
    - ``bandwidth_bytes_per_s``: the smallest ``capacity / ring flows crossing it`` over links.
    - ``exact_without_reduction``: the closed form is the flow-mode time when nothing is reduced.
    - ``exact``: it is also the flow-mode time with reductions (every flow is critical).
    - ``bottleneck``: a link attaining B* (``(u, v)``), ``num_sharing``: its ring flows.
    """

    alpha_s: float
    bandwidth_bytes_per_s: float
    exact_without_reduction: bool
    exact: bool
    bottleneck: tuple[str, str] | None = None
    num_sharing: int = 0


@dataclass(frozen=True, kw_only=True)
class RingShape:
    """A ring schedule: ``steps`` neighbour steps of ``chunk_bytes``, the first ``reduce_steps`` reduced."""

    steps: int
    reduce_steps: int
    chunk_bytes: float


@dataclass(frozen=True, kw_only=True)
class RingCheck:
    """One flow run of a ring's first ``steps_run`` (of ``steps``) steps against the closed form."""

    closed_s: float
    flow_s: float
    steps_run: int
    steps: int
    certified: bool
    num_messages: int

    @property
    def ok(self) -> bool:
        """The certificate holds and the flow run agrees with the closed form to 1e-9."""
        return self.certified and math.isclose(self.flow_s, self.closed_s, rel_tol=_AGREE, abs_tol=1e-15)


def ring_terms(
    topology: Topology, calibration: Calibration | None = None, *, ranks: Sequence[str] | None = None
) -> RingTerms:
    """:class:`RingTerms` of the ring ``ranks[0] -> ranks[1] -> ... -> ranks[0]`` (default: the
    topology's rank order). A single rank has no flows: α* = 0, B* = inf, exact."""
    net = Network(simpy.Environment(), topology, calibration=calibration)
    names = list(topology.ranks if ranks is None else ranks)
    p = len(names)
    flows = [net.route(names[k], names[(k + 1) % p]) for k in range(p)] if p > 1 else []
    if not flows:
        return RingTerms(
            alpha_s=0.0, bandwidth_bytes_per_s=math.inf, exact_without_reduction=True, exact=True
        )
    crossing: dict[int, list[int]] = {}
    for k, (links, _) in enumerate(flows):
        for li in links:
            crossing.setdefault(li, []).append(k)
    alphas = [alpha for _, alpha in flows]
    alpha_max = max(alphas)
    share = {li: net.link_capacity_bytes_per_s(li) / len(ks) for li, ks in crossing.items()}
    b_min = min(share.values(), default=math.inf)
    critical: set[int] = set()
    bottleneck, sharing = None, 0
    for li, ks in crossing.items():
        if share[li] > b_min * (1 + _SAME):
            continue
        if bottleneck is None:
            bottleneck, sharing = net.link_name(li), len(ks)
        if all(alphas[k] >= alpha_max * (1 - _SAME) for k in ks):
            critical.update(ks)
    return RingTerms(
        alpha_s=alpha_max,
        bandwidth_bytes_per_s=b_min,
        exact_without_reduction=bool(critical),
        exact=len(critical) == p,
        bottleneck=bottleneck,
        num_sharing=sharing,
    )


def ring_shape(spec: CollectiveSpec, p: int) -> RingShape | None:
    """The ring of ``spec`` on ``p`` ranks, or None when it is no ring of equal messages
    (another algorithm, or a ring all-gatherv of unequal payloads)."""
    op, alg, n = spec.op, spec.algorithm, spec.size_bytes
    if op == "sparse_all_gather":
        sizes = spec.sizes_bytes
        if alg == "padded" or (alg == "ring" and min(sizes) == max(sizes)):
            return RingShape(steps=p - 1, reduce_steps=0, chunk_bytes=float(max(sizes)))
        return None
    if alg != "ring":
        return None
    steps, reduced = {"all_reduce": (2 * (p - 1), p - 1), "all_gather": (p - 1, 0),
                      "reduce_scatter": (p - 1, p - 1)}.get(op, (None, None))  # fmt: skip
    if steps is None:
        return None
    return RingShape(steps=steps, reduce_steps=reduced, chunk_bytes=n / p)


def ring_time_s(shape: RingShape, terms: RingTerms, *, gamma_s_per_byte: float = 0.0) -> float:
    """``S (α* + c / B*) + γ c (min(S - 1, R) + [S <= R])`` (see the module docstring); 0 for no steps."""
    s, r, c = shape.steps, shape.reduce_steps, shape.chunk_bytes
    if s < 1:
        return 0.0
    reduced = min(s - 1, r) + (1 if s <= r else 0)
    return s * (terms.alpha_s + c / terms.bandwidth_bytes_per_s) + gamma_s_per_byte * c * reduced


def certified(terms: RingTerms, shape: RingShape, gamma_s_per_byte: float) -> bool:
    """Whether the certificate of :class:`RingTerms` covers ``shape`` (reductions need ``exact``)."""
    reduces = gamma_s_per_byte > 0 and shape.reduce_steps > 0 and shape.chunk_bytes > 0
    return terms.exact if reduces else terms.exact_without_reduction


def check_ring(
    spec: CollectiveSpec,
    topology: Topology,
    calibration: Calibration | None = None,
    *,
    terms: RingTerms | None = None,
    max_messages: int = 1 << 16,
) -> RingCheck:
    """Run ``spec``'s ring in flow mode on ``topology`` — its first ``max(2, max_messages // p)``
    steps — and compare with :func:`ring_time_s` of as many steps. ValueError when ``spec`` is no
    ring (:func:`ring_shape` is None)."""
    cal = calibration or Calibration()
    p = topology.num_ranks
    shape = ring_shape(spec, p)
    if shape is None:
        raise ValueError(f"collective {spec.op} {spec.algorithm!r}: not a ring of equal messages")
    terms = terms or ring_terms(topology, cal)
    run = RingShape(
        steps=min(shape.steps, max(2, max_messages // max(p, 1))),
        reduce_steps=shape.reduce_steps,
        chunk_bytes=shape.chunk_bytes,
    )
    sched = ring_schedule(p, run.chunk_bytes, steps=run.steps, reduce_steps=run.reduce_steps,
                          gamma=cal.gamma_s_per_byte)  # fmt: skip
    env = simpy.Environment()
    proc = env.process(execute_schedule(Network(env, topology, calibration=cal), sched, topology.ranks))
    env.run(proc)
    return RingCheck(
        closed_s=ring_time_s(run, terms, gamma_s_per_byte=cal.gamma_s_per_byte),
        flow_s=proc.value.time_s,
        steps_run=run.steps,
        steps=shape.steps,
        certified=certified(terms, shape, cal.gamma_s_per_byte),
        num_messages=proc.value.num_messages,
    )
