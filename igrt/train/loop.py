"""The training loop: a reference workload on real ranks, its gradients synchronized by a policy.

:func:`train` spawns the ranks (:func:`igrt.train.launch.launch`, torchrun-aware) and runs
:func:`train_on_rank` on each; the bench calls :func:`train_on_rank` itself inside its own ranks.

Per optimizer step ``t`` on every rank: ``grad_accum`` micro-batches of forward + backward (local
gradients accumulate in ``p.grad``), then the synchronization at the accumulation boundary, then
``optimizer.step()`` and ``zero_grad(set_to_none=True)``. Two integrations:

- ``sync``: a plain module; :meth:`igrt.sync.synchronizer.Synchronizer.step` after the last backward
  (blocking: all of its communication is exposed). The dense policy here is plain DDP's average.
- ``ddp-hook``: ``DistributedDataParallel`` with :func:`igrt.integrations.ddp_hook.importance_hook` (overlaps
  communication with backward); micro-batches before the boundary run under ``no_sync()``.

After the last step the model is evaluated (``before_flush``), then the residuals are flushed (one
more optimizer step on the flushed average; its bytes are reported apart from the steps') and it is
evaluated again (``after_flush``, the ``final`` evaluation). With an output directory, rank 0 writes
``metrics.csv`` (every rank's :class:`~igpolicy.vocab.StepMetrics`, ``source="real"``),
``summary.json``, ``eval.json`` and ``model.pt`` (the final, flushed weights); every rank writes its
part of ``checkpoint/`` (see :func:`igrt.train.checkpoint.save_checkpoint`). Resuming from a checkpoint at the same world
size reproduces the uninterrupted run bit for bit on CPU: the checkpoint holds the model, the
optimizer, every rank's sync state and RNG state, and the data streams are replayed to the step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from igpolicy.config import PolicyConfig
from igpolicy.plan import SyncPlan, compare_plans
from igpolicy.step_plan import INTEGRATIONS
from igpolicy.vocab import ParamInfo, StepMetrics
from igrt.sync.metrics import MetricsLog
from igrt.train.checkpoint import barrier as _barrier
from igrt.train.checkpoint import load_checkpoint, save_checkpoint
from traces.schema import RUN_SUMMARY_FORMAT

__all__ = [
    "INTEGRATIONS",
    "RankOutcome",
    "TrainOptions",
    "check_plan",
    "load_checkpoint",
    "preflight",
    "rank_seed",
    "save_checkpoint",
    "step_statistics",
    "train",
    "train_on_rank",
]



@dataclass(frozen=True, kw_only=True)
class TrainOptions:
    """One training run. ``steps`` is the total step count (a resumed run continues to it);
    ``eval_every`` / ``checkpoint_every`` = 0 mean at the end only; ``out`` None writes nothing."""

    workload: str
    config: PolicyConfig
    steps: int
    plan: SyncPlan | None = None
    plan_path: str | None = None
    batch_size: int = 16
    grad_accum: int = 1
    integration: str = "sync"
    tiny: bool = False
    seed: int = 0
    evaluate: bool = True
    eval_every: int = 0
    checkpoint_every: int = 0
    resume: str | None = None
    out: str | None = None
    progress: bool = True
    command: str = ""
    record_trace: bool = False
    ddp_bucket_cap_mb: float | None = None  # ddp-hook: DDP's bucket_cap_mb (None: DDP's default)
    flush: bool = True  # False: no end-of-training flush (speed-only runs whose model is thrown away)
    drop_held_residuals: bool = False  # ablation only: zero the residuals of parameters that held
    spec: Any = None  # an igrt.workloads.WorkloadSpec (--model / --data / --lr / --schedule), or None
    quiet: bool = False  # no status lines on rank 0 (what each slow phase is doing)
    log: tuple[str, ...] = ()  # live logs: "tensorboard", "csv", "jsonl" (igrt.train.logs)

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "grad_accum"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        for name in ("eval_every", "checkpoint_every"):
            if int(getattr(self, name)) < 0:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}")
        if self.integration not in INTEGRATIONS:
            raise ValueError(f"--integration {self.integration!r} is not one of {', '.join(INTEGRATIONS)}")
        if self.config.policy == "importance" and self.plan is None and not self.config.online_profiling:
            raise ValueError(
                "policy 'importance' needs --plan PLAN.json (igsim profile TRACE -o PLAN.json) "
                "or --online-profile"
            )
        if self.config.online_profiling and self.integration == "ddp-hook":
            raise ValueError("--online-profile runs with --integration sync or deepspeed, not ddp-hook")
        from igrt.train.logs import check_log_formats

        check_log_formats(tuple(self.log))


@dataclass(frozen=True, kw_only=True)
class RankOutcome:
    """What one rank ends with; ``rows`` / ``flush_rows`` hold every rank's rows on rank 0 only."""

    rank: int
    start_step: int
    rows: tuple[StepMetrics, ...]
    flush_rows: tuple[StepMetrics, ...]
    evals: tuple[dict[str, Any], ...]
    train_s: float
    op_rows: tuple[dict[str, Any], ...] = ()  # every rank's executed ops (record_trace), rank 0 only
    ddp: dict[str, Any] | None = None  # DDP's bucket caps (ddp-hook)
    plans: tuple[dict[str, Any], ...] = ()  # online profiling: every plan followed (plans.jsonl rows)


