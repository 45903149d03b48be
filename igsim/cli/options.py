"""Command-line options shared by several ``igsim`` commands (policy flags, workloads, topologies,
calibrations, plans, windows, plan tables): the commands import this module, never each other."""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Iterable
from typing import Any

from igpolicy.choice import crossover_density
from igpolicy.cli_outputs import check_output_file
from igpolicy.cli_util import reading
from igpolicy.config import LOW_MODES, PACKINGS, POLICIES, SPARSIFIERS, PolicyConfig
from igpolicy.limits import check_count
from igpolicy.plan import SyncPlan, compare_plans
from igpolicy.units import format_bytes, parse_bandwidth, parse_size, parse_time
from igsim.step.workload import Workload

__all__ = [
    "add_model_arguments",
    "add_policy_arguments",
    "check_output_files",
    "check_sim_steps",
    "check_workers",
    "collective_footnote",
    "format_plan_table",
    "load_calibration",
    "load_plan",
    "make_config",
    "make_topology",
    "make_workload",
    "parse_window",
    "plan_for",
]


def check_output_files(args: argparse.Namespace, *names: str) -> None:
    """Every output file named by the flags ``names`` (``args`` attributes, e.g. "csv") can be
    written: checked before the work (igpolicy.cli_outputs.check_output_file)."""
    for name in names:
        value = getattr(args, name, None)
        if value:
            check_output_file(value, flag="--" + name.replace("_", "-"))


def check_sim_steps(steps: int) -> int:
    """``--steps`` in [1, igpolicy.limits.MAX_SIM_STEPS]."""
    return check_count(steps, what="--steps", limit="MAX_SIM_STEPS")


def check_workers(workers: int) -> int:
    """``--workers`` in [1, igpolicy.limits.MAX_WORKERS] (each one is a process)."""
    return check_count(workers, what="--workers", limit="MAX_WORKERS")


def load_plan(path: str | None, *, flag: str = "--plan") -> SyncPlan | None:
    """The SyncPlan in ``path`` (None without one); ValueError naming the file for anything wrong
    with it, a number too large included, and for a release period above MAX_RELEASE_PERIOD."""
    if not path:
        return None
    with reading(path, flag):
        plan = SyncPlan.load(path)
    check_count(plan.release_period, what=f"{flag} {path}: release_period", limit="MAX_RELEASE_PERIOD")
    return plan


def parse_window(text: str | None) -> tuple[int, int] | None:
    """``"a:b"`` -> (a, b) with 0 <= a < b; None stays None. Raises ValueError naming the text."""
    if text is None:
        return None
    parts = text.split(":")
    try:
        a, b = (int(x) for x in parts)
    except ValueError:
        raise ValueError(f"--window {text!r}: expected A:B with integer steps, e.g. 10:200") from None
    if not (0 <= a < b):
        raise ValueError(f"--window {text!r}: need 0 <= A < B")
    return a, b


def format_plan_table(plan: SyncPlan, scores: Any) -> str:
    """Components, highest score first: class, phase, score, its parts and bytes per release."""
    rows = {r["key"]: r for r in scores.table()}
    by_key = plan.by_key
    lines = [
        f"{'component':32s} {'class':9s} {'phase':>5s} {'score':>6s} {'magn':>6s} {'consist':>7s} {'bytes/release':>13s}"
    ]
    for key, r in rows.items():
        c = by_key[key]
        phase = "-" if c.phase is None else str(c.phase)
        lines.append(
            f"{key:32s} {c.cls.value:9s} {phase:>5s} {r['score']:6.3f} {r['magnitude']:6.3f} "
            f"{r['consistency']:7.3f} {format_bytes(c.expected_bytes):>13s}"
        )
    return "\n".join(lines)


COLLECTIVE_HELP = (
    "per bucket: sparse = an all-gather of (index, value) pairs, dense = a ring all-reduce of the "
    "whole bucket, auto (default) = the one that moves fewer bytes on the bucket's nominal sizes: "
    "sparse while its density is at most 2 x dense value bytes / (ranks x (index + value bytes)), 1/ranks "
    "with 4-byte indices and values; the table's collective column says what each policy used"
)


