"""Size limits of the command-line inputs: each one a constant here, checked at the edge.

A small input can ask for a huge amount of work: ``--ranks 1000000`` builds a million-node graph,
``--steps 10**7`` simulates for hours, ``--workers 100000`` forks a hundred thousand processes,
``--release-period 10**9`` allocates one list entry per release phase. Every such count is bounded
here, and a value above its bound is a ``ValueError`` that names the flag (or file key), the value
and the limit, raised before any work starts. The limits are far above any real use (see
docs/reliability.md, "Limits"); raise one here if a real cluster needs it.

>>> check_count(8, what="--ranks", limit="MAX_RANKS")
8
>>> check_count(10**6, what="--ranks", limit="MAX_RANKS")
Traceback (most recent call last):
...
ValueError: --ranks 1000000: at most 16,384 (igpolicy.limits.MAX_RANKS)
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "MAX_LOCAL_RANKS",
    "MAX_RANKS",
    "MAX_RELEASE_PERIOD",
    "MAX_SCORE",
    "MAX_SIM_STEPS",
    "MAX_TOPOLOGY_LINKS",
    "MAX_TOPOLOGY_NODES",
    "MAX_TRAIN_STEPS",
    "MAX_WORKERS",
    "check_count",
]

# ranks of one simulated cluster (star, ring, two_level, leaf_spine, a topology file, --ranks):
# the largest LLM training clusters in use have ~16k accelerators; validating a topology is
# O(ranks) and a flow-level collective O(ranks^2) messages
MAX_RANKS = 16_384
# nodes of any kind (ranks, switches, NICs) and links of one topology
MAX_TOPOLOGY_NODES = 65_536
MAX_TOPOLOGY_LINKS = 262_144
# simulated steps per run (igsim simulate, sweep): 100,000 steps take ~30 s and ~200 MiB
MAX_SIM_STEPS = 100_000
# optimizer steps of one igrt run (train, record, bench): every step's metrics row stays in memory
MAX_TRAIN_STEPS = 1_000_000
# worker processes of one sweep (igsim sweep, demo)
MAX_WORKERS = 64
# processes one igrt command spawns on this machine (--nproc)
MAX_LOCAL_RANKS = 128
# R, the release period: the phases are packed into R groups, one list entry each (checked by
# PolicyConfig and SyncPlan themselves, so a config or plan file is refused however it is read)
MAX_RELEASE_PERIOD = 10_000
# |score| of a plan's component: scores are summed and ratioed when a plan is profiled, compared
# and shown; far below the largest float (1.8e308), so no sum of them overflows to inf
MAX_SCORE = 1e300


def check_count(value: Any, *, what: str, limit: str, minimum: int = 1) -> int:
    """``value`` as an int in [minimum, the limit named ``limit``] (e.g. ``"MAX_RANKS"``).

    Raises ValueError naming ``what`` (a flag or a file key), the value and the limit.
    """
    bound = int(globals()[limit])
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} {value!r}: must be an integer")
    if value < minimum:
        raise ValueError(f"{what} {value}: must be >= {minimum}")
    if value > bound:
        raise ValueError(f"{what} {value}: at most {bound:,} (igpolicy.limits.{limit})")
    return value
