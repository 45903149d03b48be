"""Calibration: what a real network adds to the nominal alpha-beta model, per link class.

Fitted from testbed measurements (the validation tooling writes these files): per link class a
per-message overhead ``alpha_s`` (software, framing, handshakes; added once per message, on top of
the path's propagation latency) and an effective bandwidth, either as a factor of the nominal link
bandwidth (TCP/IP framing and ACKs cost a few percent) or as an absolute figure; plus the reduction
cost ``gamma_s_per_byte`` (seconds per byte a rank spends adding a received chunk into its buffer),
and optional per-operation multipliers on the effective bandwidth (``op_bandwidth_factors``, e.g.
``{"all_gather": 0.94, "p2p": 1.08}``: on the testbed gloo's all-gather ring moves fewer bytes per
second than its all-reduce ring on the same links, and one-way traffic more than either). They
apply wherever a collective is costed (:meth:`Calibration.for_op`, called by
:func:`igsim.collectives.predict.predict_collective` and :func:`igsim.collectives.gloo.simulate_gloo`:
the step engine's sparse gathers and count exchanges as much as a validation case); flows that
carry no operation use the link factors alone.

A message crossing links of several classes pays the largest ``alpha_s`` among them once (the
overhead is per message, set by the slowest transport on its way), and each link's capacity is
scaled by its own class's factor.

JSON layout (strict keys; numbers are SI units, strings with units are accepted too)::

    {"gamma_s_per_byte": 2.5e-10,
     "default": {"alpha_s": 0, "effective_bandwidth_factor": 1.0},
     "link_classes": {"nic": {"alpha_s": 3.1e-05, "effective_bandwidth_factor": 0.944}},
     "op_bandwidth_factors": {"all_gather": 0.95, "p2p": 1.08},
     "downstream_share": 0.6,
     "source": "testbed 2025-01-01, 4 ranks, 100 Mbit/s"}

``downstream_share`` (default 1: plain max-min fairness) is the share weight, against 1, of a flow
whose path holds a link slower than another of its links, on every link it shares: TCP gives less
than a max-min share to a flow that also queues behind a later, slower link (its round trip is
longer and it loses packets in two queues). Measured on the two-level testbed: the root's send
across the half-rate uplink got about 0.73 of its fair share of the root's NIC, its send to the
local child the rest, and the uplink idled meanwhile (docs/validation.md).

A link class may also give ``queue_bytes`` (the buffer in front of the link, e.g. a switch port's)
and ``overflow_factor`` (< 1): a message that crosses such a link *after a faster one* on its path
(a step-down: it arrives faster than the link drains) and is large enough to overflow the queue
loses packets there, and TCP's recovery leaves its links working for ``size / overflow_factor``
bytes' worth of time instead of ``size`` (:mod:`igsim.net.network` says when a message overflows).
Without ``queue_bytes`` (or with a factor of 1) no message pays for overflowing.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from igpolicy.config import check_keys
from igpolicy.units import parse_bandwidth, parse_time

__all__ = ["TESTBED_DEFAULT", "TESTBED_DEFAULTS", "TESTBED_DEFAULTS_NIC_125KB", "Calibration", "LinkCalibration"]

_DATA = Path(__file__).resolve().parent.parent / "data"
# The calibrations of the namespace testbed (igrt testbed: 100 Mbit/s rank links, tbf shapers), one
# per topology (igrt validate's --suite testbeds), each ``igsim calibrate`` of ``igrt validate`` runs
# of that topology; its source says which. The star's is the one taken when none is named. They were
# fitted on the testbed as it is (a rank's own NIC queue 4 MiB, igrt testbed's host_queue_bytes);
# TESTBED_DEFAULTS_NIC_125KB are those fitted on the earlier testbed whose NIC queue held 125 kB like
# every other shaper (host_queue_bytes 0 in its measurement files), kept for the runs measured on it.
TESTBED_DEFAULT = _DATA / "testbed_calibration.json"
TESTBED_DEFAULTS = {
    "star": TESTBED_DEFAULT,
    "two-level": _DATA / "testbed_calibration-two-level.json",
    "hetero": _DATA / "testbed_calibration-hetero.json",
    "ring": _DATA / "testbed_calibration-ring.json",
}
TESTBED_DEFAULTS_NIC_125KB = {kind: path.with_name(f"{path.stem}-nic-125kB.json") for kind, path in TESTBED_DEFAULTS.items()}


@dataclass(frozen=True, kw_only=True)
class LinkCalibration:
    """One link class: ``alpha_s`` per message; capacity = ``effective_bandwidth_bytes_per_s`` if
    set, else nominal bandwidth x ``effective_bandwidth_factor``; ``queue_bytes`` and
    ``overflow_factor``: what a message that overflows the link's queue costs (module docstring)."""

    alpha_s: float = 0.0
    effective_bandwidth_factor: float = 1.0
    effective_bandwidth_bytes_per_s: float | None = None
    queue_bytes: float | None = None
    overflow_factor: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.alpha_s) and self.alpha_s >= 0):
            raise ValueError(f"calibration: alpha_s={self.alpha_s!r} must be >= 0 and finite")
        f = self.effective_bandwidth_factor
        if not (math.isfinite(f) and f > 0):
            raise ValueError(f"calibration: effective_bandwidth_factor={f!r} must be > 0 and finite")
        b = self.effective_bandwidth_bytes_per_s
        if b is not None and not (math.isfinite(b) and b > 0):
            raise ValueError(f"calibration: effective_bandwidth_bytes_per_s={b!r} must be > 0 and finite")
        q, o = self.queue_bytes, self.overflow_factor
        if q is not None and not (math.isfinite(q) and q > 0):
            raise ValueError(f"calibration: queue_bytes={q!r} must be > 0 and finite")
        if not (math.isfinite(o) and 0 < o <= 1):
            raise ValueError(f"calibration: overflow_factor={o!r} must be in (0, 1]")
        if q is None and o != 1.0:
            raise ValueError(f"calibration: overflow_factor={o!r} needs the queue it overflows (queue_bytes)")

    @property
    def overflows(self) -> bool:
        """Whether an overflowing message costs more on a link of this class (a queue and a factor < 1)."""
        return self.queue_bytes is not None and self.overflow_factor < 1.0

    def capacity_bytes_per_s(self, nominal_bytes_per_s: float) -> float:
        if self.effective_bandwidth_bytes_per_s is not None:
            return float(self.effective_bandwidth_bytes_per_s)
        return float(nominal_bytes_per_s) * self.effective_bandwidth_factor

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, where: str) -> LinkCalibration:
        check_keys(data, allowed=_LINK_KEYS, where=where)
        kwargs: dict[str, Any] = {}
        try:
            if "alpha_s" in data:
                kwargs["alpha_s"] = parse_time(data["alpha_s"])
            if "effective_bandwidth_factor" in data:
                kwargs["effective_bandwidth_factor"] = float(data["effective_bandwidth_factor"])
            if data.get("effective_bandwidth_bytes_per_s") is not None:
                kwargs["effective_bandwidth_bytes_per_s"] = parse_bandwidth(
                    data["effective_bandwidth_bytes_per_s"]
                )
            if data.get("queue_bytes") is not None:
                kwargs["queue_bytes"] = float(data["queue_bytes"])
            if "overflow_factor" in data:
                kwargs["overflow_factor"] = float(data["overflow_factor"])
            return cls(**kwargs)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: {e}") from None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "alpha_s": self.alpha_s,
            "effective_bandwidth_factor": self.effective_bandwidth_factor,
        }
        if self.effective_bandwidth_bytes_per_s is not None:
            d["effective_bandwidth_bytes_per_s"] = self.effective_bandwidth_bytes_per_s
        if self.queue_bytes is not None:
            d["queue_bytes"] = self.queue_bytes
            d["overflow_factor"] = self.overflow_factor
        return d


