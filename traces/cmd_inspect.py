"""``python -m traces inspect DIR [--json] [--skip-bad]``: validate a trace and summarise it.

Reads the whole trace (every check of :func:`traces.reader.read_trace`), then prints the steps,
ranks, parameters, components, sparsifier and density, the sparse bytes per step by component kind
and the files that were not read. Bytes per step are what one rank puts on the wire for the recorded
selections: ``k · (VALUE_BYTES + INDEX_BYTES)`` (fp32 values, int32 indices), summed over a kind's
parameters and averaged over the recorded (step, rank) pairs. A broken trace is a TraceError, which
the CLI prints without a traceback and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from typing import Any

import numpy as np

from igpolicy.units import format_bytes
from igpolicy.vocab import ComponentId
from traces.reader import Trace, TraceWarning, read_trace

__all__ = ["INDEX_BYTES", "VALUE_BYTES", "add_arguments", "bytes_by_kind", "run", "summarize"]

VALUE_BYTES = 4
INDEX_BYTES = 4


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("directory", help="trace directory (manifest.json + Parquet parts)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument(
        "--skip-bad", action="store_true", help="skip unreadable parts (with a warning) instead of failing"
    )


def run(args: argparse.Namespace) -> int:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TraceWarning)
        trace = read_trace(args.directory, on_error="skip" if args.skip_bad else "raise")
    for w in caught:
        print(f"traces inspect: warning: {w.message}", file=sys.stderr)
    summary = summarize(trace)
    if args.json:
        print(json.dumps(summary, indent=2, allow_nan=False))
    else:
        _print_text(summary)
    return 0


def bytes_by_kind(trace: Trace) -> dict[str, dict[str, float]]:
    """{component kind: {"params", "numel", "k_per_step", "bytes_per_step", "dense_bytes"}}.

    ``k_per_step`` and ``bytes_per_step`` are means over recorded (step, rank) pairs of one rank's
    selected entries and their wire bytes; ``dense_bytes`` is the kind's fp32 size (numel · 4).
    """
    manifest = trace.manifest
    info = manifest.by_name
    kinds = [ComponentId.from_key(info[n].component).kind.value for n in trace.param_names]
    kind_names = sorted(set(kinds))
    kind_of_code = np.array([kind_names.index(k) for k in kinds], dtype=np.int64)
    p = trace.params
    num_pairs = _num_step_rank_pairs(p["step"], p["rank"])
    k_sum = (
        np.bincount(kind_of_code[p["param"]], weights=p["k"], minlength=len(kind_names))
        if len(p["k"])
        else None
    )
    out: dict[str, dict[str, float]] = {}
    for i, kind in enumerate(kind_names):
        members = [n for n, k in zip(trace.param_names, kinds) if k == kind]
        numel = sum(info[n].numel for n in members)
        k_mean = float(k_sum[i]) / num_pairs if k_sum is not None and num_pairs else 0.0
        out[kind] = {
            "params": len(members),
            "numel": numel,
            "k_per_step": k_mean,
            "bytes_per_step": k_mean * (VALUE_BYTES + INDEX_BYTES),
            "dense_bytes": numel * VALUE_BYTES,
        }
    return out


def summarize(trace: Trace) -> dict[str, Any]:
    """The facts ``inspect`` prints, as a JSON-able dict."""
    m = trace.manifest
    ids = trace.step_ids
    recorded = sorted({trace.param_names[c] for c in np.unique(trace.params["param"])})
    return {
        "directory": str(trace.directory),
        "workload": m.workload,
        "created_utc": m.created_utc,
        "command": m.command,
        "torch_version": m.torch_version,
        "world_size": m.world_size,
        "ranks": list(trace.ranks),
        "num_steps": trace.num_steps,
        "first_step": int(ids[0]) if len(ids) else None,
        "last_step": int(ids[-1]) if len(ids) else None,
        "num_params": len(m.params),
        "num_params_recorded": len(recorded),
        "num_components": len(m.components),
        "sparsifier": m.sparsifier,
        "density": m.density,
        "grad_accum_steps": m.grad_accum_steps,
        "rows": {
            "params": len(trace.params["step"]),
            "steps": len(trace.steps["step"]),
            "unions": len(trace.unions["step"]),
        },
        "num_parts": len(trace.parts),
        "bytes_per_step_by_kind": bytes_by_kind(trace),
        "skipped": [{"path": str(path), "reason": reason} for path, reason in trace.skipped],
    }


def _print_text(s: dict[str, Any]) -> None:
    steps = f"{s['num_steps']}" + (f" ({s['first_step']}..{s['last_step']})" if s["num_steps"] else "")
    print(f"trace {s['directory']}: workload {s['workload']!r}, recorded {s['created_utc']}")
    print(
        f"  steps: {steps}   ranks: {s['ranks']} of world_size {s['world_size']}   grad accumulation: {s['grad_accum_steps']}"
    )
    print(
        f"  params: {s['num_params']} ({s['num_params_recorded']} recorded)   components: {s['num_components']}"
        f"   sparsifier: {s['sparsifier']} at density {s['density']:g}"
    )
    rows = s["rows"]
    print(
        f"  rows: params {rows['params']}, steps {rows['steps']}, unions {rows['unions']} in {s['num_parts']} parts"
    )
    by_kind = s["bytes_per_step_by_kind"]
    total = sum(v["bytes_per_step"] for v in by_kind.values())
    print(
        f"  sparse bytes per step and rank, by component kind ({VALUE_BYTES}+{INDEX_BYTES} bytes per selected entry):"
    )
    print(
        f"    {'kind':16s} {'params':>6s} {'k/step':>12s} {'bytes/step':>12s} {'share':>6s} {'dense fp32':>12s}"
    )
    for kind, v in sorted(by_kind.items(), key=lambda kv: -kv[1]["bytes_per_step"]):
        share = v["bytes_per_step"] / total if total else 0.0
        print(
            f"    {kind:16s} {v['params']:6d} {v['k_per_step']:12.1f} {format_bytes(v['bytes_per_step']):>12s}"
            f" {share:6.1%} {format_bytes(v['dense_bytes']):>12s}"
        )
    print(f"    {'total':16s} {'':6s} {'':12s} {format_bytes(total):>12s}")
    if s["skipped"]:
        print(f"  skipped files ({len(s['skipped'])}):")
        for item in s["skipped"]:
            print(f"    {item['path']}: {item['reason']}")
    else:
        print("  skipped files: none")


def _num_step_rank_pairs(step: np.ndarray, rank: np.ndarray) -> int:
    if not len(step):
        return 0
    key = (step.astype(np.int64) - int(step.min())) * (int(rank.max()) + 1) + rank
    return len(np.unique(key))
