"""Replay a real training run in the simulator and compare, step by step and rank by rank.

``igsim replay RUN_DIR`` reads an ``igrt train --record-trace`` output folder — its
``summary.json`` (policy config, integration, world size, DDP's bucket caps), ``plan.json``, the
run's own trace (``trace/``: phase times, ready times, the entries each rank sent) and the ops the
runtime executed (``ops.csv``) — simulates the same steps with :func:`igsim.step.engine.simulate`, and
compares, per step, every :class:`~igpolicy.vocab.StepMetrics` field of :data:`FIELDS`, and the
issued collective operations (kind, bucket, encoded bytes). Bytes and collective counts must agree
exactly (both sides execute :mod:`igpolicy.step_plan`'s plan); times are the model's prediction.

A trace that stopped mid-way (a rank killed while it recorded: its last steps never committed) is
refused, as by ``igsim simulate``; ``complete_prefix=True`` (``igsim replay --complete-prefix``)
replays the steps before its first incomplete one and compares those steps only.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from igpolicy.config import PolicyConfig
from igpolicy.plan import SyncPlan
from igsim.step.results import SPAN_KINDS
from traces.schema import RUN_SUMMARY_FORMAT as SUMMARY_FORMAT

__all__ = ["BYTE_FIELDS", "FIELDS", "Replay", "load_run", "replay_run"]

BYTE_FIELDS = ("values_bytes", "indices_bytes", "dense_bytes", "metadata_bytes", "num_collectives")
TIME_FIELDS = ("comm_s", "exposed_comm_s", "step_s")
FIELDS = BYTE_FIELDS + TIME_FIELDS


@dataclass(frozen=True, kw_only=True)
class RunInputs:
    """What a replay reads from a run folder."""

    directory: Path
    summary: dict[str, Any]
    config: PolicyConfig
    plan: SyncPlan | None
    integration: str
    world_size: int
    measured: list[dict[str, float]]  # metrics.csv rows
    ops: list[dict[str, str]]  # ops.csv rows
    plan_schedule: tuple[tuple[int, SyncPlan], ...] | None = None  # online profiling: plans.jsonl


def _fail(path: Path, why: str) -> ValueError:
    return ValueError(f"{path}: {why}")


def load_run(run_dir: str | Path) -> RunInputs:
    """Read and check a run folder; ValueError naming the missing or mismatching file."""
    from igsim.studies.step_validation import read_metrics

    root = Path(run_dir)
    path = root / "summary.json"
    if not path.is_file():
        if (root / "trace").is_dir() or (root / "checkpoint").is_dir():
            raise _fail(root, "the run did not finish (no summary.json: killed?); resume it with igrt train "
                        "--resume to its end, then replay it")  # fmt: skip
        raise _fail(root, "not an igrt train output folder (no summary.json)")
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise _fail(path, f"unreadable ({e})") from None
    if not isinstance(summary, dict) or summary.get("summary_format") != SUMMARY_FORMAT:
        got = summary.get("summary_format") if isinstance(summary, dict) else None
        raise _fail(
            path,
            f"summary format {got!r}, expected {SUMMARY_FORMAT!r} (a run from another version: rerun igrt train)",
        )
    if not summary.get("record_trace") or not (root / "trace").is_dir() or not (root / "ops.csv").is_file():
        raise _fail(root, "the run has no trace (trace/ and ops.csv): rerun igrt train with --record-trace")
    config = PolicyConfig.from_dict(summary["config"], where=f"{path} config")
    plan, schedule = None, None
    if config.online_profiling:
        schedule = _plan_schedule(root)
    elif config.policy == "importance":
        plan_path = root / "plan.json"
        if not plan_path.is_file():
            raise _fail(root, "an importance run without plan.json")
        plan = SyncPlan.load(plan_path)
        want = (summary.get("plan") or {}).get("fingerprint")
        if plan.fingerprint != want:
            raise _fail(plan_path, f"plan fingerprint {plan.fingerprint} does not match the run's {want}")
    with (root / "ops.csv").open(newline="") as f:
        ops = list(csv.DictReader(f))
    return RunInputs(
        directory=root,
        summary=summary,
        config=config,
        plan=plan,
        integration=str(summary["integration"]),
        world_size=int(summary["world_size"]),
        measured=read_metrics(root / "metrics.csv"),
        ops=ops,
        plan_schedule=schedule,
    )


def _plan_schedule(root: Path) -> tuple[tuple[int, SyncPlan], ...]:
    """An online-profiling run's plans (``plans.jsonl``: from which step each applies)."""
    path = root / "plans.jsonl"
    if not path.is_file():
        raise _fail(root, "an online-profiling run without plans.jsonl")
    out = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            out.append((int(row["step"]), SyncPlan.from_json(row["plan"], where=f"{path}:{i}")))
        except (ValueError, KeyError, TypeError) as e:
            raise _fail(path, f"line {i}: not a plans.jsonl row ({e})") from None
    if not out:
        raise _fail(path, "no plan")
    return tuple(out)


