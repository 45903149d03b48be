"""The sync state of one rank: residuals, step counter, planner, executor, flush and checkpoints.

:class:`SyncState` is the one object every integration holds: :class:`igrt.sync.synchronizer.Synchronizer`
adds the after-backward ``step()``, :class:`igrt.integrations.ddp_hook.ImportanceHookState` drives it
from DDP's buckets, and the DeepSpeed optimizer steps a Synchronizer. Adapters use its public
methods (``hold``, ``advance_step``, ``restore_step``, ``record``, ``decide``, ``plan_step``,
``flush``, ``state_dict``); none writes its fields. See the Synchronizer's module docstring for the
per-parameter semantics. With online profiling (``PolicyConfig.replan_every > 0``) ``online`` holds an
:class:`igrt.sync.online.OnlineProfiler` and :meth:`SyncState.apply_plan` switches plans between steps.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from igpolicy.components import mark_fresh
from igpolicy.config import PolicyConfig
from igpolicy.decide import StepDecision, payload_blocks, release_phases
from igpolicy.packing import pack
from igpolicy.plan import SyncPlan
from igpolicy.planner import StepPlanner
from igpolicy.step_plan import StepPlan, flush_plan
from igpolicy.vocab import ParamInfo, PayloadBlock, StepMetrics
from igrt.sync import comm
from igrt.sync.catch_up import CatchUp
from igrt.sync.comm import wire_dtypes
from igrt.sync.executor import Executor, OpRecord, StepRun
from igrt.sync.metrics import MetricsLog, PhaseTimer
from igrt.sync.residuals import ResidualState
from igrt.sync.setup import build_param_infos, default_sparsifier, fingerprint_parts, named_parameters
from igrt.sync.sparsifiers import Sparsifier, sparsifier_state

__all__ = ["STATE_FORMAT", "SyncState"]

STATE_FORMAT = "igsync/1"


def _set_grad(p: torch.Tensor, flat: torch.Tensor | None, *, skip_unsent: bool) -> None:
    if flat is None:
        if skip_unsent:
            p.grad = None
        elif p.grad is None:
            p.grad = torch.zeros_like(p)
        else:
            p.grad.zero_()
        return
    g = flat.view(p.shape)
    if p.grad is not None and p.grad.shape == p.shape and p.grad.dtype == p.dtype:
        p.grad.copy_(g)
    else:
        p.grad = g.to(p.dtype, copy=True)


# --------------------------------------------------------------------------- the synchronizer
class SyncState:
    """One rank's sync state for one model: residuals, the step counter, the planner and executor,
    catch-up bookkeeping, flush and checkpoints — what every integration adapts (the Synchronizer
    after backward, the DDP hook, the DeepSpeed optimizer), through its public methods only.

    ``param_infos`` overrides the name → component mapping (default:
    :func:`igpolicy.components.param_infos`). ``track_sums`` keeps fp64 running sums for the
    conservation check (tests, audits). ``sync_cuda_timing`` synchronizes the device at phase
    boundaries so phase times are device times.
    """

    supports_online = False  # online profiling measures in Synchronizer.step (the DDP hook does not)

    def __init__(
        self,
        model_or_named_params: Any,
        *,
        config: PolicyConfig,
        plan: SyncPlan | None,
        group: dist.ProcessGroup | None = None,
        sparsifier: Sparsifier | None = None,
        param_infos: Sequence[ParamInfo] | None = None,
        track_sums: bool = False,
        sync_cuda_timing: bool = True,
    ) -> None:
        named = named_parameters(model_or_named_params)
        if not named:
            raise ValueError("Synchronizer: the model has no parameters that require grad")
        self.params: dict[str, torch.nn.Parameter] = dict(named)
        if param_infos is not None:
            infos = mark_fresh(list(param_infos), config.fresh_patterns)
        else:
            infos = build_param_infos(named, fresh=config.fresh_patterns)
        if [i.name for i in infos] != [n for n, _ in named] and sorted(i.name for i in infos) != sorted(
            self.params
        ):
            raise ValueError("Synchronizer: param_infos do not name the model's trainable parameters")
        self.infos = infos
        self.config = config
        self.group = group
        self.world_size = comm.world_size(group)
        self.rank = dist.get_rank(group) if self.world_size > 1 or dist.is_initialized() else 0
        self.device = next(iter(self.params.values())).device
        self.blocks: list[PayloadBlock] = payload_blocks(infos, config)
        if config.online_profiling:
            if not self.supports_online:
                raise ValueError(
                    f"online profiling (replan_every={config.replan_every}) runs in the after-backward "
                    "Synchronizer (integrations sync and deepspeed), not in the DDP hook"
                )
            if plan is None:  # before the first re-plan: every component sends every step
                from igrt.sync.online import initial_plan

                plan = initial_plan(self)
        self.plan = plan
        try:  # a plan that does not fit the model must fail on every rank, not hang the others
            self.phases = release_phases(plan=plan, config=config, component_keys=[i.component for i in infos])
            plan_error: ValueError | None = None
        except ValueError as e:
            self.phases, plan_error = {}, e
        self.sparsifier = sparsifier if sparsifier is not None else default_sparsifier(config)
        self.index_dtype, self.value_dtype = wire_dtypes(config)
        self.residuals = ResidualState(track_sums=track_sums)
        self.planner = StepPlanner(config=config, params=infos, world_size=self.world_size, phases=self.phases)
        self.executor = Executor(self)
        self.keep_op_log = False  # set True to keep every executed op (replays, agreement tests)
        self.op_log: list[OpRecord] = []  # this rank's executed ops, in order, when keep_op_log
        self.last_run: StepRun | None = None  # the last recorded step's execution
        self.component = {i.name: i.component for i in infos}
        self.step_index = 0
        self.last_sent: dict[str, int] = {i.name: -1 for i in infos}  # step of each param's last gradient
        self._scales: dict[str, int] = {}  # steps carried by the gradients now in p.grad
        self._catch_up: CatchUp | None = None
        self.log = MetricsLog()
        self.sync_cuda_timing = sync_cuda_timing and self.device.type == "cuda"
        self.fingerprint = fingerprint_parts(
            plan=plan, config=config, infos=infos, sparsifier=self.sparsifier
        )
        try:
            self._check_agreement(plan_fits="no" if plan_error else "yes")
        except ValueError as e:
            raise ValueError(f"{e}; {plan_error}" if plan_error else str(e)) from None
        if plan_error is not None:
            raise plan_error
        self.online = None
        if config.online_profiling:
            from igrt.sync.online import OnlineProfiler

            self.online = OnlineProfiler(self)

    def apply_plan(self, plan: SyncPlan) -> None:
        """Follow ``plan`` from the next step on (online re-plans): new release phases and planner;
        residuals, the step counter and catch-up's last steps are untouched, so nothing held is lost."""
        keys = [i.component for i in self.infos]
        self.phases = release_phases(plan=plan, config=self.config, component_keys=keys)
        self.planner = StepPlanner(config=self.config, params=self.infos, world_size=self.world_size, phases=self.phases)
        self.plan = plan

    # ------------------------------------------------------------------ start-up
    def _check_agreement(self, *, plan_fits: str = "yes") -> None:
        """All-gather the fingerprint (and whether the plan fits this rank's model); raise ValueError
        on every rank naming what differs."""
        comm.check_agreement(
            {**self.fingerprint, "plan_fits_model": plan_fits},
            group=self.group,
            device=self.device,
            who=f"Synchronizer (rank {self.rank})",
        )

    # ------------------------------------------------------------------ catch-up
    def attach_optimizer(self, optimizer: torch.optim.Optimizer) -> CatchUp | None:
        """With ``config.catch_up``, hook ``optimizer`` so each update is scaled by the steps its
        gradient carries (:mod:`igrt.sync.catch_up`); without it, nothing. Call once."""
        if not self.config.catch_up:
            return None
        if self._catch_up is not None:
            raise RuntimeError("Synchronizer.attach_optimizer: already attached")
        self._catch_up = CatchUp(self.params, self.update_scales).attach(optimizer)
        return self._catch_up

    def update_scales(self) -> dict[str, int]:
        """Parameter name -> steps carried by the gradient the last :meth:`step` / :meth:`flush`
        gave it (1 = it sent on the previous step too); parameters without a gradient are absent."""
        return dict(self._scales)

    def note_sent(self, names: Iterable[str], step: int, *, scale: bool = True) -> None:
        """Record that ``names`` got a gradient applied at ``step`` (sets :meth:`update_scales`;
        ``scale=False``: every scale is 1, as for the flush, which catch-up never rescales)."""
        self._check_attached()
        self._scales = {}
        for n in names:
            self._scales[n] = max(1, step - self.last_sent[n]) if scale else 1
            self.last_sent[n] = step

    def _check_attached(self) -> None:
        if self.config.catch_up and self._catch_up is None:
            raise RuntimeError(
                "catch_up=True: call attach_optimizer(optimizer) before the first step, "
                "or the optimizer's updates are not scaled"
            )

    # ------------------------------------------------------------------ the step counter
    def advance_step(self) -> int:
        """Count one finished step (the DDP hook calls it when DDP's last bucket is launched)."""
        self.step_index += 1
        return self.step_index

    def restore_step(self, step: int) -> None:
        """Continue the schedule at ``step`` with flushed residuals (a checkpoint that flushed)."""
        if not self.residuals.is_zero():
            raise ValueError("restore_step: residuals hold gradient; load the per-rank sync state instead")
        self.step_index = int(step)

    def drop_residuals(self, names: Iterable[str]) -> None:
        """Zero the residuals of ``names``: their held gradient is DROPPED. For ablations only
        (``igrt train``'s ``drop_held_residuals``); it breaks Σg == Σsent on purpose."""
        for name in names:
            e = self.residuals.get(name)
            if e is not None:
                e.zero_()

    def hold(self, name: str, grad: torch.Tensor | None) -> None:
        """Keep ``grad`` of a parameter that does not send this step in its residual (``e = g + e``)."""
        self.residuals.hold(name, self.residuals.accumulate(name, grad, like=self.params[name]))

    # ------------------------------------------------------------------ one step
    def decide(self, step: int | None = None) -> StepDecision:
        """The decision for ``step`` (default: the next one), as the simulator would take it."""
        return self.planner.decision(self.step_index if step is None else step)

    def plan_step(self, step: int | None = None) -> StepPlan:
        """The step plan of ``step`` (default: the next one) for the after-backward integration."""
        return self.planner.plan(self.step_index if step is None else step)

    def _record(self, run: StepRun, *, compute_s: float = 0.0, extra: Mapping[str, float] | None = None) -> StepMetrics:
        sync_s = time.perf_counter() - run.t0
        comm_s = run.timer.get("comm")
        plan = run.plan
        row = run.metrics(
            rank=self.rank,
            policy=self.config.policy,
            comm_s=comm_s,
            exposed_comm_s=comm_s,  # blocking after backward: all of it is exposed
            step_s=float(compute_s) + sync_s,  # compute (when given) then this blocking sync
            compute_s=compute_s,
            num_sending_components=plan.num_sending_components if plan is not None else 0,
            bucket_imbalance=plan.bucket_imbalance if plan is not None else 1.0,
            residual_norm=self.residuals.total_norm(),
            extra={"sync_s": sync_s, **run.nonfinite_extra(), **(extra or {})},
        )
        return self.record(row, run)

    def record(self, row: StepMetrics, run: StepRun) -> StepMetrics:
        """Log a finished step's row and its executed ops (adapters call it once per step)."""
        self.log.append(row)
        self.last_run = run
        if self.keep_op_log:
            self.op_log.extend(run.records)
        return row

    # ------------------------------------------------------------------ flush
    def flush(self) -> StepMetrics:
        """Send every residual (fp32, dense all-reduce per bucket); ``p.grad`` = the rank average.

        Call after the last :meth:`step` and its optimizer step, then step the optimizer once more.
        Whatever ``p.grad`` held is overwritten; parameters whose average is all zero get
        ``grad = None`` under ``skip_unsent``. Residuals are zero afterwards (Σg == Σsent). Does not
        advance the step counter. Every rank must call it. Its ops are :func:`igpolicy.step_plan.flush_plan`'s.
        Catch-up (``config.catch_up``) does not rescale the flush's update (every scale is 1).
        """
        self._check_attached()
        run = StepRun(step=self.step_index, timer=PhaseTimer(sync_cuda=self.sync_cuda_timing), count_low=False)
        blocks = [
            PayloadBlock(name=i.name, component=i.component, size_bytes=4 * i.numel, order=i.order)
            for i in self.infos
        ]
        packing = pack(blocks, method=self.config.packing, bucket_cap_bytes=self.config.bucket_cap_bytes)
        ops = flush_plan([b.block_names for b in packing.buckets], params=self.infos)
        flusher = Executor(self, value_dtype=torch.float32)
        for op in ops:
            flusher.run_plan(_single(op, self.step_index), lambda n: None, run)
        results: dict[str, torch.Tensor | None] = {
            n: g if bool(torch.any(g != 0)) or not self.config.skip_unsent else None
            for n, g in run.results.items()
        }
        with run.timer.phase("scatter"):
            for name, p in self.params.items():
                _set_grad(p, results.get(name), skip_unsent=self.config.skip_unsent)
        # the flush's update is never rescaled: it carries what was held, not a release on its phase
        self.note_sent([n for n in self.params if results.get(n) is not None], self.step_index - 1, scale=False)
        return self._record(run, extra={"flush": 1.0})

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Residuals (CPU), step, world size, rank, fingerprints and the sparsifier's seed state."""
        return {
            "format": STATE_FORMAT,
            "step": self.step_index,
            "rank": self.rank,
            "world_size": self.world_size,
            "fingerprint": dict(self.fingerprint),
            "config": self.config.to_dict(),
            "sparsifier": sparsifier_state(self.sparsifier),
            "flushed": self.residuals.is_zero(),
            "residuals": self.residuals.state_dict(),
            "last_sent": dict(self.last_sent),
            **({"online": self.online.state_dict()} if self.online is not None else {}),
        }

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        """Restore a :meth:`state_dict`; ValueError naming any mismatch (plan, config, params, world size)."""
        if not isinstance(sd, Mapping) or sd.get("format") != STATE_FORMAT:
            raise ValueError(
                f"sync state: not a {STATE_FORMAT} state (format={sd.get('format') if isinstance(sd, Mapping) else None!r})"
            )
        saved = sd["fingerprint"]
        diffs = [
            f"{k}: saved {saved.get(k)!r}, now {v!r}"
            for k, v in self.fingerprint.items()
            if saved.get(k) != v
        ]
        if diffs:
            raise ValueError("sync state does not match this run: " + "; ".join(diffs))
        if sd["world_size"] != self.world_size:
            if not sd["flushed"]:
                raise ValueError(
                    f"sync state was saved at world size {sd['world_size']} with unflushed residuals; "
                    f"resuming at world size {self.world_size} needs a flush() before the checkpoint"
                )
        elif sd["rank"] != self.rank:
            raise ValueError(f"sync state of rank {sd['rank']} loaded on rank {self.rank}")
        self.residuals.load_state_dict(sd["residuals"], device=self.device)
        if sd["world_size"] != self.world_size:
            self.residuals.zero_()
        self.step_index = int(sd["step"])
        # absent (states written before catch-up existed) or flushed for a new world size: as if every
        # parameter had just stepped (scale 1)
        saved_last = sd.get("last_sent") or {} if sd["world_size"] == self.world_size else {}
        self.last_sent = {n: int(saved_last.get(n, self.step_index - 1)) for n in self.last_sent}
        if self.online is not None:
            if "online" not in sd:
                raise ValueError("sync state has no online-profiling state (saved by a run without it)")
            self.online.load_state_dict(sd["online"], same_world=sd["world_size"] == self.world_size)

    def parameters(self) -> Iterable[tuple[str, torch.nn.Parameter]]:
        return self.params.items()


def _single(op, step: int) -> StepPlan:
    """A one-op after-backward plan (the flush runs its dense all-reduces one at a time)."""
    return StepPlan(
        step=step, integration="sync", ops=(op,), sending_params=frozenset(op.param_names),
        num_sending_components=0, bucket_imbalance=1.0,
    )  # fmt: skip