def add_policy_arguments(p: argparse.ArgumentParser, *, policy: bool = True) -> None:
    """The policy flags; ``policy=False`` leaves out ``--policy`` (igsim sweep takes ``--policies``)."""
    if policy:
        p.add_argument(
            "--policy", required=True, choices=POLICIES, help=f"sync policy (required): {', '.join(POLICIES)}"
        )
    p.add_argument(
        "--sparsifier",
        default=None,
        choices=SPARSIFIERS,
        help="default: adtopk for --policy adtopk, else topk",
    )
    p.add_argument(
        "--density",
        type=float,
        default=None,
        help="sparsifier density in (0, 1] (default: the trace's, else 0.01)",
    )
    p.add_argument(
        "--release-period", type=int, default=4, help="R: low-importance components release every R steps (default 4)"
    )
    p.add_argument(
        "--no-stagger", action="store_true", help="release every low component on one step (burst)"
    )
    p.add_argument("--packing", default="kk", choices=PACKINGS, help="bucket packing (default kk)")
    p.add_argument("--num-buckets", type=int, default=None, help="bucket count (default: from --bucket-cap)")
    p.add_argument(
        "--bucket-cap", default="25MiB", help="bucket size cap when --num-buckets is not given, e.g. 25MiB (default)"
    )
    p.add_argument("--collective", default="auto", choices=("auto", "sparse", "dense"), help=COLLECTIVE_HELP)
    p.add_argument(
        "--value-bytes", type=int, default=4, choices=(1, 2, 4),
        help="bytes per gradient value on the wire: 4 fp32, 2 bf16, 1 int8 with a scale (default 4)",
    )
    p.add_argument(
        "--index-bytes", type=int, default=4, choices=(2, 4, 8),
        help="bytes per sparse index: 8 int64, 4 int32, 2 bucket-local uint16 (default 4)",
    )
    p.add_argument(
        "--row-sparse-embeddings", action="store_true",
        help="the 2-D token embedding sends ceil(k / dim) whole rows as (row id, row) (igrt train's flag)",
    )
    p.add_argument(
        "--low-mode", default="hold", choices=LOW_MODES,
        help="policy importance: low components 'hold' and release every R steps (default), or 'thin': "
        "send every step at density / R (igrt train's flag; other policies ignore it)",
    )


def make_config(
    args: argparse.Namespace, *, policy: str | None = None, workload: Workload | None = None
) -> PolicyConfig:
    """A PolicyConfig from the policy flags (``policy`` overrides ``--policy``); without
    ``--density``, the density the workload's trace was recorded at (else 0.01)."""
    policy = policy or args.policy
    if policy is None:
        raise ValueError(f"--policy: choose one of {', '.join(POLICIES)}")
    check_count(args.release_period, what="--release-period", limit="MAX_RELEASE_PERIOD")
    density = args.density
    if density is None:
        density = workload.k_density if workload is not None and workload.k_density is not None else 0.01
    return PolicyConfig(
        policy=policy,
        sparsifier=getattr(args, "sparsifier", None) or ("adtopk" if policy == "adtopk" else "topk"),
        density=density,
        release_period=args.release_period,
        staggered=not args.no_stagger,
        packing=args.packing,
        num_buckets=args.num_buckets,
        bucket_cap_bytes=max(1, parse_size(args.bucket_cap, flag="--bucket-cap")),
        collective=args.collective,
        value_bytes=args.value_bytes,
        index_bytes=getattr(args, "index_bytes", 4),
        row_sparse_embeddings=bool(getattr(args, "row_sparse_embeddings", False)),
        low_mode=getattr(args, "low_mode", "hold") if policy == "importance" else "hold",
        seed=getattr(args, "seed", 0),
    )


def make_topology(args: argparse.Namespace) -> Any:
    """``--topology FILE`` or a star of ``--ranks`` at ``--bandwidth`` / ``--latency``."""
    from igsim.net import topology as topo

    if args.topology:
        with reading(args.topology, "--topology"):
            return topo.load_topology(args.topology)
    check_count(args.ranks, what="--ranks", limit="MAX_RANKS")
    return topo.star(
        num_ranks=args.ranks,
        bandwidth_bytes_per_s=parse_bandwidth(args.bandwidth, flag="--bandwidth"),
        latency_s=parse_time(args.latency, flag="--latency"),
    )


