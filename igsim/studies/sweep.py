"""Sweeps: bandwidths x world sizes x policies, simulated in parallel, as a table, CSV and plot.

Each point is one :func:`igsim.step.engine.simulate` run on a star topology (every rank on its own link of
the given bandwidth to one switch), reduced to its summary. Points run in a process pool; the
result does not depend on the number of workers (every run is deterministic).
"""

from __future__ import annotations

import csv
import dataclasses
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from igpolicy.config import PolicyConfig
from igpolicy.plan import SyncPlan
from igpolicy.units import format_bandwidth, format_bytes, format_time
from igsim.step.workload import Workload

__all__ = ["SweepPoint", "format_sweep_table", "plot_sweep", "run_sweep", "write_sweep_csv"]

CSV_COLUMNS = (
    "policy",
    "world_size",
    "bandwidth_bytes_per_s",
    "latency_s",
    "step_s_mean",
    "step_s_p95",
    "compute_s_mean",
    "comm_s_mean",
    "exposed_comm_s_mean",
    "wire_bytes",
    "peak_wire_bytes",
    "dense_bytes",
    "values_bytes",
    "indices_bytes",
    "metadata_bytes",
    "speedup_vs_dense",
)


@dataclass(frozen=True, kw_only=True)
class SweepPoint:
    """One simulation of a sweep."""

    policy: str
    world_size: int
    bandwidth_bytes_per_s: float
    latency_s: float


def _config_for(base: PolicyConfig, policy: str) -> PolicyConfig:
    sparsifier = (
        "adtopk" if policy == "adtopk" else ("topk" if base.sparsifier == "adtopk" else base.sparsifier)
    )
    return dataclasses.replace(base, policy=policy, sparsifier=sparsifier)


def _run_point(
    point: SweepPoint,
    workload: Workload,
    plan: SyncPlan | None,
    base: PolicyConfig,
    num_steps: int,
    seed: int,
    mode: str,
) -> dict[str, Any]:
    from igsim.net.topology import star
    from igsim.step.engine import simulate

    topology = star(
        num_ranks=point.world_size,
        bandwidth_bytes_per_s=point.bandwidth_bytes_per_s,
        latency_s=point.latency_s,
    )
    result = simulate(
        workload=workload,
        config=_config_for(base, point.policy),
        plan=plan if point.policy == "importance" else None,
        topology=topology,
        num_steps=num_steps,
        seed=seed,
        mode=mode,
    )
    row = dataclasses.asdict(point)
    row.update(result.summary())
    row["policy"] = point.policy
    return row