def rank_seed(seed: int, rank: int) -> int:
    """The torch RNG seed of ``rank`` (dropout masks differ per rank, as under DDP)."""
    return int(seed) * 1009 + int(rank)


def check_plan(plan: SyncPlan, infos: list[ParamInfo], *, where: str = "SyncPlan") -> None:
    """ValueError naming every component the plan lacks and every one the model lacks."""
    missing, extra = compare_plans(plan, [i.component for i in infos])
    if missing or extra:
        raise ValueError(
            f"{where} (fingerprint {plan.fingerprint}) does not match the model: "
            f"components missing from the plan: {missing or 'none'}; "
            f"components in the plan but not in the model: {extra or 'none'}"
        )


# --------------------------------------------------------------------------- the loop
def _device_sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _RankRun:
    """One rank's model, optimizer and synchronization for one :class:`TrainOptions`."""

    def __init__(self, ctx, options: TrainOptions, workload) -> None:
        from igrt.sync.synchronizer import Synchronizer, build_param_infos, named_parameters

        self.ctx, self.o, self.w = ctx, options, workload
        workload.show_progress = ctx.rank == 0 and options.progress and not options.quiet
        self.model = workload.model.to(ctx.device)
        infos = build_param_infos(named_parameters(self.model), fresh=options.config.fresh_patterns)
        if options.plan is not None:
            check_plan(options.plan, infos, where=options.plan_path or "SyncPlan")
        torch.manual_seed(rank_seed(options.seed, ctx.rank))
        self.optimizer = workload.optimizer(self.model)
        self.hook = None
        self.engine = None
        self.forward_model = self.model
        if options.integration == "sync":
            self.sync = Synchronizer(self.model, config=options.config, plan=options.plan, param_infos=infos)
        elif options.integration == "deepspeed":
            self.engine, self.sync = _deepspeed_engine(self.model, self.optimizer, options)
            self.forward_model = self.engine
        else:
            from torch.nn.parallel import DistributedDataParallel

            from igrt.integrations.ddp_hook import ImportanceHookState, importance_hook

            ids = [ctx.device] if ctx.device.type == "cuda" else None
            caps = {} if options.ddp_bucket_cap_mb is None else {"bucket_cap_mb": options.ddp_bucket_cap_mb}
            self.forward_model = DistributedDataParallel(self.model, device_ids=ids, **caps)
            self.hook = ImportanceHookState(
                self.forward_model, config=options.config, plan=options.plan, param_infos=infos
            )
            self.forward_model.register_comm_hook(self.hook, importance_hook)
            self.sync = self.hook.sync
        if self.engine is None:  # (DeepSpeed's optimizer attaches catch-up itself when it binds)
            self.sync.attach_optimizer(self.optimizer)  # catch-up hooks (config.catch_up); else nothing
        self.trace = None
        if options.record_trace and options.out:
            from igrt.trace.run_trace import RunTraceRecorder

            self.sync.keep_op_log = True
            self.trace = RunTraceRecorder(
                Path(options.out) / "trace",
                rank=ctx.rank,
                world_size=ctx.world_size,
                params=self.sync.params,
                infos=infos,
                config=options.config,
                workload=options.workload,
                grad_accum=options.grad_accum,
                command=options.command,
            )
        self.meta = {
            "workload": options.workload,
            "tiny": bool(options.tiny),
            "seed": int(options.seed),
            "batch_size": int(options.batch_size),
            "grad_accum": int(options.grad_accum),
            "integration": options.integration,
            "config": options.config.to_dict(),
            "plan_fingerprint": options.plan.fingerprint if options.plan is not None else None,
        }

    def resume(self) -> int:
        o = self.o
        start = load_checkpoint(
            o.resume,
            model=self.model,
            optimizer=self.optimizer,
            sync=self.sync,
            rank=self.ctx.rank,
            world_size=self.ctx.world_size,
            meta=self.meta,
        )
        if start >= o.steps:
            raise ValueError(
                f"--resume {o.resume}: the checkpoint is at step {start}; --steps {o.steps} is done"
            )
        return start

    def save(self, directory: Path, done: int) -> None:
        save_checkpoint(
            directory,
            step=done,
            model=self.model,
            optimizer=self.optimizer,
            sync=self.sync,
            rank=self.ctx.rank,
            world_size=self.ctx.world_size,
            meta=self.meta,
        )

    def evaluate(self, step: int, **extra: Any) -> list[dict[str, Any]]:
        """Rank 0 evaluates (the others wait at a barrier, outside every step's timing)."""
        out = [{"step": step, **extra, **self.w.evaluate(self.model)}] if self.ctx.rank == 0 else []
        _barrier(self.ctx.world_size)
        return out

    def step(self, batches, *, watchdog=None) -> StepMetrics:
        """One optimizer step; its row with compute / step / exposed times filled (see docs/runtime.md).

        ``watchdog`` (an :class:`igrt.train.watchdog.RankWatchdog`) guards the whole step: a collective that
        fails because a peer died or stalled raises :class:`~igrt.train.watchdog.PeerFailure` naming it.
        """
        t = self.sync.step_index  # the hook's Synchronizer too
        with watchdog.watch(t) if watchdog is not None else contextlib.nullcontext():
            return self._step(batches)

    def _step(self, batches) -> StepMetrics:
        o, device = self.o, self.ctx.device
        _device_sync(device)
        t0 = time.perf_counter()
        loss_sum = forward_s = 0.0
        for m in range(o.grad_accum):
            last = m == o.grad_accum - 1
            quiet = self.hook is not None and not last
            with self.forward_model.no_sync() if quiet else contextlib.nullcontext():
                tf = time.perf_counter()
                loss = self.w.loss(self.forward_model, next(batches))
                forward_s += time.perf_counter() - tf
                if last and self.trace is not None:
                    self.trace.arm()
                if self.engine is not None:
                    self.engine.backward(loss)  # DeepSpeed divides by its gradient_accumulation_steps
                else:
                    (loss / o.grad_accum).backward()
            loss_sum += float(loss.detach()) / o.grad_accum
            if self.engine is not None and not last:
                self.engine.step()  # not a boundary: DeepSpeed only counts the micro-batch
        _device_sync(device)
        t1 = time.perf_counter()
        hook_extra: dict[str, float] = {}  # ddp-hook: its finalize time
        if self.engine is not None:  # the boundary: engine.step -> our optimizer -> Synchronizer.step
            self.engine.step()
            _device_sync(device)
            t3 = time.perf_counter()
            row = self.sync.log[-1]
            t2 = t1 + row.extra["sync_s"]  # the optimizer's own time is what follows the sync
            exposed_s = row.exposed_comm_s
        elif self.hook is None:
            row = self.sync.step(compute_s=t1 - t0)
            exposed_s = row.exposed_comm_s  # blocking: every collective's time is exposed
        else:
            exposed_s = _hook_exposed_s(self.hook, t1)
            hook_extra = {"finalize_s": _hook_finalize_s(self.hook, t1)}
            (row,) = self.hook.finish_step()
        if o.drop_held_residuals:
            held = [n for n in self.sync.params if n not in self.sync.last_run.results]
            self.sync.drop_residuals(held)
        if self.engine is None:
            t2 = time.perf_counter()
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            _device_sync(device)
            t3 = time.perf_counter()
        # sync: compute = forward + backward + optimizer. ddp-hook: the hook works inside backward,
        # so everything but the exposed tail counts as compute.
        compute_s = (t1 - t0) + (t3 - t2) if self.hook is None else (t3 - t0) - exposed_s
        if self.trace is not None:
            # ddp-hook: backward ends with DDP's wait for the collectives; the trace's backward time
            # is the compute's share (the simulator costs the collectives itself)
            backward_s = (t1 - t0) - forward_s - (exposed_s if self.hook is not None else 0.0)
            self.trace.end_step(
                step=row.step, forward_s=forward_s, backward_s=max(0.0, backward_s), optimizer_s=t3 - t2,
                loss=loss_sum, sent_k=self.sync.last_run.sent_k if self.sync.last_run is not None else {},
            )  # fmt: skip
        extra = {**row.extra, **hook_extra, "forward_backward_s": t1 - t0, "optimizer_s": t3 - t2, "loss": loss_sum}
        return dataclasses.replace(
            row, compute_s=compute_s, step_s=t3 - t0, exposed_comm_s=exposed_s, extra=extra
        )

    def ddp_info(self) -> dict[str, Any] | None:
        """DDP's bucket caps and the buckets the hook saw (ddp-hook only)."""
        if self.hook is None:
            return None
        ddp = self.forward_model
        default = bool(getattr(ddp, "bucket_bytes_cap_default", False))
        return {
            "bucket_cap_bytes": int(ddp.bucket_bytes_cap),
            "first_bucket_cap_bytes": 2**20 if default else None,
            "find_unused_parameters": bool(ddp.find_unused_parameters),
        }

    def flush(self) -> StepMetrics:
        """Send every residual and apply it with one more optimizer step (``flush=False``: neither;
        an empty row marked ``flush_skipped``)."""
        if self.trace is not None:
            self.trace.close()
            self.trace = None
        if not self.o.flush:
            row = StepMetrics(step=self.sync.step_index, rank=self.ctx.rank, source="real", policy=self.o.config.policy)
            return dataclasses.replace(row, extra={"flush_skipped": 1.0})
        row = self.sync.flush()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return row


