"""Hugging Face ``Trainer`` (Accelerate DDP): install the importance comm hook, keep its state in checkpoints.

    from igrt.integrations.hf import install_importance_gradient

    trainer = Trainer(model=model, args=args, train_dataset=dataset)
    sync = install_importance_gradient(trainer, {"policy": "importance", "plan": "plan.json"})
    trainer.train()                       # or trainer.train(resume_from_checkpoint=True)

:class:`ImportanceGradientCallback` holds a reference to the Trainer because callbacks are handed
the unwrapped model, while the hook belongs on the ``DistributedDataParallel`` wrapper Accelerate
builds inside ``train()`` (``trainer.model_wrapped``). Its events:

- ``on_train_begin``: registers :func:`igrt.integrations.ddp_hook.importance_hook` on that DDP wrapper (every
  rank checks that the plan and config agree); when resuming (``state.global_step > 0``) it loads
  this rank's residuals from ``<output_dir>/checkpoint-<global_step>/igsync-rank{r:03d}.pt`` (or
  from ``resume_from``) and raises ValueError if they are missing — never a silent reset.
- ``on_pre_optimizer_step`` (after the Trainer clipped the already-synchronized gradient):
  parameters that sent nothing get ``grad = None`` and one StepMetrics row is logged (``sync.log``).
- the Trainer's own logs (``trainer.log``: ``log_history``, the console, TensorBoard / W&B / any
  ``report_to``) gain, on every training log line, this rank's figures since the previous one:
  ``ig_wire_bytes`` (mean bytes on the wire per step), ``ig_density`` (entries sent over the
  model's entries, per step), ``ig_low_release_steps`` (steps that released low-importance
  components), ``ig_low_bytes`` (their mean bytes per step) and ``ig_skipped_steps`` (non-finite
  steps skipped) — see :meth:`ImportanceGradientCallback.log_figures`.
- ``on_save``: writes this rank's sync state into the checkpoint folder the Trainer just wrote
  (rotation of old checkpoints removes it with them).
- ``on_train_end``: with ``flush_at_end`` (default) sends every residual and applies it with one
  more optimizer step, so no gradient mass is left behind.

Refused with a ValueError: the Trainer's DeepSpeed or FSDP modes (use
:mod:`igrt.integrations.deepspeed`; FSDP shards gradients itself), a model that is not wrapped in
DDP in a multi-process run, another comm hook already registered, and ``flush_at_end`` together
with ``load_best_model_at_end`` (the flush would apply the last run's residuals to another model).
A single-process run has nothing to synchronize: the callback then does nothing and says so.
To record a gradient trace instead, add :class:`igrt.integrations.hf_callback.TraceRecorderCallback`.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from transformers import TrainerCallback

from igpolicy.vocab import StepMetrics
from igpolicy.wire import dense_value_bytes
from igrt.integrations import SECTION, SyncOptions, sync_options
from igrt.integrations.ddp_hook import ImportanceHookState, importance_hook
from igrt.sync.checkpoint import load_sync_state, save_sync_state

__all__ = ["ImportanceGradientCallback", "install_importance_gradient"]


def checkpoint_dir(args: Any, global_step: int) -> Path:
    """The folder the Trainer writes the checkpoint of ``global_step`` into."""
    return Path(args.output_dir) / f"checkpoint-{int(global_step)}"


class ImportanceGradientCallback(TrainerCallback):
    """Importance-aware sparse sync for a ``Trainer`` run (see the module docstring).

    ``options``: the ``importance_gradient`` section (PolicyConfig keys and ``plan``, a SyncPlan JSON
    path), validated strictly; or a :class:`~igrt.integrations.SyncOptions`. ``resume_from``: the
    checkpoint folder to read residuals from when resuming (default: the Trainer's own
    ``checkpoint-<global_step>`` under ``output_dir``). ``track_sums``: fp64 sums for the
    conservation audit (tests). ``hook_state`` is available once training began.
    """

    def __init__(
        self,
        trainer: Any,
        options: Mapping[str, Any] | SyncOptions,
        *,
        resume_from: str | Path | None = None,
        flush_at_end: bool = True,
        track_sums: bool = False,
    ) -> None:
        self.trainer = trainer
        self.options = options if isinstance(options, SyncOptions) else sync_options(options, where=SECTION)
        self.resume_from = Path(resume_from) if resume_from is not None else None
        self.flush_at_end = bool(flush_at_end)
        self.track_sums = bool(track_sums)
        self.hook_state: ImportanceHookState | None = None
        self._ddp: torch.nn.Module | None = None
        self.loaded_from: Path | None = None
        self._logged_rows = 0  # rows of sync.log already reported in the Trainer's logs

    # ------------------------------------------------------------------ set-up
    def _wrapped_ddp(self, args: Any) -> torch.nn.parallel.DistributedDataParallel | None:
        trainer = self.trainer
        if getattr(trainer, "is_deepspeed_enabled", False):
            raise ValueError(
                f"{SECTION}: the Trainer's DeepSpeed mode is not supported by the DDP hook; use "
                "igrt.integrations.deepspeed.initialize with ZeRO stage 0 in your own loop"
            )
        if getattr(trainer, "is_fsdp_enabled", False):
            raise ValueError(f"{SECTION}: FSDP shards and reduces gradients itself; use DDP")
        if self.flush_at_end and getattr(args, "load_best_model_at_end", False):
            raise ValueError(
                f"{SECTION}: flush_at_end=True with load_best_model_at_end=True would apply the last "
                "run's residuals to the best checkpoint's model; pass flush_at_end=False"
            )
        wrapped = trainer.model_wrapped
        if isinstance(wrapped, torch.nn.parallel.DistributedDataParallel):
            return wrapped
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        if world > 1:
            raise ValueError(
                f"{SECTION}: {world} processes but the Trainer's model is a {type(wrapped).__name__}, "
                "not DistributedDataParallel; launch with torchrun and plain DDP"
            )
        return None

    def on_train_begin(self, args, state, control, **kwargs):
        ddp = self._wrapped_ddp(args)
        if ddp is None:
            warnings.warn(
                f"{SECTION}: a single process has nothing to synchronize; training runs unchanged",
                stacklevel=2,
            )
            return control
        if self.hook_state is None or self._ddp is not ddp:
            hook_state = ImportanceHookState(
                ddp, config=self.options.config, plan=self.options.plan, track_sums=self.track_sums
            )
            try:
                ddp.register_comm_hook(hook_state, importance_hook)
            except RuntimeError as e:
                raise ValueError(f"{SECTION}: cannot register the importance comm hook ({e})") from None
            self.hook_state, self._ddp = hook_state, ddp
            if hook_state.config.catch_up:  # hooks on the torch optimizer inside Accelerate's wrapper
                optimizer = kwargs.get("optimizer")
                if optimizer is None:
                    raise ValueError(f"{SECTION}: catch_up needs the Trainer's optimizer; none was passed")
                hook_state.sync.attach_optimizer(getattr(optimizer, "optimizer", optimizer))
        if state.global_step > 0:
            self._resume(args, state.global_step)
        self._wrap_trainer_log()
        return control

    # ------------------------------------------------------------------ the Trainer's logs
    def _wrap_trainer_log(self) -> None:
        """Make ``trainer.log`` add :meth:`log_figures` to training log lines, before the Trainer
        appends them to ``log_history`` and hands them to every callback (its reporters run before
        a user's callback, so adding in ``on_log`` would reach none of them)."""
        trainer = self.trainer
        if getattr(trainer.log, "_ig_wrapped", False):
            return
        original = trainer.log

        def log(logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
            if "loss" in logs:  # a training line, not an evaluation's
                logs.update(self.log_figures())
            return original(logs, *args, **kwargs)

        log._ig_wrapped = True  # type: ignore[attr-defined]
        trainer.log = log

    def log_figures(self) -> dict[str, float]:
        """This rank's figures over the steps since the last call (empty when there were none)."""
        if self.hook_state is None:
            return {}
        sync = self.hook_state.sync
        rows = list(sync.log)[self._logged_rows :]
        self._logged_rows += len(rows)
        if not rows:
            return {}
        vb = max(int(sync.config.value_bytes), 1)
        dvb = dense_value_bytes(vb)
        numel = max(sum(p.numel() for p in sync.params.values()), 1)
        n = len(rows)
        sent = [r.values_bytes / vb + r.dense_bytes / dvb for r in rows]
        return {
            "ig_wire_bytes": sum(r.wire_bytes for r in rows) / n,
            "ig_density": sum(sent) / n / numel,
            "ig_low_release_steps": float(sum(1 for r in rows if r.low_bytes > 0)),
            "ig_low_bytes": sum(r.low_bytes for r in rows) / n,
            "ig_skipped_steps": float(sum(1 for r in rows if r.extra.get("nonfinite_skipped", 0.0))),
        }

    def _resume(self, args: Any, global_step: int) -> None:
        assert self.hook_state is not None
        directory = self.resume_from or checkpoint_dir(args, global_step)
        try:
            self.loaded_from = load_sync_state(self.hook_state, directory, rank=self.hook_state.sync.rank)
        except ValueError as e:
            raise ValueError(
                f"{SECTION}: resuming at step {global_step} needs this rank's residuals: {e}; "
                "pass resume_from=<checkpoint folder> if it is not under output_dir"
            ) from None
        loaded_step = self.hook_state.sync.step_index
        if loaded_step != global_step:
            raise ValueError(
                f"{SECTION}: {self.loaded_from} holds the sync state of step {loaded_step}, "
                f"but the Trainer resumes at step {global_step}"
            )

    # ------------------------------------------------------------------ per step
    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if self.hook_state is not None:
            self.hook_state.finish_step()
        return control

    def on_save(self, args, state, control, **kwargs):
        if self.hook_state is not None:
            save_sync_state(
                self.hook_state, checkpoint_dir(args, state.global_step), rank=self.hook_state.sync.rank
            )
        return control

    def on_train_end(self, args, state, control, optimizer=None, **kwargs):
        if self.hook_state is None or not self.flush_at_end:
            return control
        if optimizer is None:
            raise ValueError(f"{SECTION}: the Trainer passed no optimizer to on_train_end; cannot flush")
        self.hook_state.sync.flush()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return control

    # ------------------------------------------------------------------ views
    @property
    def metrics(self) -> list[StepMetrics]:
        """Every StepMetrics row of this run (empty before training)."""
        return list(self.hook_state.sync.log) if self.hook_state is not None else []


def install_importance_gradient(
    trainer: Any, options: Mapping[str, Any] | SyncOptions, **kwargs: Any
) -> ImportanceGradientCallback:
    """Add an :class:`ImportanceGradientCallback` to ``trainer`` and return it (keyword arguments as its)."""
    callback = ImportanceGradientCallback(trainer, options, **kwargs)
    trainer.add_callback(callback)
    return callback
