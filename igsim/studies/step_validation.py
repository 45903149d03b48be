"""Training steps on the testbed vs igsim's replay of the same run: communication time per step.

``igrt validate --steps N`` trains every policy for N steps on the testbed (``igrt train
--record-trace``, one process per rank namespace) and leaves, in one directory::

    trace/                 a gradient trace of the workload (igrt record, loopback), for the plan
    plan.json              the SyncPlan profiled from it (igsim profile)
    real_<policy>/         igrt train's output with its own trace (metrics.csv, summary.json, trace/, ops.csv)

:func:`simulate_runs` replays each run with :func:`igsim.studies.replay.replay_run` (its own config,
plan, integration, compute and sent counts) on the testbed topology with the fitted calibration,
and requires exact bytes and ops; :func:`compare_steps` compares, per policy, the
mean over steps (after ``skip_steps``) of

- ``comm_s`` as measured: the mean over ranks, and the minimum over ranks. A rank that reaches a
  collective early waits for the others' compute, and that wait counts as communication; the rank
  that arrives last waits only for the network, so the minimum is the network's share;
- ``step_s`` (the slowest rank's step);
- bytes on the wire (must agree exactly: both sides make the same decisions).

and reports the error of the predicted ``comm_s`` against each, their mean absolute value over
policies, and the Kendall tau of the policies ranked by step time and by communication time.
"""

from __future__ import annotations

import csv
import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from igsim.net.calibration import Calibration
from igsim.net.topology import Topology
from igsim.studies.validation import kendall_tau

__all__ = ["compare_steps", "format_steps", "read_metrics", "simulate_runs"]

Rows = Sequence[Mapping[str, Any]]