def run_workload(inputs: RunInputs, *, complete_prefix: bool = False):
    """The run's own workload: every rank's own compute, readiness (means over ranks), per-rank sent
    k (``complete_prefix``: of the steps before the trace's first incomplete one), every rank's
    local sync work from its metrics (:func:`local_sync_s`) and its combine time per op from the
    op log (:func:`combine_s`)."""
    from igsim.step.workload import Workload

    w = Workload.from_trace(inputs.directory / "trace", per_rank_k=True, complete_prefix=complete_prefix)
    if w.k_by_rank.shape[1] != inputs.world_size:
        got = w.k_by_rank.shape[1]
        raise _fail(inputs.directory / "trace", f"{got} ranks recorded, the run had {inputs.world_size}")
    local = local_sync_s(inputs, w.num_recorded_steps)
    if local is not None:
        w = dataclasses.replace(w, local_s_by_rank=local)
    combine = combine_s(inputs, w.num_recorded_steps)
    if combine is not None:
        w = dataclasses.replace(w, combine_s_by_rank=combine)
    finalize = finalize_s(inputs, w.num_recorded_steps)
    return dataclasses.replace(w, finalize_s_by_rank=finalize) if finalize is not None else w


def combine_s(inputs: RunInputs, num_steps: int) -> np.ndarray | None:
    """[T, R, J] each rank's combine seconds of its i-th issued op of step t (``ops.csv``'s
    ``combine_s``: the CPU work after the collective that turns what arrived into the averaged
    gradient; 0-padded), or None for an op log without the column (runs recorded before it)."""
    rows = [r for r in inputs.ops if int(r["issued"]) and int(r["step"]) < num_steps]
    if not rows or "combine_s" not in rows[0]:
        return None
    seen: dict[tuple[int, int], list[tuple[int, float]]] = {}
    for r in rows:
        rank = int(r["rank"])
        if 0 <= rank < inputs.world_size:
            seen.setdefault((int(r["step"]), rank), []).append((int(r["seq"]), float(r["combine_s"] or 0.0)))
    width = max((len(v) for v in seen.values()), default=0)
    out = np.zeros((num_steps, inputs.world_size, width))
    for (step, rank), ops in seen.items():
        out[step, rank, : len(ops)] = [max(0.0, c) for _, c in sorted(ops)]
    return out


def finalize_s(inputs: RunInputs, num_steps: int) -> np.ndarray | None:
    """[T, R] each rank's seconds from the end of its communication and backward's own work to
    backward's return (``x_finalize_s``, ``ddp-hook`` only: DDP's write-back and wake-up), or None
    for other integrations and runs recorded before the column."""
    if inputs.integration != "ddp-hook":
        return None
    return _metric_by_step_rank(inputs, num_steps, "x_finalize_s", lambda r: float(r["x_finalize_s"] or 0.0))


def _metric_by_step_rank(inputs: RunInputs, num_steps: int, column: str, value) -> np.ndarray | None:
    """[T, R] ``max(0, value(row))`` of every metrics row that has ``column``, or None when none has it."""
    rows = [r for r in inputs.measured if column in r and int(r["step"]) < num_steps]
    if not rows:
        return None
    out = np.zeros((num_steps, inputs.world_size))
    for r in rows:
        rank = int(r["rank"])
        if 0 <= rank < inputs.world_size:
            out[int(r["step"]), rank] = max(0.0, value(r))
    return out


def local_sync_s(inputs: RunInputs, num_steps: int) -> np.ndarray | None:
    """[T, R] seconds of each rank's local sync work (CPU work the simulator takes as input, like
    compute), from its metrics rows:

    - sync: the Synchronizer's work that is neither compute nor a collective (selection, packing,
      decisions, scatter: ``x_sync_s - comm_s``, less an online re-plan's ``x_online_replan_s``,
      whose collectives the engine costs), between backward and the first collective;
    - ddp-hook: the hooks' selection (``x_select_s``), which runs inside backward (so in the
      trace's backward time) but before each bucket's collective is launched;
    - None otherwise, or when the rows lack the columns."""
    column = {"sync": "x_sync_s", "ddp-hook": "x_select_s"}.get(inputs.integration)
    if column is None:
        return None

    def value(r) -> float:
        v = float(r[column]) - (float(r["comm_s"]) if inputs.integration == "sync" else 0.0)
        return v - float(r.get("x_online_replan_s", 0.0) or 0.0)  # a re-plan's collectives: costed by the engine

    return _metric_by_step_rank(inputs, num_steps, column, value)