def run_sweep(
    *,
    workload: Workload,
    plan: SyncPlan | None,
    config: PolicyConfig,
    policies: Sequence[str],
    bandwidths_bytes_per_s: Sequence[float],
    world_sizes: Sequence[int],
    latency_s: float = 5e-6,
    num_steps: int = 20,
    seed: int = 0,
    mode: str = "auto",
    max_workers: int = 2,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Simulate every (policy, world size, bandwidth); rows sorted by (world size, bandwidth, policy).

    ``config`` supplies everything but the policy. Each row holds the point and the run's
    :meth:`SimResult.summary`, plus ``speedup_vs_dense`` (dense mean step time / this one) when
    ``dense`` is among the policies. ``max_workers=1`` runs in this process. A tqdm bar shows
    progress on stderr when ``progress``.
    """
    if not policies or not bandwidths_bytes_per_s or not world_sizes:
        raise ValueError("sweep: policies, bandwidths and world sizes must each name at least one value")
    if "importance" in policies and plan is None:
        raise ValueError("sweep: policy 'importance' needs a plan")
    points = [
        SweepPoint(policy=p, world_size=int(w), bandwidth_bytes_per_s=float(b), latency_s=float(latency_s))
        for w in world_sizes
        for b in bandwidths_bytes_per_s
        for p in policies
    ]
    bar = _bar(len(points), progress)
    rows: list[dict[str, Any]] = []
    try:
        if max_workers <= 1:
            for point in points:
                rows.append(_run_point(point, workload, plan, config, num_steps, seed, mode))
                bar.update(1)
        else:
            with ProcessPoolExecutor(max_workers=max_workers) as pool:
                futures = [
                    pool.submit(_run_point, point, workload, plan, config, num_steps, seed, mode)
                    for point in points
                ]
                for fut in as_completed(futures):
                    rows.append(fut.result())
                    bar.update(1)
    finally:
        bar.close()
    order = {p: i for i, p in enumerate(policies)}
    rows.sort(key=lambda r: (r["world_size"], r["bandwidth_bytes_per_s"], order[r["policy"]]))
    dense = {
        (r["world_size"], r["bandwidth_bytes_per_s"]): r["step_s_mean"]
        for r in rows
        if r["policy"] == "dense"
    }
    for r in rows:
        base = dense.get((r["world_size"], r["bandwidth_bytes_per_s"]))
        r["speedup_vs_dense"] = base / r["step_s_mean"] if base and r["step_s_mean"] > 0 else float("nan")
    return rows


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _bar(total: int, show: bool) -> Any:
    if not show:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, desc="simulating", unit="run", leave=False)


def format_sweep_table(rows: Sequence[dict[str, Any]]) -> str:
    """Aligned text table: one line per point."""
    head = (
        f"{'ranks':>6s} {'bandwidth':>12s} {'policy':>10s} {'step':>10s} {'exposed':>10s} "
        f"{'bytes/step':>11s} {'peak':>11s} {'vs dense':>8s}"
    )
    lines = [head]
    for r in rows:
        sp = r.get("speedup_vs_dense", float("nan"))
        lines.append(
            f"{r['world_size']:>6d} {format_bandwidth(r['bandwidth_bytes_per_s']):>12s} {r['policy']:>10s} "
            f"{format_time(r['step_s_mean']):>10s} {format_time(r['exposed_comm_s_mean']):>10s} "
            f"{format_bytes(r['wire_bytes']):>11s} {format_bytes(r['peak_wire_bytes']):>11s} "
            + (f"{sp:>7.2f}x" if sp == sp else f"{'-':>8s}")
        )
    return "\n".join(lines)


def write_sweep_csv(rows: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """One line per point with :data:`CSV_COLUMNS`."""
    path = Path(path)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(CSV_COLUMNS), extrasaction="ignore")
        writer.writeheader()
        for r in rows:
            writer.writerow(r)
    return path


def plot_sweep(rows: Sequence[dict[str, Any]], path: str | Path, *, title: str = "") -> Path:
    """PNG: mean step time (top) and bytes per rank per step (bottom) vs bandwidth, per policy,
    one column per world size (log-log axes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    sizes = sorted({r["world_size"] for r in rows})
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    fig, axes = plt.subplots(2, len(sizes), figsize=(4.2 * len(sizes), 6.5), squeeze=False, sharex=True)
    for j, w in enumerate(sizes):
        for pol in policies:
            pts = sorted(
                (r for r in rows if r["world_size"] == w and r["policy"] == pol),
                key=lambda r: r["bandwidth_bytes_per_s"],
            )
            x = [r["bandwidth_bytes_per_s"] * 8 / 1e9 for r in pts]
            axes[0][j].plot(x, [r["step_s_mean"] for r in pts], marker="o", label=pol)
            axes[1][j].plot(x, [max(r["wire_bytes"], 1.0) for r in pts], marker="o", label=pol)
        axes[0][j].set_title(f"{w} ranks")
        axes[1][j].set_xlabel("link bandwidth (Gbit/s)")
        for ax in (axes[0][j], axes[1][j]):
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("step time (s)")
    axes[1][0].set_ylabel("bytes per rank per step")
    axes[0][0].legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