@contextlib.contextmanager
def _watchdog(ctx):
    """A RankWatchdog over the training steps of a multi-rank run (None on one rank)."""
    if ctx.world_size == 1 or not dist.is_initialized():
        yield None
        return
    from igrt.train.watchdog import RankWatchdog, run_number

    # several runs may share one group (experiments/): each gets its own keys in the store
    with RankWatchdog(interval_s=1.0, prefix=f"igrt/train/{run_number('igrt/train', ctx.world_size)}") as wd:
        yield wd


def _deepspeed_engine(model, optimizer, options: TrainOptions):
    """A DeepSpeed ZeRO-0 engine over ``model`` whose optimizer runs our Synchronizer (CPU or GPU)."""
    import deepspeed

    from igrt.integrations import SyncOptions
    from igrt.integrations import deepspeed as igds

    # DeepSpeed's CPU accelerator would JIT-build a shared-memory all-reduce op (minutes) that our
    # path never uses (the engine's all-reduce is off)
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    config = {
        "train_micro_batch_size_per_gpu": options.batch_size,
        "gradient_accumulation_steps": options.grad_accum,
        "steps_per_print": 10**9,
    }
    engine, wrapped, _, _ = igds.initialize(
        model=model,
        optimizer=optimizer,
        config=config,
        sync=SyncOptions(config=options.config, plan=options.plan, plan_path=None),
    )
    return engine, wrapped.sync