@dataclass(frozen=True, kw_only=True)
class Replay:
    """Per-step measured and predicted values, op-list agreement and the summary; :meth:`write`
    puts ``replay.csv``, ``replay.json`` and ``replay.png`` (:func:`igplot.plot_replay`) in a folder."""

    rows: list[dict[str, Any]]  # one per step: step, measured_<f>, predicted_<f>
    summary: dict[str, Any]
    measured: list[dict[str, float]]  # the run's StepMetrics rows, one per (step, rank)
    predicted: list[dict[str, Any]]  # the replay's, one per (step, rank)

    def write(self, out: str | Path) -> list[Path]:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        with (out / "replay.csv").open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(self.rows[0]))
            w.writeheader()
            w.writerows(self.rows)
        (out / "replay.json").write_text(
            json.dumps(self.summary, indent=2, allow_nan=False, default=str) + "\n"
        )
        return [out / "replay.csv", out / "replay.json", self.plot(out / "replay.png")]

    def plot(self, path: str | Path) -> Path:
        """``replay.png``: measured vs predicted step time, communication time and bytes per step."""
        from igplot import plot_replay

        wire = ("values_bytes", "indices_bytes", "dense_bytes", "metadata_bytes")
        s = self.summary
        return plot_replay(
            path,
            title=f"igsim replay: {s['policy']} ({s['integration']}) on {s['world_size']} ranks, "
            f"{s['steps']} steps — measured vs predicted",
            steps=[r["step"] for r in self.rows],
            measured_step_s=[r["measured_step_s"] for r in self.rows],
            predicted_step_s=[r["predicted_step_s"] for r in self.rows],
            measured_comm_s=[r["measured_comm_s"] for r in self.rows],
            predicted_comm_s=[r["predicted_comm_s"] for r in self.rows],
            measured_bytes=[sum(r[f"measured_{f}"] for f in wire) for r in self.rows],
            predicted_bytes=[sum(r[f"predicted_{f}"] for f in wire) for r in self.rows],
            note=s.get("note"),
        )


def replay_run(
    run_dir: str | Path,
    *,
    topology=None,
    calibration=None,
    mode: str = "auto",
    complete_prefix: bool = False,
    combine: bool = True,
    carry_skew: bool = True,
    finalize: bool = True,
) -> Replay:
    """Replay ``run_dir`` (see the module doc). ``topology`` defaults to a star of the run's world
    size at 10 Gbit/s and 25 µs per link. ``complete_prefix``: an incomplete trace replays (and
    compares) its complete prefix; ``summary["truncated_at"]`` is its first incomplete step.
    ``combine=False`` ignores the op log's combine times, ``finalize=False`` the DDP hook's
    finalize times and ``carry_skew=False`` starts every rank of every step together
    (``simulate``'s): the replay model without them, for ablations."""
    from igsim.net.topology import star
    from igsim.step.engine import simulate

    inputs = load_run(run_dir)
    workload = run_workload(inputs, complete_prefix=complete_prefix)
    if not combine:
        workload = dataclasses.replace(workload, combine_s_by_rank=None)
    if not finalize:
        workload = dataclasses.replace(workload, finalize_s_by_rank=None)
    steps = sorted({int(r["step"]) for r in inputs.measured})
    truncated_at = workload.source.get("truncated_at")
    if truncated_at is not None:  # the measured steps the trace's complete prefix holds
        n = workload.num_recorded_steps
        steps = [s for s in steps if s < n]
        inputs = dataclasses.replace(
            inputs,
            measured=[r for r in inputs.measured if int(float(r["step"])) < n],
            ops=[r for r in inputs.ops if int(float(r["step"])) < n],
        )
    if steps != list(range(len(steps))) or len(steps) != workload.num_recorded_steps:
        raise _fail(
            inputs.directory,
            f"metrics.csv steps {steps[:3]}.. do not match the trace's {workload.num_recorded_steps}",
        )
    nominal_topology = topology is None and calibration is None
    if topology is None:
        topology = star(num_ranks=inputs.world_size, bandwidth_bytes_per_s=1.25e9, latency_s=25e-6)
    if len(topology.ranks) != inputs.world_size:
        raise ValueError(f"topology has {len(topology.ranks)} ranks, the run had {inputs.world_size}")
    ddp = inputs.summary.get("ddp") or {}
    result = simulate(
        workload=workload, config=inputs.config, plan=inputs.plan, topology=topology, calibration=calibration,
        num_steps=len(steps), mode=mode, integration=inputs.integration, plan_schedule=inputs.plan_schedule,
        ddp_bucket_cap_bytes=int(ddp.get("bucket_cap_bytes", 25 * 2**20)),
        ddp_first_bucket_cap_bytes=ddp.get("first_bucket_cap_bytes", 2**20), carry_skew=carry_skew,
    )  # fmt: skip
    predicted = [r.to_row() for r in result.rows]
    rep = _compare(inputs, predicted, result, steps)
    rep.summary["truncated_at"] = truncated_at
    if truncated_at is not None:
        rep.summary["note"] += (
            f"; the trace is incomplete: replayed its complete prefix, steps 0..{len(steps) - 1}"
        )
    if nominal_topology:
        rep.summary["note"] += (
            "; the topology is a nominal 10 Gbit/s star, not the machine the run used: pass a fitted "
            "--topology / --calibration for its times"
        )
    return rep


