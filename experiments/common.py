"""Shared plumbing of the RQ1–RQ5 studies: arguments, output files, traces, plans, simulation.

Every study is a module run from the repository root (``python -m experiments.rq5_end_to_end``)
whose ``main(argv) -> int`` writes CSV / JSON tables and PNG plots into ``--out``. ``--quick`` is the
CI smoke version: tiny models, few steps, the same code paths.

This module holds no study logic, only the project's real pieces wired together:

- traces: the shipped samples (:func:`traces.samples.sample_trace_path`) or ``igrt record`` run in a
  subprocess (:func:`trace_for`), cached by their settings;
- plans: ``igsim profile``'s :func:`igsim.cli.profile.profile_trace` (:func:`profile`);
- training: :mod:`experiments.training` (``igrt train`` and the testbed launcher);
- simulation: :func:`igsim.step.engine.simulate` on a star like the testbed (:func:`simulate_star`).

Nothing here imports torch: training runs in subprocesses, so a study's own process stays small.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import math
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "REPO",
    "Study",
    "jaccard",
    "mean_std",
    "profile",
    "read_csv",
    "simulate_star",
    "spearman",
    "trace_for",
    "write_csv",
    "write_json",
]

REPO = Path(__file__).resolve().parents[1]
PAIR_BYTES = 8  # int32 index + fp32 value: the wire width of one sparse entry


# ------------------------------------------------------------------------------------ arguments


class Study:
    """One study's run: parsed arguments, its output folder, a log and a wall-clock budget.

    ``add_arguments(parser)`` adds the options every study shares: ``--out DIR`` (default
    ``docs/results/<name>``), ``--quick`` (CI smoke version), ``--cache DIR`` (recorded traces and
    training runs, reused across studies and reruns; default :func:`default_cache`), ``--nproc`` (gloo
    ranks) and ``--no-testbed`` (skip the shaped-link part).
    """

    def __init__(self, name: str, args: argparse.Namespace, argv: Sequence[str] | None = None) -> None:
        self.name = name
        self.args = args
        self.quick = bool(args.quick)
        self.out = Path(args.out or REPO / "docs" / "results" / name)
        self.out.mkdir(parents=True, exist_ok=True)
        self.cache = Path(args.cache) if args.cache else default_cache()
        self.cache.mkdir(parents=True, exist_ok=True)
        self.started_s = time.monotonic()
        self.meta: dict[str, Any] = {
            "study": name,
            "quick": self.quick,
            "command": " ".join(["python -m experiments." + name, *(argv or [])]),
            "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        }

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser, *, nproc: int = 2) -> None:
        parser.add_argument("--out", default=None, help="output folder (default docs/results/<study>)")
        parser.add_argument("--quick", action="store_true", help="CI smoke version: tiny models, few steps")
        parser.add_argument(
            "--cache",
            default=None,
            help="cache of traces and runs (default ~/.cache/importance-gradient/experiments)",
        )
        parser.add_argument("--nproc", type=int, default=nproc, help=f"gloo ranks (default {nproc})")
        parser.add_argument("--no-testbed", action="store_true", help="skip the shaped-link (root) part")
        parser.add_argument(
            "--testbed-wait",
            type=float,
            default=1800.0,
            help="seconds to wait for a busy testbed (default 1800)",
        )

    def log(self, message: str) -> None:
        elapsed = time.monotonic() - self.started_s
        line = f"[{self.name} {elapsed:7.1f} s] {message}"
        print(line, flush=True)
        with open(self.out / "log.txt", "a") as f:
            f.write(line + "\n")

    def finish(self, **extra: Any) -> dict[str, Any]:
        """Write ``meta.json`` (command, timing, what was measured) and return it."""
        self.meta.update(extra)
        self.meta["wall_s"] = round(time.monotonic() - self.started_s, 1)
        write_json(self.meta, self.out / "meta.json")
        self.log(f"done in {self.meta['wall_s']:.0f} s -> {self.out}")
        return self.meta


def default_cache() -> Path:
    """``$IGRT_CACHE_DIR/experiments`` (default ``~/.cache/importance-gradient/experiments``)."""
    base = os.environ.get("IGRT_CACHE_DIR")
    return (Path(base) if base else Path.home() / ".cache" / "importance-gradient") / "experiments"


# ------------------------------------------------------------------------------------ files


def write_csv(rows: Sequence[Mapping[str, Any]], path: str | Path) -> Path:
    """Rows (dicts) as CSV, columns in first-seen order; floats with 6 significant digits."""
    path = Path(path)
    columns: list[str] = []
    for row in rows:
        columns.extend(k for k in row if k not in columns)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        for row in rows:
            w.writerow({k: _fmt(v) for k, v in row.items()})
    return path


def _fmt(v: Any) -> Any:
    if isinstance(v, (float, np.floating)):
        return "" if not math.isfinite(v) else f"{float(v):.6g}"
    if isinstance(v, (list, tuple)):
        return " ".join(str(_fmt(x)) for x in v)
    return v


def read_csv(path: str | Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def write_json(obj: Any, path: str | Path) -> Path:
    """``obj`` as JSON (atomic write); NaN and infinities become null, numpy values plain numbers."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    text = json.dumps(_finite(obj), indent=1, sort_keys=True, default=_json_default, allow_nan=False)
    tmp.write_text(text + "\n")
    tmp.replace(path)
    return path


