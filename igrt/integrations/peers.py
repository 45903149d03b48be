"""PyTorch's own DDP communication hooks, metered: what a user would pick instead of ours.

``igrt bench`` runs them beside our policies and ``experiments.protocol`` trains with PowerSGD
as a control; both register them here (:func:`register_peer`) and count what the hooks hand to
``torch.distributed.all_reduce`` with :class:`CollectiveMeter`.
"""

from __future__ import annotations

import contextlib
import threading
import time

__all__ = ["POWERSGD_START_ITER", "CollectiveMeter", "register_peer"]

POWERSGD_START_ITER = 2  # PyTorch's minimum with error feedback / warm start


class CollectiveMeter:
    """What DDP comm hooks hand to collectives, and how long their own work takes.

    :meth:`counting` wraps ``torch.distributed.all_reduce`` (the one collective PyTorch's hooks
    call; from the hook or from its future callbacks, on any thread) while it is active: every
    call adds its tensor's bytes and, once its future completes, its time in flight.
    :meth:`hook` wraps a hook: the time from each call to the end of its future chain. ``own_s``
    is their difference: compression, decompression and copies, without the wire.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.bytes = 0
            self.num_collectives = 0
            self.chain_s = 0.0
            self.comm_s = 0.0

    @property
    def own_s(self) -> float:
        return max(0.0, self.chain_s - self.comm_s)

    def _add(self, **amounts: float) -> None:
        with self._lock:
            for k, v in amounts.items():
                setattr(self, k, getattr(self, k) + v)

    def hook(self, hook):
        """``hook`` timed from its call to the end of the future chain it returns."""

        def metered(state, bucket):
            t0 = time.perf_counter()

            def chain_done(fut):
                self._add(chain_s=time.perf_counter() - t0)
                return fut.value()

            return hook(state, bucket).then(chain_done)

        return metered

    @contextlib.contextmanager
    def counting(self):
        """``torch.distributed.all_reduce`` counted while inside (restored on exit)."""
        import torch.distributed as dist

        original = dist.all_reduce

        def all_reduce(tensor, *args, **kwargs):
            t0 = time.perf_counter()
            work = original(tensor, *args, **kwargs)
            self._add(bytes=tensor.numel() * tensor.element_size(), num_collectives=1)
            if work is None:  # a blocking call
                self._add(comm_s=time.perf_counter() - t0)
            else:
                work.get_future().then(lambda _fut: self._add(comm_s=time.perf_counter() - t0))
            return work

        dist.all_reduce = all_reduce
        try:
            yield self
        finally:
            dist.all_reduce = original


def register_peer(ddp, method: str, meter: CollectiveMeter) -> None:
    """Register PyTorch's own comm hook ``method`` (allreduce, fp16, powersgdN) on ``ddp``, metered by
    ``meter``; ``ddp`` is plain DDP (its built-in all-reduce, nothing registered) for any other name."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

    if method == "allreduce":
        ddp.register_comm_hook(None, meter.hook(default_hooks.allreduce_hook))
    elif method == "fp16":
        ddp.register_comm_hook(None, meter.hook(default_hooks.fp16_compress_hook))
    elif method.startswith("powersgd"):
        state = psgd.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=int(method.removeprefix("powersgd")),
            start_powerSGD_iter=POWERSGD_START_ITER,
        )
        ddp.register_comm_hook(state, meter.hook(psgd.powerSGD_hook))