def _hook_exposed_s(state, backward_end: float) -> float:
    """ddp-hook: seconds from the end of backward's own work (the last bucket's hook returned:
    every bucket ready, selected and launched) to ``backward()``'s return (DDP waits for every
    bucket there)."""
    last = state.backward_done_s()
    return max(0.0, backward_end - last) if last is not None else 0.0


def _hook_finalize_s(state, backward_end: float) -> float:
    """ddp-hook: seconds from the later of backward's own work and the last collective's completion
    (its combine included) to ``backward()``'s return: DDP's write-back of the buckets into the
    gradients and its wake-up, plus any wait for a core. Inside ``exposed_comm_s``, not ``comm_s``;
    ``igsim replay`` takes it as an input (``x_finalize_s``)."""
    marks = [m for m in (state.backward_done_s(), state.comm_done_s()) if m is not None]
    return max(0.0, backward_end - max(marks)) if marks else 0.0


def _status(options: TrainOptions, rank: int, message: str) -> None:
    """One status line on rank 0's stderr (not with ``quiet``), safe next to a tqdm bar."""
    from igrt.train.launch import status_line

    status_line("igrt train", message, rank=rank, quiet=options.quiet)


def train_on_rank(ctx, options: TrainOptions, *, workload=None) -> RankOutcome:
    """Run ``options`` on this rank (inside a process group set up by :func:`igrt.train.launch.launch`).

    ``workload`` reuses an already built one (its model is trained in place). Rows of every rank
    are gathered to rank 0 at the end; rank 0 writes the outputs when ``options.out`` is set.
    Raises ValueError (on every rank alike) for a plan that does not match the model or a bad
    checkpoint.
    """
    from tqdm import tqdm

    from igrt.workloads import make_workload

    o = options
    from igrt.train.launch import status_phase

    w = workload
    if w is None:
        loading = f"{ctx.world_size} {ctx.backend} rank(s) up; loading the model and data ({o.workload})"
        with status_phase("igrt train", loading, rank=ctx.rank, quiet=o.quiet):
            w = make_workload(o.workload, tiny=o.tiny, seed=o.seed, spec=o.spec)
    setting_up = f"setting up the {o.integration} integration ({w.num_params:,} parameters)"
    with status_phase("igrt train", setting_up, rank=ctx.rank, quiet=o.quiet):
        run = _RankRun(ctx, o, w)
    if o.resume:
        _status(o, ctx.rank, f"resuming from {o.resume}")
    start = run.resume() if o.resume else 0
    batches = w.train_batches(ctx.rank, ctx.world_size, o.batch_size)
    if start:
        _status(o, ctx.rank, f"replaying the data streams to step {start}")
    for _ in range(start * o.grad_accum):  # replay the data streams up to the checkpoint
        next(batches)
    if o.evaluate and start == 0:
        _status(o, ctx.rank, "evaluating on the held-out split (step 0)")
    evals = run.evaluate(0) if o.evaluate and start == 0 else []
    logger = _open_logger(ctx, o)
    for record in evals:
        logger.evaluation(record)
    ckpt_dir = Path(o.out) / "checkpoint" if o.out else None
    desc = f"train {o.workload} {o.config.policy}"
    bar = tqdm(total=o.steps, initial=start, desc=desc, disable=ctx.rank != 0 or not o.progress)
    log, train_s = MetricsLog(), 0.0
    with _watchdog(ctx) as watchdog:
        for done in range(start + 1, o.steps + 1):
            row = run.step(batches, watchdog=watchdog)
            log.append(row)
            logger.step(row, lr=run.optimizer.param_groups[0].get("lr"))
            train_s += row.step_s
            bar.update(1)
            bar.set_postfix(loss=f"{row.extra['loss']:.3f}", kB=f"{row.wire_bytes / 1e3:.0f}")
            if o.evaluate and o.eval_every and done % o.eval_every == 0 and done < o.steps:
                _status(o, ctx.rank, f"evaluating on the held-out split (step {done})")
                new = run.evaluate(done)
                evals += new
                for record in new:
                    logger.evaluation(record)
            if ckpt_dir is not None and (
                done == o.steps or (o.checkpoint_every and done % o.checkpoint_every == 0)
            ):
                _status(o, ctx.rank, f"saving a checkpoint at step {done} to {ckpt_dir}")
                run.save(ckpt_dir, done)  # the last one before the flush: a resumed run continues it
    bar.close()
    if o.evaluate and o.flush and start < o.steps:  # the trained model as it is, before the flush moves it
        _status(o, ctx.rank, f"evaluating on the held-out split (step {o.steps}, before the flush)")
        new = run.evaluate(o.steps, before_flush=True)
        evals += new
        for record in new:
            logger.evaluation(record)
    _status(o, ctx.rank, "flushing the residuals (one more optimizer step)" if o.flush else "training done")
    flush_row = run.flush()
    if o.evaluate:
        _status(o, ctx.rank, "evaluating on the held-out split after the flush")
        new = run.evaluate(o.steps, after_flush=True)
        evals += new
        for record in new:
            logger.evaluation(record)
    logger.close()
    op_rows = [r.to_row(ctx.rank) for r in run.sync.op_log]
    _status(o, ctx.rank, f"gathering every rank's metrics on rank 0 ({ctx.world_size} ranks)")
    rows, flush_rows, op_rows = _gather(ctx, list(log), [flush_row], op_rows)
    outcome = RankOutcome(
        rank=ctx.rank,
        start_step=start,
        rows=tuple(rows),
        flush_rows=tuple(flush_rows),
        evals=tuple(evals),
        train_s=train_s,
        op_rows=tuple(op_rows),
        ddp=run.ddp_info(),
        plans=tuple(run.sync.online.history) if run.sync.online is not None else (),
    )
    if o.out and ctx.rank == 0:
        _status(o, ctx.rank, f"writing metrics.csv, summary.json, eval.json, model.pt to {o.out}")
        _write_outputs(Path(o.out), options=o, outcome=outcome, model=run.model, ctx=ctx)
        with status_phase("igrt train", f"plotting {Path(o.out) / 'run.png'}", rank=ctx.rank, quiet=o.quiet):
            plot_run(Path(o.out) / "run.png", options=o, outcome=outcome)
    _barrier(ctx.world_size)
    return outcome


