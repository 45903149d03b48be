"""``igrt record``: train a workload on real processes and record its gradient trace.

Each rank computes its local gradient, the recorder (the runtime's own sparsifier) writes what it
would select, then the ranks average their gradients with one dense all-reduce — so the model
trains exactly as plain data-parallel training would, and the trace is of that training.

    igrt record --workload minilm --ranks 2 --steps 300 -o traces/samples/minilm
    igrt record --model ./my-gpt2 --data corpus.jsonl --ranks 2 --steps 100 -o runs/my-trace

Rows reach the disk in commits of whole steps, every ``--commit-every-steps`` steps or
``--commit-every-s`` seconds: a run killed mid-way keeps every step up to its ranks' last commit,
which ``igsim profile --complete-prefix`` (``read_trace(..., complete_prefix=True)``) reads.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from igpolicy.cli_util import add_deprecated_alias
from igpolicy.limits import check_count
from igrt.cli.options import add_workload_arguments, spec_command_line, workload_spec

RECORD_SPARSIFIERS = ("topk", "adtopk", "randomk")
COMMIT_EVERY_STEPS = 100
COMMIT_EVERY_S = 30.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_workload_arguments(parser)  # a reference workload, or your own --model on your own --data
    out = parser.add_argument(
        "-o", "--out", dest="out", default=None, type=Path, help="trace directory (required; must not hold a trace)"
    )
    add_deprecated_alias(parser, "--output", out)
    parser.add_argument("--steps", type=int, default=100, help="optimizer steps to record (default 100)")
    ranks = parser.add_argument(
        "--ranks", dest="nproc", type=int, default=2, metavar="N", help="ranks to spawn (ignored under torchrun; default 2)"
    )
    add_deprecated_alias(parser, "--nproc", ranks)
    parser.add_argument(
        "--density", type=float, default=0.01, help="sparsifier density in (0, 1] (default 0.01)"
    )
    parser.add_argument(
        "--sparsifier", choices=RECORD_SPARSIFIERS, default="topk", help="entry selection to record (default topk)"
    )
    parser.add_argument(
        "--batch-size", type=int, default=16, help="examples per rank per micro-batch (default 16)"
    )
    parser.add_argument("--grad-accum-steps", type=int, default=1, help="micro-batches per step (default 1)")
    parser.add_argument("--seed", type=int, default=0, help="model, data and sparsifier seed (default 0)")
    parser.add_argument("--tiny", action="store_true", help="tiny random-init model (tests, smoke runs)")
    parser.add_argument(
        "--backend", choices=("auto", "gloo", "nccl"), default="auto", help="auto: nccl with CUDA, else gloo (default)"
    )
    parser.add_argument("--rows-per-part", type=int, default=200_000, help="at most this many rows per part")
    parser.add_argument(
        "--commit-every-steps",
        type=int,
        default=COMMIT_EVERY_STEPS,
        metavar="N",
        help=f"write the recorded rows to disk every N steps (default {COMMIT_EVERY_STEPS}; 0: not by steps)",
    )
    parser.add_argument(
        "--commit-every-s",
        type=float,
        default=COMMIT_EVERY_S,
        metavar="S",
        help=f"... or every S seconds, whichever comes first (default {COMMIT_EVERY_S:g}; 0: not by time); "
        "a crash loses at most that interval",
    )
    parser.add_argument(
        "--no-eval", action="store_true", help="skip the held-out evaluation before and after"
    )
    timeout = parser.add_argument(
        "--timeout-s", dest="timeout", type=float, default=600.0, metavar="S", help="collective timeout in seconds (default 600)"
    )
    add_deprecated_alias(parser, "--timeout", timeout)
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--quiet", action="store_true", help="no progress bar and no status lines")


def _command_line(args: argparse.Namespace) -> str:
    """The canonical command that reproduces this recording."""
    parts = [
        "igrt record",
        *spec_command_line(args),
        f"--ranks {args.nproc}",
        f"--steps {args.steps}",
        f"-o {args.out}",
        f"--density {args.density:g}",
        f"--sparsifier {args.sparsifier}",
        f"--batch-size {args.batch_size}",
        f"--seed {args.seed}",
    ]
    if args.grad_accum_steps != 1:
        parts.append(f"--grad-accum-steps {args.grad_accum_steps}")
    if args.tiny:
        parts.append("--tiny")
    if args.rows_per_part != 200_000:
        parts.append(f"--rows-per-part {args.rows_per_part}")
    if args.commit_every_steps != COMMIT_EVERY_STEPS:
        parts.append(f"--commit-every-steps {args.commit_every_steps}")
    if args.commit_every_s != COMMIT_EVERY_S:
        parts.append(f"--commit-every-s {args.commit_every_s:g}")
    return " ".join(parts)


def _check(args: argparse.Namespace) -> None:
    if args.out is None:
        raise ValueError("give -o/--out DIR: the trace directory to write")
    for name in ("steps", "nproc", "batch_size", "grad_accum_steps", "rows_per_part"):
        if getattr(args, name) < 1:
            flag = "ranks" if name == "nproc" else name.replace("_", "-")
            raise ValueError(f"--{flag} must be >= 1, got {getattr(args, name)}")
    check_count(args.steps, what="--steps", limit="MAX_TRAIN_STEPS")  # as igrt train and bench
    if not 0.0 < args.density <= 1.0:
        raise ValueError(f"--density must be in (0, 1], got {args.density}")
    if args.commit_every_steps < 0:
        raise ValueError(f"--commit-every-steps must be >= 0, got {args.commit_every_steps}")
    if not (math.isfinite(args.commit_every_s) and args.commit_every_s >= 0):
        raise ValueError(f"--commit-every-s must be a number >= 0, got {args.commit_every_s}")
    first_rank = os.environ.get("RANK", "0") == "0"  # under torchrun, rank 0 writes the manifest
    if first_rank and (args.out / "manifest.json").exists():
        raise ValueError(f"{args.out} already holds a trace; record into a new directory")


def _average_gradients(params: list, world_size: int) -> None:
    """Average ``.grad`` over ranks in place, one all-reduce per parameter (a missing grad counts as
    zeros, so every rank issues the same collectives)."""
    import torch
    import torch.distributed as dist

    if world_size == 1:
        return
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad)
        p.grad /= world_size


def _record_rank(ctx: Any, opts: dict[str, Any]) -> dict[str, Any]:
    """One rank: build the workload, train ``steps`` steps under the recorder, return a summary."""
    import torch
    import torch.distributed
    from tqdm import tqdm

    from igrt.trace.recorder import TraceRecorder
    from igrt.train.launch import status_line, status_phase
    from igrt.workloads import make_workload

    def say(message: str) -> None:
        status_line("igrt record", message, rank=ctx.rank, quiet=opts["quiet"])

    loading = f"{ctx.world_size} {ctx.backend} rank(s) up; loading the model and data ({opts['workload']})"
    with status_phase("igrt record", loading, rank=ctx.rank, quiet=opts["quiet"]):
        workload = make_workload(opts["workload"], tiny=opts["tiny"], seed=opts["seed"], spec=opts["spec"])
    workload.show_progress = ctx.rank == 0 and opts["progress"] and not opts["quiet"]
    torch.manual_seed(opts["seed"] * 1009 + ctx.rank)  # dropout masks differ per rank, as in DDP
    model = workload.model.to(ctx.device)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = workload.optimizer(model)
    batches = workload.train_batches(ctx.rank, ctx.world_size, opts["batch_size"])
    summary: dict[str, Any] = {"rank": ctx.rank}
    if ctx.rank == 0 and opts["eval"]:
        say("evaluating on the held-out split (before training)")
        summary["eval_before"] = workload.evaluate(model)
    if ctx.world_size > 1:
        torch.distributed.barrier()  # rank 0's evaluation must not count as the others' recording time
    recorder = TraceRecorder(
        model,
        directory=opts["output"],
        sparsifier=opts["sparsifier"],
        density=opts["density"],
        grad_accum_steps=opts["grad_accum_steps"],
        workload=opts["workload"] + (" (tiny)" if opts["tiny"] else "")
        + (f" ({opts['spec'].model})" if opts["spec"].model else ""),
        command=opts["command"],
        rows_per_part=opts["rows_per_part"],
        commit_every_steps=opts["commit_every_steps"] or None,
        commit_every_s=opts["commit_every_s"] or None,
        seed=opts["seed"],
        extra={
            "batch_size": opts["batch_size"],
            "seed": opts["seed"],
            "tiny": opts["tiny"],
            "backend": ctx.backend,
            "num_params": sum(p.numel() for p in params),
        },
    )
    bar = tqdm(
        total=opts["steps"],
        desc=f"record {opts['workload']}",
        disable=ctx.rank != 0 or not opts["progress"] or opts["quiet"],
    )
    step_s, losses = [], []
    with recorder:
        for _ in range(opts["steps"]):
            t0 = time.perf_counter()
            recorder.begin_step()
            step_loss = 0.0
            for _ in range(opts["grad_accum_steps"]):
                loss = workload.loss(model, next(batches))
                recorder.begin_backward()
                (loss / opts["grad_accum_steps"]).backward()
                recorder.end_backward()
                step_loss += float(loss.detach()) / opts["grad_accum_steps"]
            _average_gradients(params, ctx.world_size)
            recorder.begin_optimizer()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            recorder.end_step(loss=step_loss)
            step_s.append(time.perf_counter() - t0)
            losses.append(step_loss)
            bar.update(1)
            bar.set_postfix(loss=f"{step_loss:.3f}")
        bar.close()
        if ctx.rank == 0 and opts["eval"]:
            say("evaluating on the held-out split (after training)")
            summary["eval_after"] = workload.evaluate(model)
            recorder.add_extra({"eval_before": summary["eval_before"], "eval_after": summary["eval_after"]})
        record_s = recorder.record_s
        say(f"committing the last parts to {opts['output']}")
    if ctx.world_size > 1:
        torch.distributed.barrier()  # every rank's parts are on disk before rank 0 reads the trace
    summary.update(
        step_s_mean=sum(step_s) / len(step_s),
        record_s_mean=sum(record_s) / len(record_s),
        loss_first=losses[0],
        loss_last=losses[-1],
        num_params=len(params),
    )
    return summary


def run(args: argparse.Namespace) -> int:
    from igrt.train.launch import launch, status_line
    from igrt.workloads import prepare_workload
    from traces.reader import read_trace

    _check(args)
    workload, spec = workload_spec(args)
    args.workload = workload
    note = prepare_workload(workload, tiny=args.tiny, seed=args.seed, spec=spec)
    if not args.quiet:
        print(f"igrt record: {note}", file=sys.stderr)
    opts = {
        "workload": workload,
        "spec": spec,
        "tiny": args.tiny,
        "seed": args.seed,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "grad_accum_steps": args.grad_accum_steps,
        "density": args.density,
        "sparsifier": args.sparsifier,
        "output": str(args.out),
        "rows_per_part": args.rows_per_part,
        "commit_every_steps": args.commit_every_steps,
        "commit_every_s": args.commit_every_s,
        "eval": not args.no_eval,
        "progress": not args.no_progress,
        "quiet": args.quiet,
        "command": _command_line(args),
    }
    status_line("igrt record", f"starting {args.nproc} rank(s)", rank=int(os.environ.get("RANK", "0")), quiet=args.quiet)
    t0 = time.perf_counter()
    results = launch(
        _record_rank, nproc=args.nproc, backend=args.backend, args=(opts,), timeout_s=args.timeout
    )
    wall_s = time.perf_counter() - t0
    if 0 not in results:  # under torchrun only rank 0 reports
        return 0
    first = results[0]
    status_line("igrt record", f"reading the trace back to check it ({args.out})", quiet=args.quiet)
    trace = read_trace(args.out)
    print(
        f"wrote {args.out}: {trace.num_steps} steps x {len(trace.ranks)} ranks x {first['num_params']} params"
    )
    print(
        f"  rows: params {len(trace.params['step'])}, steps {len(trace.steps['step'])}, "
        f"unions {len(trace.unions['step'])}; parts {len(trace.parts)}"
    )
    print(f"  {args.sparsifier} at density {args.density:g}; wall {wall_s:.1f} s")
    for rank, r in results.items():
        print(
            f"  rank {rank}: step {r['step_s_mean'] * 1e3:.0f} ms (recording {r['record_s_mean'] * 1e3:.0f} ms), "
            f"loss {r['loss_first']:.3f} -> {r['loss_last']:.3f}"
        )
    if "eval_after" in first:
        before = ", ".join(f"{k} {v:.4g}" for k, v in first["eval_before"].items())
        after = ", ".join(f"{k} {v:.4g}" for k, v in first["eval_after"].items())
        print(f"  held-out before: {before}\n  held-out after:  {after}")
    return 0