def _per_op(data: Mapping[str, Any], key: str, parse, unit: str, kind: str, *, where: str) -> dict[str, float]:
    """``data[key]`` (default empty) as op name -> ``parse(value)``; errors name ``where`` and ``key``."""
    raw = data.get(key, {})
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where}: {key} must be a mapping of op name -> {unit}")
    try:
        return {str(k): parse(x) for k, x in raw.items()}
    except (TypeError, ValueError):
        raise ValueError(f"{where}: {key}: every value must be {kind}") from None


_LINK_KEYS = frozenset(
    {"alpha_s", "effective_bandwidth_factor", "effective_bandwidth_bytes_per_s", "queue_bytes", "overflow_factor"}
)
_TOP_KEYS = frozenset(
    {"gamma_s_per_byte", "default", "link_classes", "op_bandwidth_factors", "op_alpha_s", "downstream_share", "source"}
)


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """Per-link-class corrections plus the reduction cost; the identity calibration by default."""

    link_classes: Mapping[str, LinkCalibration] = field(default_factory=dict)
    default: LinkCalibration = field(default_factory=LinkCalibration)
    gamma_s_per_byte: float = 0.0
    op_bandwidth_factors: Mapping[str, float] = field(default_factory=dict)
    op_alpha_s: Mapping[str, float] = field(default_factory=dict)
    downstream_share: float = 1.0
    source: str = ""

    def __post_init__(self) -> None:
        d = self.downstream_share
        if not (isinstance(d, int | float) and math.isfinite(d) and 0 < d <= 1):
            raise ValueError(f"calibration: downstream_share={d!r} must be in (0, 1]")
        g = self.gamma_s_per_byte
        if not (math.isfinite(g) and g >= 0):
            raise ValueError(f"calibration: gamma_s_per_byte={g!r} must be >= 0 and finite")
        for op, f in self.op_bandwidth_factors.items():
            if not isinstance(op, str) or not (isinstance(f, int | float) and math.isfinite(f) and f > 0):
                raise ValueError(f"calibration: op_bandwidth_factors[{op!r}]={f!r} must be a number > 0")
        for op, a in self.op_alpha_s.items():
            if not isinstance(op, str) or not (isinstance(a, int | float) and math.isfinite(a) and a >= 0):
                raise ValueError(f"calibration: op_alpha_s[{op!r}]={a!r} must be a number >= 0")

    def op_factor(self, op: str) -> float:
        """The multiplier on every link's effective bandwidth for operation ``op`` (1 if unset)."""
        return float(self.op_bandwidth_factors.get(op, 1.0))

    def for_op(self, op: str) -> Calibration:
        """This calibration as operation ``op`` sees it: every link class's effective bandwidth (factor,
        or absolute figure) times :meth:`op_factor`, every class's ``alpha_s`` replaced by
        ``op_alpha_s[op]`` where the op has one, and no per-op entries left (so applying it twice
        changes nothing); ``self`` when there are no per-op entries."""
        if not self.op_bandwidth_factors and not self.op_alpha_s:
            return self
        f = self.op_factor(op)
        alpha = self.op_alpha_s.get(op)

        def scaled(link: LinkCalibration) -> LinkCalibration:
            b = link.effective_bandwidth_bytes_per_s
            return replace(link, effective_bandwidth_factor=link.effective_bandwidth_factor * f,
                           effective_bandwidth_bytes_per_s=None if b is None else b * f,
                           alpha_s=link.alpha_s if alpha is None else float(alpha))  # fmt: skip

        return replace(self, link_classes={k: scaled(v) for k, v in self.link_classes.items()},
                       default=scaled(self.default), op_bandwidth_factors={}, op_alpha_s={})  # fmt: skip

    def for_class(self, link_class: str) -> LinkCalibration:
        return self.link_classes.get(link_class, self.default)

    def capacity_bytes_per_s(self, link_class: str, nominal_bytes_per_s: float) -> float:
        """The capacity one direction of a link of this class offers to flows (bytes/s)."""
        return self.for_class(link_class).capacity_bytes_per_s(nominal_bytes_per_s)

    def message_alpha_s(self, link_classes: Iterable[str]) -> float:
        """Per-message overhead of a message crossing these classes: the largest ``alpha_s``."""
        return max((self.for_class(c).alpha_s for c in link_classes), default=0.0)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, where: str = "calibration") -> Calibration:
        """Build from a mapping with strict keys; errors name ``where`` and the key."""
        check_keys(data, allowed=_TOP_KEYS, where=where)
        classes = data.get("link_classes", {})
        if not isinstance(classes, Mapping):
            raise ValueError(f"{where}: link_classes must be a mapping of class name -> settings")
        try:
            gamma = float(data.get("gamma_s_per_byte", 0.0))
        except (TypeError, ValueError):
            raise ValueError(
                f"{where}: gamma_s_per_byte={data['gamma_s_per_byte']!r} is not a number"
            ) from None
        ops = _per_op(data, "op_bandwidth_factors", float, "factor", "a number", where=where)
        op_alpha = _per_op(data, "op_alpha_s", parse_time, "seconds", "a time", where=where)
        links = {
            str(k): LinkCalibration.from_dict(v, where=f"{where}: link_classes.{k}")
            for k, v in classes.items()
        }
        default = LinkCalibration.from_dict(data.get("default", {}), where=f"{where}: default")
        try:
            share = data.get("downstream_share", 1.0)
            if isinstance(share, bool) or not isinstance(share, int | float):
                raise ValueError(f"downstream_share={share!r} is not a number")
            return cls(link_classes=links, default=default, gamma_s_per_byte=gamma, op_bandwidth_factors=ops,
                       op_alpha_s=op_alpha, downstream_share=float(share),
                       source=str(data.get("source", "")))  # fmt: skip
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None

    def to_dict(self) -> dict[str, Any]:
        return {
            "gamma_s_per_byte": self.gamma_s_per_byte,
            "default": self.default.to_dict(),
            "link_classes": {k: v.to_dict() for k, v in sorted(self.link_classes.items())},
            "op_bandwidth_factors": dict(sorted(self.op_bandwidth_factors.items())),
            **({"op_alpha_s": dict(sorted(self.op_alpha_s.items()))} if self.op_alpha_s else {}),
            **({"downstream_share": self.downstream_share} if self.downstream_share != 1.0 else {}),
            "source": self.source,
        }

    @classmethod
    def load(cls, path: str | Path) -> Calibration:
        """Read a calibration JSON file (ValueError names the file on any problem)."""
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"calibration file {path}: not valid JSON ({e})") from None
        return cls.from_dict(data, where=f"calibration file {path}")

    @classmethod
    def testbed_default(cls, testbed: str = "star", *, host_queue_bytes: int | None = None) -> Calibration:
        """The shipped calibration of one topology of the namespace testbed (:data:`TESTBED_DEFAULTS`:
        star, two-level, hetero, ring; ``igsim.studies.validation.testbed_kind`` names a measurement's).
        ``host_queue_bytes`` is the measured testbed's NIC queue (``TestbedDescription.host_queue_bytes``):
        0 picks the file fitted on the earlier testbed whose NIC queue was an ordinary 125 kB shaper
        queue (:data:`TESTBED_DEFAULTS_NIC_125KB`); None or any other size, the current testbed's."""
        if testbed not in TESTBED_DEFAULTS:
            raise ValueError(f"no shipped calibration for testbed {testbed!r} (known: {', '.join(TESTBED_DEFAULTS)})")
        if host_queue_bytes is not None and host_queue_bytes < 0:
            raise ValueError(f"host_queue_bytes must be >= 0, got {host_queue_bytes}")
        files = TESTBED_DEFAULTS_NIC_125KB if host_queue_bytes == 0 else TESTBED_DEFAULTS
        return cls.load(files[testbed])

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")