def _open_logger(ctx, options: TrainOptions):
    """``--log``'s live logs on rank 0 (a logger that does nothing elsewhere or without ``out``)."""
    from igrt.train.logs import StepLogger

    on = ctx.rank == 0 and options.out is not None
    return StepLogger(options.out if on else None, tuple(options.log) if on else ())


def plot_run(path: Path, *, options: TrainOptions, outcome: RankOutcome) -> Path:
    """``run.png``: loss, the held-out metric, bytes per step and step time (:func:`igplot.plot_run`)."""
    from igplot import plot_run as draw

    steps = sorted({r.step for r in outcome.rows})
    by_step: dict[int, list[StepMetrics]] = {s: [] for s in steps}
    for r in outcome.rows:
        by_step[r.step].append(r)
    exposed = [[r.exposed_comm_s for r in by_step[s] if r.exposed_comm_s is not None] for s in steps]
    evals = list(outcome.evals)
    name = "accuracy" if any("accuracy" in e for e in evals) else "loss"
    floors = [e["majority_floor"] for e in evals if "majority_floor" in e]
    flush = [r.wire_bytes for r in outcome.flush_rows]
    spec = options.spec
    what = options.workload if spec is None or not spec.model else f"{Path(spec.model).name} (hf)"
    return draw(
        path,
        title=f"igrt train: {what}, {options.config.policy} on {max(len({r.rank for r in outcome.rows}), 1)} "
        f"ranks ({options.integration})",
        steps=[s + 1 for s in steps],
        loss=[float(np.mean([r.extra.get("loss", np.nan) for r in by_step[s]])) for s in steps],
        wire_bytes=[float(np.mean([r.wire_bytes for r in by_step[s]])) for s in steps],
        step_s=[max(r.step_s for r in by_step[s]) for s in steps],
        exposed_comm_s=[float(np.mean(e)) if e else None for e in exposed],
        eval_steps=[int(e["step"]) for e in evals if name in e],
        eval_values=[float(e[name]) for e in evals if name in e],
        eval_name=name,
        floor=floors[-1] if floors else None,
        flush_bytes=float(np.mean(flush)) if flush else None,
    )


