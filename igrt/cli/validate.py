"""``igrt validate``: real gloo collectives on the namespace testbed vs igsim's prediction.

Builds the testbed (root), times a calibration set and a disjoint validation set of cases on real
gloo processes (one per rank namespace, :mod:`igrt.testbed.netmeasure`), writes ``DIR/measurements.json``,
tears the testbed down (always, also on errors and Ctrl-C), then runs the igsim side as a
subprocess — ``python -m igsim.cli.validate_report`` — which fits the calibration, predicts every
case, prints the table and writes ``DIR/calibration.json`` and ``DIR/report.json``. igrt never
imports igsim: the measurement file is the interface (layout in :mod:`igsim.studies.validation`).

Cases (sizes are each rank's full buffer n; see :mod:`igrt.testbed.netbench`):

- calibration: small p2p / all-reduce / all-gather (alpha), large p2p (one-way bandwidth), large
  all-reduce / all-gather at 512 KiB and 2 MiB (duplex bandwidth, one factor per ring op); on the
  two-level testbed a 2 MiB broadcast (the uplink send's share of the root's NIC);
- validation: other sizes of all-reduce and all-gather, reduce-scatter, broadcast, sparse
  all-gather with skewed per-rank sizes, p2p. No validation case repeats a calibration case.

The largest size is capped so that no case moves much more than a second of traffic over the
slowest link.

With ``--steps N`` it also validates training steps: a trace of ``--workload`` is recorded on
loopback and profiled into a plan (``igsim profile``), each policy trains N steps with ``igrt
train`` on the testbed (one process per rank namespace), and the igsim side replays the same runs
with the fitted calibration (:mod:`igsim.studies.step_validation`).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from igpolicy.cli_outputs import LOCK_NAME, claim_output_dir
from igpolicy.units import format_bandwidth
from igrt.cli.options import add_testbed_arguments, spec_from_args
from igrt.testbed import namespaces as testbed
from igrt.testbed import netmeasure

__all__ = [
    "INTEGRATIONS",
    "POLICIES",
    "SUITE_TESTBEDS",
    "StepRun",
    "add_arguments",
    "parse_step_runs",
    "plan_cases",
    "run",
    "run_suite",
    "spec_from_args",
    "train_on_testbed",
]

KiB, MiB = 1024, 1024 * 1024
#: the largest case's size, in seconds of the slowest link's line rate (``--max-case-s``)
MAX_CASE_S, MAX_CASE_S_QUICK = 0.8, 0.4
POLICIES = ("dense", "topk", "adtopk", "importance")
DEFAULT_POLICIES = ("dense", "topk", "importance")
INTEGRATIONS = ("sync", "ddp-hook")


@dataclass(frozen=True)
class StepRun:
    """One training run of the step validation: a policy (importance with an optional release
    period R) under one integration; trained into ``real_<label>``."""

    policy: str
    integration: str = "sync"
    release_period: int | None = None

    @property
    def label(self) -> str:
        name = self.policy + (f"-R{self.release_period}" if self.release_period is not None else "")
        return name if self.integration == "sync" else f"{name}-{self.integration}"

    def train_args(self) -> list[str]:
        out = ["--policy", self.policy, "--integration", self.integration]
        return out + (
            ["--release-period", str(self.release_period)] if self.release_period is not None else []
        )


def parse_step_runs(policies: str, integrations: str = "sync") -> list[StepRun]:
    """``--policies`` x ``--integrations``: policies among :data:`POLICIES`, ``importance-R<k>`` for
    the importance policy with release period k (plain ``importance``: the plan's R)."""
    names = [s.strip() for s in policies.split(",") if s.strip()]
    modes = [s.strip() for s in integrations.split(",") if s.strip()]
    if not names or not modes:
        raise ValueError("--policies and --integrations must each name at least one")
    bad_modes = [m for m in modes if m not in INTEGRATIONS]
    if bad_modes:
        raise ValueError(f"--integrations: {bad_modes} are not among {', '.join(INTEGRATIONS)}")
    parsed: list[tuple[str, int | None]] = []
    for name in names:
        policy, _, period = name.partition("-R")
        if policy not in POLICIES or (period and (policy != "importance" or not period.isdigit())):
            raise ValueError(
                f"--policies: {name!r} is not among {', '.join(POLICIES)} or importance-R<k> (k >= 1)"
            )
        if period and int(period) < 1:
            raise ValueError(f"--policies: {name!r}: the release period must be >= 1")
        parsed.append((policy, int(period) if period else None))
    runs = [StepRun(p, m, r) for m in modes for p, r in parsed]
    labels = [r.label for r in runs]
    if len(set(labels)) != len(labels):
        raise ValueError(f"--policies: a run is named twice ({', '.join(labels)})")
    return runs


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ranks", type=int, default=4, help="rank namespaces (default 4)")
    add_testbed_arguments(p)
    p.add_argument("--quick", action="store_true", help="few sizes and 3 reps (the CI smoke version)")
    p.add_argument("--reps", type=int, default=None, help="timed reps per case (default 7, --quick 3)")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs per case before the reps")
    p.add_argument(
        "--interleave",
        action="store_true",
        help="time the reps in rounds over all cases (rep i of every case before rep i+1), not back to back",
    )
    p.add_argument(
        "--max-case-s",
        type=float,
        default=None,
        help="the largest case moves at most this many seconds of the slowest link's line rate (default "
        f"{MAX_CASE_S:g}, --quick {MAX_CASE_S_QUICK:g}; e.g. 3.5 adds the 4 and 8 MiB cases at 25 Mbit/s)",
    )
    p.add_argument("--out", default="validate-out", help="directory for measurements, calibration, report")
    p.add_argument("--timeout-s", type=float, default=1800.0, help="kill the ranks after this long")
    p.add_argument(
        "--steps", type=int, default=0, help="also train each policy N steps and compare (default 0)"
    )
    p.add_argument("--workload", default="gpt", help="workload of the step validation (default gpt)")
    p.add_argument("--tiny", action="store_true", help="the workload's tiny model (fast, latency-bound)")
    p.add_argument(
        "--policies",
        default=",".join(DEFAULT_POLICIES),
        help=f"policies of the step validation, among {', '.join(POLICIES)} and importance-R<k> "
        f"(release period k); default {','.join(DEFAULT_POLICIES)}",
    )
    p.add_argument(
        "--integrations",
        default="sync",
        help=f"integrations each policy trains under, among {', '.join(INTEGRATIONS)} (default sync)",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="step validation: examples per rank (default: the workload's)",
    )
    g = p.add_argument_group("the whole validation in one command (--suite)")
    g.add_argument(
        "--suite",
        action="store_true",
        help="every testbed of --testbeds in --rounds rounds (collectives; round A's calibration predicts "
        "the later rounds, and so does the shipped default), then with --steps the step validation on the "
        "4-rank star at every --step-rates rate; one summary table (DIR/suite.json)",
    )
    g.add_argument(
        "--testbeds",
        default=",".join(SUITE_TESTBEDS),
        help=f"--suite: testbeds among {', '.join(SUITE_TESTBEDS)} (default all)",
    )
    g.add_argument("--rounds", type=int, default=2, help="--suite: measurements of every testbed (default 2)")
    g.add_argument(
        "--step-rates",
        default="25Mbit,100Mbit",
        help="--suite --steps: star link rates of the step validation",
    )


#: the testbeds of ``--suite``: igrt validate flags of each (the ring is 3 ranks, the others 4)
SUITE_TESTBEDS = {
    "star": ["--ranks", "4"],
    "two-level": ["--ranks", "4", "--two-level"],
    "hetero": ["--ranks", "4", "--hetero"],
    "ring": ["--ranks", "3", "--ring"],
}


def plan_cases(num_ranks: int, *, max_bytes: int, quick: bool = False, two_level: bool = False) -> list[dict[str, Any]]:
    """The calibration and validation cases (disjoint, each labelled with its ``role``).

    ``two_level``: one more calibration case, a broadcast of the large size, from which igsim fits
    how much less than its fair share of the root's NIC the send across the uplink gets
    (``downstream_share``, :mod:`igsim.net.calibration`); the validation broadcasts are other sizes.

    Names carry the nominal size; ``size_bytes`` is what netbench really moves (all-gather and
    reduce-scatter buffers hold num_ranks whole fp32 blocks). Sizes above ``max_bytes`` are left
    out, except that one large calibration case of each kind is always kept (at most ``max_bytes``).
    """
    p = num_ranks

    def dense(op: str, role: str, n: int) -> dict[str, Any]:
        real = max(n // (4 * p), 1) * 4 * p if op in ("all_gather", "reduce_scatter") else max(n // 4, 1) * 4
        return {"name": f"{op}-{_label(n)}", "op": op, "role": role, "size_bytes": real}

    def sparse(role: str, top: int, tag: str) -> dict[str, Any]:
        # skewed: rank r carries top / 2**(p-1-r) bytes of (index, value) pairs; "zero": rank 0 has none
        sizes = [max(top >> (p - 1 - r), 8) // 8 * 8 for r in range(p)]
        if tag == "zero":
            sizes[0] = 0
        return {"name": f"sparse_all_gather-{tag}-{_label(top)}", "op": "sparse_all_gather", "role": role,
                "sizes_bytes": sizes}  # fmt: skip

    def fits(n: int) -> bool:
        return n <= max_bytes

    big = min(2 * MiB, max_bytes)
    cal = "calibration"
    cases = [dense("p2p", cal, 64), dense("all_reduce", cal, 4 * KiB), dense("all_gather", cal, 4 * KiB)]
    cases += [dense("p2p", cal, big), dense("all_reduce", cal, big), dense("all_gather", cal, big)]
    val = "validation"
    if quick:
        cases += [dense("all_reduce", val, n) for n in (256 * KiB, 1 * MiB) if fits(n)]
        cases += [dense("all_gather", val, 512 * KiB)] if fits(512 * KiB) else []
        cases += [dense("reduce_scatter", val, 512 * KiB), dense("broadcast", val, 512 * KiB)]
        cases += [sparse(val, 256 * KiB, "skew"), dense("p2p", val, 256 * KiB)]
    else:
        cases += [dense("p2p", cal, n) for n in (1 * KiB, 16 * KiB)]
        cases += [dense("broadcast", cal, big)] if two_level and big not in (1 * MiB, 4 * MiB) else []
        cases += [dense("all_reduce", cal, 16 * KiB), dense("all_gather", cal, 16 * KiB)]
        # two large sizes per ring op, so each op's bandwidth factor rests on more than one case
        cases += (
            [dense(op, cal, 512 * KiB) for op in ("all_reduce", "all_gather")] if big != 512 * KiB else []
        )
        sizes = [64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB, 8 * MiB]
        cases += [dense(op, val, n) for op in ("all_reduce", "all_gather") for n in sizes if fits(n)]
        cases += [dense(op, val, n) for op in ("reduce_scatter", "broadcast")
                  for n in (16 * KiB, 256 * KiB, 1 * MiB, 4 * MiB) if fits(n)]  # fmt: skip
        cases += [
            sparse(val, n, tag) for tag in ("skew", "zero") for n in (64 * KiB, 512 * KiB, 2 * MiB) if fits(n)
        ]
        cases += [dense("p2p", val, n) for n in (256 * KiB, 4 * MiB) if fits(n)]
    keys = [(c["op"], c.get("size_bytes"), tuple(c.get("sizes_bytes", ()))) for c in cases]
    assert len(set(keys)) == len(keys), "plan_cases: a case appears twice"
    return cases


def _label(n: int) -> str:
    if n >= MiB:
        return f"{n / MiB:g}MiB"
    if n >= KiB:
        return f"{n / KiB:g}KiB"
    return f"{n}B"


def _subprocess(cmd: list[str], *, what: str) -> None:
    proc = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).strip()[-1500:]
        raise ValueError(f"{what} failed (exit {proc.returncode}): {shlex.join(cmd)}\n{tail}")


def claim_out(out: Path, *, overwrite: bool, reuse: bool) -> list[Path]:
    """Claim ``--out`` (:func:`igpolicy.cli_outputs.claim_output_dir`); with ``overwrite`` and
    ``reuse`` (a step validation), the trace and plan :func:`prepare_steps` reuses are kept while
    everything else goes. Returns the paths kept."""
    steps, keep = out / "steps", []
    if overwrite and reuse and not steps.is_symlink() and (steps / "trace" / "manifest.json").is_file():
        keep = [p for p in (steps / "trace", steps / "plan.json") if p.exists() and not p.is_symlink()]
    if not keep or not (out / LOCK_NAME).is_file():  # a folder no command wrote: the usual refusal
        claim_output_dir(out, overwrite=overwrite, flag="--out")
        return []
    claim_output_dir(out, overwrite=False, continue_in_place=True, flag="--out")  # the lock, nothing removed
    for p in [*out.iterdir(), *steps.iterdir()]:
        if p in (out / LOCK_NAME, steps, *keep):
            continue
        try:
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        except OSError as e:
            raise ValueError(f"--out {out}: cannot remove {p} ({e.strerror or e})") from None
    return keep


def prepare_steps(steps_dir: Path, *, workload: str, steps: int, tiny: bool) -> None:
    """A trace of ``workload`` (igrt record on loopback: the trace is about gradients, not the
    network) and the SyncPlan profiled from it (igsim profile, a subprocess); kept if present."""
    trace, plan = steps_dir / "trace", steps_dir / "plan.json"
    size = ["--tiny"] if tiny else []
    if not (trace / "manifest.json").exists():
        cmd = [sys.executable, "-m", "igrt", "record", "--workload", workload, *size, "--ranks", "2",
               "--steps", str(steps + 2), "-o", str(trace)]  # fmt: skip
        _subprocess(cmd, what="recording the trace")
    if not plan.exists():
        _subprocess([sys.executable, "-m", "igsim", "profile", str(trace), "-o", str(plan)], what="profiling")


def train_on_testbed(
    spec: testbed.TestbedSpec, steps_dir: Path, *, run: StepRun, workload: str, steps: int, tiny: bool,
    timeout_s: float, batch_size: int | None = None,
) -> None:  # fmt: skip
    """``igrt train`` of ``run`` for ``steps`` steps, one process per rank namespace, into
    ``steps_dir/real_<label>`` (metrics.csv with every rank's StepMetrics rows, its own trace)."""
    args = ["igrt", "train", "--workload", workload, *run.train_args(), "--steps", str(steps), "--no-eval",
            "--no-progress", "--out", str(steps_dir / f"real_{run.label}"), "--timeout-s", str(timeout_s),
            "--record-trace"]  # fmt: skip
    args += ["--tiny"] if tiny else []
    args += ["--batch-size", str(batch_size)] if batch_size is not None else []
    args += ["--plan", str(steps_dir / "plan.json")] if run.policy == "importance" else []
    netmeasure.run_ranks(
        args, spec=spec, timeout_s=timeout_s, what=f"igrt train {shlex.join(run.train_args())}"
    )


def measure_on_testbed(
    spec: testbed.TestbedSpec,
    cases: list[dict[str, Any]],
    *,
    reps: int,
    warmup: int,
    timeout_s: float,
    steps: dict[str, Any] | None = None,
    interleave: bool = False,
) -> dict[str, Any]:
    """Build the testbed, time ``cases`` on it (then, with ``steps``, train every policy on it),
    always tear it down; returns the measurement file."""
    try:
        testbed.check_support()
    except testbed.TestbedError as e:
        raise ValueError(f"igrt validate: {e}") from None
    t0, date = time.time(), time.strftime("%Y-%m-%d %H:%M:%S")
    load_before = list(os.getloadavg())
    from igrt.train.launch import status_line

    status_line("igrt validate", f"building the testbed ({spec.num_ranks} rank namespaces, shaped links)")
    with testbed.Testbed(spec):
        status_line("igrt validate", f"timing {len(cases)} cases x {reps} reps on real gloo ranks")
        measured = netmeasure.measure(
            cases, spec=spec, reps=reps, warmup=warmup, timeout_s=timeout_s, interleave=interleave
        )
        wall = time.time() - t0
        load_after = list(os.getloadavg())
        for step_run in (steps or {}).get("runs", ()):
            t1 = time.time()
            train_on_testbed(spec, steps["dir"], run=step_run, workload=steps["workload"], steps=steps["steps"],
                             tiny=steps["tiny"], timeout_s=timeout_s, batch_size=steps["batch_size"])  # fmt: skip
            print(
                f"trained {step_run.label} for {steps['steps']} steps in {time.time() - t1:.0f} s", flush=True
            )
    by_name = {r["name"]: r for r in measured["results"]}
    merged = []
    for c in cases:
        r = by_name[c["name"]]
        merged.append(
            {**c, "times_s": r["times_s"], "median_s": r["median_s"], "world_size": r["world_size"],
             "rank_times_s": r["rank_times_s"], **({"cpu_ticks": r["cpu_ticks"]} if "cpu_ticks" in r else {})}
        )  # fmt: skip
    return {
        "testbed": testbed.describe(spec),
        "reps": reps,
        "warmup": warmup,
        "interleaved": interleave,
        "host": measured.get("host", ""),
        "date": date,
        "wall_s": wall,
        "machine": {
            "cpu_count": os.cpu_count(),
            "load_average_before": load_before,
            "load_average_after": load_after,
        },
        "cases": merged,
    }


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"


def _summary_row(name: str, kind: str, report: dict[str, Any]) -> dict[str, Any]:
    c = report["collectives_large"]
    return {
        "run": name,
        "predicted_with": kind,
        "cases": c["num_cases"],
        "mean": c["mape"],
        "worst": c["worst_error"],
        "worst_case": c["worst_case"],
        "meets_mean": bool(c["meets_mean"]),
        "meets_worst": bool(c["meets_worst"]),
        "flags": report.get("flags", []),
        "load": (report.get("machine") or {}).get("load_average_after", [None])[0],
    }


def run_suite(args: argparse.Namespace) -> int:
    """``igrt validate --suite``: the whole validation, one ``igrt validate`` / igsim subprocess per
    part, every part in its own folder of ``--out``; prints and writes the summary (suite.json)."""
    testbeds = [t.strip() for t in args.testbeds.split(",") if t.strip()]
    bad = [t for t in testbeds if t not in SUITE_TESTBEDS]
    if bad or not testbeds:
        raise ValueError(f"--testbeds: {bad or 'none'} not among {', '.join(SUITE_TESTBEDS)}")
    if args.rounds < 1:
        raise ValueError(f"--rounds {args.rounds} must be >= 1")
    step_rates = [r.strip() for r in args.step_rates.split(",") if r.strip()] if args.steps else []
    parse_step_runs(args.policies, args.integrations)  # bad names fail before anything runs
    out = Path(args.out)
    claim_out(out, overwrite=args.overwrite, reuse=False)
    common = [
        "--queue-ms",
        f"{args.queue_ms:g}",
        "--queue-min-bytes",
        str(args.queue_min_bytes),
        "--host-queue-bytes",
        str(args.host_queue_bytes),
        "--tcp-slow-start-after-idle",
        str(args.tcp_slow_start_after_idle),
        "--warmup",
        str(args.warmup),
        "--timeout-s",
        f"{args.timeout_s:g}",
    ]
    common += ["--quick"] if args.quick else []
    common += ["--max-case-s", f"{args.max_case_s:g}"] if args.max_case_s is not None else []
    common += ["--reps", str(args.reps)] if args.reps else []
    common += ["--interleave"] if args.interleave else []
    rounds = [chr(ord("A") + i) for i in range(args.rounds)]
    parts = [
        (f"{r}-{tb}", [*SUITE_TESTBEDS[tb], "--bandwidth", args.rate]) for r in rounds for tb in testbeds
    ]
    step_args = [
        "--workload",
        args.workload,
        "--policies",
        args.policies,
        "--integrations",
        args.integrations,
    ]
    step_args += ["--tiny"] if args.tiny else []
    step_args += ["--batch-size", str(args.batch_size)] if args.batch_size else []
    parts += [
        (
            f"steps-{rate}",
            [*SUITE_TESTBEDS["star"], "--bandwidth", rate, "--steps", str(args.steps), *step_args],
        )
        for rate in step_rates
    ]
    t0 = time.time()
    for i, (name, extra) in enumerate(parts, 1):
        print(
            f"igrt validate --suite: [{i}/{len(parts)}] {name} ({time.time() - t0:.0f} s so far)", flush=True
        )
        cmd = [sys.executable, "-m", "igrt", "validate", *extra, *common, "--out", str(out / name)]
        _subprocess(cmd, what=f"igrt validate ({name})")
    rows, steps = [], {}
    for name, _ in parts:
        report = json.loads((out / name / "report.json").read_text())
        if name.startswith("steps-"):
            steps[name] = report["steps"]
        else:
            rows.append(_summary_row(name, "its own fit", report))
    for tb in testbeds:  # round A's fit, and the shipped default, predict every later round
        first = out / f"{rounds[0]}-{tb}"
        for r in rounds[1:]:
            later = out / f"{r}-{tb}"
            for kind, cal, sub in ((f"{rounds[0]}'s fit", str(first / "calibration.json"), "transfer"),
                                   ("the shipped default", "default", "shipped-default")):  # fmt: skip
                cmd = [sys.executable, "-m", "igsim.cli.validate_report", str(later / "measurements.json"),
                       "--calibration", cal, "--out", str(later / sub)]  # fmt: skip
                proc = subprocess.run(
                    cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}
                )
                if proc.returncode != 0:
                    raise ValueError(
                        f"the igsim side failed (exit {proc.returncode}): {shlex.join(cmd)}\n{proc.stderr[-2000:]}"
                    )
                rows.append(
                    _summary_row(f"{r}-{tb}", kind, json.loads((later / sub / "report.json").read_text()))
                )
    print(format_suite(rows, steps))
    wall = time.time() - t0
    (out / "suite.json").write_text(
        json.dumps({"collectives": rows, "steps": steps, "wall_s": wall}, indent=1) + "\n"
    )
    print(f"igrt validate --suite: {len(parts)} parts in {wall:.0f} s -> {out / 'suite.json'}")
    return 0


def format_suite(rows: list[dict[str, Any]], steps: dict[str, Any]) -> str:
    """The suite's summary: collectives >= 256 KiB per run and calibration, then each step run set."""
    lines = [
        "collectives >= 256 KiB (targets: mean |error| 5%, worst 10%)",
        f"{'run':14s} {'predicted with':20s} {'cases':>5s} {'mean':>6s} {'worst':>7s}  {'mean/worst':14s} worst case",
    ]
    for r in rows:
        met = f"{'met' if r['meets_mean'] else 'MISSED'}/{'met' if r['meets_worst'] else 'MISSED'}"
        lines.append(
            f"{r['run']:14s} {r['predicted_with']:20s} {r['cases']:5d} {r['mean']:6.1%} {_pct(r['worst']):>7s}  "
            f"{met:14s} {r['worst_case']}" + ("  (flagged)" if r["flags"] else "")
        )
    for name, rep in steps.items():
        lines.append(
            f"\n{name}: {len(rep['policies'])} runs; comm per step mean |error| {rep['mean_abs_error_vs_min']:.1%} "
            f"(last-arriving rank), {rep['mean_abs_error_vs_mean']:.1%} (mean rank); step time "
            f"{rep['mean_abs_step_error']:.1%} (target 10%); Kendall tau by step time "
            f"{rep.get('kendall_tau_step', float('nan')):.3f} (target 0.9); over {rep['means_over']}"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.suite:
        return run_suite(args)
    spec = spec_from_args(args)
    reps = args.reps or (3 if args.quick else 7)
    if reps < 1 or args.warmup < 0 or args.steps < 0:
        raise ValueError(f"--reps {reps} must be >= 1, --warmup {args.warmup} and --steps {args.steps} >= 0")
    step_runs = parse_step_runs(args.policies, args.integrations)
    if args.batch_size is not None and args.batch_size < 1:
        raise ValueError(f"--batch-size {args.batch_size} must be >= 1")
    max_case_s = (MAX_CASE_S_QUICK if args.quick else MAX_CASE_S) if args.max_case_s is None else args.max_case_s
    if not max_case_s > 0:
        raise ValueError(f"--max-case-s {max_case_s:g} must be > 0")
    max_bytes = int(testbed.bottleneck_bytes_per_s(spec) * max_case_s)
    cases = plan_cases(spec.num_ranks, max_bytes=max_bytes, quick=args.quick, two_level=spec.two_level)
    out = Path(args.out)
    kept = claim_out(out, overwrite=args.overwrite, reuse=bool(args.steps))  # locked until the command ends
    if kept:
        print(
            f"igrt validate: --overwrite keeps {' and '.join(map(str, kept))} for reuse (delete them to record anew)"
        )
    roles = {r: sum(c["role"] == r for c in cases) for r in ("calibration", "validation")}
    slow = spec.slow_rank
    print(
        f"igrt validate: {spec.num_ranks} ranks at {format_bandwidth(spec.rate_bytes_per_s)}"
        + (f", two-level uplink {format_bandwidth(spec.uplink_rate)}" if spec.two_level else "")
        + (f", rank {slow} at {format_bandwidth(spec.rank_rate(slow))}" if slow is not None else "")
        + (", switchless ring" if spec.ring else "")
        + ", shaper queues "
        + ", ".join(
            f"{spec.queue_s_at(r) * 1e3:.3g} ms at {format_bandwidth(r)}" for r in testbed.link_rates(spec)
        )
        + (f" (a rank's own NIC: {spec.host_queue_bytes / 2**20:g} MiB)" if spec.host_queue_bytes else "")
        + f"; {roles['calibration']} calibration + {roles['validation']} validation cases x {reps} reps"
        + (
            f"; then {args.steps} training steps of {', '.join(r.label for r in step_runs)}"
            if args.steps
            else ""
        ),
        flush=True,
    )
    steps = None
    if args.steps:
        steps = {"dir": out / "steps", "workload": args.workload, "steps": args.steps, "tiny": args.tiny,
                 "runs": step_runs, "batch_size": args.batch_size}  # fmt: skip
        steps["dir"].mkdir(parents=True, exist_ok=True)
        prepare_steps(steps["dir"], workload=args.workload, steps=args.steps, tiny=args.tiny)
    data = measure_on_testbed(
        spec,
        cases,
        reps=reps,
        warmup=args.warmup,
        timeout_s=args.timeout_s,
        steps=steps,
        interleave=args.interleave,
    )
    data["command"] = "igrt validate " + shlex.join(
        sys.argv[2:] if sys.argv[1:2] == ["validate"] else sys.argv[1:]
    )
    path = out / "measurements.json"
    path.write_text(json.dumps(data, indent=1) + "\n")
    print(f"measured in {data['wall_s']:.0f} s -> {path}", flush=True)
    cmd = [sys.executable, "-m", "igsim.cli.validate_report", str(path), "--out", str(out)]
    cmd += ["--steps-dir", str(out / "steps")] if args.steps else []
    from igrt.train.launch import status_phase

    with status_phase("igrt validate", "fitting the calibration and comparing (igsim)"):
        proc = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, check=False)
    if proc.returncode != 0:
        raise ValueError(f"the igsim side failed (exit {proc.returncode}): {shlex.join(cmd)}")
    print(f"report: {out / 'report.json'}, calibration: {out / 'calibration.json'}")
    return 0
