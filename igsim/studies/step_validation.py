"""Training steps on the testbed vs igsim's replay of the same run: communication time per step.

``igrt validate --steps N`` trains every policy for N steps on the testbed (``igrt train
--record-trace``, one process per rank namespace) and leaves, in one directory::

    trace/                 a gradient trace of the workload (igrt record, loopback), for the plan
    plan.json              the SyncPlan profiled from it (igsim profile)
    real_<label>/          igrt train's output with its own trace (metrics.csv, summary.json, trace/, ops.csv);
                           label: the policy, ``importance-R<k>`` for a release period, ``-ddp-hook``
                           for the DDP-hook integration (``igrt.cli.validate.StepRun``)

:func:`simulate_runs` replays each run with :func:`igsim.studies.replay.replay_run` (its own config,
plan, integration, compute and sent counts) on the testbed topology with the fitted calibration,
and requires exact bytes and ops; :func:`compare_steps` compares, per run, the
mean over steps (after ``skip_steps``) of

- ``comm_s``, measured and predicted: the mean over ranks, and the minimum over ranks, each against
  its like. A rank that reaches a collective early waits for the others' compute, and that wait
  counts as communication; the replay runs every rank with its own recorded compute, so it
  predicts those waits too. The rank that arrives last waits only for the network, so the minimum
  is the network's share;
- ``step_s``: the step period (:data:`STEP_TIME_OF`);
- bytes on the wire (must agree exactly: both sides make the same decisions).

and reports the error of the predicted ``comm_s`` against each and of the predicted step time, their mean absolute
value over runs, and the Kendall tau of the runs ranked by step time and by communication
time.

Honest edges: :func:`range_flags` names what puts a run outside the range the model was validated
on (2 ranks on gloo; more ranks than cores, or a CPU busy with other work while it ran). Flagged
runs are shown with their reason and left out of the means and the taus, which are computed over
the runs inside the range (or over all runs, said so, when none is).
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

__all__ = [
    "RESOLVE_Z",
    "compare_steps",
    "format_steps",
    "judge_run",
    "last_rank_spread",
    "range_flags",
    "read_metrics",
    "run_flags",
    "simulate_runs",
    "summary_line",
]

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
    steps_dir: str | Path, *, topology: Topology, calibration: Calibration, **model: bool
) -> dict[str, tuple[list[dict[str, float]], list[dict[str, Any]]]]:
    """For every ``real_<label>`` run in ``steps_dir``, by label: (measured rows, predicted rows), from
    :func:`igsim.studies.replay.replay_run` — the run's own trace, plan and integration (so each run
    must have been trained with ``--record-trace``; ``model``: its ``combine`` / ``carry_skew``
    switches, for ablations). Raises ValueError when a replay's bytes or ops
    do not agree exactly with the run (the comparison of times would be about different steps)."""
    from igsim.studies.replay import replay_run

    root = Path(steps_dir)
    runs = sorted(p for p in root.glob("real_*") if p.is_dir())
    if not runs:
        raise ValueError(f"{root}: no real_<policy> run directories")
    out = {}
    for run in runs:
        rep = replay_run(run, topology=topology, calibration=calibration, **model)
        s = rep.summary
        if not (s["bytes_exact"] and s["ops_exact"]):
            raise ValueError(
                f"{run}: the replay does not execute the run's steps (bytes exact: {s['bytes_exact']}, "
                f"ops exact: {s['ops_exact']}; first mismatches {s['byte_mismatches'][:2]})"
            )
        out[run.name[len("real_") :]] = (rep.measured, rep.predicted)
    return out


#: what the step time compares, on each side: the step period, which sets the throughput
STEP_TIME_OF = (
    "the step period: measured, the mean over ranks of each rank's step time (every rank times its step "
    "from its own start, so skew carried over from the previous step moves time between ranks, not "
    "their total); predicted, the same: the replay starts each rank's step when that rank finished its "
    "previous one, as the runtime does (no barrier between steps)"
)

#: a run's 1-minute load average above this share of the cores: the ranks did not have the CPU to
#: themselves, and per-message overheads become scheduling delays the model does not cost
BUSY_LOAD_SHARE = 1.0


def range_flags(summary: Mapping[str, Any]) -> list[str]:
    """Why a run (its ``summary.json``) lies outside the model's validated range; empty when it does not.

    - 2 ranks on gloo: a pair's sends and the receiver's notifications share one TCP stream, which
      serialises a ring's two directions (docs/validation.md); validated from 3 ranks.
    - more ranks than CPU cores: ranks wait for a core, not for the network.
    - a 1-minute load average above :data:`BUSY_LOAD_SHARE` x the cores while the run ended.
    """
    flags = []
    world = int(summary.get("world_size", 0) or 0)
    if world == 2 and summary.get("backend") == "gloo":
        flags.append("2 ranks on gloo (one TCP stream per pair serialises a ring; validated from 3 ranks)")
    machine = summary.get("machine") or {}
    cores = int(machine.get("cpu_count") or 0)
    if cores and world > cores:
        flags.append(f"{world} ranks on {cores} cores (ranks wait for a core, not the network)")
    load = (machine.get("load_average") or [None])[0]
    if cores and load is not None and float(load) > BUSY_LOAD_SHARE * cores:
        flags.append(
            f"CPU busy: load {float(load):.1f} on {cores} cores (scheduling delays are not modelled)"
        )
    return flags


def run_flags(steps_dir: str | Path) -> dict[str, list[str]]:
    """:func:`range_flags` of every ``real_<label>`` run in ``steps_dir``, by label."""
    import json

    out = {}
    for run in sorted(p for p in Path(steps_dir).glob("real_*") if p.is_dir()):
        summary = json.loads((run / "summary.json").read_text())
        out[run.name[len("real_") :]] = range_flags(summary)
    return out


def _per_step(rows: Rows, column: str, reduce) -> dict[int, float]:
    by_step: dict[int, list[float]] = {}
    for r in rows:
        by_step.setdefault(int(r["step"]), []).append(float(r[column]))
    return {s: reduce(v) for s, v in by_step.items()}


#: a run's error is *resolved* (the measurement can tell it) when the prediction lies more than this
#: many standard errors of the measured mean from it (about a 95 % interval)
RESOLVE_Z = 2.0


def last_rank_spread(rows: Rows, *, skip_steps: int = 1) -> dict[str, float]:
    """The last-arriving rank's communication per step (the minimum over ranks of each step's
    ``comm_s``, steps from ``skip_steps``) of one run's rows: ``mean_s``, ``sd_s`` (over steps),
    ``se_s`` (``sd / sqrt(steps)``, the standard error of the mean; NaN below 2 steps) and ``steps``."""
    per = _per_step(rows, "comm_s", min)
    xs = [per[s] for s in sorted(per) if s >= skip_steps]
    if not xs:
        raise ValueError(f"no step >= {skip_steps} in the rows")
    sd = statistics.stdev(xs) if len(xs) >= 2 else math.nan
    return {"mean_s": statistics.mean(xs), "sd_s": sd, "se_s": sd / math.sqrt(len(xs)), "steps": len(xs)}


def judge_run(
    measured_s: float, predicted_s: float, se_s: float, sd_s: float, *, target: float = 0.10
) -> dict[str, Any]:
    """One run's communication against a relative ``target``: ``verdict`` is ``met`` (within it),
    ``missed`` (outside it, and the prediction more than :data:`RESOLVE_Z` standard errors from the
    measured mean, so the measurement can tell), or ``unresolved`` (outside it, but within that
    many standard errors: the run's steps vary too much to judge it; ``steps_to_resolve`` is how
    many steps would bring ``RESOLVE_Z`` standard errors down to half the target)."""
    err = (predicted_s - measured_s) / measured_s if measured_s else math.nan
    z = (predicted_s - measured_s) / se_s if se_s and se_s > 0 else math.inf
    if abs(err) <= target:
        verdict = "met"
    elif abs(z) > RESOLVE_Z:
        verdict = "missed"
    else:
        verdict = "unresolved"
    need = math.ceil((RESOLVE_Z * sd_s / (0.5 * target * measured_s)) ** 2) if sd_s == sd_s and measured_s else None
    return {"error": err, "z": z, "verdict": verdict, "steps_to_resolve": need}


def compare_steps(
    runs: Mapping[str, tuple[Rows, Rows]],
    *,
    skip_steps: int = 1,
    flags: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, Any]:
    """Per run (by label) and overall (see the module docstring). Steps below ``skip_steps`` are
    left out; only steps present on both sides count; ``flags`` (label -> reasons, :func:`run_flags`) marks
    runs outside the validated range. JSON-ready."""
    flags = flags or {}
    policies: dict[str, Any] = {}
    for policy, (real, sim) in runs.items():
        real_min = _per_step(real, "comm_s", min)
        real_mean = _per_step(real, "comm_s", statistics.mean)
        sim_comm = _per_step(sim, "comm_s", statistics.mean)
        sim_min = _per_step(sim, "comm_s", min)
        steps = sorted(s for s in real_min if s >= skip_steps and s in sim_comm)
        if not steps:
            raise ValueError(f"policy {policy}: no step >= {skip_steps} in both the run and the replay")

        def mean(d: Mapping[int, float], steps: list[int] = steps) -> float:
            return float(statistics.mean(d[s] for s in steps))

        m_min, m_mean, p, p_min = mean(real_min), mean(real_mean), mean(sim_comm), mean(sim_min)
        spread = last_rank_spread([r for r in real if int(r["step"]) in set(steps)], skip_steps=skip_steps)
        judged = judge_run(m_min, p_min, spread["se_s"], spread["sd_s"])
        policies[policy] = {
            "steps": len(steps),
            "measured_comm_min_over_ranks_s": m_min,
            "measured_comm_mean_over_ranks_s": m_mean,
            "predicted_comm_s": p,
            "predicted_comm_min_over_ranks_s": p_min,
            # like for like: the replay runs every rank with its own recorded compute, so it
            # predicts the waits of early ranks too; min against min, mean against mean
            "error_vs_min": (p_min - m_min) / m_min if m_min else math.nan,
            "error_vs_mean": (p - m_mean) / m_mean if m_mean else math.nan,
            # how well the run's own steps pin its last-rank communication down (judge_run)
            "measured_comm_min_over_ranks_se_s": spread["se_s"],
            "verdict_vs_min": judged["verdict"],
            "steps_to_resolve": judged["steps_to_resolve"],
            "measured_step_s": mean(_per_step(real, "step_s", statistics.mean)),
            "measured_step_max_over_ranks_s": mean(_per_step(real, "step_s", max)),
            "predicted_step_s": mean(_per_step(sim, "step_s", statistics.mean)),
            "step_time_of": STEP_TIME_OF,
            "measured_wire_bytes": mean(_per_step(real, "wire_bytes", statistics.mean)),
            "predicted_wire_bytes": mean(_per_step(sim, "wire_bytes", statistics.mean)),
        }
        v = policies[policy]
        v["step_error"] = (
            (v["predicted_step_s"] - v["measured_step_s"]) / v["measured_step_s"]
            if v["measured_step_s"]
            else math.nan
        )
        v["outside_range"] = list(flags.get(policy, ()))
    out: dict[str, Any] = {"skip_steps": skip_steps, "policies": policies}
    inside = [v for v in policies.values() if not v["outside_range"]]
    out["runs_in_range"] = len(inside)
    out["means_over"] = (
        "runs inside the validated range" if inside else "all runs (none is inside the validated range)"
    )
    vals = inside or list(policies.values())
    out["mean_abs_error_vs_min"] = statistics.mean(abs(v["error_vs_min"]) for v in vals)
    out["mean_abs_error_vs_mean"] = statistics.mean(abs(v["error_vs_mean"]) for v in vals)
    out["mean_abs_step_error"] = statistics.mean(abs(v["step_error"]) for v in vals)
    out["verdicts_vs_min"] = {
        k: sum(v["verdict_vs_min"] == k for v in vals) for k in ("met", "missed", "unresolved")
    }
    if len(vals) >= 2:  # over the same runs as the means
        out["kendall_tau_step"] = kendall_tau(
            [v["measured_step_s"] for v in vals], [v["predicted_step_s"] for v in vals]
        )
        out["kendall_tau_comm"] = kendall_tau(
            [v["measured_comm_min_over_ranks_s"] for v in vals],
            [v.get("predicted_comm_min_over_ranks_s", v["predicted_comm_s"]) for v in vals],
        )
    return out


def summary_line(report: Mapping[str, Any], *, what: str) -> str:
    """One line of a step comparison's means (a :func:`compare_steps` report), ``what`` naming how it
    was predicted: last-rank and mean-rank communication, step time, the verdicts and tau."""
    n = report.get("verdicts_vs_min", {})
    return (
        f"{what} ({(report.get('calibration') or 'its file').split(' (')[0]}): last rank {report['mean_abs_error_vs_min']:.1%}, "
        f"mean rank {report['mean_abs_error_vs_mean']:.1%}, step {report.get('mean_abs_step_error', math.nan):.1%}; "
        f"within 10%: {n.get('met', 0)} met, {n.get('missed', 0)} missed, {n.get('unresolved', 0)} unresolved; "
        f"Kendall tau by step time {report.get('kendall_tau_step', math.nan):.3f}"
    )


def format_steps(report: Mapping[str, Any]) -> str:
    """The step comparison as a plain-text table (times in ms): communication of the last-arriving
    rank and of the mean rank, measured / predicted / error each, then the step time."""
    width = max([12, *(len(k) for k in report["policies"])])
    lines = [
        f"{'run':{width}s} {'steps':>5s} {'comm last':>10s} {'± se':>7s} {'predicted':>10s} {'err':>7s} "
        f"{'verdict':>10s} {'comm mean':>10s} "
        f"{'predicted':>10s} {'err':>7s} {'step ms':>9s} {'predicted':>9s} {'err':>7s} {'bytes ok':>8s}"
    ]
    flagged = []
    for policy, v in report["policies"].items():
        same = math.isclose(v["measured_wire_bytes"], v["predicted_wire_bytes"], rel_tol=1e-9)
        p_min = v.get("predicted_comm_min_over_ranks_s", v["predicted_comm_s"])
        lines.append(
            f"{policy:{width}s} {v['steps']:5d} {v['measured_comm_min_over_ranks_s'] * 1e3:10.2f} "
            f"{v.get('measured_comm_min_over_ranks_se_s', math.nan) * 1e3:7.2f} "
            f"{p_min * 1e3:10.2f} {v['error_vs_min']:+7.1%} {v.get('verdict_vs_min', '-'):>10s} "
            f"{v['measured_comm_mean_over_ranks_s'] * 1e3:10.2f} "
            f"{v['predicted_comm_s'] * 1e3:10.2f} {v['error_vs_mean']:+7.1%} {v['measured_step_s'] * 1e3:9.1f} "
            f"{v['predicted_step_s'] * 1e3:9.1f} {v.get('step_error', math.nan):+7.1%} {'yes' if same else 'NO':>8s}"
            + (" *" if v.get("outside_range") else "")
        )
        if v.get("outside_range"):
            flagged.append(f"  * {policy}: outside the validated range: {'; '.join(v['outside_range'])}")
    lines.append(f"step = {STEP_TIME_OF}")
    lines += flagged
    over = report.get("means_over", "all runs")
    lines.append(
        f"over {over}: comm per step, mean |error| {report['mean_abs_error_vs_min']:.1%} (last-arriving "
        f"rank), {report['mean_abs_error_vs_mean']:.1%} (mean rank); step time "
        f"{report.get('mean_abs_step_error', math.nan):.1%}; target 10%"
    )
    if "verdicts_vs_min" in report:
        n = report["verdicts_vs_min"]
        lines.append(
            f"last-rank comm within 10%: {n['met']} met, {n['missed']} missed, {n['unresolved']} unresolved "
            f"(outside 10% but within {RESOLVE_Z:g} standard errors of the run's own mean over its steps: "
            "too few or too varied steps to judge; more steps resolve them)"
        )
    if "kendall_tau_step" in report:
        lines.append(
            f"Kendall tau of the runs: by step time {report['kendall_tau_step']:.3f}, by communication time "
            f"{report['kendall_tau_comm']:.3f} (target 0.9)"
        )
    return "\n".join(lines)