def read_metrics(path: str | Path) -> list[dict[str, float]]:
    """StepMetrics rows of a metrics CSV as floats (non-numeric columns dropped)."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{path}: no such metrics file")
    out = []
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            parsed = {}
            for k, v in row.items():
                try:
                    parsed[k] = float(v)
                except (TypeError, ValueError):
                    continue
            out.append(parsed)
    if not out or "step" not in out[0] or "comm_s" not in out[0]:
        raise ValueError(f"{path}: not a StepMetrics CSV with step and comm_s")
    return out


def simulate_runs(
    steps_dir: str | Path, *, topology: Topology, calibration: Calibration
) -> dict[str, tuple[list[dict[str, float]], list[dict[str, Any]]]]:
    """For every ``real_<policy>`` run in ``steps_dir``: (measured rows, predicted rows), from
    :func:`igsim.studies.replay.replay_run` — the run's own trace, plan and integration (so each run
    must have been trained with ``--record-trace``). Raises ValueError when a replay's bytes or ops
    do not agree exactly with the run (the comparison of times would be about different steps)."""
    from igsim.studies.replay import replay_run

    root = Path(steps_dir)
    runs = sorted(p for p in root.glob("real_*") if p.is_dir())
    if not runs:
        raise ValueError(f"{root}: no real_<policy> run directories")
    out = {}
    for run in runs:
        rep = replay_run(run, topology=topology, calibration=calibration)
        s = rep.summary
        if not (s["bytes_exact"] and s["ops_exact"]):
            raise ValueError(
                f"{run}: the replay does not execute the run's steps (bytes exact: {s['bytes_exact']}, "
                f"ops exact: {s['ops_exact']}; first mismatches {s['byte_mismatches'][:2]})"
            )
        out[s["policy"]] = (rep.measured, rep.predicted)
    return out


def _per_step(rows: Rows, column: str, reduce) -> dict[int, float]:
    by_step: dict[int, list[float]] = {}
    for r in rows:
        by_step.setdefault(int(r["step"]), []).append(float(r[column]))
    return {s: reduce(v) for s, v in by_step.items()}


def compare_steps(runs: Mapping[str, tuple[Rows, Rows]], *, skip_steps: int = 1) -> dict[str, Any]:
    """Per policy and overall (see the module docstring). Steps below ``skip_steps`` are left out;
    only steps present on both sides count. JSON-ready."""
    policies: dict[str, Any] = {}
    for policy, (real, sim) in runs.items():
        real_min = _per_step(real, "comm_s", min)
        real_mean = _per_step(real, "comm_s", statistics.mean)
        sim_comm = _per_step(sim, "comm_s", statistics.mean)
        steps = sorted(s for s in real_min if s >= skip_steps and s in sim_comm)
        if not steps:
            raise ValueError(f"policy {policy}: no step >= {skip_steps} in both the run and the replay")

        def mean(d: Mapping[int, float], steps: list[int] = steps) -> float:
            return float(statistics.mean(d[s] for s in steps))

        m_min, m_mean, p = mean(real_min), mean(real_mean), mean(sim_comm)
        policies[policy] = {
            "steps": len(steps),
            "measured_comm_min_over_ranks_s": m_min,
            "measured_comm_mean_over_ranks_s": m_mean,
            "predicted_comm_s": p,
            "error_vs_min": (p - m_min) / m_min if m_min else math.nan,
            "error_vs_mean": (p - m_mean) / m_mean if m_mean else math.nan,
            "measured_step_s": mean(_per_step(real, "step_s", max)),
            "predicted_step_s": mean(_per_step(sim, "step_s", max)),
            "measured_wire_bytes": mean(_per_step(real, "wire_bytes", statistics.mean)),
            "predicted_wire_bytes": mean(_per_step(sim, "wire_bytes", statistics.mean)),
        }
    out: dict[str, Any] = {"skip_steps": skip_steps, "policies": policies}
    vals = list(policies.values())
    out["mean_abs_error_vs_min"] = statistics.mean(abs(v["error_vs_min"]) for v in vals)
    out["mean_abs_error_vs_mean"] = statistics.mean(abs(v["error_vs_mean"]) for v in vals)
    if len(vals) >= 2:
        out["kendall_tau_step"] = kendall_tau(
            [v["measured_step_s"] for v in vals], [v["predicted_step_s"] for v in vals]
        )
        out["kendall_tau_comm"] = kendall_tau(
            [v["measured_comm_min_over_ranks_s"] for v in vals], [v["predicted_comm_s"] for v in vals]
        )
    return out


def format_steps(report: Mapping[str, Any]) -> str:
    """The step comparison as a plain-text table (times in ms)."""
    lines = [
        f"{'policy':12s} {'steps':>5s} {'comm min':>10s} {'comm mean':>10s} {'predicted':>10s} {'err(min)':>9s} "
        f"{'err(mean)':>9s} {'step ms':>9s} {'pred step':>9s} {'bytes ok':>8s}"
    ]
    for policy, v in report["policies"].items():
        same = math.isclose(v["measured_wire_bytes"], v["predicted_wire_bytes"], rel_tol=1e-9)
        lines.append(
            f"{policy:12s} {v['steps']:5d} {v['measured_comm_min_over_ranks_s'] * 1e3:10.2f} "
            f"{v['measured_comm_mean_over_ranks_s'] * 1e3:10.2f} {v['predicted_comm_s'] * 1e3:10.2f} "
            f"{v['error_vs_min']:+9.1%} {v['error_vs_mean']:+9.1%} {v['measured_step_s'] * 1e3:9.1f} "
            f"{v['predicted_step_s'] * 1e3:9.1f} {'yes' if same else 'NO':>8s}"
        )
    lines.append(
        f"comm per step, mean |error| over policies: {report['mean_abs_error_vs_min']:.1%} (vs the last-arriving "
        f"rank), {report['mean_abs_error_vs_mean']:.1%} (vs the mean rank); target 10%"
    )
    if "kendall_tau_step" in report:
        lines.append(
            f"Kendall tau of policies: by step time {report['kendall_tau_step']:.3f}, by communication time "
            f"{report['kendall_tau_comm']:.3f} (target 0.95)"
        )
    return "\n".join(lines)
