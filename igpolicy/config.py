"""Strict configuration: unknown keys and removed keys are errors that name them.

The lesson of DeepSpeed's removed ``sparse_gradients`` flag: a key that is silently accepted is a
setting the user believes in and does not have. :func:`check_keys` is used by every loader (policy
config, SyncPlan, topology, calibration), and :class:`PolicyConfig` is the online policy shared by
the simulator and the runtime.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from igpolicy.limits import MAX_RELEASE_PERIOD
from igpolicy.vocab import ComponentId, ComponentKind
from igpolicy.wire import INDEX_WIDTHS, VALUE_WIDTHS

__all__ = ["LOW_MODES", "POLICIES", "SPLIT_CONTROLS", "PolicyConfig", "check_keys"]

POLICIES = ("dense", "topk", "adtopk", "importance", "periodic")
SPARSIFIERS = ("topk", "adtopk", "threshold", "randomk", "none")
PACKINGS = ("ddp", "round_robin", "lpt", "kk")
COLLECTIVES = ("auto", "sparse", "dense")
NONFINITE = ("skip", "error")  # what a non-finite local gradient does
LOW_MODES = ("hold", "thin")  # how low components send (PolicyConfig.low_mode)
SPLIT_CONTROLS = ("all_low", "random", "swapped")  # igpolicy.controls (PolicyConfig.online_control)

# removed key -> what replaced it (shown in the error)
REMOVED_POLICY_KEYS: dict[str, str] = {
    "sparse_gradients": "use 'sparsifier' and 'density' (rows were selected by their sum and dropped [1, -1])",
    "interval": "use 'release_period'",
    "bucket_size_mb": "use 'bucket_cap_bytes' (bytes; sizes with units are parsed at the CLI)",
    "balance": "use 'packing' (one of ddp, round_robin, lpt, kk)",
}


def check_keys(
    data: Mapping[str, Any],
    *,
    allowed: set[str] | frozenset[str],
    where: str,
    removed: Mapping[str, str] | None = None,
    required: set[str] | frozenset[str] = frozenset(),
) -> None:
    """Raise ValueError naming every unknown, removed or missing key of ``data``.

    ``where`` names the file or section (it starts the message). A removed key's message says what
    replaced it.
    """
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: expected a mapping, got {type(data).__name__}")
    removed = removed or {}
    problems = []
    for key in data:
        if key in removed:
            problems.append(f"key {key!r} was removed: {removed[key]}")
        elif key not in allowed:
            problems.append(f"unknown key {key!r} (allowed: {', '.join(sorted(allowed))})")
    for key in sorted(required - set(data)):
        problems.append(f"missing required key {key!r}")
    if problems:
        raise ValueError(f"{where}: " + "; ".join(problems))


def check_max_share(max_share: object, *, where: str) -> None:
    """A plan's bytes cap (``PolicyConfig.max_share``, ``igsim profile --max-share``) is None or 0
    (off), or a number in (0, 1]; ValueError naming ``where`` otherwise."""
    if max_share is None:
        return
    if isinstance(max_share, bool) or not isinstance(max_share, (int, float)) or not (0.0 <= max_share <= 1.0):
        raise ValueError(f"{where}: max_share={max_share!r} must be a share of the bytes in (0, 1] (0: no cap)")


@dataclass(frozen=True, kw_only=True)
class PolicyConfig:
    """The online policy: how gradients are sparsified, released, packed and sent.

    - ``policy``: ``dense`` (plain all-reduce every step), ``topk`` / ``adtopk`` (sparsify every
      component every step, error feedback), ``importance`` (important components every step, low
      ones on their staggered release phase), ``periodic`` (every component every ``release_period``
      steps, all at once).
    - ``density``: fraction of entries kept by the sparsifier, in (0, 1]; ``density_per_kind``
      overrides it per :class:`ComponentKind` value.
    - ``release_period``: R, the period of low-importance releases (>= 1).
    - ``staggered``: split low components into R phases of equal expected bytes (True) or release
      them all on one step (False, the prototype's burst).
    - ``packing`` / ``num_buckets`` / ``bucket_cap_bytes``: how payloads are packed into buckets;
      with ``num_buckets`` None the count is ceil(total / bucket_cap_bytes).
    - ``collective``: ``auto`` chooses sparse gather vs dense all-reduce per bucket by cost.
    - ``index_bytes`` / ``value_bytes``: wire widths (int32 indices, fp32 values by default);
      ``index_bytes=2``: bucket-local 16-bit offsets, ``value_bytes=1``: int8 values with a scale
      (dense all-reduces then travel in bf16); see :mod:`igpolicy.wire`.
    - ``row_sparse_embeddings``: a 2-D token embedding sends whole rows, ``ceil(k / dim)`` of them,
      as (row id, row) (:func:`igpolicy.wire.rows_layout`) instead of per-entry pairs (False: off).
    - ``skip_unsent``: parameters that sent nothing get ``grad = None`` (True) or a zero grad.
    - ``catch_up``: after the optimizer step, scale each parameter's update by the number of steps
      whose gradient it carries (1 for a parameter that sent on the previous step too; R for a low
      component released after R steps). For scale-invariant optimizers (Adam, AdamW, Adafactor),
      whose step does not grow with a gradient accumulated over R steps; leave it off for SGD,
      where the accumulated residual already is R steps' worth. Requires ``skip_unsent``.
    - ``nonfinite``: what a NaN / inf local gradient does (AMP GradScaler style, checked before it
      touches a residual): ``skip`` the step on every rank (nothing is applied; every finite
      gradient is held in the residuals, the non-finite parameters' gradients are discarded on the
      rank that had them), or ``error``: stop every rank with an error naming the parameter.
    - ``fresh_patterns``: parameters that are freshly initialised (a new task head), as module names
      or globs (``auto``: Hugging Face task heads, :data:`igpolicy.components.FRESH_AUTO`); they form
      the component ``fresh``, which the profiler always pins (:func:`igpolicy.components.mark_fresh`).
    - ``dense_small_numel``: parameters of at most this many entries (biases, norm weights) send
      every entry whenever they send, instead of ``ceil(density · numel)`` pairs (0: off; 4096
      covers MiniLM's and GPT-2's vectors). See :func:`igpolicy.wire.param_k`.
    - ``warmup_steps``: every component sends on every step ``t < warmup_steps`` (the sparsifier
      still selects); the release schedule starts after it (0: off).
    - ``replan_every`` / ``online_window``: online profiling (:mod:`igpolicy.online`; 0: off). Every
      ``replan_every`` steps (once ``online_window`` steps were observed) the ranks reduce their
      statistics of the last ``online_window`` steps and switch to the plan profiled from them at
      the next step; before the first re-plan every component sends every step (or the given
      plan is followed). Policy ``importance`` only.
    - ``low_mode``: how low components send (policy ``importance``). ``hold`` (the default): they
      wait in their residuals and release on their staggered phase, every ``release_period`` steps.
      ``thin``: they send on **every** step at density / ``release_period`` (``ceil(k / R)`` pairs of
      their error-fed residual), so about the same bytes reach the wire as with ``hold`` but the
      optimizer steps every component every step (Adam's pace is kept without ``catch_up``, which
      then scales nothing). Important components send at the full density either way.
    - ``density_per_component``: a density per component key that overrides ``density_per_kind``
      (set by :func:`igpolicy.decide.step_config` for ``low_mode="thin"``; users may set it too).
    - ``max_share``: online re-plans cap their expected bytes per step at this share of every
      component sending every step (:func:`igpolicy.profile.build_plan`: the threshold raised, the
      lowest-scored important components made low, until the plan fits; 0: no cap). Needs online
      profiling; for an offline plan give ``igsim profile --max-share``.
    - ``online_control``: a split control for experiments (:mod:`igpolicy.controls`: ``swapped``,
      ``random``, ``all_low``; "" off): every online re-plan's important set is replaced by the
      control's, same bytes where it keeps any, seeded by ``seed`` and the re-plan's step. It asks
      whether the profiler's choice of components matters, not only the bytes. Needs online profiling.
    """

    policy: str = "importance"
    sparsifier: str = "topk"
    density: float = 0.01
    density_per_kind: Mapping[str, float] = field(default_factory=dict)
    density_per_component: Mapping[str, float] = field(default_factory=dict)
    release_period: int = 4
    staggered: bool = True
    packing: str = "kk"
    num_buckets: int | None = None
    bucket_cap_bytes: int = 25 * 2**20
    collective: str = "auto"
    index_bytes: int = 4
    value_bytes: int = 4
    row_sparse_embeddings: bool = False
    skip_unsent: bool = True
    catch_up: bool = False
    nonfinite: str = "skip"
    fresh_patterns: tuple[str, ...] = ()
    dense_small_numel: int = 0
    warmup_steps: int = 0
    online_window: int = 0
    replan_every: int = 0
    max_share: float = 0.0
    low_mode: str = "hold"
    online_control: str = ""
    seed: int = 0

    def __post_init__(self) -> None:
        def bad(key: str, value: object, why: str) -> ValueError:
            return ValueError(f"policy config: {key}={value!r} {why}")

        self._check_types(bad)
        if self.policy not in POLICIES:
            raise bad("policy", self.policy, f"is not one of {', '.join(POLICIES)}")
        if self.sparsifier not in SPARSIFIERS:
            raise bad("sparsifier", self.sparsifier, f"is not one of {', '.join(SPARSIFIERS)}")
        if not (0.0 < float(self.density) <= 1.0):
            raise bad("density", self.density, "must be in (0, 1]")
        kinds = {k.value for k in ComponentKind}
        for kind, d in dict(self.density_per_kind).items():
            if kind not in kinds:
                raise bad("density_per_kind", kind, f"is not a component kind ({', '.join(sorted(kinds))})")
            if not (0.0 < float(d) <= 1.0):
                raise bad(f"density_per_kind[{kind}]", d, "must be in (0, 1]")
        for comp, d in dict(self.density_per_component).items():
            if not isinstance(comp, str) or not comp:
                raise bad("density_per_component", comp, "must be keyed by component keys (strings)")
            if not (0.0 < float(d) <= 1.0):
                raise bad(f"density_per_component[{comp}]", d, "must be in (0, 1]")
        if self.low_mode not in LOW_MODES:
            raise bad("low_mode", self.low_mode, f"is not one of {', '.join(LOW_MODES)}")
        if self.low_mode != "hold" and self.policy != "importance":
            raise bad("low_mode", self.low_mode, f"is for policy 'importance', not {self.policy!r}")
        if int(self.release_period) < 1:
            raise bad("release_period", self.release_period, "must be >= 1")
        if self.release_period > MAX_RELEASE_PERIOD:
            raise bad(
                "release_period", self.release_period,
                f"is above the limit {MAX_RELEASE_PERIOD:,} (igpolicy.limits.MAX_RELEASE_PERIOD)",
            )  # fmt: skip
        if self.packing not in PACKINGS:
            raise bad("packing", self.packing, f"is not one of {', '.join(PACKINGS)}")
        if self.num_buckets is not None and int(self.num_buckets) < 1:
            raise bad("num_buckets", self.num_buckets, "must be >= 1 or None")
        if int(self.bucket_cap_bytes) < 1:
            raise bad("bucket_cap_bytes", self.bucket_cap_bytes, "must be >= 1")
        if self.collective not in COLLECTIVES:
            raise bad("collective", self.collective, f"is not one of {', '.join(COLLECTIVES)}")
        if self.index_bytes not in INDEX_WIDTHS:
            raise bad(
                "index_bytes", self.index_bytes,
                "must be 2 (bucket-local 16-bit offsets with a block table), 4 (int32) or 8 (int64)",
            )  # fmt: skip
        if self.value_bytes not in VALUE_WIDTHS:
            raise bad(
                "value_bytes", self.value_bytes,
                "must be 1 (int8 with one fp32 scale per payload; dense ops in bf16), 2 (bf16) or 4 (fp32)",
            )  # fmt: skip
        if self.nonfinite not in NONFINITE:
            raise bad("nonfinite", self.nonfinite, f"is not one of {', '.join(NONFINITE)}")
        if int(self.dense_small_numel) < 0:
            raise bad("dense_small_numel", self.dense_small_numel, "must be >= 0 (0: off)")
        if int(self.warmup_steps) < 0:
            raise bad("warmup_steps", self.warmup_steps, "must be >= 0 (0: off)")
        self._check_online(bad)
        if self.catch_up and not self.skip_unsent:
            raise bad("catch_up", self.catch_up, "needs skip_unsent=true (a zero grad steps the optimizer anyway)")

    def _check_types(self, bad) -> None:
        """Each field has its declared type (bool is not an int; an int is a valid float)."""

        def is_int(v: object) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        def is_number(v: object) -> bool:
            return isinstance(v, (int, float)) and not isinstance(v, bool)

        for key in ("policy", "sparsifier", "packing", "collective", "nonfinite", "low_mode", "online_control"):
            if not isinstance(getattr(self, key), str):
                raise bad(key, getattr(self, key), "must be a string")
        for key in (
            "release_period", "bucket_cap_bytes", "index_bytes", "value_bytes", "seed",
            "dense_small_numel", "warmup_steps", "online_window", "replan_every",
        ):  # fmt: skip
            if not is_int(getattr(self, key)):
                raise bad(key, getattr(self, key), "must be an integer")
        if self.num_buckets is not None and not is_int(self.num_buckets):
            raise bad("num_buckets", self.num_buckets, "must be an integer or null")
        for key in ("staggered", "skip_unsent", "catch_up", "row_sparse_embeddings"):
            if not isinstance(getattr(self, key), bool):
                raise bad(key, getattr(self, key), "must be true or false")
        fresh = self.fresh_patterns
        if isinstance(fresh, str) or not isinstance(fresh, (tuple, list)):
            raise bad("fresh_patterns", fresh, "must be a list of module names or globs")
        if not all(isinstance(x, str) and x.strip(". ") for x in fresh):
            raise bad("fresh_patterns", fresh, "must hold non-empty strings")
        object.__setattr__(self, "fresh_patterns", tuple(fresh))
        if not is_number(self.density):
            raise bad("density", self.density, "must be a number")
        if not isinstance(self.density_per_kind, Mapping):
            raise bad("density_per_kind", self.density_per_kind, "must be a mapping of kind -> density")
        for kind, d in dict(self.density_per_kind).items():
            if not is_number(d):
                raise bad(f"density_per_kind[{kind}]", d, "must be a number")
        if not isinstance(self.density_per_component, Mapping):
            raise bad("density_per_component", self.density_per_component, "must be a mapping of component -> density")
        for comp, d in dict(self.density_per_component).items():
            if not is_number(d):
                raise bad(f"density_per_component[{comp}]", d, "must be a number")

    def _check_online(self, bad) -> None:
        """Online profiling: both keys >= 0, both set or neither, the importance policy only."""
        for key in ("online_window", "replan_every"):
            if int(getattr(self, key)) < 0:
                raise bad(key, getattr(self, key), "must be >= 0 (0: off)")
        if self.online_window > MAX_RELEASE_PERIOD:
            raise bad("online_window", self.online_window, f"is above the limit {MAX_RELEASE_PERIOD:,}")
        if self.replan_every and not self.online_window:
            raise bad("replan_every", self.replan_every, "needs online_window >= 1 (the steps it profiles)")
        if self.online_window and not self.replan_every:
            raise bad("online_window", self.online_window, "needs replan_every >= 1 (0: profiling off)")
        if self.replan_every and self.policy != "importance":
            raise bad("replan_every", self.replan_every, f"is for policy 'importance', not {self.policy!r}")
        check_max_share(self.max_share, where="policy config")
        if self.max_share and not self.replan_every:
            raise bad(
                "max_share", self.max_share,
                "caps online re-plans and needs online profiling (replan_every >= 1); "
                "cap an offline plan with igsim profile --max-share",
            )  # fmt: skip
        if self.online_control:
            if self.online_control not in SPLIT_CONTROLS:
                raise bad("online_control", self.online_control, f"is not one of {', '.join(SPLIT_CONTROLS)} ('' off)")
            if not self.replan_every:
                raise bad("online_control", self.online_control, "replaces online re-plans and needs online profiling")

    @property
    def online_profiling(self) -> bool:
        """True when online profiling is on (``replan_every > 0``)."""
        return self.replan_every > 0

    def density_for(self, kind: str) -> float:
        """The sparsifier density for a component kind (1.0 for the dense policy)."""
        if self.policy == "dense":
            return 1.0
        return float(self.density_per_kind.get(kind, self.density))

    def density_of(self, component: str) -> float:
        """The sparsifier density of one component key: ``density_per_component``'s, else its kind's."""
        if self.policy != "dense" and component in self.density_per_component:
            return float(self.density_per_component[component])
        return self.density_for(ComponentId.from_key(component).kind.value)

    @property
    def sparse(self) -> bool:
        return self.policy != "dense"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, where: str = "policy config") -> PolicyConfig:
        """Build from a mapping, rejecting unknown and removed keys by name."""
        allowed = {f.name for f in dataclasses.fields(cls)}
        check_keys(data, allowed=allowed, where=where, removed=REMOVED_POLICY_KEYS)
        return cls(**dict(data))

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["density_per_kind"] = dict(self.density_per_kind)
        d["density_per_component"] = dict(self.density_per_component)
        d["fresh_patterns"] = list(self.fresh_patterns)
        return d
