"""The SyncPlan: the profiler's verdict, as schema-versioned JSON with a content fingerprint.

A plan lists every component with its score, its class (important / low / pinned), its release phase
(low components only) and its expected bytes per release, plus the settings that produced it. The
fingerprint is a SHA-256 over the canonical JSON of everything but the fingerprint itself; ranks
compare it at start-up, and a file whose stored fingerprint does not match its content is rejected.
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from igpolicy.config import PolicyConfig, check_keys
from igpolicy.limits import MAX_SCORE, check_count
from igpolicy.vocab import ComponentClass, ComponentId, ComponentKind

__all__ = ["SCHEMA_VERSION", "ComponentPlan", "SyncPlan", "apply_policy_defaults", "bytes_share", "compare_plans"]

SCHEMA_VERSION = 1
_TOP_KEYS = frozenset(
    {"schema_version", "release_period", "components", "settings", "source", "fingerprint"}
)
_COMPONENT_KEYS = frozenset({"key", "score", "class", "phase", "expected_bytes"})


@dataclass(frozen=True, kw_only=True)
class ComponentPlan:
    """One component's entry: ``phase`` is set for low components only, in [0, release_period)."""

    key: str
    score: float
    cls: ComponentClass
    phase: int | None = None
    expected_bytes: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "score": self.score,
            "class": self.cls.value,
            "phase": self.phase,
            "expected_bytes": self.expected_bytes,
        }


def _check_score(c: ComponentPlan) -> None:
    """A finite number of magnitude at most MAX_SCORE (an int too large for a float included)."""
    s = c.score
    if isinstance(s, bool) or not isinstance(s, numbers.Real):
        raise ValueError(f"SyncPlan: component {c.key!r}: score must be a number, got {s!r}")
    if not isinstance(s, numbers.Integral) and not math.isfinite(float(s)):
        raise ValueError(f"SyncPlan: component {c.key!r} has a non-finite score {s!r}")
    if abs(int(s) if isinstance(s, numbers.Integral) else float(s)) > MAX_SCORE:  # ints: no float()
        raise ValueError(
            f"SyncPlan: component {c.key!r} has a score of magnitude above {MAX_SCORE:.0e} "
            f"(igpolicy.limits.MAX_SCORE; too large)"
        )


def bytes_share(*, every_step: int, low: int, release_period: int) -> float:
    """A plan's expected bytes per step over every component sending every step (Top-k's at the same
    density): the components sent every step (pinned, important) in full, the low ones' over R (their
    staggered phases release about 1/R of them each step). 1.0 when there are no bytes at all."""
    total = every_step + low
    return (every_step + low / release_period) / total if total else 1.0


