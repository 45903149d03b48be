"""``igsim validate-against MEASURED.csv PREDICTED.csv``: a prediction vs a measurement, per column.

Both files hold StepMetrics rows (``igsim simulate --csv`` and the runtime's metrics CSV). Rows are
joined on (step, rank); a prediction made for one representative rank (rank 0 only) is compared
with every measured rank. For each numeric column present in both: the means, the mean absolute
error, the mean relative error |p - m| / |m| over rows with m != 0, and the relative bias
(mean p - mean m) / mean m.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from pathlib import Path
from typing import Any

from igpolicy.vocab import StepMetrics

__all__ = ["add_arguments", "compare", "read_rows", "run"]

_KEY = ("step", "rank")
_SKIP = frozenset({"step", "rank", "source", "policy"})


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("measured", help="CSV of measured StepMetrics rows (source real)")
    p.add_argument("predicted", help="CSV of predicted StepMetrics rows (source sim)")
    p.add_argument("--skip-steps", type=int, default=0, help="leave out steps < N (warm-up)")
    p.add_argument("--columns", default=None, help="comma-separated columns to compare (default: all shared)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def read_rows(path: str | Path) -> list[dict[str, str]]:
    """CSV rows as dicts; raises ValueError naming the file when it is missing or lacks step/rank."""
    path = Path(path)
    try:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            rows = list(reader)
            fields = reader.fieldnames or []
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None
    missing = [k for k in _KEY if k not in fields]
    if missing:
        raise ValueError(f"{path}: not a StepMetrics CSV (no column {', '.join(missing)})")
    return rows


def _num(value: str, *, where: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: {value!r} is not a number") from None


def compare(
    measured: list[dict[str, str]],
    predicted: list[dict[str, str]],
    *,
    columns: list[str] | None = None,
    skip_steps: int = 0,
) -> dict[str, Any]:
    """Join on (step, rank) and compute per-column errors; see the module docstring."""

    def key(row: dict[str, str], where: str) -> tuple[int, int]:
        return int(_num(row["step"], where=where)), int(_num(row["rank"], where=where))

    pred = {key(r, "predicted"): r for r in predicted}
    pred_ranks = {k[1] for k in pred}
    broadcast = len(pred_ranks) == 1
    pairs = []
    for r in measured:
        step, rank = key(r, "measured")
        if step < skip_steps:
            continue
        p = pred.get((step, next(iter(pred_ranks)) if broadcast else rank))
        if p is not None:
            pairs.append((r, p))
    if not pairs:
        raise ValueError("no (step, rank) rows in common between the measurement and the prediction")
    shared = [c for c in StepMetrics.columns() if c not in _SKIP and c in pairs[0][0] and c in pairs[0][1]]
    if columns:
        unknown = [c for c in columns if c not in shared]
        if unknown:
            raise ValueError(
                f"--columns: {unknown} are not numeric columns of both files (have: {', '.join(shared)})"
            )
        shared = columns
    measured_ranks = {key(a, "measured")[1] for a, _ in pairs}
    out: dict[str, Any] = {
        "rows": len(pairs),
        "broadcast_representative": broadcast and len(measured_ranks) > 1,
        "columns": {},
    }
    for c in shared:
        m = [_num(a[c], where=f"measured column {c}") for a, _ in pairs]
        p = [_num(b[c], where=f"predicted column {c}") for _, b in pairs]
        mean_m, mean_p = sum(m) / len(m), sum(p) / len(p)
        rel = [abs(pi - mi) / abs(mi) for mi, pi in zip(m, p) if mi != 0]
        out["columns"][c] = {
            "measured_mean": mean_m,
            "predicted_mean": mean_p,
            "mean_abs_error": sum(abs(pi - mi) for mi, pi in zip(m, p)) / len(m),
            "mean_rel_error": sum(rel) / len(rel) if rel else (0.0 if all(pi == 0 for pi in p) else math.inf),
            "rel_bias": (mean_p - mean_m) / abs(mean_m) if mean_m else (0.0 if mean_p == 0 else math.inf),
        }
    return out


def run(args: argparse.Namespace) -> int:
    columns = [c.strip() for c in args.columns.split(",") if c.strip()] if args.columns else None
    report = compare(
        read_rows(args.measured), read_rows(args.predicted), columns=columns, skip_steps=args.skip_steps
    )
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    note = (
        " (prediction for one representative rank, compared with every measured rank)"
        if report["broadcast_representative"]
        else ""
    )
    print(f"{report['rows']} rows joined on (step, rank){note}")
    print(
        f"{'column':24s} {'measured':>14s} {'predicted':>14s} {'mean |err|':>12s} {'mean rel err':>12s} {'bias':>8s}"
    )
    for c, s in report["columns"].items():
        print(
            f"{c:24s} {s['measured_mean']:14.6g} {s['predicted_mean']:14.6g} {s['mean_abs_error']:12.4g} "
            f"{s['mean_rel_error']:12.2%} {s['rel_bias']:+8.1%}"
        )
    return 0
