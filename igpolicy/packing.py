"""Packing payload blocks into buckets (STUB: signatures are the contract; bodies being written)."""

from __future__ import annotations

from collections.abc import Sequence

from igpolicy.vocab import PackingPlan, PayloadBlock

PACKING_METHODS = ("ddp", "round_robin", "lpt", "kk")


def pack(
    blocks: Sequence[PayloadBlock],
    *,
    method: str = "kk",
    num_buckets: int | None = None,
    bucket_cap_bytes: int = 25 * 2**20,
) -> PackingPlan:
    """Pack ``blocks`` into buckets; deterministic (ties broken by block name), every block exactly once.

    - ``ddp``: walk blocks by descending ``order`` (reverse registration, as DDP does), start a new
      bucket when adding a block would pass ``bucket_cap_bytes`` (a block larger than the cap gets a
      bucket of its own). ``num_buckets`` is ignored.
    - ``round_robin``: blocks by descending ``order`` dealt to buckets in turn.
    - ``lpt``: largest block first onto the currently lightest bucket.
    - ``kk``: Karmarkar–Karp largest differencing (multi-way), refined by local search.

    For the balanced methods the bucket count is ``num_buckets`` or ceil(total / bucket_cap_bytes),
    at least 1 and at most len(blocks). Within a bucket, blocks are in descending ``order``.
    Empty ``blocks`` gives a plan with no buckets. Raises ValueError for an unknown method.
    """
    raise NotImplementedError