@dataclass(frozen=True, kw_only=True)
class SyncPlan:
    """The offline plan the simulator and the runtime both follow.

    ``settings`` records how it was profiled (score weights, threshold method and value, window);
    ``source`` where from (trace path, model). Both are informational but fingerprinted.
    """

    release_period: int
    components: tuple[ComponentPlan, ...]
    settings: Mapping[str, Any] = field(default_factory=dict)
    source: Mapping[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        if self.schema_version != SCHEMA_VERSION:
            raise ValueError(
                f"SyncPlan: schema_version {self.schema_version!r} is not supported (expected {SCHEMA_VERSION})"
            )
        if not isinstance(self.release_period, int) or self.release_period < 1:
            raise ValueError(f"SyncPlan: release_period must be an integer >= 1, got {self.release_period!r}")
        check_count(self.release_period, what="SyncPlan: release_period", limit="MAX_RELEASE_PERIOD")
        seen: set[str] = set()
        for c in self.components:
            ComponentId.from_key(c.key)  # raises on a malformed key
            if c.key in seen:
                raise ValueError(f"SyncPlan: component {c.key!r} appears twice")
            seen.add(c.key)
            _check_score(c)
            if c.cls == ComponentClass.LOW and ComponentId.from_key(c.key).kind == ComponentKind.FRESH:
                raise ValueError(f"SyncPlan: component {c.key!r} is freshly initialised and cannot be low")
            if c.cls == ComponentClass.LOW:
                if c.phase is None or not (0 <= c.phase < self.release_period):
                    raise ValueError(
                        f"SyncPlan: low component {c.key!r} needs a phase in [0, {self.release_period}), "
                        f"got {c.phase!r}"
                    )
            elif c.phase is not None:
                raise ValueError(f"SyncPlan: {c.cls.value} component {c.key!r} must not have a phase")
            if c.expected_bytes < 0:
                raise ValueError(f"SyncPlan: component {c.key!r} has negative expected_bytes")

    # ----------------------------------------------------------------- views
    @property
    def by_key(self) -> dict[str, ComponentPlan]:
        return {c.key: c for c in self.components}

    @property
    def phases(self) -> dict[str, int | None]:
        """{component key: release phase}, None for components that send every step."""
        return {c.key: c.phase for c in self.components}

    @property
    def policy_defaults(self) -> dict[str, Any]:
        """PolicyConfig settings the profiler recommends with this plan (``settings["policy_defaults"]``;
        empty for plans written before it existed). See :func:`apply_policy_defaults`."""
        d = self.settings.get("policy_defaults", {})
        return dict(d) if isinstance(d, Mapping) else {}

    @property
    def important(self) -> frozenset[str]:
        return frozenset(c.key for c in self.components if c.cls != ComponentClass.LOW)

    @property
    def low(self) -> frozenset[str]:
        return frozenset(c.key for c in self.components if c.cls == ComponentClass.LOW)

    @property
    def expected_share(self) -> float:
        """Expected bytes per step over every component every step (:func:`bytes_share`)."""
        low = sum(c.expected_bytes for c in self.components if c.cls == ComponentClass.LOW)
        every = sum(c.expected_bytes for c in self.components) - low
        return bytes_share(every_step=every, low=low, release_period=self.release_period)

    # ----------------------------------------------------------- serialising
    def _body(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "release_period": self.release_period,
            "components": [c.to_json() for c in sorted(self.components, key=lambda c: c.key)],
            "settings": _jsonable(self.settings),
            "source": _jsonable(self.source),
        }

    @property
    def fingerprint(self) -> str:
        """SHA-256 (hex, first 16 characters) of the canonical JSON body."""
        text = json.dumps(self._body(), sort_keys=True, separators=(",", ":"), allow_nan=False)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def to_json(self) -> dict[str, Any]:
        body = self._body()
        body["fingerprint"] = self.fingerprint
        return body

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n")
        tmp.replace(path)
        return path

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, where: str = "SyncPlan") -> SyncPlan:
        """Parse and validate; raises ValueError naming the problem (unknown key, schema, fingerprint)."""
        check_keys(
            data,
            allowed=_TOP_KEYS,
            where=where,
            required=frozenset({"schema_version", "release_period", "components"}),
        )
        if data["schema_version"] != SCHEMA_VERSION:
            raise ValueError(
                f"{where}: schema_version {data['schema_version']!r} is not supported (expected {SCHEMA_VERSION})"
            )
        comps_raw = data["components"]
        if not isinstance(comps_raw, list):
            raise ValueError(f"{where}: 'components' must be a list")
        comps = []
        for i, c in enumerate(comps_raw):
            cwhere = f"{where}: components[{i}]"
            check_keys(c, allowed=_COMPONENT_KEYS, where=cwhere, required=frozenset({"key", "score", "class"}))
            try:
                cls_ = ComponentClass(c["class"])
            except ValueError:
                raise ValueError(
                    f"{cwhere}: class {c['class']!r} is not one of {[k.value for k in ComponentClass]}"
                ) from None
            score = c["score"]
            if not isinstance(score, (int, float)) or isinstance(score, bool):
                raise ValueError(f"{cwhere}: score must be a number, got {score!r}")
            phase = c.get("phase")
            if phase is not None and (not isinstance(phase, int) or isinstance(phase, bool)):
                raise ValueError(f"{cwhere}: phase must be an integer or null, got {phase!r}")
            eb = c.get("expected_bytes", 0)
            if not isinstance(eb, int) or isinstance(eb, bool):
                raise ValueError(f"{cwhere}: expected_bytes must be an integer, got {eb!r}")
            if not isinstance(c["key"], str):
                raise ValueError(f"{cwhere}: key must be a string, got {c['key']!r}")
            if abs(score) > MAX_SCORE:  # before float(): an integer beyond any float overflows there
                raise ValueError(
                    f"{cwhere}: score of magnitude above {MAX_SCORE:.0e} (igpolicy.limits.MAX_SCORE; too large)"
                )
            comps.append(ComponentPlan(key=c["key"], score=float(score), cls=cls_, phase=phase, expected_bytes=eb))
        for name in ("settings", "source"):
            if not isinstance(data.get(name, {}), Mapping):
                raise ValueError(f"{where}: {name!r} must be a mapping")
        rp = data["release_period"]
        if not isinstance(rp, int) or isinstance(rp, bool):
            raise ValueError(f"{where}: release_period must be an integer, got {rp!r}")
        try:
            plan = cls(
                release_period=rp,
                components=tuple(comps),
                settings=dict(data.get("settings", {})),
                source=dict(data.get("source", {})),
            )
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        stored = data.get("fingerprint")
        if stored is not None and stored != plan.fingerprint:
            raise ValueError(
                f"{where}: fingerprint {stored!r} does not match the content ({plan.fingerprint!r}); "
                "the file was edited or corrupted"
            )
        return plan

    @classmethod
    def load(cls, path: str | Path) -> SyncPlan:
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise ValueError(f"{path}: no such SyncPlan file") from None
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
            raise ValueError(f"{path}: not valid JSON ({type(e).__name__}: {e})") from None
        except OSError as e:
            raise ValueError(f"{path}: cannot read the SyncPlan file ({e.strerror or e})") from None
        return cls.from_json(data, where=str(path))


def compare_plans(plan: SyncPlan, component_keys: Sequence[str]) -> tuple[list[str], list[str]]:
    """(keys the model has that the plan lacks, keys the plan has that the model lacks), sorted."""
    have = set(component_keys)
    planned = set(plan.by_key)
    return sorted(have - planned), sorted(planned - have)


def apply_policy_defaults(config: PolicyConfig, plan: SyncPlan | None, *, explicit: Iterable[str] = ()) -> PolicyConfig:
    """``config`` with the plan's :attr:`SyncPlan.policy_defaults` for every key not in ``explicit``
    (keys the user set), under the ``importance`` and ``periodic`` policies only.

    This is how a default changes for new plans only: e.g. ``catch_up`` is on for runs with a plan
    profiled since it was recorded, off for older plans and for every config built without a plan,
    so states saved before keep their config digest. A bad recorded key is a ValueError naming it.
    """
    if plan is None or config.policy not in ("importance", "periodic"):
        return config
    chosen = {k: v for k, v in plan.policy_defaults.items() if k not in set(explicit)}
    if not chosen:
        return config
    return PolicyConfig.from_dict({**config.to_dict(), **chosen}, where=f"SyncPlan {plan.fingerprint} policy_defaults")


def _jsonable(obj: Any) -> Any:
    """Round-trip through JSON so fingerprints see exactly what a file would hold."""
    return json.loads(json.dumps(obj, sort_keys=True, allow_nan=False, default=str))