def _gather(ctx, rows: list[StepMetrics], flush_rows: list[StepMetrics], op_rows: list[dict[str, Any]]):
    """Every rank's rows on rank 0, sorted by (step, rank); empty lists elsewhere."""
    if ctx.world_size == 1:
        return rows, flush_rows, op_rows
    got: list[Any] = [None] * ctx.world_size if ctx.rank == 0 else None  # type: ignore[assignment]
    dist.gather_object((rows, flush_rows, op_rows), got, dst=0)
    if ctx.rank != 0:
        return [], [], []
    all_rows = sorted((r for rs, _, _ in got for r in rs), key=lambda r: (r.step, r.rank))
    all_flush = sorted((r for _, fs, _ in got for r in fs), key=lambda r: r.rank)
    all_ops = sorted((r for _, _, os_ in got for r in os_), key=lambda r: (r["step"], r["rank"], r["seq"]))
    return all_rows, all_flush, all_ops


# --------------------------------------------------------------------------- summaries
def step_statistics(
    rows: list[StepMetrics] | tuple[StepMetrics, ...], *, warmup_steps: int = 1
) -> dict[str, Any]:
    """Per-step aggregates of StepMetrics rows (every rank's).

    Bytes are per rank per step (mean over ranks), by kind; ``peak_to_median`` is the largest
    step's wire bytes over the median step's. Times: a step takes as long as its slowest rank
    (``step_s``); phase times are means over ranks; the first ``warmup_steps`` steps are left out
    of the times (not of the bytes) when there are more steps than that.
    """
    steps = sorted({r.step for r in rows})
    if not steps:
        return {"num_steps": 0}
    by_step = {s: [r for r in rows if r.step == s] for s in steps}
    kinds = ("values_bytes", "indices_bytes", "dense_bytes", "metadata_bytes", "wire_bytes", "low_bytes")
    per_step = {k: np.array([np.mean([getattr(r, k) for r in by_step[s]]) for s in steps]) for k in kinds}
    wire = per_step["wire_bytes"]
    timed = steps[warmup_steps:] if len(steps) > warmup_steps else steps

    def mean_time(get) -> float | None:
        """Mean over timed steps of the mean over ranks; None when no row has the value."""
        means = [np.mean(v) for s in timed if (v := [x for r in by_step[s] if (x := get(r)) is not None])]
        return float(np.mean(means)) if means else None

    step_s = float(np.mean([max(r.step_s for r in by_step[s]) for s in timed]))
    median = float(np.median(wire))
    return {
        "num_steps": len(steps),
        "bytes_per_step": {k: float(v.mean()) for k, v in per_step.items()},
        "peak_step_bytes": float(wire.max()),
        "median_step_bytes": median,
        "peak_to_median": float(wire.max() / median) if median > 0 else None,  # None: median step sends 0
        "num_collectives_per_step": float(np.mean([r.num_collectives for r in rows])),
        "bucket_imbalance_mean": float(np.mean([r.bucket_imbalance for r in rows])),
        "bucket_imbalance_max": float(max(r.bucket_imbalance for r in rows)),
        "timed_steps": len(timed),
        "step_s_mean": step_s,
        "steps_per_s": 1.0 / step_s if step_s > 0 else None,
        "compute_s_mean": mean_time(lambda r: r.compute_s),
        "comm_s_mean": mean_time(lambda r: r.comm_s),
        "exposed_comm_s_mean": mean_time(lambda r: r.exposed_comm_s),
        # a step that selected nothing has no select phase: 0 s where the row has a sync time
        "sparsifier_s_mean": mean_time(
            lambda r: r.extra.get("select_s", 0.0 if "sync_s" in r.extra else None)
        ),
        "sync_s_mean": mean_time(lambda r: r.extra.get("sync_s")),  # None under ddp-hook
    }


