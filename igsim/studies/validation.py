"""Simulator vs real network: fit a calibration from testbed measurements, predict, report the error.

Input: the measurement file ``igrt validate`` writes (JSON, layout below). Every case is labelled
``calibration`` or ``validation``; the two sets must not share a case (same op and sizes), and the
fit reads only calibration cases. Predictions come from :func:`igsim.collectives.gloo.predict_gloo` (gloo's real
schedules on igsim's flow network) on the testbed's topology (:func:`testbed_topology`).

The fit (all times are per-case medians):

1. ``alpha_s`` (per message, every link class): the median over small calibration cases
   (<= ``small_max_bytes``) of the alpha that makes each case's prediction equal its measurement.
   With ``split_alpha`` (what :func:`fit_testbed`, so ``igsim calibrate`` and ``igsim
   validate-report``, fit) the ring collectives' alpha is the median over the small ring cases
   alone and p2p and broadcast get theirs (``message_alpha_s``) from the small p2p cases: on the
   testbed a ring hop, which waits for the previous hop's arrival before it sends, costs 1.1-4x a
   p2p message (0.7-1.8 against 0.1-0.6 ms on the 20 committed step sets' own cases). The saved
   calibration carries it as ``op_alpha_s`` (:meth:`igsim.net.calibration.Calibration.for_op`).
2. ``duplex_factor``: effective bandwidth / nominal for links whose reverse direction carries data
   too (ring collectives: every rank sends and receives at once), by least squares on the relative
   error of large (>= ``large_min_bytes``) duplex calibration cases.
3. ``simplex_factor``: the same from large one-way cases (p2p); broadcast uses it. Without such
   cases it equals the duplex factor.

4. ``downstream_share`` (:mod:`igsim.net.calibration`): from the large calibration cases whose
   prediction depends on it (the two-level testbed's broadcast), which then fit nothing else;
   without such cases it stays as given (1: max-min).

Steps 1, 2 and 4 alternate until they settle, so synthetic measurements made with known values are
recovered exactly. The saved :class:`~igsim.net.calibration.Calibration` (for ``igsim simulate``) holds
``alpha_s`` and the duplex factor for every link class: data-parallel traffic is duplex.

Measurement file::

    {"testbed": {"num_ranks": 4, "rate_bytes_per_s": 12500000.0, "two_level": false,
                 "uplink_rate_bytes_per_s": null, "slow_rank": null, "slow_rate_bytes_per_s": null},
     "cases": [{"name": "all_reduce-1MiB", "op": "all_reduce", "role": "validation",
                "size_bytes": 1048576, "times_s": [0.135, ...]}, ...]}

``sparse_all_gather`` cases give ``sizes_bytes`` (one per rank) instead of ``size_bytes``. A case
may give ``cpu_ticks``: per rep, the machine's ``[stolen, idle, total]`` CPU clock ticks over it
(:func:`igrt.testbed.netbench.cpu_ticks`); the report states each case's stolen and busy shares and
flags a case with more than :data:`STEAL_FLAG_SHARE` stolen (it still counts in every figure).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import networkx as nx
from scipy import optimize

from igsim.collectives.gloo import GLOO_OPS, predict_gloo
from igsim.net.calibration import Calibration, LinkCalibration
from igsim.net.topology import Topology, star

__all__ = [
    "CALIBRATION",
    "DUPLEX_OPS",
    "VALIDATION",
    "Case",
    "Fit",
    "TestbedDescription",
    "build_report",
    "describe_alpha",
    "describe_extras",
    "fit",
    "fit_overflow",
    "fit_share",
    "fit_testbed",
    "kendall_tau",
    "load_measurements",
    "measurement_path",
    "overflow_queues",
    "pool_measurements",
    "predict_case",
    "testbed_kind",
    "testbed_topology",
]

CALIBRATION, VALIDATION = "calibration", "validation"
DUPLEX_OPS = frozenset({"all_reduce", "reduce_scatter", "all_gather", "sparse_all_gather"})
GATHER_OPS = frozenset({"all_gather", "sparse_all_gather"})
STATISTICS = ("median", "min")
DENSE_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
TARGETS = {
    "dense_min_bytes": 256 * 1024,
    "dense_mean_error": 0.05,
    "dense_worst_error": 0.10,
    "kendall_tau": 0.95,
}
# a case is flagged when more than this share of the machine's CPU time was stolen (by the
# hypervisor, /proc/stat's steal) during its reps: the ranks, their softirqs and the shaper's timers
# all wait through stolen time, so such a case times the host rather than the link. Flagged cases
# still count in every figure; the report names them and states the figures without them too.
STEAL_FLAG_SHARE = 0.05


@dataclass(frozen=True, kw_only=True)
class TestbedDescription:
    """The testbed a measurement ran on (rates in bytes per second)."""

    __test__ = False

    num_ranks: int
    rate_bytes_per_s: float
    two_level: bool = False
    uplink_rate_bytes_per_s: float | None = None
    slow_rank: int | None = None
    slow_rate_bytes_per_s: float | None = None
    ring: bool = False
    queue_s: float = 0.1  # files written before the field existed ran with 100 ms tbf queues
    # a shaper's queue held at least this many bytes (files written before the field: time only)
    queue_min_bytes: int = 0
    queues_s: Mapping[str, float] | None = None  # each link rate's queue (B/s -> s), where recorded
    # a rank's own egress (NIC) queue in bytes (0, and files written before the field: like the others)
    host_queue_bytes: int = 0
    burst_s: float = 0.0
    # the rank namespaces' net.ipv4.tcp_slow_start_after_idle (files written before the field: Linux's 1);
    # recorded, not modelled: the simulator's links are warm connections (docs/validation.md)
    slow_start_after_idle: bool = True

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, where: str) -> TestbedDescription:
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(data) - known - {"mtu"})
        if unknown:
            raise ValueError(f"{where}: unknown testbed keys {unknown} (known: {', '.join(sorted(known))})")
        try:
            return cls(**{k: v for k, v in data.items() if k in known})
        except TypeError as e:
            raise ValueError(f"{where}: testbed: {e}") from None


def testbed_kind(tb: TestbedDescription) -> str:
    """The topology's name among igrt validate's --suite testbeds: ring, two-level, hetero (one slow
    NIC) or star."""
    if tb.ring:
        return "ring"
    if tb.two_level:
        return "two-level"
    return "hetero" if tb.slow_rank is not None else "star"


def testbed_topology(tb: TestbedDescription) -> Topology:
    """The testbed as an igsim topology: ranks ``r0..`` on switch ``sw`` (class ``nic``); two-level:
    ranks below p/2 on ``br0``, the rest on ``br1``, bridges joined by one ``uplink`` link; ring:
    rank r joined to rank r+1 by a link of its own (class ``nic``; a slow rank's links are slow).
    Link latency is 0: the calibration's alpha is the whole per-message latency."""
    p, rate = tb.num_ranks, float(tb.rate_bytes_per_s)
    if tb.ring:
        g = nx.Graph()

        def bw(i: int) -> float:
            return float(tb.slow_rate_bytes_per_s) if i == tb.slow_rank else rate

        for i in range(p):
            g.add_node(f"r{i}", kind="rank")
        for i in range(p):
            j = (i + 1) % p
            g.add_edge(
                f"r{i}", f"r{j}", bandwidth_bytes_per_s=min(bw(i), bw(j)), latency_s=0.0, link_class="nic"
            )
        ranks = tuple(f"r{i}" for i in range(p))
        return Topology(graph=g, ranks=ranks, name=f"testbed-ring-{p}").validate(where="testbed")
    if not tb.two_level:
        overrides = {}
        if tb.slow_rank is not None:
            overrides[(f"r{tb.slow_rank}", "sw")] = {"bandwidth_bytes_per_s": float(tb.slow_rate_bytes_per_s)}
        return star(num_ranks=p, bandwidth_bytes_per_s=rate, latency_s=0.0, link_overrides=overrides or None)
    g = nx.Graph()
    for br in ("br0", "br1"):
        g.add_node(br, kind="switch")
    uplink = float(tb.uplink_rate_bytes_per_s or rate)
    g.add_edge("br0", "br1", bandwidth_bytes_per_s=uplink, latency_s=0.0, link_class="uplink")
    ranks = [f"r{i}" for i in range(p)]
    for i, r in enumerate(ranks):
        g.add_node(r, kind="rank")
        bw = float(tb.slow_rate_bytes_per_s) if i == tb.slow_rank else rate
        g.add_edge(
            r, "br0" if i < p // 2 else "br1", bandwidth_bytes_per_s=bw, latency_s=0.0, link_class="nic"
        )
    return Topology(graph=g, ranks=tuple(ranks), name=f"testbed-two-level-{p}").validate(where="testbed")


@dataclass(frozen=True, kw_only=True)
class Case:
    """One measured case: what ran, in which role, and its per-rep times (seconds)."""

    name: str
    op: str
    role: str
    times_s: tuple[float, ...]
    size_bytes: int = 0
    sizes_bytes: tuple[int, ...] = ()
    # per rep, the machine's CPU ticks over it: (stolen, idle, total) (igrt.testbed.netbench.cpu_ticks);
    # empty in measurements made before it was recorded
    cpu_ticks: tuple[tuple[int, int, int], ...] = ()

    def __post_init__(self) -> None:
        if self.op not in GLOO_OPS:
            raise ValueError(f"case {self.name!r}: op {self.op!r} is not one of {', '.join(GLOO_OPS)}")
        if self.role not in (CALIBRATION, VALIDATION):
            raise ValueError(
                f"case {self.name!r}: role {self.role!r} is not {CALIBRATION!r} or {VALIDATION!r}"
            )
        if not self.times_s or any(not (math.isfinite(t) and t >= 0) for t in self.times_s):
            raise ValueError(f"case {self.name!r}: times_s must be a non-empty list of times >= 0")

        if self.cpu_ticks and (
            len(self.cpu_ticks) != len(self.times_s)
            or any(len(t) != 3 or min(t) < 0 or t[0] + t[1] > t[2] for t in self.cpu_ticks)
        ):
            raise ValueError(
                f"case {self.name!r}: cpu_ticks must hold one [stolen, idle, total] of ticks >= 0 per rep "
                "(stolen + idle <= total)"
            )

    @property
    def median_s(self) -> float:
        return float(statistics.median(self.times_s))

    def cpu_share(self) -> tuple[float, float]:
        """(stolen, busy) share of the machine's CPU time over all reps; NaN, NaN when not recorded
        or no tick passed."""
        total = sum(t[2] for t in self.cpu_ticks)
        if not total:
            return math.nan, math.nan
        return sum(t[0] for t in self.cpu_ticks) / total, 1.0 - sum(t[1] for t in self.cpu_ticks) / total

    def time_s(self, statistic: str = "median") -> float:
        """The median or the minimum of the reps (seconds)."""
        return float(min(self.times_s)) if statistic == "min" else self.median_s

    @property
    def bytes(self) -> int:
        """The size that decides small vs large: n, or the largest per-rank payload (sparse)."""
        return int(max(self.sizes_bytes)) if self.sizes_bytes else int(self.size_bytes)

    @property
    def key(self) -> tuple:
        return (self.op, int(self.size_bytes), tuple(int(s) for s in self.sizes_bytes))


def measurement_path(run: str | Path) -> Path:
    """The measurement file of ``run``: an ``igrt validate`` folder (its ``measurements.json``) or
    the file itself. ValueError names what is missing."""
    p = Path(run)
    if p.is_dir():
        p = p / "measurements.json"
        if not p.is_file():
            raise ValueError(f"{run}: a folder without measurements.json (not an igrt validate output)")
    elif not p.is_file():
        raise ValueError(f"{run}: no such run folder or measurement file")
    return p


def load_measurements(path: str | Path) -> tuple[TestbedDescription, list[Case], dict[str, Any]]:
    """Read a measurement file: (testbed, cases, the raw JSON). ValueError names the file."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: no such measurement file") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict) or "testbed" not in data or "cases" not in data:
        raise ValueError(f"{path}: a measurement file needs 'testbed' and 'cases'")
    tb = TestbedDescription.from_dict(data["testbed"], where=str(path))
    cases = [_case(c, where=f"{path}: case {i}") for i, c in enumerate(data["cases"])]
    check_disjoint(cases)
    return tb, cases, data


# the testbed fields a pooled fit needs equal: everything that shapes a prediction or the network
_POOL_KEYS = ("num_ranks", "rate_bytes_per_s", "two_level", "uplink_rate_bytes_per_s", "slow_rank",
              "slow_rate_bytes_per_s", "ring", "queue_s", "queue_min_bytes", "host_queue_bytes", "burst_s")  # fmt: skip


def pool_measurements(paths: Sequence[str | Path]) -> tuple[TestbedDescription, list[Case], list[dict[str, Any]]]:
    """Read several measurement files of one testbed as one set of cases: (testbed, cases, the raw
    JSON of each). With more than one file each case's name gets its file's index (``"1:p2p-64B"``),
    so a fit sees every run's measurement of a case as a case of its own. ValueError when the files
    describe different testbeds (names the first differing field)."""
    if not paths:
        raise ValueError("no measurement file to read")
    loaded = [load_measurements(p) for p in paths]
    tb0 = loaded[0][0]
    for p, (tb, _, _) in zip(paths[1:], loaded[1:]):
        for k in _POOL_KEYS:
            if getattr(tb, k) != getattr(tb0, k):
                raise ValueError(
                    f"{p}: another testbed than {paths[0]} ({k} {getattr(tb, k)!r} vs {getattr(tb0, k)!r}); "
                    "a pooled fit needs one testbed"
                )
    if len(loaded) == 1:
        return tb0, loaded[0][1], [loaded[0][2]]
    cases = [replace(c, name=f"{i}:{c.name}") for i, (_, cs, _) in enumerate(loaded) for c in cs]
    return tb0, cases, [raw for _, _, raw in loaded]


def _case(c: Mapping[str, Any], *, where: str) -> Case:
    try:
        return Case(
            name=str(c["name"]),
            op=str(c["op"]),
            role=str(c["role"]),
            times_s=tuple(float(t) for t in c["times_s"]),
            size_bytes=int(c.get("size_bytes", 0)),
            sizes_bytes=tuple(int(s) for s in c.get("sizes_bytes", ())),
            cpu_ticks=tuple(tuple(int(x) for x in t) for t in c.get("cpu_ticks", ())),
        )
    except KeyError as e:
        raise ValueError(f"{where}: missing key {e}") from None


def check_disjoint(cases: Iterable[Case]) -> None:
    """ValueError if a calibration case and a validation case are the same measurement."""
    cases = list(cases)
    cal = {c.key: c.name for c in cases if c.role == CALIBRATION}
    both = [(cal[c.key], c.name) for c in cases if c.role == VALIDATION and c.key in cal]
    if both:
        raise ValueError(f"calibration and validation cases overlap: {both}")


# -- prediction and fitting --------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Fit:
    """Fitted per-message overhead and effective-bandwidth factors (see the module docstring).

    ``gather_factor``: the all-gather family's own duplex factor (all-gather, sparse all-gather),
    fitted from the large all-gather calibration cases with ``per_op=True``; None: the all-reduce
    family's ``duplex_factor`` serves every duplex op (the one-factor model). ``overflow_queues``:
    link class -> the queue in front of such a link (bytes; :func:`overflow_queues` of the testbed),
    and ``overflow_factor`` what a message that overflows one costs (:mod:`igsim.net.network`)."""

    alpha_s: float
    duplex_factor: float
    simplex_factor: float
    gather_factor: float | None = None
    #: the per-message alpha of the ops that are not ring collectives (p2p, broadcast), fitted from
    #: the small p2p cases with ``split_alpha``; None: ``alpha_s`` serves every op
    message_alpha_s: float | None = None
    downstream_share: float = 1.0
    overflow_factor: float = 1.0
    overflow_queues: Mapping[str, float] = field(default_factory=dict)
    alpha_cases: Mapping[str, float] = field(default_factory=dict)
    rounds: int = 0

    def factor(self, op: str) -> float:
        """The effective-bandwidth factor of ``op``'s traffic."""
        if op not in DUPLEX_OPS:
            return self.simplex_factor
        if op in GATHER_OPS and self.gather_factor is not None:
            return self.gather_factor
        return self.duplex_factor

    def alpha(self, op: str) -> float:
        """The per-message alpha of ``op``: ``alpha_s`` for the ring collectives (every hop waits
        for the previous one's arrival), :attr:`message_alpha_s` (where fitted) for the others."""
        if op in DUPLEX_OPS or self.message_alpha_s is None:
            return self.alpha_s
        return self.message_alpha_s

    def link_classes(self, topology: Topology, factor: float) -> dict[str, LinkCalibration]:
        """Every link class of ``topology`` at ``factor`` with this fit's alpha (and, where it
        has one, its queue and the overflow factor)."""
        classes = sorted({d["link_class"] for _, _, d in topology.graph.edges(data=True)})
        out = {}
        for c in classes:
            q = self.overflow_queues.get(c)
            out[c] = LinkCalibration(alpha_s=self.alpha_s, effective_bandwidth_factor=factor, queue_bytes=q,
                                     overflow_factor=self.overflow_factor if q is not None else 1.0)  # fmt: skip
        return out

    def calibration(self, topology: Topology, *, source: str = "") -> Calibration:
        """An igsim Calibration: alpha and the all-reduce family's duplex factor on every link class
        of ``topology`` (data-parallel traffic is duplex); the other ops' factors as
        ``op_bandwidth_factors`` relative to it. :meth:`from_calibration` reads it back."""
        link = LinkCalibration(alpha_s=self.alpha_s, effective_bandwidth_factor=self.duplex_factor)
        ops = {
            op: self.factor(op) / self.duplex_factor
            for op in GLOO_OPS
            if op not in ("all_reduce", "reduce_scatter")
        }
        alphas = {op: self.alpha(op) for op in GLOO_OPS if op not in DUPLEX_OPS} if self.message_alpha_s is not None else {}
        return Calibration(link_classes=self.link_classes(topology, self.duplex_factor), default=link,
                           source=source, op_bandwidth_factors=ops, op_alpha_s=alphas,
                           downstream_share=self.downstream_share)  # fmt: skip

    @classmethod
    def from_calibration(cls, calibration: Calibration) -> Fit:
        """The fit a calibration written by :meth:`calibration` holds (its default link class, and
        the queues of the classes that have one). ValueError when the calibration's link classes
        disagree otherwise (not one fit)."""
        link = calibration.default
        plain = link.to_dict()
        queues: dict[str, float] = {}
        overflow: set[float] = set()
        for name, c in calibration.link_classes.items():
            d = c.to_dict()
            if c.queue_bytes is not None:
                queues[name] = c.queue_bytes
                overflow.add(c.overflow_factor)
                d = {k: v for k, v in d.items() if k not in ("queue_bytes", "overflow_factor")}
            if d != plain:
                raise ValueError(
                    "calibration: link classes differ; a testbed fit has one alpha and factor for all"
                )
        if len(overflow) > 1:
            raise ValueError("calibration: link classes differ in overflow_factor; a testbed fit has one")
        base = link.effective_bandwidth_factor
        ops = calibration.op_bandwidth_factors
        gather = ops.get("all_gather")
        return cls(
            alpha_s=link.alpha_s,
            duplex_factor=base,
            simplex_factor=base * ops.get("p2p", 1.0),
            gather_factor=None if gather is None or gather == 1.0 else base * gather,
            message_alpha_s=calibration.op_alpha_s.get("p2p"),
            downstream_share=calibration.downstream_share,
            overflow_factor=overflow.pop() if overflow else 1.0,
            overflow_queues=queues,
        )


def describe_alpha(alpha_s: float, message_alpha_s: float | None = None) -> str:
    """The fit's alpha(s) for a one-line summary: one per message, or the ring collectives' per hop
    and p2p / broadcast's per message (``split_alpha``)."""
    if message_alpha_s is None:
        return f"alpha {alpha_s * 1e3:.3f} ms/message"
    return f"alpha {alpha_s * 1e3:.3f} ms/ring hop, {message_alpha_s * 1e3:.3f} ms/p2p or broadcast message"


def describe_extras(downstream_share: float = 1.0, overflow_factor: float = 1.0,
                    overflow_queues: Mapping[str, float] | None = None) -> str:  # fmt: skip
    """The fit's two-level terms for a one-line summary ("" when neither applies)."""
    parts = []
    if downstream_share != 1.0:
        parts.append(f"downstream share {downstream_share:.3f}")
    for cls, q in sorted((overflow_queues or {}).items()):
        parts.append(f"a message overflowing the {cls}'s {q / 1e3:.0f} kB queue x{overflow_factor:.4f}")
    return "".join(f"; {p}" for p in parts)


def overflow_queues(tb: TestbedDescription) -> dict[str, float]:
    """Link class -> bytes of the queue in front of a link that a message meets after a faster one
    (:mod:`igsim.net.network`): the two-level testbed's uplink, when it is slower than the rank
    links (its tbf queue: ``queues_s`` at its rate where recorded, else ``queue_s`` of traffic and
    at least ``queue_min_bytes``). Empty for the other testbeds: a star's or a ring's links all run
    at one rate, and on the slow-NIC testbed, whose switch port into the slow NIC is a step-down
    too, the factor fitted there is 0.96-1.00 and improves no prediction (docs/validation.md)."""
    if not tb.two_level:
        return {}
    rate = float(tb.uplink_rate_bytes_per_s or tb.rate_bytes_per_s)
    if rate >= float(tb.rate_bytes_per_s):
        return {}
    recorded = [float(q) for k, q in (tb.queues_s or {}).items() if math.isclose(float(k), rate, rel_tol=1e-6)]
    return {"uplink": recorded[0] * rate if recorded else max(tb.queue_s * rate, float(tb.queue_min_bytes))}


def predict_case(case: Case, topology: Topology, fit_: Fit, *, burst_s: float = 0.0) -> float:
    """Seconds gloo takes for ``case`` on ``topology`` under ``fit_``: its saved calibration
    (:meth:`Fit.calibration`), so the op's factor (:meth:`Fit.factor`) reaches the case the way it
    reaches a replayed step (:meth:`igsim.net.calibration.Calibration.for_op`); ``burst_s`` is the
    shapers' token-bucket burst (see :func:`igsim.collectives.gloo.predict_gloo`)."""
    return predict_gloo(
        case.op,
        topology=topology,
        calibration=fit_.calibration(topology),
        size_bytes=case.size_bytes,
        sizes_bytes=case.sizes_bytes,
        burst_s=burst_s,
    )


def fit(
    cases: Sequence[Case],
    topology: Topology,
    *,
    small_max_bytes: int = 16 * 1024,
    large_min_bytes: int = 512 * 1024,
    max_rounds: int = 30,
    rtol: float = 1e-9,
    burst_s: float = 0.0,
    per_op: bool = True,
    statistic: str = "median",
    downstream_share: float = 1.0,
    overflow_queues: Mapping[str, float] | None = None,
    split_alpha: bool = False,
) -> Fit:
    """Fit alpha and the bandwidth factors from the *calibration* cases (validation cases are
    ignored), matching each case's ``statistic`` of its reps ("median" or "min"). ``per_op``: the
    all-gather family gets its own factor (from the large all-gather cases; the all-reduce factor
    then comes from the other large duplex cases). The large calibration cases whose prediction
    depends on :attr:`~igsim.net.calibration.Calibration.downstream_share` (the two-level testbed's
    broadcast: a flow across the uplink shares the root's NIC with one that stays local) fit that
    share instead of a bandwidth factor; without such cases it stays ``downstream_share``.
    ``overflow_queues`` (link class -> queue bytes, :func:`overflow_queues` of the testbed): every
    large calibration case with a message that overflows one of them also fits the overflow factor
    (least squares over those cases); without it no message overflows. ``split_alpha``: the ring
    collectives' alpha (``alpha_s``) is the median over the small ring cases only, and p2p and
    broadcast get their own (``message_alpha_s``, from the small p2p cases); without it one alpha,
    the median over every small case, serves all. ValueError when there is no small or no large
    duplex calibration case."""
    _check_statistic(statistic)
    cal = [c for c in cases if c.role == CALIBRATION]
    small = [c for c in cal if c.bytes <= small_max_bytes]
    large = [c for c in cal if c.bytes >= large_min_bytes]
    share_cases = [c for c in large if _depends_on_share(c, topology, burst_s)]
    large = [c for c in large if c not in share_cases]
    large_duplex = [c for c in large if c.op in DUPLEX_OPS]
    large_simplex = [c for c in large if c.op not in DUPLEX_OPS]
    if not small:
        raise ValueError(f"calibration: no case of <= {small_max_bytes} bytes to fit alpha from")
    if not large_duplex:
        raise ValueError(
            f"calibration: no duplex collective of >= {large_min_bytes} bytes to fit bandwidth from"
        )
    large_gather = [c for c in large_duplex if c.op in GATHER_OPS] if per_op else []
    large_reduce = [c for c in large_duplex if c.op not in GATHER_OPS] if large_gather else large_duplex
    if not large_reduce:  # only gathers measured: one factor for every duplex op
        large_reduce, large_gather = large_duplex, []
    current = Fit(alpha_s=0.0, duplex_factor=1.0, simplex_factor=1.0, gather_factor=1.0 if large_gather else None,
                  downstream_share=downstream_share, overflow_queues=dict(overflow_queues or {}))  # fmt: skip
    overflow_cases = [c for c in cal if c.bytes >= large_min_bytes and _overflows(c, topology, current, burst_s)]
    per_case: dict[str, float] = {}

    def factor(sel: Sequence[Case], which: str, base: Fit) -> float:
        return _fit_factor(sel, topology, base, which, burst_s, statistic)

    ring_small = [c for c in small if c.op in DUPLEX_OPS]
    split = split_alpha and bool(ring_small) and len(ring_small) < len(small)

    def which_alpha(c: Case) -> str:
        return "message_alpha_s" if split and c.op not in DUPLEX_OPS else "alpha_s"

    for rounds in range(1, max_rounds + 1):
        per_case = {c.name: _solve_alpha(c, topology, current, burst_s, statistic, which_alpha(c)) for c in small}
        if split:
            ring = statistics.median(per_case[c.name] for c in ring_small)
            message = statistics.median(per_case[c.name] for c in small if c not in ring_small)
            base = replace(current, alpha_s=float(ring), message_alpha_s=float(message))
        else:
            base = replace(current, alpha_s=float(statistics.median(per_case.values())))
        duplex = factor(large_reduce, "duplex_factor", base)
        gather = factor(large_gather, "gather_factor", base) if large_gather else None
        simplex = factor(large_simplex, "simplex_factor", base) if large_simplex else duplex
        new = replace(base, duplex_factor=duplex, simplex_factor=simplex, gather_factor=gather,
                      alpha_cases=per_case, rounds=rounds)  # fmt: skip
        if share_cases:
            new = replace(new, downstream_share=fit_share(share_cases, topology, new, burst_s, statistic))
        if overflow_cases:
            new = replace(new, overflow_factor=fit_overflow(overflow_cases, topology, new, burst_s, statistic))
        keys = ("alpha_s", "message_alpha_s", "duplex_factor", "simplex_factor", "gather_factor", "downstream_share", "overflow_factor")
        settled = all(
            abs((getattr(new, k) or 0) - (getattr(current, k) or 0))
            <= rtol * max(abs(getattr(new, k) or 0), 1e-12)
            for k in keys
        )
        current = new
        if settled:
            break
    return current


def fit_testbed(
    cases: Sequence[Case], testbed: TestbedDescription, *, overflow: bool = True, split_alpha: bool = True, **kw: Any
) -> Fit:
    """:func:`fit` on ``testbed``'s topology with its shapers' burst and, unless ``overflow`` is
    False (the model before queue overflow), its :func:`overflow_queues`; the ring collectives'
    alpha apart from p2p's unless ``split_alpha`` is False (the model before 2026-12-07, which the
    shipped files were fitted with): what ``igsim calibrate`` and ``igsim validate-report`` fit."""
    queues = overflow_queues(testbed) if overflow else None
    return fit(cases, testbed_topology(testbed), burst_s=testbed.burst_s, overflow_queues=queues,
               split_alpha=split_alpha, **kw)  # fmt: skip


def _check_statistic(statistic: str) -> None:
    if statistic not in STATISTICS:
        raise ValueError(f"statistic {statistic!r} is not one of {', '.join(STATISTICS)}")


def _solve_alpha(
    case: Case, topology: Topology, base: Fit, burst_s: float, statistic: str, which: str = "alpha_s"
) -> float:
    """The alpha (>= 0; the Fit field ``which``) at which the prediction of ``case`` equals its
    measured ``statistic`` (0 if even alpha = 0 predicts too slow)."""
    target = case.time_s(statistic)

    def gap(alpha: float) -> float:
        return predict_case(case, topology, replace(base, **{which: alpha}), burst_s=burst_s) - target

    if gap(0.0) >= 0:
        return 0.0
    hi = max(target, 1e-9)
    while gap(hi) < 0:
        hi *= 2
    return float(optimize.brentq(gap, 0.0, hi, xtol=1e-15, rtol=1e-12))


def _depends_on_share(case: Case, topology: Topology, burst_s: float) -> bool:
    """Whether ``case``'s prediction moves with the downstream share (some flow of its schedule
    shares a link with one that a slower link limits further on)."""
    return _moves_with(case, topology, Fit(alpha_s=0.0, duplex_factor=1.0, simplex_factor=1.0), "downstream_share",
                       burst_s)  # fmt: skip


def _overflows(case: Case, topology: Topology, base: Fit, burst_s: float) -> bool:
    """Whether a message of ``case``'s schedule overflows one of ``base``'s queues (its prediction
    moves with the overflow factor)."""
    if not base.overflow_queues:
        return False
    ideal = Fit(alpha_s=0.0, duplex_factor=1.0, simplex_factor=1.0, overflow_queues=base.overflow_queues)
    return _moves_with(case, topology, ideal, "overflow_factor", burst_s)


def _moves_with(case: Case, topology: Topology, base: Fit, which: str, burst_s: float) -> bool:
    """Whether ``case``'s prediction under ``base`` changes when the Fit field ``which`` (1 in
    ``base``: no effect) is halved."""
    one = predict_case(case, topology, base, burst_s=burst_s)
    half = predict_case(case, topology, replace(base, **{which: 0.5}), burst_s=burst_s)
    return abs(half - one) > 1e-6 * max(one, 1e-12)


def fit_overflow(cases: Sequence[Case], topology: Topology, base: Fit, burst_s: float, statistic: str) -> float:
    """Least squares on relative error over ``cases`` for the overflow factor, in [0.2, 1]."""
    return _fit_up_to_one(cases, topology, base, "overflow_factor", 0.2, burst_s, statistic)


def fit_share(cases: Sequence[Case], topology: Topology, base: Fit, burst_s: float, statistic: str) -> float:
    """Least squares on relative error over ``cases`` for the downstream share, in [0.05, 1]."""
    return _fit_up_to_one(cases, topology, base, "downstream_share", 0.05, burst_s, statistic)


def _fit_up_to_one(
    cases: Sequence[Case], topology: Topology, base: Fit, which: str, low: float, burst_s: float, statistic: str
) -> float:
    """Least squares on relative error over ``cases`` for the Fit field ``which`` in [``low``, 1]
    (1: the term has no effect)."""

    def loss(value: float) -> float:
        f = replace(base, **{which: value})
        return sum(
            ((predict_case(c, topology, f, burst_s=burst_s) - c.time_s(statistic)) / c.time_s(statistic)) ** 2
            for c in cases
        )

    res = optimize.minimize_scalar(loss, bounds=(low, 1.0), method="bounded", options={"xatol": 1e-10})
    return min((float(res.x), 1.0), key=loss)  # the bounded search never lands on its bound: try 1


def _fit_factor(
    cases: Sequence[Case], topology: Topology, base: Fit, which: str, burst_s: float, statistic: str
) -> float:
    """Least squares on relative error over ``cases`` for one bandwidth factor."""

    def loss(log_f: float) -> float:
        f = replace(base, **{which: math.exp(log_f)})
        return sum(
            ((predict_case(c, topology, f, burst_s=burst_s) - c.time_s(statistic)) / c.time_s(statistic)) ** 2
            for c in cases
        )

    res = optimize.minimize_scalar(loss, bounds=(math.log(0.05), math.log(20.0)), method="bounded",
                                   options={"xatol": 1e-12})  # fmt: skip
    return float(math.exp(res.x))


# -- report ------------------------------------------------------------------------------------


def kendall_tau(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Kendall's tau-b of two paired sequences (1: same order, -1: reversed); ties count as neither
    concordant nor discordant. ValueError for fewer than two pairs or unequal lengths; nan when one
    side is constant."""
    if len(xs) != len(ys):
        raise ValueError(f"kendall_tau: {len(xs)} and {len(ys)} values")
    if len(xs) < 2:
        raise ValueError("kendall_tau needs at least two pairs")
    conc = disc = tie_x = tie_y = 0
    for i in range(len(xs)):
        for j in range(i + 1, len(xs)):
            dx, dy = _sign(xs[i] - xs[j]), _sign(ys[i] - ys[j])
            if dx == 0 and dy == 0:
                continue
            if dx == 0:
                tie_x += 1
            elif dy == 0:
                tie_y += 1
            elif dx == dy:
                conc += 1
            else:
                disc += 1
    denom = math.sqrt((conc + disc + tie_x) * (conc + disc + tie_y))
    return (conc - disc) / denom if denom else math.nan


def _sign(v: float) -> int:
    return (v > 0) - (v < 0)


def mean_abs_pct_error(errors: Iterable[float]) -> float:
    """Mean of |relative error| (a fraction: 0.05 is 5 %)."""
    errors = [abs(e) for e in errors]
    return sum(errors) / len(errors) if errors else math.nan


def _summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    worst = max(rows, key=lambda r: abs(r["error"]))
    out = {
        "num_cases": len(rows),
        "mape": mean_abs_pct_error(r["error"] for r in rows),
        "mean_signed_error": sum(r["error"] for r in rows) / len(rows),
        "worst_case": worst["name"],
        "worst_error": worst["error"],
    }
    if len(rows) >= 2:
        out["kendall_tau"] = kendall_tau([r["measured_s"] for r in rows], [r["predicted_s"] for r in rows])
    return out


def build_report(
    cases: Sequence[Case],
    topology: Topology,
    fit_: Fit,
    *,
    burst_s: float = 0.0,
    predictor: Callable[[Case], float] | None = None,
    statistic: str = "median",
    roles: Sequence[str] = (VALIDATION,),
) -> dict[str, Any]:
    """Per case: role, median, spread, prediction, error against the ``statistic`` of its reps;
    over the cases of ``roles`` (the validation cases; both roles when the fit came from another
    run) per family (op; all sizes in ``families``, those >= 256 KiB in ``families_large``), for the
    dense target group (``dense_large``) and for every collective >= 256 KiB, sparse gathers
    included (``collectives_large``, the target): MAPE, worst case, Kendall tau of the
    cases ranked by time. JSON-ready."""
    _check_statistic(statistic)
    predictor = predictor or (lambda c: predict_case(c, topology, fit_, burst_s=burst_s))
    rows = []
    for c in cases:
        pred = predictor(c)
        med = c.median_s
        ref = c.time_s(statistic)
        steal, busy = c.cpu_share()
        rows.append(
            {
                "name": c.name,
                "op": c.op,
                "role": c.role,
                "size_bytes": c.size_bytes,
                "sizes_bytes": list(c.sizes_bytes),
                "reps": len(c.times_s),
                "measured_median_s": med,
                "measured_min_s": min(c.times_s),
                "measured_max_s": max(c.times_s),
                "spread": (max(c.times_s) - min(c.times_s)) / med if med else math.nan,
                "measured_s": ref,
                "predicted_s": pred,
                "error": (pred - ref) / ref if ref else math.nan,
                "cpu_steal_share": steal,
                "cpu_busy_share": busy,
                "steal_flag": bool(steal > STEAL_FLAG_SHARE),  # NaN (not recorded): not flagged
            }
        )
    val = [r for r in rows if r["role"] in roles]
    large = [r for r, c in zip(rows, cases) if r["role"] in roles and c.bytes >= TARGETS["dense_min_bytes"]]
    families = {op: _summary(sel) for op in GLOO_OPS if (sel := [r for r in val if r["op"] == op])}
    families_large = {op: _summary(sel) for op in GLOO_OPS if (sel := [r for r in large if r["op"] == op])}
    dense = [r for r in large if r["op"] in DENSE_OPS]
    report: dict[str, Any] = {
        "fit": {
            "alpha_s": fit_.alpha_s,
            "message_alpha_s": fit_.message_alpha_s,
            "duplex_factor": fit_.duplex_factor,
            "simplex_factor": fit_.simplex_factor,
            "gather_factor": fit_.gather_factor,
            "downstream_share": fit_.downstream_share,
            "overflow_factor": fit_.overflow_factor,
            "overflow_queues": dict(fit_.overflow_queues),
            "alpha_cases": dict(fit_.alpha_cases),
            "rounds": fit_.rounds,
        },
        "cases": rows,
        "families": families,
        "families_large": families_large,
        "targets": dict(TARGETS),
        "statistic": statistic,
        "roles": list(roles),
    }
    collectives = [r for r in large if r["op"] != "p2p"]
    for key, sel in (("dense_large", dense), ("collectives_large", collectives)):
        if sel:
            d = _summary(sel)
            d["meets_mean"] = d["mape"] <= TARGETS["dense_mean_error"]
            d["meets_worst"] = abs(d["worst_error"]) <= TARGETS["dense_worst_error"]
            flagged = [r for r in sel if r["steal_flag"]]
            d["steal_flagged"] = [r["name"] for r in flagged]
            if flagged and len(flagged) < len(sel):
                rest = _summary([r for r in sel if not r["steal_flag"]])
                d["without_steal_flagged"] = {k: rest[k] for k in ("num_cases", "mape", "worst_case", "worst_error")}
            report[key] = d
    if len(val) >= 2:
        tau = kendall_tau([r["measured_s"] for r in val], [r["predicted_s"] for r in val])
        report["validation_kendall_tau"] = tau
    return report