def _finite(obj: Any) -> Any:
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    return str(obj)


def plt():
    """matplotlib.pyplot with the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot

    return pyplot


# ------------------------------------------------------------------------------------ statistics


def jaccard(a: Iterable[str], b: Iterable[str]) -> float:
    """|A ∩ B| / |A ∪ B|; 1.0 for two empty sets."""
    a, b = set(a), set(b)
    return 1.0 if not a and not b else len(a & b) / len(a | b)


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation (scipy); NaN with fewer than 3 pairs or a constant side."""
    from scipy.stats import spearmanr

    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return math.nan
    return float(spearmanr(x, y).statistic)


def mean_std(values: Iterable[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0.0 for one value; NaN, NaN for none)."""
    v = np.asarray([x for x in values if x is not None and math.isfinite(x)], dtype=float)
    if v.size == 0:
        return math.nan, math.nan
    return float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else 0.0


# ------------------------------------------------------------------------------------ traces


@contextlib.contextmanager
def single_rank() -> Iterator[None]:
    """Environment of a one-rank torchrun job on loopback, restored afterwards.

    ``igrt.train.launch`` then runs the rank function in this process instead of spawning one (the quick
    studies use it: start-up, imports and data preparation are paid once per process).
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    new = {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
    old = {k: os.environ.get(k) for k in new}
    os.environ.update(new)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_igrt_inprocess(argv: list[str]) -> None:
    """``igrt ARGV`` as one rank in this process; ValueError when it exits non-zero."""
    from igrt.cli import main

    with single_rank(), contextlib.redirect_stdout(io.StringIO()) as out:
        code = main(argv)
    if code:
        raise ValueError(f"`igrt {' '.join(argv)}` exited {code}: {out.getvalue()[-1500:]}")


def _run_logged(cmd: list[str], log_path: Path, *, env: Mapping[str, str] | None = None) -> None:
    """Run ``cmd`` with stdout+stderr into ``log_path``; ValueError with the log's tail on failure."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    with open(log_path, "w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO, check=False)
    if proc.returncode != 0:
        tail = log_path.read_text()[-1500:]
        raise ValueError(f"`{' '.join(cmd)}` failed (exit {proc.returncode}); log {log_path}:\n{tail}")


def trace_for(
    workload: str,
    *,
    seed: int,
    steps: int,
    tiny: bool,
    cache: Path,
    nproc: int = 2,
    density: float = 0.01,
    use_sample: bool = True,
    inprocess: bool = False,
) -> Path:
    """A recorded trace of ``workload``: the shipped sample when it matches, else ``igrt record``.

    The shipped sample (``traces/samples/<workload>``) is used for a full-size model with ``seed``,
    ``density`` and ``nproc`` as recorded there and at least ``steps`` steps. Otherwise the trace is
    recorded once into ``cache/traces/<workload>-...`` (a finished recording is reused; a half
    written one is removed and recorded again). ``inprocess=True`` (quick mode) records one rank in
    this process (:func:`single_rank`), which saves the ranks' start-up (imports, data) per run.
    """
    from traces.reader import read_manifest

    if use_sample and not tiny:
        from traces.samples import sample_trace_path

        try:
            path = sample_trace_path(workload)
            m = read_manifest(path)
            recorded = num_steps(path)
            if (
                m.extra.get("seed") == seed
                and math.isclose(m.density, density)
                and m.world_size == nproc
                and recorded >= steps
            ):
                return path
        except ValueError:
            pass
    if inprocess:
        nproc = 1
    name = f"{workload}{'-tiny' if tiny else ''}-s{seed}-n{steps}-p{nproc}-d{density:g}"
    path = cache / "traces" / name
    if (path / "manifest.json").is_file() and (path / "DONE").is_file():
        return path
    if path.exists():
        import shutil

        shutil.rmtree(path)
    argv = ["record", "--workload", workload, "--ranks", str(nproc), "--steps", str(steps)]
    argv += ["-o", str(path), "--density", f"{density:g}", "--seed", str(seed)]
    argv += ["--no-progress", "--no-eval", "--backend", "gloo"] + (["--tiny"] if tiny else [])
    if inprocess:
        run_igrt_inprocess(argv)
    else:
        _run_logged([sys.executable, "-m", "igrt", *argv], cache / "traces" / f"{name}.log")
    (path / "DONE").write_text("ok\n")
    return path


def num_steps(path: Path) -> int:
    """Recorded steps of the trace at ``path``."""
    from traces.reader import read_trace

    return int(read_trace(path).num_steps)


# ------------------------------------------------------------------------------------ profiling


def profile(
    trace: Path,
    *,
    method: str = "knee",
    release_period: int = 4,
    window: tuple[int, int] | None = None,
    method_params: Mapping[str, Any] | None = None,
    pinned: Sequence[str] = (),
):
    """``igsim profile``'s pipeline on ``trace``: returns (SyncPlan, ImportanceScores, ThresholdResult).

    ``pinned`` component keys are sent every step whatever their score
    (:func:`igpolicy.profile.build_plan`'s rule 1; the threshold is then taken over the others).
    """
    from igpolicy.profile import build_plan
    from traces.profiling import profile_trace

    plan, scores, result = profile_trace(
        trace,
        method=method,
        method_params=dict(method_params or {}),
        release_period=release_period,
        window=window,
    )
    if pinned:
        plan = build_plan(
            scores=scores,
            expected_bytes={c.key: c.expected_bytes for c in plan.components},
            release_period=release_period,
            method=method,
            method_params=method_params,
            pinned=pinned,
            source=plan.source,
        )
    return plan, scores, result


def plan_decision_id(plan: Any) -> str:
    """16 hex digits of what ``plan`` decides (release period, each component's class and phase, the
    policy settings it recommends), not where its trace lay or how it was profiled: two plans with one
    id train alike."""
    import hashlib

    comps = sorted((c.key, c.cls.value, c.phase) for c in plan.components)
    decides = [plan.release_period, comps, sorted(plan.policy_defaults.items())]
    return hashlib.sha256(json.dumps(decides).encode()).hexdigest()[:16]


def plan_byte_share(plan: Any) -> float:
    """Share of the plan's expected bytes per release held by low-importance components."""
    total = sum(c.expected_bytes for c in plan.components)
    low = sum(c.expected_bytes for c in plan.components if c.key in plan.low)
    return low / total if total else 0.0


# ------------------------------------------------------------------------------------ simulation


def simulate_star(
    *,
    trace: Path,
    policy: str,
    plan: Any,
    num_ranks: int,
    bandwidth_bytes_per_s: float,
    latency_s: float = 50e-6,
    num_steps: int = 50,
    density: float = 0.01,
    release_period: int = 4,
    packing: str = "kk",
    staggered: bool = True,
    overlap: bool = False,
    calibration: Any = None,
    compute_scale: float = 1.0,
) -> dict[str, Any]:
    """igsim's prediction of ``policy`` on ``num_ranks`` ranks, each on its own link of
    ``bandwidth_bytes_per_s`` to one switch (the testbed's shape), replaying the trace's compute.

    ``overlap=False`` is the synchronizer called after backward (``igrt train``'s plain loop).
    ``compute_scale`` multiplies the recorded compute times (e.g. measured / recorded step time).
    Returns the run's :meth:`SimResult.summary` plus ``steps_per_s``.
    """
    import dataclasses

    from igpolicy.config import PolicyConfig
    from igsim.net.topology import star
    from igsim.step.engine import simulate
    from igsim.step.workload import Workload

    workload = Workload.from_trace(trace)
    if compute_scale != 1.0:
        workload = dataclasses.replace(
            workload,
            ready_s=workload.ready_s * compute_scale,
            forward_s=workload.forward_s * compute_scale,
            backward_s=workload.backward_s * compute_scale,
            optimizer_s=workload.optimizer_s * compute_scale,
        )
    config = PolicyConfig(
        policy=policy,
        sparsifier="adtopk" if policy == "adtopk" else "topk",
        density=density,
        release_period=release_period,
        packing=packing,
        staggered=staggered,
    )
    topology = star(num_ranks=num_ranks, bandwidth_bytes_per_s=bandwidth_bytes_per_s, latency_s=latency_s)
    result = simulate(
        workload=workload,
        config=config,
        plan=plan if policy == "importance" else None,
        topology=topology,
        calibration=calibration,
        num_steps=num_steps,
        integration="ddp-hook" if overlap else "sync",
    )
    summary = result.summary()
    summary["steps_per_s"] = 1.0 / summary["step_s_mean"] if summary["step_s_mean"] > 0 else math.nan
    return summary


# ------------------------------------------------------------------------------------ training
#
# A *job* is one training run as a JSON-able dict: workload, tiny, seed, steps, batch_size, config
# (PolicyConfig keys), plan_path, evaluate, ablation (None or "drop_held"). Its result lands in
# ``<cache>/runs/<name>-<hash>.json`` (rank 0 writes it), so a study that is stopped and started
# again, or another study asking for the same run, reuses it. Jobs run one after another on the
# same ranks (one start-up for many runs) through igrt.train.loop.train_on_rank, with out=None: no
# checkpoints or model files, only the small result JSON.

ABLATIONS = (None, "drop_held")


def job(
    *,
    workload: str,
    policy: str,
    seed: int,
    steps: int,
    tiny: bool,
    plan_path: str | Path | None = None,
    batch_size: int = 16,
    evaluate: bool = True,
    ablation: str | None = None,
    flush: bool = True,
    **config: Any,
) -> dict[str, Any]:
    """A job dict; ``config`` holds PolicyConfig keys besides ``policy`` (validated here).

    ``flush=False`` is for speed-only runs (no evaluation): the end-of-training flush — one dense
    all-reduce of every residual, the model's full size, minutes on a slow shaped link — is skipped
    (``TrainOptions(flush=False)``); it is not a training step and does not enter the step statistics.
    """
    from igpolicy.config import PolicyConfig

    if ablation not in ABLATIONS:
        raise ValueError(f"ablation {ablation!r} is not one of {ABLATIONS}")
    sparsifier = "adtopk" if policy == "adtopk" else config.pop("sparsifier", "topk")
    cfg = PolicyConfig(policy=policy, sparsifier=sparsifier, seed=seed, **config).to_dict()
    if not flush and evaluate:
        raise ValueError("flush=False is for speed-only runs: pass evaluate=False too")
    extra = {} if flush else {"flush": False}  # absent by default: keys of earlier runs stay valid
    return {
        **extra,
        "workload": workload,
        "tiny": bool(tiny),
        "seed": int(seed),
        "steps": int(steps),
        "batch_size": int(batch_size),
        "config": cfg,
        "plan_path": str(plan_path) if plan_path is not None and policy == "importance" else None,
        "evaluate": bool(evaluate),
        "ablation": ablation,
    }


def job_path(runs_dir: Path, j: Mapping[str, Any]) -> Path:
    import hashlib

    from igpolicy.config import PolicyConfig
    from igpolicy.plan import SyncPlan

    body = dict(j)
    # config keys at their default value do not enter the key: a key added later (default off)
    # keeps every earlier run's cache entry valid
    defaults = PolicyConfig().to_dict()
    body["config"] = {k: v for k, v in body["config"].items() if k not in defaults or v != defaults[k]}
    if body.get(
        "plan_path"
    ):  # what the plan decides, not where it lies or how it was made, identifies the run
        plan = SyncPlan.load(body["plan_path"])
        decides = [plan.release_period, sorted((c.key, c.cls.value, c.phase) for c in plan.components)]
        body["plan_path"] = hashlib.sha256(json.dumps(decides).encode()).hexdigest()[:16]
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:12]
    name = f"{j['workload']}{'-tiny' if j['tiny'] else ''}-{j['config']['policy']}-s{j['seed']}"
    return runs_dir / f"{name}-{digest}.json"


def run_jobs(
    jobs: Sequence[Mapping[str, Any]],
    *,
    cache: Path,
    nproc: int,
    spec: Any = None,
    log=print,
    timeout_s: float = 3600.0,
    inprocess: bool = False,
) -> list[dict[str, Any]]:
    """Run every job whose result is not cached (on ``nproc`` spawned gloo ranks on loopback, or one
    rank per namespace of the testbed ``spec``); returns the results in ``jobs`` order.

    ``inprocess=True`` (quick mode) trains one rank in this process (:func:`single_rank`): bytes are
    still counted as the payload handed to the collectives, but nothing crosses a process boundary.
    """
    if spec is not None:
        runs_dir = cache / f"runs-testbed-{spec.num_ranks}x{spec.rate_bytes_per_s:.0f}"
    else:
        runs_dir = cache / ("runs-inprocess" if inprocess else "runs")
    runs_dir.mkdir(parents=True, exist_ok=True)
    paths = [job_path(runs_dir, j) for j in jobs]
    pending = list({str(p): (dict(j), str(p)) for j, p in zip(jobs, paths) if not p.is_file()}.values())
    # (one run per distinct key: e.g. two threshold methods that split the same way train once)
    if pending:
        where = f"the testbed ({spec.num_ranks} ranks)" if spec is not None else (
            "1 rank in this process" if inprocess else f"{nproc} loopback ranks")  # fmt: skip
        log(f"training {len(pending)} run(s) ({len(set(paths)) - len(pending)} cached) on {where}")
        t0 = time.monotonic()
        from igrt.workloads import prepare_workload

        for wl, tiny, seed in sorted({(j["workload"], j["tiny"], j["seed"]) for j, _ in pending}):
            prepare_workload(wl, tiny=tiny, seed=seed)  # e.g. GPT pre-training, once, before the ranks
        if spec is None:
            from igrt.train.launch import launch

            with single_rank() if inprocess else contextlib.nullcontext():
                launch(_jobs_rank, nproc=nproc, backend="gloo", args=(pending,), timeout_s=timeout_s)
        else:
            _launch_on_testbed(pending, spec, timeout_s=timeout_s)
        log(f"trained {len(pending)} run(s) in {time.monotonic() - t0:.0f} s")
    return [json.loads(p.read_text()) for p in paths]


def _jobs_rank(ctx: Any, pending: Sequence[tuple[dict[str, Any], str]]) -> int:
    """Rank function: run the jobs one after another; rank 0 writes each result file."""
    for j, path in pending:
        result = _run_job(ctx, j)
        if ctx.rank == 0:
            write_json(result, path)
    return len(pending)


def _run_job(ctx: Any, j: Mapping[str, Any]) -> dict[str, Any]:
    from igpolicy.config import PolicyConfig
    from igpolicy.plan import SyncPlan
    from igrt.train.loop import TrainOptions, step_statistics, train_on_rank

    options = TrainOptions(
        workload=j["workload"],
        config=PolicyConfig.from_dict(j["config"]),
        steps=j["steps"],
        plan=SyncPlan.load(j["plan_path"]) if j["plan_path"] else None,
        plan_path=j["plan_path"],
        batch_size=j["batch_size"],
        tiny=j["tiny"],
        seed=j["seed"],
        evaluate=j["evaluate"],
        progress=False,
        command="experiments job",
        flush=j.get("flush", True),
        drop_held_residuals=j["ablation"] == "drop_held",
    )
    t0 = time.perf_counter()
    outcome = train_on_rank(ctx, options)
    wall_s = time.perf_counter() - t0
    if ctx.rank != 0:
        return {}
    rows = outcome.rows
    steps = sorted({r.step for r in rows})
    by_step = {s: [r for r in rows if r.step == s] for s in steps}
    return {
        "job": dict(j),
        "world_size": ctx.world_size,
        "stats": step_statistics(rows),
        "evals": list(outcome.evals),
        "final_eval": outcome.evals[-1] if outcome.evals else None,
        "flush_wire_bytes": float(np.mean([r.wire_bytes for r in outcome.flush_rows]))
        if outcome.flush_rows
        else 0,
        "train_s": outcome.train_s,
        "wall_s": wall_s,
        "per_step": {
            "step": steps,
            "loss": [float(np.mean([r.extra.get("loss", math.nan) for r in by_step[s]])) for s in steps],
            "wire_bytes": [float(np.mean([r.wire_bytes for r in by_step[s]])) for s in steps],
            "low_bytes": [float(np.mean([r.low_bytes for r in by_step[s]])) for s in steps],
            "step_s": [max(r.step_s for r in by_step[s]) for s in steps],
            "compute_s": [float(np.mean([r.compute_s for r in by_step[s]])) for s in steps],
            "bucket_imbalance": [float(np.mean([r.bucket_imbalance for r in by_step[s]])) for s in steps],
        },
    }


# ------------------------------------------------------------------------------------ testbed


def testbed_busy() -> list[str]:
    """Testbed namespaces that exist now (another run, e.g. ``igrt validate``, may own them)."""
    from igrt.testbed import namespaces as testbed

    return testbed.leftovers()


def wait_for_testbed(timeout_s: float, log=print) -> bool:
    """Wait up to ``timeout_s`` for the testbed namespaces of another run to go; True when free.

    Setting the testbed up removes every ``igtb-`` namespace, so a study must not start while
    another run (``igrt validate``, another study) uses it.
    """
    deadline = time.monotonic() + timeout_s
    busy = testbed_busy()
    if busy:
        log(f"the testbed is in use ({', '.join(busy)}); waiting up to {timeout_s:.0f} s")
    while busy and time.monotonic() < deadline:
        time.sleep(10)
        busy = testbed_busy()
    return not busy


def _launch_on_testbed(pending: Sequence[tuple[dict[str, Any], str]], spec: Any, *, timeout_s: float) -> None:
    """One process per rank namespace (``ip netns exec``), each a one-rank torchrun-style job
    (env from :func:`igrt.testbed.namespaces.rank_env`) running ``python -m experiments.common --jobs FILE``.
    The caller owns the testbed (``with Testbed(spec)``). Every 5 s the rank namespaces are checked:
    if another process tore the testbed down, the ranks are stopped and RuntimeError says so
    (instead of waiting for the collectives' timeout)."""
    import tempfile

    from igrt.testbed import namespaces as testbed
    from igrt.testbed.netmeasure import random_port

    port = random_port()  # not predictable from the pid (another user could squat on it)
    names = {spec.rank_ns(r) for r in range(spec.num_ranks)}
    with tempfile.TemporaryDirectory(prefix="igexp-") as tmp:
        jobs_file = Path(tmp) / "jobs.json"
        jobs_file.write_text(json.dumps(list(pending)))
        procs, logs = [], []
        for r in range(spec.num_ranks):
            env = {**os.environ, **testbed.rank_env(spec, r, port=port), "PYTHONPATH": str(REPO)}
            cmd = [
                *testbed.exec_args(spec, r),
                sys.executable,
                "-m",
                "experiments.common",
                "--jobs",
                str(jobs_file),
            ]
            logs.append(open(Path(tmp) / f"rank{r}.log", "w+"))  # noqa: SIM115 (closed below)
            procs.append(subprocess.Popen(cmd, env=env, cwd=REPO, stdout=logs[-1], stderr=subprocess.STDOUT))
        deadline = time.monotonic() + timeout_s
        try:
            while any(p.poll() is None for p in procs):
                time.sleep(5)
                if any(p.poll() not in (None, 0) for p in procs):
                    break  # a rank failed: its peers would only wait for the collectives' timeout
                gone = names - set(testbed.leftovers())
                if gone or time.monotonic() > deadline:
                    why = (f"namespaces {sorted(gone)} vanished: another process tore the testbed down"
                           if gone else f"the ranks did not finish within {timeout_s:.0f} s")  # fmt: skip
                    raise RuntimeError(f"testbed training stopped: {why}")
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            tails = []
            for f in logs:
                f.seek(0)
                tails.append(f.read()[-1200:].strip())
                f.close()
        failed = [f"rank {r} exited {p.returncode}: {tails[r]}" for r, p in enumerate(procs) if p.returncode]
        if failed:
            raise RuntimeError("testbed training failed: " + " | ".join(failed))


def _main(argv: Sequence[str] | None = None) -> int:
    """Entry point of one testbed rank: ``python -m experiments.common --jobs FILE`` (torchrun env)."""
    parser = argparse.ArgumentParser(prog="experiments.common")
    parser.add_argument("--jobs", required=True, help="JSON list of [job, result path] pairs")
    args = parser.parse_args(argv)
    from igrt.train.launch import launch

    pending = [tuple(x) for x in json.loads(Path(args.jobs).read_text())]
    launch(_jobs_rank, nproc=1, backend="gloo", args=(pending,), timeout_s=3600.0)
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