def collective_footnote(config: PolicyConfig, world_sizes: Iterable[int]) -> str:
    """The footnote under a table with a ``collective`` column: the crossover density of the
    sparse-vs-dense choice at each world size (:func:`igpolicy.choice.crossover_density`, the rule
    :func:`igpolicy.choice.choose_collective` applies) and what it means for this run's density."""
    ib, vb = config.index_bytes, config.value_bytes
    sizes = sorted({int(w) for w in world_sizes if int(w) > 1})
    cross = {w: crossover_density(world_size=w, index_bytes=ib, value_bytes=vb) for w in sizes}
    at = ", ".join(f"{cross[w]:.3g} at {w} ranks" for w in sizes) or "no crossover on one rank"
    lines = [
        "collective: how each policy's buckets were aggregated (mixed D/N dense: D of the run's N payload "
        "collectives went dense).",
        f"--collective {config.collective}: "
        + (
            f"a bucket goes as a sparse gather ({ib}+{vb} bytes per index-value pair to every other rank) only "
            f"while its density is at most 2 x {vb} / (p x {ib + vb}), where a ring all-reduce (2(p-1)/p x {vb} "
            f"bytes per element) becomes cheaper: {at}."
            if config.collective == "auto"
            else f"every bucket takes the {config.collective} path (auto would switch to dense above density {at})."
        ),
    ]
    if config.collective == "auto":
        dense_at = [w for w in sizes if config.density > cross[w]]
        lines.append(
            f"At density {config.density:g}, Top-k-style buckets go dense from {dense_at[0]} ranks on and cost "
            "what dense costs there; buckets whose k rounds up (small tensors) cross earlier (mixed)."
            if dense_at
            else f"At density {config.density:g} the sparse gather wins at every world size here; only buckets "
            "whose k rounds up (small tensors) may go dense (mixed)."
        )
    lines = [textwrap.fill(line, width=110, subsequent_indent="  ") for line in lines]
    return "\n".join(lines)


def load_calibration(path: str | None) -> Any:
    if not path:
        return None
    from igsim.net.calibration import Calibration

    with reading(path, "--calibration"):
        return Calibration.load(path)


def make_workload(args: argparse.Namespace) -> Workload:
    """The workload of ``--trace`` (with ``--window``) or ``--model`` (roofline)."""
    if args.trace:
        window = parse_window(args.window)
        with reading(args.trace, "--trace"):
            return Workload.from_trace(args.trace, window=window)
    from igsim.step.architectures import architecture_workload

    return architecture_workload(
        args.model,
        accelerator=args.accelerator,
        utilisation=args.utilisation,
        tokens_per_step=args.tokens_per_step,
    )


def plan_for(workload: Workload, plan: SyncPlan | None, *, policy: str) -> tuple[SyncPlan | None, str | None]:
    """The plan to use for ``workload``; carried over when it was profiled on another model.

    Returns (plan, note) where note says what was done (None when nothing was).
    """
    if plan is None or policy != "importance":
        return plan, None
    missing, extra = compare_plans(plan, [p.component for p in workload.params])
    if not missing and not extra:
        return plan, None
    from igsim.step.architectures import transfer_plan

    moved = transfer_plan(plan, None, workload.params)
    note = (
        f"note: plan {plan.fingerprint} was profiled on another model ({len(missing)} components missing, "
        f"{len(extra)} extra); carried over by component kind and relative depth -> {moved.fingerprint}"
    )
    if moved.source.get("unmatched"):
        note += f"; pinned without a counterpart: {', '.join(moved.source['unmatched'][:8])}"
    return moved, note


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """The testbed fit's model switches (``igsim validate-report`` and ``igsim calibrate``)."""
    from igsim.studies.validation import STATISTICS

    p.add_argument(
        "--statistic",
        choices=STATISTICS,
        default="median",
        help="which time of a case's reps the fit matches and the errors compare against (default median)",
    )
    p.add_argument(
        "--one-factor",
        action="store_true",
        help="one duplex bandwidth factor for every ring op (the model before the all-gather got its own)",
    )
    p.add_argument(
        "--no-overflow",
        action="store_true",
        help="no message overflows a queue (the model before the two-level uplink's queue overflow)",
    )


def fit_from_args(args: argparse.Namespace, cases, topo, testbed):
    """The testbed fit (:func:`igsim.studies.validation.fit`) under the flags both fitting commands take."""
    from igsim.studies.validation import fit_testbed

    return fit_testbed(
        cases,
        testbed,
        small_max_bytes=args.small_max_bytes,
        large_min_bytes=args.large_min_bytes,
        per_op=not args.one_factor,
        statistic=args.statistic,
        overflow=not getattr(args, "no_overflow", False),
    )