def _write_atomically(path: Path, write) -> None:
    """``write(tmp)`` then rename ``tmp`` to ``path``; a failure removes ``tmp`` (nothing half-written
    under the final name, no ``.tmp`` left behind)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        write(tmp)
        tmp.replace(path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def _write_outputs(out: Path, *, options: TrainOptions, outcome: RankOutcome, model, ctx) -> None:
    """Rank 0's files in ``out`` (the folder ``igrt train`` claimed before the run), each written
    atomically; ``summary.json`` last, so its presence marks a finished run."""
    out.mkdir(parents=True, exist_ok=True)
    log = MetricsLog()
    for r in outcome.rows:
        log.append(r)
    _write_atomically(out / "metrics.csv", log.write_csv)
    _write_atomically(out / "model.pt", lambda p: torch.save(model.state_dict(), p))
    evals = json.dumps(list(outcome.evals), indent=2) + "\n"
    _write_atomically(out / "eval.json", lambda p: p.write_text(evals))
    last = [r for r in outcome.rows if r.step == options.steps - 1]
    flush = {
        k: sum(getattr(r, k) for r in outcome.flush_rows) / max(len(outcome.flush_rows), 1)
        for k in ("values_bytes", "indices_bytes", "dense_bytes", "metadata_bytes", "wire_bytes")
    }
    flush["time_s"] = max((r.extra.get("sync_s", 0.0) for r in outcome.flush_rows), default=0.0)
    plan = options.plan
    summary = {
        "command": options.command,
        "workload": options.workload,
        # the model / data / learning-rate settings on top of the workload's own (None: its defaults)
        "workload_settings": None if options.spec is None else dataclasses.asdict(options.spec),
        "tiny": options.tiny,
        "seed": options.seed,
        "world_size": ctx.world_size,
        "backend": ctx.backend,
        "integration": options.integration,
        "steps": options.steps,
        "start_step": outcome.start_step,
        "batch_size": options.batch_size,
        "grad_accum": options.grad_accum,
        "config": options.config.to_dict(),
        "plan": None
        if plan is None
        else {
            "path": options.plan_path,
            "fingerprint": plan.fingerprint,
            "release_period": plan.release_period,
            "num_components": len(plan.components),
            "num_low": len(plan.low),
        },
        "stats": step_statistics(outcome.rows),
        "flush_bytes_per_rank": flush,
        "train_s": outcome.train_s,
        "final_loss": float(np.mean([r.extra["loss"] for r in last])) if last else None,
        "eval": {"history": list(outcome.evals), "final": outcome.evals[-1] if outcome.evals else None},
        "files": ["metrics.csv", "summary.json", "eval.json", "model.pt", "checkpoint/"],
        "summary_format": RUN_SUMMARY_FORMAT,
        "ddp": outcome.ddp,
        "record_trace": bool(options.record_trace),
        # the machine while the run ended (1-, 5-, 15-minute load): a replay is only trusted where
        # the ranks had the CPU to themselves (igsim.studies.step_validation.range_flags)
        "machine": {"cpu_count": os.cpu_count(), "load_average": [round(x, 2) for x in os.getloadavg()]},
    }
    if plan is not None:
        _write_atomically(out / "plan.json", plan.save)
        summary["files"].append("plan.json")
    if outcome.plans:
        lines = "".join(json.dumps(p, sort_keys=True, allow_nan=False) + "\n" for p in outcome.plans)
        _write_atomically(out / "plans.jsonl", lambda p: p.write_text(lines))
        final = SyncPlan.from_json(outcome.plans[-1]["plan"], where="plans.jsonl")
        _write_atomically(out / "online-plan.json", final.save)
        summary["online_profile"] = online_summary(options.config, outcome)
        summary["files"] += ["plans.jsonl", "online-plan.json"]
    if options.record_trace:
        _write_atomically(out / "ops.csv", lambda p: _write_ops(p, outcome.op_rows))
        summary["files"] += ["trace/", "ops.csv"]
    text = json.dumps(summary, indent=2, sort_keys=True, default=str, allow_nan=False) + "\n"
    _write_atomically(out / "summary.json", lambda p: p.write_text(text))


def online_summary(config: PolicyConfig, outcome: RankOutcome) -> dict[str, Any]:
    """summary.json's ``online_profile``: the re-plans, the final plan, and the bytes of profiling
    (the window all-reduces and agreement checks, already inside ``stats.bytes_per_step``)."""
    plans = outcome.plans
    final = plans[-1]
    settled = final["step"]
    for p in reversed(plans):
        if (p["important"], p["low"]) != (final["important"], final["low"]):
            break
        settled = p["step"]
    ranks = max(len({r.rank for r in outcome.rows}), 1)
    online_bytes = sum(r.extra.get("online_bytes", 0.0) for r in outcome.rows) / ranks
    steps = max(len({r.step for r in outcome.rows}), 1)
    return {
        "online_window": config.online_window,
        "replan_every": config.replan_every,
        "num_replans": len(plans) - 1,
        "replan_steps": [p["step"] for p in plans[1:]],
        "num_changes": sum(plans[i]["fingerprint"] != plans[i + 1]["fingerprint"] for i in range(len(plans) - 1)),
        "final_fingerprint": final["fingerprint"],
        "final_important": final["important"],
        "final_low": final["low"],
        "settled_since_step": settled,  # the first step of the final important/low split
        "profiling_bytes_per_rank": online_bytes,
        "profiling_bytes_per_step": online_bytes / steps,
        "files": ["plans.jsonl", "online-plan.json"],
    }


def _write_ops(path: Path, rows: tuple[dict[str, Any], ...]) -> None:
    import csv

    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["step", "rank", "seq"])
        w.writeheader()
        w.writerows(rows)


def preflight(options: TrainOptions) -> None:
    """Refuse to start, before any rank is spawned, when the plan does not match the model (the
    model is built here once to read its parameter names; ranks check again)."""
    if options.plan is None:
        return
    from igrt.sync.synchronizer import build_param_infos, named_parameters
    from igrt.workloads import make_workload

    w = make_workload(options.workload, tiny=options.tiny, seed=options.seed, spec=options.spec)
    check_plan(
        options.plan,
        build_param_infos(named_parameters(w.model), fresh=options.config.fresh_patterns),
        where=options.plan_path or "SyncPlan",
    )


def _train_rank(ctx, options: TrainOptions) -> dict[str, Any]:
    outcome = train_on_rank(ctx, options)
    return {"rank": ctx.rank, "train_s": outcome.train_s}


def train(
    options: TrainOptions, *, nproc: int, backend: str = "auto", timeout_s: float = 600.0
) -> dict[str, Any]:
    """Run ``options`` on ``nproc`` spawned ranks (or this torchrun rank); returns rank 0's summary
    (read back from ``summary.json``; an empty dict on other torchrun ranks or without ``out``)."""
    from igrt.train.launch import launch

    here = int(os.environ.get("RANK", "0"))  # under torchrun this process is a rank
    if options.plan is not None:
        from igrt.train.launch import status_phase

        with status_phase("igrt train", "checking the plan against the model", rank=here, quiet=options.quiet):
            preflight(options)
    else:
        preflight(options)
    _status(options, here, f"starting {nproc} rank(s)")
    results = launch(_train_rank, nproc=nproc, backend=backend, args=(options,), timeout_s=timeout_s)
    if 0 not in results or not options.out:
        return {}
    return json.loads((Path(options.out) / "summary.json").read_text())