def _by_step_rank(rows, key=lambda r: (int(float(r["step"])), int(float(r["rank"])))) -> dict:
    return {key(r): r for r in rows}


def _issued_ops(inputs: RunInputs) -> dict[int, list[tuple]]:
    """rank 0's issued ops per step: (kind, bucket, encoded bytes) — every rank issues the same."""
    out: dict[int, list[tuple]] = {}
    for r in inputs.ops:
        if int(r["rank"]) == 0 and int(r["issued"]):
            out.setdefault(int(r["step"]), []).append(
                (r["kind"], int(r["buckets"].split()[0]), int(r["wire_size_bytes"]))
            )
    return out


def _sim_ops(result, steps) -> dict[int, list[tuple]]:
    names = {SPAN_KINDS.index("metadata"): "count_exchange", SPAN_KINDS.index("sparse_gather"): "sparse_gather",
             SPAN_KINDS.index("dense_allreduce"): "dense_allreduce"}  # fmt: skip
    sp = result.spans
    out: dict[int, list[tuple]] = {s: [] for s in steps}
    for s, b, kind, size in zip(sp["step"], sp["bucket"], sp["kind"], sp["size_bytes"]):
        out[int(s)].append((names[int(kind)], int(b), int(size)))
    return out


def _compare(inputs: RunInputs, predicted: list[dict], result, steps: list[int]) -> Replay:
    real, sim = _by_step_rank(inputs.measured), _by_step_rank(predicted)
    ranks = range(inputs.world_size)
    mismatches = []
    for s in steps:
        for r in ranks:
            if (s, r) not in sim or (s, r) not in real:
                mismatches.append(
                    {
                        "step": s,
                        "rank": r,
                        "field": "row",
                        "measured": (s, r) in real,
                        "predicted": (s, r) in sim,
                    }
                )
                continue
            for f in BYTE_FIELDS:
                m, p = int(float(real[s, r][f])), int(float(sim[s, r][f]))
                if m != p:
                    mismatches.append({"step": s, "rank": r, "field": f, "measured": m, "predicted": p})
    real_ops, sim_ops = _issued_ops(inputs), _sim_ops(result, steps)
    op_mismatch = [s for s in steps if real_ops.get(s, []) != sim_ops.get(s, [])]
    rows = []
    for s in steps:
        row: dict[str, Any] = {"step": s}
        for f in FIELDS:
            agg = max if f == "step_s" else statistics.mean
            row[f"measured_{f}"] = agg(float(real[s, r][f]) for r in ranks if (s, r) in real)
            row[f"predicted_{f}"] = agg(float(sim[s, r][f]) for r in ranks if (s, r) in sim)
        rows.append(row)
    summary = _summary(inputs, rows, mismatches, op_mismatch, real_ops, result)
    return Replay(rows=rows, summary=summary, measured=inputs.measured, predicted=predicted)


