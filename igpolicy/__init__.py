"""igpolicy: the pure policy core shared by the simulator (igsim) and the runtime (igrt).

numpy/scipy only. Every decision here is a pure function of (step, plan, config, payload sizes), so all
ranks — and the simulator — compute the same schedule without talking.
"""

from igpolicy.vocab import (
    Bucket,
    CollectiveKind,
    ComponentClass,
    ComponentId,
    ComponentKind,
    PackingPlan,
    ParamInfo,
    PayloadBlock,
    ReleaseDecision,
    StepMetrics,
    StepView,
)

__all__ = [
    "Bucket",
    "CollectiveKind",
    "ComponentClass",
    "ComponentId",
    "ComponentKind",
    "PackingPlan",
    "ParamInfo",
    "PayloadBlock",
    "ReleaseDecision",
    "StepMetrics",
    "StepView",
]
__version__ = "0.1.0"
