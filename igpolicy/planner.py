"""Step plans for every step of a run, memoised per release slot.

:class:`StepPlanner` is what the runtime and the simulator both hold: per step it calls
:func:`igpolicy.decide.decide_step` and :func:`igpolicy.step_plan.build_step_plan`. Every release
schedule is periodic in the release period and decisions use nominal sizes, so the decision of
step ``t`` equals that of ``t mod R`` (up to the step number): the planner decides steps
``0 .. 2R-1`` only, checks the second period against the first (a loud error if a schedule ever
stops being periodic), and reuses the packing afterwards (KK packing at 64 buckets costs ms).
With a warm-up (``PolicyConfig.warmup_steps`` = W), steps ``t < W`` share one memo slot (every
component sends) and the periodic slots start at step W (:meth:`StepPlanner.slot`).
The planner decides under :func:`igpolicy.decide.step_config` of its config and phases (``config``;
the one given is ``base_config``): with ``low_mode="thin"`` the low components' densities divided by R.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from igpolicy.config import PolicyConfig
from igpolicy.decide import StepDecision, decide_step, step_config
from igpolicy.step_plan import CollectiveOp, StepPlan, bucket_ops, build_step_plan
from igpolicy.vocab import ParamInfo, PayloadBlock
from igpolicy.wire import config_k

__all__ = ["StepPlanner"]


class StepPlanner:
    """Decisions and step plans of one run (one integration, one world size)."""

    def __init__(
        self,
        *,
        config: PolicyConfig,
        params: Sequence[ParamInfo],
        world_size: int,
        phases: Mapping[str, int | None],
        integration: str = "sync",
        blocks: Sequence[PayloadBlock] | None = None,
    ) -> None:
        self.base_config = config
        self.config = step_config(config, phases)  # low components thinned with low_mode="thin"
        self.params, self.world_size = tuple(params), int(world_size)
        self.phases, self.integration = dict(phases), integration
        self.blocks = None if blocks is None else tuple(blocks)
        self.period = int(config.release_period)
        self.warmup = int(config.warmup_steps)
        self.infos = {p.name: p for p in self.params}
        self.k = {p.name: config_k(p, self.config) for p in self.params}
        self._decisions: dict[int, StepDecision] = {}
        self._plans: dict[tuple, StepPlan] = {}
        self._bucket_ops: dict[tuple, tuple[CollectiveOp, ...]] = {}

    def _decide(self, step: int) -> StepDecision:
        return decide_step(
            step=step,
            config=self.config,
            params=self.params,
            world_size=self.world_size,
            phases=self.phases,
            blocks=self.blocks,
        )

    def slot(self, step: int) -> int:
        """The memo slot of ``step``: -1 for every warm-up step, else ``step mod R`` (steps in one
        slot have the same decision up to the step number)."""
        return -1 if step < self.warmup else step % self.period

    def decision(self, step: int) -> StepDecision:
        """decide_step's decision for ``step`` (memoised per release slot)."""
        slot = self.slot(step)
        rel = step - (0 if slot == -1 else self.warmup)  # steps since the slot's regime began
        if rel < self.period or slot not in self._decisions:
            self._decisions[slot] = self._decide(step)
        elif rel < 2 * self.period:
            again = self._decide(step)
            first = self._decisions[slot]
            if (again.sending_params, [b.param_names for b in again.buckets]) != (
                first.sending_params,
                [b.param_names for b in first.buckets],
            ):
                raise AssertionError(f"decide_step is not periodic in release_period at step {step}")
        d = self._decisions[slot]
        if d.step == step:
            return d
        return dataclasses.replace(d, step=step, release=dataclasses.replace(d.release, step=step))

    def plan(self, step: int, *, ddp_bucket_names: Sequence[Sequence[str]] | None = None) -> StepPlan:
        """The step plan of ``step`` (``ddp_bucket_names``: DDP's buckets, for ``ddp-hook``)."""
        names_key = None if ddp_bucket_names is None else tuple(tuple(b) for b in ddp_bucket_names)
        key = (self.slot(step), names_key)
        plan = self._plans.get(key)
        if plan is None:
            plan = build_step_plan(
                self.decision(step),
                integration=self.integration,
                params=self.params,
                config=self.config,
                world_size=self.world_size,
                ddp_bucket_names=names_key,
            )
            self._plans[key] = plan
        return plan if plan.step == step else dataclasses.replace(plan, step=step)

    def ddp_bucket_ops(self, step: int, *, bucket: int, names: Sequence[str]) -> tuple[CollectiveOp, ...]:
        """The ops of one DDP bucket at ``step`` (``seq`` counted within the bucket)."""
        key = (self.slot(step), bucket, tuple(names))
        ops = self._bucket_ops.get(key)
        if ops is None:
            ops = bucket_ops(
                self.decision(step),
                bucket=bucket,
                names=names,
                infos=self.infos,
                ks=self.k,
                config=self.config,
                world_size=self.world_size,
            )
            self._bucket_ops[key] = ops
        return ops
