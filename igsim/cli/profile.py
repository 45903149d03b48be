"""``igsim profile TRACE -o plan.json``: score a recorded trace's components and write a SyncPlan.

Pipeline: read the trace (optionally a step window) -> per-parameter series, means over ranks
(sel_norm, overlap, k, grad_norm) -> per-component statistics -> importance scores -> adaptive
threshold -> plan. A component's expected bytes per release are its nominal k pairs (at the trace's
density) times 8 bytes (int32 index + fp32 value).
"""

from __future__ import annotations

import argparse
from typing import Any

from igpolicy.cli_util import add_deprecated_alias
from igpolicy.importance import SIZE_NORMS, ImportanceConfig
from igpolicy.vocab import ComponentClass
from igsim.cli.options import format_plan_table, parse_window
from traces.profiling import profile_trace

__all__ = ["add_arguments", "run"]

METHODS = ("knee", "otsu", "gmm", "kmeans2", "percentile", "fixed_ratio")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("trace", help="trace directory (manifest.json + Parquet parts)")
    out = p.add_argument("-o", "--out", dest="out", default=None, help="where to write the SyncPlan JSON (required)")
    add_deprecated_alias(p, "--output", out)
    p.add_argument("--method", default="knee", choices=METHODS, help="threshold method (default knee)")
    p.add_argument(
        "--method-param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="threshold parameter, e.g. q=75 for percentile or ratio=0.3 for fixed_ratio (repeatable)",
    )
    p.add_argument("--release-period", type=int, default=4, help="R: low components release every R steps")
    p.add_argument("--window", default=None, metavar="A:B", help="profile recorded steps A <= step < B only")
    p.add_argument(
        "--complete-prefix",
        action="store_true",
        help="profile an incomplete trace (a recording that stopped mid-way) up to its first incomplete step",
    )
    p.add_argument(
        "--fresh",
        action="append",
        default=[],
        metavar="PATTERN",
        help="freshly initialised parameters (module name or glob; 'auto': classifier, score, qa_outputs) "
        "form the always-pinned component 'fresh'; repeatable; train with the same --fresh",
    )
    p.add_argument(
        "--size-norm",
        choices=SIZE_NORMS,
        default="numel",
        help="selected norm per sqrt(numel) (default, the prototype's) or per sqrt(selected entries): "
        "a row-sparse embedding is not diluted by its untouched rows",
    )
    p.add_argument(
        "--max-share",
        type=float,
        default=None,
        metavar="S",
        help="cap the plan's expected bytes per step at S x every component every step: the lowest-scored "
        "important components become low until it fits (e.g. 0.25)",
    )
    p.add_argument("--quiet", action="store_true", help="print only the summary line")


def _method_params(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--method-param {item!r}: expected KEY=VALUE")
        try:
            out[key] = int(value)
        except ValueError:
            try:
                out[key] = float(value)
            except ValueError:
                out[key] = value
    return out


def run(args: argparse.Namespace) -> int:
    if args.out is None:
        raise ValueError("give -o/--out FILE: where to write the SyncPlan JSON")
    from igpolicy.cli_outputs import check_output_file

    check_output_file(args.out, flag="--out")  # before the work, not after it
    window = parse_window(args.window)
    plan, scores, result = profile_trace(
        args.trace,
        method=args.method,
        method_params=_method_params(args.method_param),
        release_period=args.release_period,
        window=window,
        complete_prefix=args.complete_prefix,
        fresh=tuple(args.fresh),
        importance=ImportanceConfig(size_norm=args.size_norm),
        max_share=args.max_share,
    )
    if "truncated_at" in plan.source:
        print(
            f"note: the trace is incomplete; profiled its complete prefix, {plan.source['num_steps']} steps "
            f"before step {plan.source['truncated_at']}"
        )
    if not args.quiet:
        print(format_plan_table(plan, scores))
    n_imp = sum(1 for c in plan.components if c.cls == ComponentClass.IMPORTANT)
    n_pin = sum(1 for c in plan.components if c.cls == ComponentClass.PINNED)
    low_bytes = sum(c.expected_bytes for c in plan.components if c.cls == ComponentClass.LOW)
    all_bytes = sum(c.expected_bytes for c in plan.components)
    print(
        f"threshold {result.method} = {result.threshold:.4f}: {n_imp} important, {n_pin} pinned, "
        f"{len(plan.low)} low of {len(plan.components)} components; low share of bytes "
        f"{low_bytes / max(all_bytes, 1):.1%}; release period {plan.release_period}; "
        f"expected {plan.expected_share:.3f} x every component every step"
    )
    cap = plan.settings["threshold"].get("max_share")
    if cap is not None:
        print(
            f"bytes cap {cap['cap']:g}: {len(cap['demoted'])} important component(s) made low "
            f"({cap['share_before']:.3f} -> {cap['share']:.3f})"
            + ("" if cap["reached"] else "; NOT reached: that is the least with every unpinned component low")
        )
    path = plan.save(args.out)
    print(f"wrote {path} (fingerprint {plan.fingerprint})")
    return 0
