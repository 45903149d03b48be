"""One step's decisions, as a pure function of (step, plan, config, payload sizes).

The simulator and the runtime both call :func:`decide_step`; that is what makes a prediction and a
measurement about the same schedule. Payload sizes are *nominal* (k = ceil(density · numel) pairs per
parameter), which every rank knows without talking; actual per-rank sizes travel with the payloads
and are what the wire-byte counters measure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from igpolicy.choice import choose_collective
from igpolicy.config import PolicyConfig
from igpolicy.packing import pack
from igpolicy.plan import SyncPlan, compare_plans
from igpolicy.schedule import AlwaysSchedule, ImportanceSchedule, PeriodicSchedule, assign_phases
from igpolicy.vocab import CollectiveKind, PackingPlan, ParamInfo, PayloadBlock, ReleaseDecision
from igpolicy.wire import dense_value_bytes, nominal_k, pairs_of

__all__ = [
    "BucketDecision",
    "StepDecision",
    "decide_step",
    "nominal_k",
    "payload_blocks",
    "release_phases",
    "step_config",
]


@dataclass(frozen=True, kw_only=True)
class BucketDecision:
    """How one bucket travels: its parameters (wire order), total elements and nominal pairs."""

    index: int
    param_names: tuple[str, ...]
    numel: int
    nominal_nnz: int
    size_bytes: int
    collective: CollectiveKind


@dataclass(frozen=True, kw_only=True)
class StepDecision:
    """Everything decided for one step; identical on every rank and in the simulator."""

    step: int
    release: ReleaseDecision
    packing: PackingPlan
    buckets: tuple[BucketDecision, ...]
    sending_params: frozenset[str]

    @property
    def num_collectives(self) -> int:
        return len(self.buckets)


def payload_blocks(params: Sequence[ParamInfo], config: PolicyConfig) -> list[PayloadBlock]:
    """Nominal per-step payload of every parameter: k pairs for sparse policies (every entry for a
    parameter within ``dense_small_numel``), dense values otherwise."""
    blocks = []
    for p in params:
        if config.sparse:
            size = pairs_of(p, config) * (config.index_bytes + config.value_bytes)
        else:
            size = p.numel * dense_value_bytes(config.value_bytes)
        blocks.append(PayloadBlock(name=p.name, component=p.component, size_bytes=size, order=p.order))
    return blocks


def release_phases(
    *, plan: SyncPlan | None, config: PolicyConfig, component_keys: Sequence[str]
) -> dict[str, int | None]:
    """{component: release phase, None = every step} for the configured policy.

    ``importance`` needs a plan covering exactly the model's components (a mismatch is a ValueError
    naming the difference, never a silent default). Its low components keep the plan's phases when the
    periods agree; otherwise they are re-split into ``config.release_period`` phases of equal expected
    bytes. With ``staggered=False`` every low component releases on phase R-1 (one burst).
    """
    keys = sorted(set(component_keys))
    R = config.release_period
    if config.policy in ("dense", "topk", "adtopk"):
        return {k: None for k in keys}
    if config.policy == "periodic":
        return {k: R - 1 for k in keys}
    if plan is None:
        raise ValueError("policy 'importance' needs a SyncPlan (igsim profile TRACE -o plan.json)")
    missing, extra = compare_plans(plan, keys)
    if missing or extra:
        hint = ""
        if "fresh" in extra:
            hint = f"; the plan has fresh parameters: set fresh_patterns (--fresh) to {_fresh_of(plan)}"
        elif "fresh" in missing:
            hint = "; the plan was profiled without fresh_patterns: profile with the same --fresh"
        raise ValueError(
            f"SyncPlan {plan.fingerprint} does not match the model: "
            f"components missing from the plan: {missing or 'none'}; "
            f"components in the plan but not in the model: {extra or 'none'}{hint}"
        )
    by_key = plan.by_key
    low = sorted(plan.low)
    phases: dict[str, int | None] = {k: None for k in keys}
    if not config.staggered:
        phases.update({k: R - 1 for k in low})
    elif plan.release_period == R:
        phases.update({k: by_key[k].phase for k in low})
    else:
        phases.update(assign_phases({k: by_key[k].expected_bytes for k in low}, num_phases=R))
    return phases


def _fresh_of(plan: SyncPlan) -> str:
    pats = plan.source.get("fresh_patterns")
    return " ".join(map(str, pats)) if isinstance(pats, list) and pats else "the patterns it was profiled with"


def step_config(config: PolicyConfig, phases: Mapping[str, int | None]) -> PolicyConfig:
    """The config the steps of a run are decided under, given its release ``phases``.

    ``config`` itself unless ``low_mode`` is ``thin``: then every low component (a phase that is
    not None) gets density / ``release_period`` in ``density_per_component`` (its own entry there,
    else its kind's density, divided by R), so it sends ``ceil(density · numel / R)`` pairs every
    step. :class:`igpolicy.planner.StepPlanner` holds this config; the runtime's selection and the
    simulator's bytes both read k from its step plans.
    """
    if config.low_mode != "thin":
        return config
    R = config.release_period
    dens = dict(config.density_per_component)
    for key, phase in phases.items():
        if phase is not None:
            dens[key] = config.density_of(key) / R
    return dataclasses.replace(config, density_per_component=dens)


def _schedule(config: PolicyConfig, step: int):
    if config.policy in ("dense", "topk", "adtopk") or step < config.warmup_steps or config.low_mode == "thin":
        return AlwaysSchedule()
    if config.policy == "periodic":
        return PeriodicSchedule(period=config.release_period)
    return ImportanceSchedule(period=config.release_period)


def decide_step(
    *,
    step: int,
    config: PolicyConfig,
    params: Sequence[ParamInfo],
    world_size: int,
    phases: Mapping[str, int | None],
    blocks: Sequence[PayloadBlock] | None = None,
) -> StepDecision:
    """Decide which parameters send at ``step``, how they are packed and how each bucket travels.

    ``phases`` comes from :func:`release_phases` (computed once per run). ``blocks`` defaults to the
    nominal :func:`payload_blocks`; pass a step's own sizes (e.g. from a trace) only where every rank
    knows them. Parameters of components that do not send this step contribute no block. Before
    ``config.warmup_steps`` every component sends (the release schedule starts after the warm-up).
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    release = _schedule(config, step).decide(step=step, components=phases)
    if blocks is None:
        blocks = payload_blocks(params, config)
    by_name = {p.name: p for p in params}
    unknown = sorted({b.component for b in blocks} - set(phases))
    if unknown:
        raise ValueError(f"decide_step: components without a release phase (not in `phases`): {unknown}")
    strangers = sorted({b.name for b in blocks} - set(by_name))
    if strangers:
        raise ValueError(f"decide_step: payload blocks for unknown parameters: {strangers[:5]}")
    sending = [b for b in blocks if b.component in release.send]
    packing = pack(
        sending,
        method=config.packing,
        num_buckets=config.num_buckets,
        bucket_cap_bytes=config.bucket_cap_bytes,
    )
    buckets = []
    for bucket in packing.buckets:
        numel = sum(by_name[n].numel for n in bucket.block_names)
        if config.sparse:
            nnz = sum(pairs_of(by_name[n], config) for n in bucket.block_names)
            collective = choose_collective(
                numel=numel,
                nnz_per_rank=[nnz] * world_size,
                index_bytes=config.index_bytes,
                value_bytes=config.value_bytes,
                mode=config.collective,
            )
        else:
            nnz, collective = numel, CollectiveKind.DENSE_ALLREDUCE
        buckets.append(
            BucketDecision(
                index=bucket.index,
                param_names=bucket.block_names,
                numel=numel,
                nominal_nnz=nnz,
                size_bytes=bucket.size_bytes,
                collective=collective,
            )
        )
    return StepDecision(
        step=step,
        release=release,
        packing=packing,
        buckets=tuple(buckets),
        sending_params=frozenset(b.name for b in sending),
    )
