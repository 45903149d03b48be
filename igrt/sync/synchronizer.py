"""The Synchronizer: importance-aware sparse gradient synchronization after backward.

Use it instead of DDP's all-reduce (a plain module, no DDP wrapper)::

    sync = Synchronizer(model, config=PolicyConfig(policy="importance"), plan=SyncPlan.load(path))
    for batch in loader:
        loss(model, batch).backward()        # local gradients (accumulate micro-batches freely)
        metrics = sync.step()                # the accumulation boundary: sync, p.grad = average
        optimizer.step(); optimizer.zero_grad(set_to_none=True)
    sync.flush(); optimizer.step()           # send what the residuals still hold

Per step every decision — which components send, how payloads are packed into buckets, sparse
gather or dense all-reduce per bucket — comes from :func:`igpolicy.decide.decide_step`, the function
the simulator calls. Per parameter: ``u = g + e`` (fp32); a sending parameter selects ``S`` from ``u``
by magnitude (k = nominal k of its kind's density), ``e = u`` with ``S`` zeroed; a holding one keeps
``e = u``. Each bucket is one collective: concatenated int32 indices (positions in the bucket) and
values padded to the largest rank's count, or the zero-filled dense bucket; the pair counts of all
sparse buckets travel first, in one int64 all-gather per step (8 metadata bytes per bucket). The synchronized gradient is the average over ranks; a
parameter that sent nothing gets ``p.grad = None`` (``config.skip_unsent``; else zeros) so the
optimizer skips it: no stale momentum, no weight decay. With ``config.catch_up`` the optimizer's
update of a parameter is scaled by the steps its gradient carries (:mod:`igrt.sync.catch_up`; call
:meth:`Synchronizer.attach_optimizer` once).

Values travel in fp32 (``value_bytes=4``), bf16 (``value_bytes=2``) or int8 with one fp32 scale per
payload (``value_bytes=1``; dense ops then travel in bf16); the rounding error stays in the residual
(:mod:`igpolicy.wire`). At start-up every rank all-gathers a fingerprint of plan, config, parameters and sparsifier
and raises ValueError on every rank when they differ.

With online profiling (``PolicyConfig.replan_every > 0``, :mod:`igrt.sync.online`) ``step()`` also
measures the raw local gradients at the window's steps, before any residual is added, and after a
step that ends a re-plan period it reduces the window, agrees on the new plan and follows it from
the next step; the reduction's bytes are in that step's ``metadata_bytes``. No plan is needed then::

    sync = Synchronizer(model, config=PolicyConfig(online_window=20, replan_every=20), plan=None)
"""

from __future__ import annotations

import torch

from igpolicy.vocab import StepMetrics
from igrt.sync.executor import StepRun
from igrt.sync.metrics import PhaseTimer
from igrt.sync.setup import build_param_infos, default_sparsifier, fingerprint_parts, named_parameters
from igrt.sync.state import STATE_FORMAT, SyncState, _set_grad

__all__ = [
    "STATE_FORMAT",
    "Synchronizer",
    "build_param_infos",
    "default_sparsifier",
    "fingerprint_parts",
    "named_parameters",
]


class Synchronizer(SyncState):
    """Importance-aware sparse synchronization after backward: a :class:`~igrt.sync.state.SyncState`
    with ``step()``, run at the accumulation boundary.

    ``param_infos`` overrides the name → component mapping (default:
    :func:`igpolicy.components.param_infos`). ``track_sums`` keeps fp64 running sums for the
    conservation check (tests, audits). ``sync_cuda_timing`` synchronizes the device at phase
    boundaries so phase times are device times.
    """

    supports_online = True

    def step(self, *, compute_s: float = 0.0) -> StepMetrics:
        """Synchronize the gradients in ``p.grad`` (call at the accumulation boundary, after backward).

        Executes :meth:`plan_step`'s ops with :class:`igrt.sync.executor.Executor`. ``compute_s`` (the
        caller's forward + backward seconds, if measured) is recorded as is; all of this blocking
        step's communication is exposed.
        """
        self._check_attached()
        t = self.step_index
        run = StepRun(step=t, timer=PhaseTimer(sync_cuda=self.sync_cuda_timing))
        with run.timer.phase("decide"):
            plan = run.plan = self.plan_step(t)
        with run.timer.phase("check"):  # one fused NaN / inf check before any residual is touched
            bad = self.executor.screen(list(self.params), lambda n: self.params[n].grad, run)

        def grads(name: str) -> torch.Tensor | None:
            return None if name in bad else self.params[name].grad

        if self.online is not None:
            with run.timer.phase("online"):  # the raw local gradients, before any residual is added
                self.online.observe(t, grads)

        with run.timer.phase("hold"):
            for name in self.params:
                if name not in plan.sending_params:
                    self.hold(name, grads(name))
        self.executor.run_plan(plan, grads, run, poison=bool(bad))
        self.executor.finish_nonfinite(run)  # may raise (nonfinite='error'), on every rank alike
        with run.timer.phase("scatter"):
            for name, p in self.params.items():
                if run.skipped:
                    p.grad = None  # a skipped step applies nothing, whatever skip_unsent says
                else:
                    _set_grad(p, run.results.get(name), skip_unsent=self.config.skip_unsent)
        self.note_sent([n for n in self.params if n in run.results], t)
        self.advance_step()
        extra = self.online.after_step(t, run) if self.online is not None else {}  # re-plan for t + 1
        return self._record(run, compute_s=compute_s, extra=extra)
