"""DeepSpeed (ZeRO stage 0): the engine's all-reduce turned off, our Synchronizer inside ``step()``.

The pattern of DeepSpeed's 1-bit Adam: an optimizer that owns gradient synchronization. The engine
is told not to all-reduce after backward (``engine.enable_backward_allreduce = False``); at each
accumulation boundary the engine calls ``optimizer.step()``, where :class:`ImportanceGradientOptimizer`
runs :meth:`Synchronizer.step` (importance schedule, sparse payloads, residuals), clips the
*synchronized* gradient, then steps the wrapped torch optimizer::

    from igrt.integrations.deepspeed import initialize, load_checkpoint, save_checkpoint

    ds_config = {
        "train_micro_batch_size_per_gpu": 8,
        "gradient_accumulation_steps": 2,
        "gradient_clipping": 1.0,                 # applied after our sync, to the averaged gradient
        "importance_gradient": {"policy": "importance", "plan": "plan.json", "density": 0.01},
    }
    engine, optimizer, _, _ = initialize(model=model, optimizer=torch.optim.AdamW(model.parameters()),
                                         config=ds_config)
    for batch in loader:
        engine.backward(loss_fn(engine, batch))
        engine.step()
    save_checkpoint(engine, "ckpt")               # DeepSpeed's checkpoint + one igsync file per rank
    optimizer.flush()                             # at the end: send what the residuals still hold

Refused at start-up with a ValueError that says why: ZeRO stages 1-3 (their optimizers partition
and reduce gradients themselves, so there is no full local gradient to sparsify and no all-reduce
to turn off), ``fp16`` / ``bf16`` / ``amp`` (DeepSpeed's precision wrappers keep fp32 master copies
and flat gradient buffers outside the model, and fp16 loss scaling skips steps per rank), a
DeepSpeed ``optimizer`` section (pass a torch optimizer object), the all-reduce tuning keys
(``communication_data_type``, ``prescale_gradients``, ``gradient_predivide_factor``: they would be
silently ignored), pipeline modules, model parallelism (``mpu``) and MoE layers.

Per-rank state: DeepSpeed saves the (replicated) optimizer state from data-parallel rank 0 only,
but residuals differ per rank. :func:`save_checkpoint` therefore writes each rank's sync state
beside DeepSpeed's files (``<dir>/<tag>/igsync-rank{r:03d}.pt``, :mod:`igrt.sync.checkpoint`) and
:func:`load_checkpoint` restores it; the optimizer state carries the step and a marker, so a
checkpoint saved or loaded with the engine's own methods alone fails loudly at the next step
instead of silently resetting residuals (unless they were flushed: then nothing is lost).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from igpolicy.config import PolicyConfig
from igpolicy.plan import SyncPlan
from igpolicy.vocab import StepMetrics
from igrt.integrations import SECTION, SyncOptions, sync_options
from igrt.sync.checkpoint import load_sync_state, save_sync_state, sync_state_path
from igrt.sync.synchronizer import Synchronizer

__all__ = [
    "ImportanceGradientOptimizer",
    "initialize",
    "load_checkpoint",
    "prepare_config",
    "save_checkpoint",
]

MARKER_FORMAT = "igsync-deepspeed/1"
_ALLREDUCE_KEYS = {  # key -> the value that means "not set"
    "communication_data_type": None,
    "prescale_gradients": False,
    "gradient_predivide_factor": 1.0,
}


# --------------------------------------------------------------------------- configuration
def _read_config(config: Mapping[str, Any] | str | Path) -> tuple[dict[str, Any], Path | None]:
    if isinstance(config, (str, Path)):
        path = Path(config)
        try:
            return json.loads(path.read_text()), path.parent
        except FileNotFoundError:
            raise ValueError(f"{path}: no such DeepSpeed config file") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(config, Mapping):
        raise ValueError(f"DeepSpeed config: expected a mapping or a JSON path, got {type(config).__name__}")
    return json.loads(json.dumps(config)), None  # a deep copy; the caller's dict is never changed


def _enabled(section: Any) -> bool:
    return isinstance(section, Mapping) and bool(section.get("enabled", False))


def prepare_config(
    config: Mapping[str, Any] | str | Path, *, sync: SyncOptions | None = None
) -> tuple[dict[str, Any], SyncOptions, float]:
    """Split a DeepSpeed config into (config for DeepSpeed, our options, gradient clipping norm).

    Our section (``importance_gradient``) is validated strictly and removed — or, with ``sync``
    (the options as objects, as ``igrt train`` has them), must be absent; ``gradient_clipping``
    is taken over (DeepSpeed would clip each rank's local gradient before our synchronization).
    Raises ValueError naming the key for every unsupported setting (see the module docstring).
    """
    ds_config, base_dir = _read_config(config)
    where = f"DeepSpeed config section {SECTION!r}"
    if sync is None:
        options = sync_options(ds_config.pop(SECTION, None), where=where, base_dir=base_dir)
    elif SECTION in ds_config:
        raise ValueError(f"DeepSpeed config: give the {SECTION!r} section or sync=, not both")
    else:
        options = sync
    zero = ds_config.get("zero_optimization") or {}
    if isinstance(zero, bool):  # DeepSpeed's legacy form: true means ZeRO stage 1
        raise ValueError(
            f"DeepSpeed config: zero_optimization=true (DeepSpeed's legacy form of ZeRO stage 1) is not "
            f"supported with {SECTION}: ZeRO stage 1 partitions the optimizer state and reduces gradients "
            'itself; use "zero_optimization": {"stage": 0} or leave it out'
        )
    if not isinstance(zero, Mapping):
        raise ValueError(f"DeepSpeed config: zero_optimization={zero!r} must be a mapping with a 'stage'")
    stage = int(zero.get("stage", 0))
    if stage != 0:
        raise ValueError(
            f"DeepSpeed config: zero_optimization.stage={stage} is not supported with {SECTION}: "
            f"ZeRO stage {stage} partitions gradients or optimizer state and reduces gradients itself, "
            "so there is no full local gradient to sparsify and no all-reduce to turn off; use stage 0"
        )
    for key in ("fp16", "bf16", "amp"):
        if _enabled(ds_config.get(key)):
            raise ValueError(
                f"DeepSpeed config: {key}.enabled=true is not supported with {SECTION}: DeepSpeed's "
                "mixed-precision optimizer wraps ours with fp32 master copies and flat gradient buffers "
                "(and fp16 loss scaling skips steps per rank); keep the model in fp32"
            )
    if _enabled(ds_config.get("torch_autocast")):
        raise ValueError(
            f"DeepSpeed config: torch_autocast.enabled=true is not supported with {SECTION} "
            "(its fp16 grad scaler unscales and skips steps per rank); keep the model in fp32"
        )
    if ds_config.get("optimizer") is not None:
        raise ValueError(
            f"DeepSpeed config: an 'optimizer' section is not supported with {SECTION}; pass a torch "
            "optimizer object instead (optimizer=torch.optim.AdamW(model.parameters(), lr=...))"
        )
    if ds_config.get("sparse_gradients"):
        raise ValueError(
            f"DeepSpeed config: sparse_gradients={ds_config['sparse_gradients']!r} makes DeepSpeed's own "
            f"all-reduce send embedding gradients sparse, but {SECTION} turns that all-reduce off (it "
            f"would be ignored); remove it (our sparsification: 'sparsifier' and 'density' in {SECTION!r})"
        )
    for key, unset in _ALLREDUCE_KEYS.items():
        if key in ds_config and ds_config[key] != unset:
            raise ValueError(
                f"DeepSpeed config: {key}={ds_config[key]!r} tunes DeepSpeed's own all-reduce, which "
                f"{SECTION} turns off (it would be ignored); remove it (wire precision: 'value_bytes' "
                f"in {SECTION!r})"
            )
    max_grad_norm = float(ds_config.pop("gradient_clipping", 0.0) or 0.0)
    if max_grad_norm < 0:
        raise ValueError(f"DeepSpeed config: gradient_clipping={max_grad_norm} must be >= 0")
    return ds_config, options, max_grad_norm


# --------------------------------------------------------------------------- the optimizer
class ImportanceGradientOptimizer(torch.optim.Optimizer):
    """A torch optimizer whose ``step()`` first synchronizes gradients with a :class:`Synchronizer`.

    Wraps ``optimizer``: ``param_groups``, ``state`` and ``defaults`` are the wrapped optimizer's own
    (an LR scheduler on this object drives it). :meth:`bind` (done by :func:`initialize`) turns off
    the engine's all-reduce and builds the synchronizer on ``engine.module``; ``step()`` then
    syncs (``p.grad`` = rank average, ``None`` for parameters that sent nothing), clips the
    synchronized gradient to ``max_grad_norm`` (0: no clipping) and steps the wrapped optimizer.
    ``last_metrics`` is the newest :class:`StepMetrics` row (all rows: ``sync.log``).
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        *,
        config: PolicyConfig,
        plan: SyncPlan | None,
        max_grad_norm: float = 0.0,
        track_sums: bool = False,
    ) -> None:
        # Optimizer.__init__ is not called: the parameter groups and state stay the wrapped one's.
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ValueError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        self.optimizer = optimizer
        self.config = config
        self.plan = plan
        self.max_grad_norm = float(max_grad_norm)
        self.track_sums = bool(track_sums)
        self.sync: Synchronizer | None = None
        self.last_metrics: StepMetrics | None = None
        self._global_grad_norm: torch.Tensor | None = None  # read by the engine after each step
        self._awaiting_rank_state: dict[str, Any] | None = None
        self._saving_rank_state = False

    # the wrapped optimizer's groups / state / defaults
    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        self.optimizer.param_groups = value

    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.optimizer.state

    @state.setter
    def state(self, value: Any) -> None:
        self.optimizer.state = value

    @property
    def defaults(self) -> dict[str, Any]:  # type: ignore[override]
        return self.optimizer.defaults

    @defaults.setter
    def defaults(self, value: dict[str, Any]) -> None:
        self.optimizer.defaults = value

    def __repr__(self) -> str:
        return f"ImportanceGradientOptimizer(policy={self.config.policy!r}, optimizer={self.optimizer!r})"

    # ------------------------------------------------------------------ binding
    def bind(self, engine: Any) -> None:
        """Turn off ``engine``'s backward all-reduce and build the synchronizer (every rank)."""
        if self.sync is not None:
            raise ValueError("ImportanceGradientOptimizer is already bound to an engine")
        engine.enable_backward_allreduce = False
        self.sync = Synchronizer(
            engine.module, config=self.config, plan=self.plan, track_sums=self.track_sums
        )
        self.sync.attach_optimizer(self.optimizer)  # config.catch_up: scale updates of released params

    def _bound(self) -> Synchronizer:
        if self.sync is None:
            raise ValueError(
                "ImportanceGradientOptimizer is not bound to an engine: build it with "
                "igrt.integrations.deepspeed.initialize(...)"
            )
        return self.sync

    # ------------------------------------------------------------------ stepping
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Synchronize (the accumulation boundary), clip the synchronized gradient, step."""
        if closure is not None:
            raise ValueError("ImportanceGradientOptimizer.step: closures are not supported")
        sync = self._bound()
        if self._awaiting_rank_state is not None:
            raise ValueError(
                "the optimizer state was restored by engine.load_checkpoint, but this rank's residuals "
                "(igsync-rank*.pt beside it) were not: load with "
                "igrt.integrations.deepspeed.load_checkpoint(engine, dir) so no gradient mass is lost"
            )
        self.last_metrics = sync.step()
        self._clip(sync)
        return self.optimizer.step()

    def _clip(self, sync: Synchronizer) -> None:
        grads = [p for p in sync.params.values() if p.grad is not None]
        if self.max_grad_norm > 0 and grads:
            # the averaged gradient is bit-identical on every rank, so is its norm
            self._global_grad_norm = torch.nn.utils.clip_grad_norm_(grads, self.max_grad_norm)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def flush(self) -> StepMetrics:
        """Send every residual and apply it with one more step of the wrapped optimizer.

        Call on every rank after the last ``engine.step()``; afterwards Σg == Σsent on every rank.
        """
        sync = self._bound()
        row = sync.flush()
        self._clip(sync)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.last_metrics = row
        return row

    # ------------------------------------------------------------------ checkpoints
    def _marker(self) -> dict[str, Any]:
        sync = self._bound()
        return {
            "format": MARKER_FORMAT,
            "step": sync.step_index,
            "world_size": sync.world_size,
            "fingerprint": dict(sync.fingerprint),
            "flushed": sync.residuals.is_zero(),
            "rank_files": self._saving_rank_state,
        }

    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's state and a marker (step, fingerprint, whether residuals were flushed)."""
        return {"optimizer": self.optimizer.state_dict(), SECTION: self._marker()}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore the wrapped optimizer; the per-rank residuals must follow (see the module doc)."""
        marker = state_dict.get(SECTION) if isinstance(state_dict, Mapping) else None
        if not isinstance(marker, Mapping) or marker.get("format") != MARKER_FORMAT:
            raise ValueError(
                "optimizer state: not saved by ImportanceGradientOptimizer (no "
                f"{SECTION!r} marker of format {MARKER_FORMAT})"
            )
        sync = self._bound()
        diffs = [
            f"{k}: saved {marker['fingerprint'].get(k)!r}, now {v!r}"
            for k, v in sync.fingerprint.items()
            if marker["fingerprint"].get(k) != v
        ]
        if diffs:
            raise ValueError("optimizer state does not match this run: " + "; ".join(diffs))
        self.optimizer.load_state_dict(state_dict["optimizer"])
        if marker["flushed"]:  # nothing in flight: the step alone restores the schedule
            sync.residuals.zero_()
            sync.restore_step(int(marker["step"]))
            self._awaiting_rank_state = None
        else:
            self._awaiting_rank_state = dict(marker)


# --------------------------------------------------------------------------- entry points
def initialize(
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | Callable[[Iterable[Any]], torch.optim.Optimizer],
    config: Mapping[str, Any] | str | Path,
    model_parameters: Iterable[Any] | None = None,
    track_sums: bool = False,
    sync: SyncOptions | None = None,
    **deepspeed_kwargs: Any,
) -> tuple[Any, ImportanceGradientOptimizer, Any, Any]:
    """``deepspeed.initialize`` with importance-aware sync; returns its (engine, optimizer, loader, scheduler).

    ``config``: a DeepSpeed config (dict or JSON path) with an ``importance_gradient`` section.
    ``optimizer``: a torch optimizer, or a callable building one from ``model_parameters`` (default
    ``model.parameters()``). Other keyword arguments go to ``deepspeed.initialize`` (``mpu`` is
    refused). ``track_sums``: keep fp64 sums for the conservation audit (tests). ``sync``: the
    options as objects instead of an ``importance_gradient`` section (``igrt train``). Raises
    ValueError for every unsupported setting, before any process group work.
    """
    import deepspeed
    from deepspeed.runtime.pipe.module import PipelineModule

    for key in ("args", "config_params"):
        if deepspeed_kwargs.get(key) is not None:
            raise ValueError(f"initialize: pass the DeepSpeed config as config=, not {key}=")
    if deepspeed_kwargs.get("mpu") is not None:
        raise ValueError(
            "initialize: model parallelism (mpu) is not supported: our synchronizer averages over the "
            "whole world, not a data-parallel sub-group"
        )
    if isinstance(model, PipelineModule):
        raise ValueError("initialize: pipeline parallelism (PipelineModule) is not supported")
    ds_config, options, max_grad_norm = prepare_config(config, sync=sync)
    if not isinstance(optimizer, torch.optim.Optimizer):
        if not callable(optimizer):
            raise ValueError(
                f"initialize: optimizer must be a torch optimizer or a callable, got {optimizer!r}"
            )
        optimizer = optimizer(model_parameters if model_parameters is not None else model.parameters())
    wrapped = ImportanceGradientOptimizer(
        optimizer,
        config=options.config,
        plan=options.plan,
        max_grad_norm=max_grad_norm,
        track_sums=track_sums,
    )
    engine, engine_optimizer, loader, scheduler = deepspeed.initialize(
        model=model,
        optimizer=wrapped,
        model_parameters=model_parameters,
        config=ds_config,
        **deepspeed_kwargs,
    )
    if engine.has_moe_layers:
        raise ValueError("initialize: MoE layers are not supported (experts reduce over their own groups)")
    if engine_optimizer is not wrapped or engine.optimizer is not wrapped:
        raise ValueError(
            f"initialize: DeepSpeed wrapped our optimizer in {type(engine.optimizer).__name__}; only "
            "fp32 ZeRO stage 0 is supported"
        )
    wrapped.bind(engine)
    return engine, wrapped, loader, scheduler


def _optimizer_of(engine: Any) -> ImportanceGradientOptimizer:
    opt = getattr(engine, "optimizer", None)
    if not isinstance(opt, ImportanceGradientOptimizer):
        raise ValueError(
            "engine was not built by igrt.integrations.deepspeed.initialize (its optimizer is "
            f"{type(opt).__name__})"
        )
    return opt


def save_checkpoint(
    engine: Any,
    save_dir: str | Path,
    tag: str | None = None,
    client_state: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> bool:
    """``engine.save_checkpoint`` plus this rank's sync state in ``<save_dir>/<tag>/`` (every rank calls it).

    ``tag`` defaults to DeepSpeed's ``global_step<N>``. The rank file is written first, so
    DeepSpeed's ``latest`` never names a checkpoint without it.
    """
    opt = _optimizer_of(engine)
    sync = opt._bound()
    tag = str(tag) if tag is not None else f"global_step{engine.global_steps}"
    save_sync_state(sync, Path(save_dir) / tag, rank=sync.rank)
    opt._saving_rank_state = True
    try:
        return engine.save_checkpoint(str(save_dir), tag=tag, client_state=dict(client_state or {}), **kwargs)
    finally:
        opt._saving_rank_state = False


def load_checkpoint(
    engine: Any, load_dir: str | Path, tag: str | None = None, **kwargs: Any
) -> tuple[str | None, dict[str, Any] | None]:
    """``engine.load_checkpoint`` plus this rank's sync state; returns DeepSpeed's (path, client_state).

    With ``load_optimizer_states=False`` or ``load_module_only=True`` the sync state is not loaded
    either (a fresh optimizer starts with empty residuals). Raises ValueError when the checkpoint
    holds unflushed residuals but no rank files (it was saved with ``engine.save_checkpoint``).
    """
    opt = _optimizer_of(engine)
    sync = opt._bound()
    load_path, client_state = engine.load_checkpoint(str(load_dir), tag=tag, **kwargs)
    if load_path is None:
        return None, None
    if not kwargs.get("load_optimizer_states", True) or kwargs.get("load_module_only", False):
        return load_path, client_state
    directory = Path(load_path).parent
    has_files = sync_state_path(directory, rank=sync.rank).exists() or any(directory.glob("igsync-rank*.pt"))
    if has_files:
        load_sync_state(sync, directory, rank=sync.rank)
    elif opt._awaiting_rank_state is not None:
        raise ValueError(
            f"{directory}: the checkpoint holds unflushed residuals but no igsync-rank*.pt files "
            "(it was saved with engine.save_checkpoint, not igrt.integrations.deepspeed.save_checkpoint); "
            "resuming would drop that gradient mass"
        )
    opt._awaiting_rank_state = None
    return load_path, client_state