def _below_nominal(inputs: RunInputs) -> dict[str, Any]:
    """Sparse gathers in which a rank sent fewer pairs than the nominal k (exact zeros in ``u`` are
    never selected — the row-sparse rule — or a threshold sparsifier): why bytes sit below
    ``nominal k · pair bytes``. Both sides use the recorded counts, so they still agree exactly."""
    gathers = [r for r in inputs.ops if r["kind"] == "sparse_gather" and int(r["issued"])]
    below = [r for r in gathers if int(r["k"]) < int(r["capacity"])]
    return {
        "gathers": len(gathers),
        "below": len(below),
        "why": "a rank's payload is padded to the bucket's capacity; fewer pairs were selected where the "
        "residual-corrected gradient has exact zeros (never sent) or the sparsifier is unbounded",
    }


def _err(m: float, p: float) -> float | None:
    return (p - m) / m if m else None


def _summary(inputs, rows, mismatches, op_mismatch, real_ops, result) -> dict[str, Any]:
    timed = rows[1:] if len(rows) > 1 else rows  # step 0 warms up (DDP's first iteration, caches)
    means = {
        f: {
            "measured": float(np.mean([r[f"measured_{f}"] for r in timed])),
            "predicted": float(np.mean([r[f"predicted_{f}"] for r in timed])),
        }
        for f in FIELDS
    }
    for v in means.values():
        e = _err(v["measured"], v["predicted"])
        v["error"] = None if e is None or not math.isfinite(e) else e
    return {
        "run": str(inputs.directory),
        "policy": inputs.config.policy,
        "integration": inputs.integration,
        "world_size": inputs.world_size,
        "steps": len(rows),
        "bytes_exact": not mismatches,
        "byte_mismatches": mismatches[:50],
        "ops_exact": not op_mismatch,
        "op_mismatch_steps": op_mismatch[:50],
        "num_ops_measured": sum(len(v) for v in real_ops.values()),
        "k_source": result.settings["k_source"],
        "sparse_sends_below_nominal_k": _below_nominal(inputs),
        "means_after_step_0": means,
        "note": "bytes and collectives use each rank's recorded sent k; times are the topology model's prediction",
    }


def format_replay(rep: Replay, *, max_rows: int = 12) -> str:
    """A terminal table: per step measured / predicted, then the summary."""
    s = rep.summary
    lines = [
        f"replay of {s['run']}: {s['policy']} ({s['integration']}) on {s['world_size']} ranks, {s['steps']} steps",
        f"{'step':>4} {'wire B meas':>12} {'wire B pred':>12} {'coll':>9} {'comm ms meas':>13} {'pred':>8}"
        f" {'exposed meas':>13} {'pred':>8} {'step ms meas':>13} {'pred':>8}",
    ]
    for r in rep.rows[:max_rows]:
        wm = sum(r[f"measured_{f}"] for f in BYTE_FIELDS[:4])
        wp = sum(r[f"predicted_{f}"] for f in BYTE_FIELDS[:4])
        lines.append(
            f"{r['step']:>4} {wm:>12.0f} {wp:>12.0f} {r['measured_num_collectives']:>4.0f}/{r['predicted_num_collectives']:<4.0f}"
            f" {1e3 * r['measured_comm_s']:>13.2f} {1e3 * r['predicted_comm_s']:>8.2f}"
            f" {1e3 * r['measured_exposed_comm_s']:>13.2f} {1e3 * r['predicted_exposed_comm_s']:>8.2f}"
            f" {1e3 * r['measured_step_s']:>13.2f} {1e3 * r['predicted_step_s']:>8.2f}"
        )
    if len(rep.rows) > max_rows:
        lines.append(f"  ... {len(rep.rows) - max_rows} more steps in replay.csv")
    lines.append(
        f"bytes by kind and collective counts, every step and rank: {'EXACT' if s['bytes_exact'] else 'DIFFER'}"
        f"; issued ops (kind, bucket, bytes): {'EXACT' if s['ops_exact'] else 'DIFFER at steps ' + str(s['op_mismatch_steps'][:10])}"
    )
    b = s["sparse_sends_below_nominal_k"]
    if b["below"]:
        lines.append(
            f"{b['below']} of {b['gathers']} rank payloads carried fewer pairs than their capacity: {b['why']}"
        )
    for m in s["byte_mismatches"][:5]:
        lines.append(
            f"  step {m['step']} rank {m['rank']} {m['field']}: measured {m['measured']}, predicted {m['predicted']}"
        )
    for f in TIME_FIELDS:
        v = s["means_after_step_0"][f]
        err = "n/a" if v["error"] is None else f"{100 * v['error']:+.1f} %"
        lines.append(
            f"mean {f} (steps >= 1): measured {1e3 * v['measured']:.2f} ms, predicted {1e3 * v['predicted']:.2f} ms ({err})"
        )
    lines.append(s["note"])
    return "\n".join(lines)
