"""Framework integrations: DeepSpeed, the Hugging Face Trainer, and (via :mod:`igrt.train.launch`) torchrun.

- :mod:`igrt.integrations.deepspeed`: ZeRO stage 0 with the engine's backward all-reduce turned off
  and the :class:`~igrt.sync.synchronizer.Synchronizer` run inside the optimizer's ``step()``.
- :mod:`igrt.integrations.hf`: a ``TrainerCallback`` that installs the importance DDP comm hook on
  the model the Trainer (Accelerate) wrapped in DDP, and keeps the per-rank state in its checkpoints.
- :mod:`igrt.integrations.peers`: PyTorch's own DDP comm hooks (all-reduce, fp16, PowerSGD), metered,
  as ``igrt bench`` and the evaluation protocol run them beside our policies.

Both read the same options: one mapping with the :class:`~igpolicy.config.PolicyConfig` keys plus
``plan`` (a SyncPlan JSON path), validated strictly by :func:`sync_options` — unknown and removed
keys are ValueErrors that name them. This module imports neither framework.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from igpolicy.config import REMOVED_POLICY_KEYS, PolicyConfig, check_keys
from igpolicy.plan import SyncPlan

__all__ = ["SECTION", "SyncOptions", "sync_options"]

SECTION = "importance_gradient"
PLAN_KEY = "plan"


@dataclass(frozen=True, kw_only=True)
class SyncOptions:
    """A validated options section: the online policy and its plan (None for plan-free policies)."""

    config: PolicyConfig
    plan: SyncPlan | None
    plan_path: Path | None


def sync_options(
    section: Mapping[str, Any] | None, *, where: str = SECTION, base_dir: str | Path | None = None
) -> SyncOptions:
    """Validate an ``importance_gradient`` section and load its plan.

    ``section``: the PolicyConfig keys (``policy``, ``density``, ``release_period``, ...) and
    ``plan``, the path of a SyncPlan JSON file; a relative path is taken from ``base_dir`` (the
    directory of the config file it came from) or the working directory. ``where`` starts every
    error message. Raises ValueError for a missing section, an unknown or removed key (naming it
    and, for a removed one, what replaced it), a bad value, an unreadable plan, or policy
    ``importance`` without a plan.

    >>> sync_options({"policy": "topk", "density": 0.05}).config.density
    0.05
    """
    if section is None:
        raise ValueError(
            f"{where}: missing; add a section like {{'policy': 'importance', 'plan': 'plan.json'}}"
        )
    allowed = {f.name for f in dataclasses.fields(PolicyConfig)} | {PLAN_KEY}
    check_keys(section, allowed=allowed, where=where, removed=REMOVED_POLICY_KEYS)
    config = PolicyConfig.from_dict({k: v for k, v in section.items() if k != PLAN_KEY}, where=where)
    plan_path = None
    plan = None
    if section.get(PLAN_KEY) is not None:
        raw = section[PLAN_KEY]
        if not isinstance(raw, (str, Path)):
            raise ValueError(f"{where}: key 'plan' must be a file path, got {type(raw).__name__}")
        plan_path = Path(raw)
        if not plan_path.is_absolute() and base_dir is not None:
            plan_path = Path(base_dir) / plan_path
        plan = SyncPlan.load(plan_path)
    if config.policy == "importance" and plan is None and not config.online_profiling:
        raise ValueError(
            f"{where}: policy 'importance' needs 'plan' (a SyncPlan JSON file: igsim profile TRACE -o plan.json) "
            "or online profiling ('online_window' and 'replan_every')"
        )
    return SyncOptions(config=config, plan=plan, plan_path=plan_path)
