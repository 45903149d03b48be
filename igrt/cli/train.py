"""``igrt train``: train a reference workload on real processes with a gradient-sync policy.

    igrt train --workload minilm --policy importance --plan plan.json --ranks 2 --steps 200 --out runs/imp
    torchrun --nproc-per-node 2 -m igrt train --workload gpt --policy topk --steps 100 --out runs/topk

The policy comes from ``--config FILE.json`` (PolicyConfig keys, strict: an unknown or removed key
is an error naming it) with ``--policy``, ``--density``, ``--release-period``, ``--packing`` and
``--seed`` on top. Writes ``metrics.csv``, ``summary.json``, ``eval.json``, ``model.pt`` and
``checkpoint/`` into ``--out`` (see :mod:`igrt.train.loop` and docs/runtime.md).

Your own model and data instead of a reference workload (nothing is downloaded):

    igrt train --model ./my-gpt2 --data corpus.jsonl --policy topk --steps 200 --lr 1e-4 --schedule cosine
    igrt train --model ./my-bert --data reviews.csv --text-column review --label-column stars --policy topk

Online profiling instead of a plan: the run profiles itself over a sliding window and re-plans
(``--online-window W --replan-every P``, defaults 25 and 25; every component sends until the first
re-plan), writing every plan it followed to ``plans.jsonl``:

    igrt train --workload gpt --policy importance --online-profile --steps 300 --out runs/online
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from igpolicy.cli_outputs import claim_output_dir
from igpolicy.cli_util import add_deprecated_alias, reading
from igpolicy.config import LOW_MODES, PACKINGS, POLICIES, SPARSIFIERS, SPLIT_CONTROLS, PolicyConfig
from igpolicy.limits import check_count
from igpolicy.step_plan import INTEGRATIONS
from igpolicy.wire import INDEX_WIDTHS, VALUE_WIDTHS
from igrt.cli.options import add_workload_arguments, workload_spec
from igrt.train.logs import LOG_FORMATS

__all__ = ["add_arguments", "options_from_args", "policy_config", "run"]

ONLINE_DEFAULT_STEPS = 25  # --online-profile's window and re-plan period unless given



def add_arguments(p: argparse.ArgumentParser) -> None:
    add_workload_arguments(p)
    p.add_argument("--policy", choices=POLICIES, default=None, help="sync policy (or 'policy' in --config)")
    p.add_argument("--plan", type=Path, default=None, help="SyncPlan JSON (required by --policy importance)")
    ranks = p.add_argument(
        "--ranks", dest="nproc", type=int, default=2, metavar="N", help="ranks to spawn (ignored under torchrun; default 2)"
    )
    add_deprecated_alias(p, "--nproc", ranks)
    p.add_argument(
        "--backend",
        choices=("auto", "gloo", "nccl"),
        default="auto",
        help="auto: nccl with CUDA tensors when CUDA is available, else gloo",
    )
    p.add_argument("--steps", type=int, default=100, help="total optimizer steps (default 100)")
    p.add_argument("--density", type=float, default=None, help="sparsifier density in (0, 1]")
    p.add_argument("--release-period", type=int, default=None, help="R: low components release every R steps")
    p.add_argument("--packing", choices=PACKINGS, default=None, help="bucket packing (default kk)")
    p.add_argument("--config", type=Path, default=None, help="PolicyConfig JSON (strict keys)")
    p.add_argument(
        "--collective",
        choices=("auto", "sparse", "dense"),
        default=None,
        help="per bucket: sparse = an all-gather of (index, value) pairs, dense = a ring all-reduce, auto "
        "(default) = the one that moves fewer bytes on nominal sizes: sparse while the bucket's density is at "
        "most 2 x value bytes / (ranks x (index + value bytes)), 1/ranks with 4-byte indices and values",
    )
    p.add_argument("--sparsifier", choices=SPARSIFIERS, default=None, help="entry selection (default topk)")
    p.add_argument(
        "--index-bytes",
        type=int,
        choices=INDEX_WIDTHS,
        default=None,
        help="bytes per sparse index on the wire: 4 int32 (default), 8 int64, 2 bucket-local 16-bit offsets "
        "with a per-64Ki-block count table (docs/runtime.md, wire format)",
    )
    p.add_argument(
        "--value-bytes",
        type=int,
        choices=VALUE_WIDTHS,
        default=None,
        help="bytes per value on the wire: 4 fp32 (default), 2 bf16, 1 int8 with one scale per payload "
        "(dense all-reduces then in bf16); the rounding error stays in the residual",
    )
    p.add_argument(
        "--row-sparse-embeddings",
        action="store_true",
        default=None,
        help="a 2-D token embedding sends ceil(k / dim) whole rows as (int32 row id, row) instead of "
        "(index, value) pairs; error feedback keeps the rest (docs/runtime.md, wire format)",
    )
    p.add_argument(
        "--record-trace",
        action="store_true",
        help="also record this run's own trace (phase times, ready times, sent k) and executed ops "
        "into OUT/trace and OUT/ops.csv, for igsim replay OUT",
    )
    p.add_argument(
        "--catch-up",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="scale each update by the steps its gradient carries (Adam-family optimizers; see docs/runtime.md); "
        "default: on when --plan recommends it (every newly profiled plan with low components and R > 1 does), else off",
    )
    p.add_argument(
        "--fresh",
        action="append",
        default=None,
        metavar="PATTERN",
        help="freshly initialised parameters (module name or glob; 'auto': classifier, score, qa_outputs) "
        "form the always-sent component 'fresh'; repeatable; the plan must be profiled with the same",
    )
    p.add_argument(
        "--dense-small",
        type=int,
        default=None,
        metavar="N",
        help="parameters of at most N entries (biases, norms) send every entry when they send (0: off; e.g. 4096)",
    )
    p.add_argument(
        "--sync-warmup-steps",
        type=int,
        default=None,
        metavar="W",
        help="every component sends on each of the first W steps, then the release schedule starts (0: off)",
    )
    p.add_argument(
        "--online-profile",
        action="store_true",
        help="policy importance without --plan: profile this run over a sliding window and re-plan every "
        f"--replan-every steps, all ranks agreeing (window and period default {ONLINE_DEFAULT_STEPS}; "
        "every component sends until the first re-plan; plans.jsonl lists every plan)",
    )
    p.add_argument(
        "--online-window", type=int, default=None, metavar="W", help="steps each online re-plan profiles"
    )
    p.add_argument(
        "--replan-every", type=int, default=None, metavar="P", help="steps between online re-plans"
    )
    p.add_argument(
        "--max-share",
        type=float,
        default=None,
        metavar="S",
        help="online re-plans: cap each plan's expected bytes per step at S x every component every step "
        "(the lowest-scored important components made low until it fits; e.g. 0.18)",
    )
    p.add_argument(
        "--low-mode",
        choices=LOW_MODES,
        default=None,
        help="policy importance: low components 'hold' in their residuals and release every R steps "
        "(default), or 'thin': send every step at density / R (the optimizer steps every component every step)",
    )
    p.add_argument(
        "--online-control",
        choices=SPLIT_CONTROLS,
        default=None,
        help="experiments: replace every online re-plan's important set by a split control (swapped: the "
        "lowest-scored components at the same bytes; random: a seeded random set at the same bytes; "
        "all_low: none), to test whether the choice of components matters (igpolicy.controls)",
    )
    p.add_argument("--tiny", action="store_true", help="tiny random-init model (tests, smoke runs)")
    p.add_argument("--seed", type=int, default=0, help="model, data and sparsifier seed (default 0)")
    p.add_argument(
        "--batch-size", type=int, default=16, help="examples per rank per micro-batch (default 16)"
    )
    accum = p.add_argument(
        "--grad-accum-steps",
        dest="grad_accum",
        type=int,
        default=1,
        metavar="A",
        help="micro-batches per optimizer step (default 1)",
    )
    add_deprecated_alias(p, "--grad-accum", accum)
    p.add_argument(
        "--integration",
        choices=INTEGRATIONS,
        default="sync",
        help="sync: Synchronizer after backward; ddp-hook: DDP + importance_hook; deepspeed: DeepSpeed ZeRO-0 engine, our optimizer syncs",
    )
    p.add_argument(
        "--ddp-bucket-cap-mb",
        type=float,
        default=None,
        help="ddp-hook: DDP's bucket_cap_mb (default: DDP's own, 25 MiB with a 1 MiB first bucket)",
    )
    p.add_argument(
        "--eval-every", type=int, default=0, help="held-out evaluation every K steps (0: end only)"
    )
    p.add_argument("--no-eval", action="store_true", help="skip every held-out evaluation")
    p.add_argument("--checkpoint-every", type=int, default=0, help="checkpoint every K steps (0: end only)")
    p.add_argument(
        "--resume", type=Path, default=None, help="continue from a checkpoint (DIR or DIR/checkpoint)"
    )
    p.add_argument("--out", type=Path, default=None, help="output directory (default runs/WORKLOAD-POLICY)")
    timeout = p.add_argument(
        "--timeout-s", dest="timeout", type=float, default=600.0, metavar="S", help="collective timeout in seconds (default 600)"
    )
    add_deprecated_alias(p, "--timeout", timeout)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--quiet", action="store_true", help="no progress bar and no status lines")
    p.add_argument(
        "--log",
        action="append",
        choices=LOG_FORMATS,
        default=None,
        help="also log every step as it happens: tensorboard (OUT/tensorboard/), csv (OUT/log.csv), "
        "jsonl (OUT/log.jsonl); repeat for several",
    )


def _read_config(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"--config {path}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"--config {path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"--config {path}: expected a JSON object of PolicyConfig keys")
    return data


def policy_config(args: argparse.Namespace) -> PolicyConfig:
    """--config file (strict keys), then the explicit flags on top; the seed defaults to --seed."""
    data: dict[str, Any] = _read_config(args.config) if args.config else {}
    where = f"--config {args.config}" if args.config else "policy config"
    PolicyConfig.from_dict(data, where=where)  # names a bad key of the file before flags are merged
    for key, value in (
        ("policy", args.policy),
        ("density", args.density),
        ("release_period", args.release_period),
        ("packing", args.packing),
        ("catch_up", args.catch_up),
        ("fresh_patterns", args.fresh),
        ("dense_small_numel", args.dense_small),
        ("warmup_steps", args.sync_warmup_steps),
        ("collective", args.collective),
        ("sparsifier", args.sparsifier),
        ("index_bytes", args.index_bytes),
        ("value_bytes", args.value_bytes),
        ("row_sparse_embeddings", args.row_sparse_embeddings),
        ("max_share", args.max_share),
        ("low_mode", args.low_mode),
        ("online_control", args.online_control),
    ):
        if value is not None:
            data[key] = value
    for key, value in (("online_window", args.online_window), ("replan_every", args.replan_every)):
        if value is not None:
            data[key] = value
        elif args.online_profile:
            data.setdefault(key, ONLINE_DEFAULT_STEPS)
    if args.online_profile and "catch_up" not in data:
        data["catch_up"] = True  # what every profiled plan with low components recommends (policy_defaults)
    if "policy" not in data:
        raise ValueError(f"give --policy ({', '.join(POLICIES)}) or 'policy' in --config")
    data.setdefault("seed", args.seed)
    return PolicyConfig.from_dict(data, where=where)


def options_from_args(args: argparse.Namespace):
    """TrainOptions from parsed arguments (ValueError for bad combinations)."""
    from igpolicy.plan import SyncPlan, apply_policy_defaults
    from igrt.train.loop import TrainOptions

    workload, spec = workload_spec(args)
    config = policy_config(args)
    check_count(config.release_period, what="--release-period", limit="MAX_RELEASE_PERIOD")
    plan = None
    if args.plan is not None:
        with reading(args.plan, "--plan"):
            plan = SyncPlan.load(args.plan)
        check_count(plan.release_period, what=f"--plan {args.plan}: release_period", limit="MAX_RELEASE_PERIOD")
        # a plan's recommended settings (catch_up for plans profiled since it was recorded), unless set
        explicit = set(_read_config(args.config)) if args.config else set()
        explicit |= {"catch_up"} if args.catch_up is not None else set()
        config = apply_policy_defaults(config, plan, explicit=explicit)
    out = args.out if args.out is not None else Path("runs") / f"{workload}-{config.policy}"
    check_count(args.nproc, what="--ranks", limit="MAX_LOCAL_RANKS")
    check_count(args.steps, what="--steps", limit="MAX_TRAIN_STEPS")
    return TrainOptions(
        workload=workload,
        spec=spec,
        config=config,
        steps=args.steps,
        plan=plan,
        plan_path=str(args.plan) if args.plan is not None else None,
        batch_size=args.batch_size,
        grad_accum=args.grad_accum,
        integration=args.integration,
        tiny=args.tiny,
        seed=args.seed,
        evaluate=not args.no_eval,
        eval_every=args.eval_every,
        checkpoint_every=args.checkpoint_every,
        resume=str(args.resume) if args.resume is not None else None,
        out=str(out),
        progress=not (args.no_progress or args.quiet),
        quiet=args.quiet,
        log=tuple(args.log or ()),
        command=_command_line(args),
        record_trace=args.record_trace,
        ddp_bucket_cap_mb=args.ddp_bucket_cap_mb,
    )


def _command_line(args: argparse.Namespace) -> str:
    """The ``igrt train`` command with every setting spelled out (recorded in summary.json)."""
    parts = ["igrt", "train"]
    for key, value in sorted(vars(args).items()):
        if key in ("command", "_run") or value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        parts += [flag] if value is True else [flag, str(value)]
    return shlex.join(parts)


def _claim_out(args: argparse.Namespace, out: Path) -> None:
    """Lock ``--out`` for this run (rank 0 under torchrun); a non-empty folder is refused unless
    ``--overwrite``, or unless ``--resume`` reads a checkpoint inside it (the run continues there)."""
    resume = Path(args.resume).resolve() if args.resume is not None else None
    in_place = resume is not None and (resume == out.resolve() or out.resolve() in resume.parents)
    rank = int(os.environ.get("RANK", "0"))
    overwrite = bool(getattr(args, "overwrite", False))
    claim_output_dir(out, overwrite=overwrite, flag="--out", continue_in_place=in_place, rank=rank)


def _mb(x: float) -> str:
    return f"{x / 1e6:.3f} MB"


def _num(x: float | None, spec: str, scale: float = 1.0) -> str:
    return "n/a" if x is None else format(x * scale, spec)


def run(args: argparse.Namespace) -> int:
    from igrt.train.loop import train
    from igrt.workloads import prepare_workload

    options = options_from_args(args)
    _claim_out(args, Path(options.out))
    first_rank = os.environ.get("RANK", "0") == "0"
    note = prepare_workload(options.workload, tiny=args.tiny, seed=args.seed, spec=options.spec)
    if first_rank and not args.quiet:
        print(f"igrt train: {note}", file=sys.stderr)
    summary = train(options, nproc=args.nproc, backend=args.backend, timeout_s=args.timeout)
    if not summary:
        return 0
    s = summary["stats"]
    b = s["bytes_per_step"]
    print(f"wrote {options.out}: metrics.csv, summary.json, eval.json, model.pt, run.png, checkpoint/")
    print(
        f"  {summary['config']['policy']} on {summary['world_size']} {summary['backend']} ranks "
        f"({summary['integration']}), steps {summary['start_step']}..{summary['steps']}"
    )
    print(
        f"  bytes/step/rank {_mb(b['wire_bytes'])} (values {_mb(b['values_bytes'])}, indices "
        f"{_mb(b['indices_bytes'])}, dense {_mb(b['dense_bytes'])}, metadata {b['metadata_bytes']:.0f} B); "
        f"peak/median {_num(s['peak_to_median'], '.2f')}"
    )
    print(
        f"  step {_num(s['step_s_mean'], '.0f', 1e3)} ms ({_num(s['steps_per_s'], '.2f')} steps/s), exposed "
        f"comm {_num(s['exposed_comm_s_mean'], '.1f', 1e3)} ms; "
        f"final flush {_mb(summary['flush_bytes_per_rank']['wire_bytes'])}"
    )
    final = summary["eval"]["final"]
    if final:
        metrics = ", ".join(
            f"{k} {v:.4g}" for k, v in final.items() if isinstance(v, float) and k != "majority_floor"
        )
        if "majority_floor" in final:
            metrics += f" (majority-class floor {final['majority_floor']:.4g})"
        print(f"  held-out after flush: {metrics}; final training loss {summary['final_loss']:.4f}")
    return 0
