"""Sweeps: bandwidths x world sizes x policies, simulated in parallel, as a table, CSV and plot.

Each point is one :func:`igsim.step.engine.simulate` run on a star topology (every rank on its own link of
the given bandwidth to one switch), reduced to its summary. Points run in a local process pool
(``executor="process"``) or as tasks on a Ray cluster (``executor="ray"``: the optional extra
``pip install -e '.[ray]'``; a local cluster, or an existing one at ``address``, e.g. ``"auto"``).
Either way results stream back as points finish (a progress bar, and ``on_row`` per point), and
the rows do not depend on the executor or the number of workers (every run is deterministic).
The workers are bounded by the CPUs available: this machine's for the pool, the cluster's for Ray.
"""

from __future__ import annotations

import csv
import dataclasses
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from igpolicy.config import PolicyConfig
from igpolicy.plan import SyncPlan
from igpolicy.units import format_bandwidth, format_bytes, format_time
from igsim.step.workload import Workload

__all__ = [
    "EXECUTORS",
    "SweepPoint",
    "available_cpus",
    "format_sweep_table",
    "plot_sweep",
    "run_sweep",
    "write_sweep_csv",
]

EXECUTORS = ("process", "ray")

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
    "sparse_gathers",
    "dense_allreduces",
    "collective",
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


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


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
    executor: str = "process",
    address: str | None = None,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Simulate every (policy, world size, bandwidth); rows sorted by (world size, bandwidth, policy).

    ``config`` supplies everything but the policy. Each row holds the point and the run's
    :meth:`SimResult.summary`, plus ``speedup_vs_dense`` (dense mean step time / this one) when
    ``dense`` is among the policies. ``executor``: ``process`` (a pool of ``max_workers``
    processes, capped at :func:`available_cpus`; ``max_workers=1`` runs in this process) or
    ``ray`` (one task per point, at most ``max_workers`` in flight, capped at the cluster's CPUs;
    a local cluster of ``max_workers`` CPUs unless Ray is already initialised or ``address`` names
    a cluster). ``on_row`` is called with each row as its point finishes (in completion order); a
    tqdm bar shows progress on stderr when ``progress``. The rows are the same for every executor
    and worker count.

    Raises ValueError for empty lists, ``importance`` without a plan, an unknown executor, or
    ``ray`` when Ray is not installed.
    """
    if not policies or not bandwidths_bytes_per_s or not world_sizes:
        raise ValueError("sweep: policies, bandwidths and world sizes must each name at least one value")
    if "importance" in policies and plan is None:
        raise ValueError("sweep: policy 'importance' needs a plan")
    if executor not in EXECUTORS:
        raise ValueError(f"sweep: executor {executor!r} is not one of {', '.join(EXECUTORS)}")
    if int(max_workers) < 1:
        raise ValueError(f"sweep: max_workers={max_workers!r} must be >= 1")
    points = [
        SweepPoint(policy=p, world_size=int(w), bandwidth_bytes_per_s=float(b), latency_s=float(latency_s))
        for w in world_sizes
        for b in bandwidths_bytes_per_s
        for p in policies
    ]
    args = (workload, plan, config, num_steps, seed, mode)
    run = _ray_rows if executor == "ray" else _pool_rows
    bar = _bar(len(points), progress)
    rows: list[dict[str, Any]] = []
    try:
        for row in run(points, args, int(max_workers), address):
            rows.append(row)
            bar.update(1)
            if on_row is not None:
                on_row(row)
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


def _pool_rows(points: list[SweepPoint], args: tuple, workers: int, _address: str | None) -> Iterator[dict]:
    workers = min(workers, available_cpus(), len(points))
    if workers <= 1:
        for point in points:
            yield _run_point(point, *args)
        return
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(_run_point, point, *args) for point in points]
        for fut in as_completed(futures):
            yield fut.result()


def _ray_rows(points: list[SweepPoint], args: tuple, workers: int, address: str | None) -> Iterator[dict]:
    """One Ray task per point, at most ``workers`` (and the cluster's CPUs) in flight, results
    collected as they finish; the shared inputs go to the object store once."""
    try:
        import ray
    except ImportError:
        raise ValueError(
            "sweep: executor 'ray' needs Ray, an optional extra: pip install -e '.[ray]'"
        ) from None
    started = not ray.is_initialized()
    if started:
        if address is None:
            ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
        else:
            ray.init(address=address, log_to_driver=False)
    try:
        workers = max(1, min(workers, int(ray.cluster_resources().get("CPU", 1)), len(points)))
        task = ray.remote(num_cpus=1)(_run_point)
        shared = [ray.put(a) for a in args]
        todo = list(points)
        running = []
        while todo or running:
            while todo and len(running) < workers:
                running.append(task.remote(todo.pop(0), *shared))
            done, running = ray.wait(running, num_returns=1)
            yield ray.get(done[0])
    finally:
        if started:
            ray.shutdown()


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
    """Aligned text table: one line per point; ``collective`` says how the point's buckets were
    aggregated (:func:`igsim.step.results.collective_label`)."""
    head = (
        f"{'ranks':>6s} {'bandwidth':>12s} {'policy':>10s} {'step':>10s} {'exposed':>10s} "
        f"{'bytes/step':>11s} {'peak':>11s} {'vs dense':>8s}  collective"
    )
    lines = [head]
    for r in rows:
        sp = r.get("speedup_vs_dense", float("nan"))
        lines.append(
            f"{r['world_size']:>6d} {format_bandwidth(r['bandwidth_bytes_per_s']):>12s} {r['policy']:>10s} "
            f"{format_time(r['step_s_mean']):>10s} {format_time(r['exposed_comm_s_mean']):>10s} "
            f"{format_bytes(r['wire_bytes']):>11s} {format_bytes(r['peak_wire_bytes']):>11s} "
            + (f"{sp:>7.2f}x" if sp == sp else f"{'-':>8s}")
            + f"  {r.get('collective', '-')}"
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
    one column per world size (:func:`igplot.plot_sweep`: log-log, shared y per row)."""
    from igplot import plot_sweep as draw

    return draw(rows, path, title=title)
