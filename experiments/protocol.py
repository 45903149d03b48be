"""The evaluation protocol (issue 15): tuned, paired, pre-flush comparisons of every sync method.

Per workload (MiniLM fine-tuning: held-out accuracy beside the majority-class floor; GPT
post-training: held-out loss), every method below trains ``--steps`` steps under linear warm-up
(``--warmup`` of the steps) and cosine decay:

- **learning rate tuned per method** on the same grid (``--lrs``, one full-length run per LR on
  seed 0, the same budget for every method), picked by the pre-flush held-out metric; the best LR
  then runs on the other seeds. There is no third split: the LR is picked on the held-out split
  that is reported (the same for every method).
- **paired seeds** 0..S-1: a seed fixes the model's initialisation and each rank's data order for
  every method, so each method's difference to Top-k+EF is taken per seed (mean and sample std).
- **quality before the flush**: ``igrt train`` evaluates the trained model before the final dense
  flush of the residuals (``before_flush``) and again after it; the tables report the first and
  show the second beside it.
- **bytes** per rank: the steps' bytes, the final flush, and for every plan-based method the dense
  ``igrt record`` traffic of the profiling run the offline plan came from (recorded steps x the
  model's fp32 gradient, the dense all-reduce each recorded step made), stated apart and amortised.

Methods (``--policies``; all of them by default): ``dense``; ``topk`` (Top-k+EF at ``--density``);
``topk_equal`` (Top-k+EF thinned to the knee plan's expected bytes); ``topk_quarter`` (thinned to
0.25 x its bytes, the bytes target); ``importance`` (the knee plan of
the workload's trace); three split controls derived in code from that plan (:func:`igpolicy.controls.split_controls`):
``all_low`` (every unpinned component low), ``random`` (a random split with the important set's
bytes), ``swapped`` (the lowest-scored components, as many bytes as the important set, sent every
step); ``powersgd1`` / ``powersgd2`` (PyTorch's ``powerSGD_hook`` through ``igrt bench``'s code
path, :func:`igrt.integrations.peers.register_peer`, on DDP with one bucket; the same workload, optimizer,
schedule and evaluations; no flush: its error feedback is never sent); and the method's parts, each
switched on its own in an importance run (:data:`VARIANTS`): ``imp_nocatch`` (catch-up off),
``imp_warm`` (every component every step during the LR warm-up), ``imp_small`` (vectors of at most
4,096 entries sent dense), ``imp_online`` (no offline plan: online profiling, so no profiling
run), ``imp_online_r8`` (the same at release period 8), ``imp_online_r8_fresh`` (and the freshly
initialised task head, ``--fresh auto``, its own component sent every step),
``imp_online_r8_fresh_cap`` (and every re-plan capped at 0.16 x Top-k's bytes, ``--max-share``),
``imp_online_r8_thin`` (online R = 8 with ``--low-mode thin``: low components send every step at
density / 8 instead of holding for 8 steps), ``imp_online_r8_thin_w10`` (the same, its first plan
at step 10 and a re-plan every 10 steps on 10-step windows: a shorter all-send start),
``imp_online_r7_thin_w10`` (that at R = 7: the bytes the shorter start saved spent on the low
components' density), ``imp_online_r8_thin_w10_fresh_cap`` (the 10-step variant with the freshly
initialised task head its own component sent every step and each re-plan capped at 0.16 x),
``imp_online_r8_thin_head`` (the thinned run with the whole task head, pooler and fresh classifier,
pinned: ``--fresh auto --fresh pooler``);
and the split controls of the thinned online run, ``imp_online_r8_thin_swapped`` / ``_random`` /
``_all_low`` (``--online-control``: every re-plan's important set replaced by the lowest-scored
components at its bytes, a seeded random set at its bytes, or none; the start and the thinning
unchanged).

**Cached and resumable.** Every run is one subprocess (``igrt train``, or ``python -m
experiments.protocol --powersgd-run DIR`` for PowerSGD) writing into its own folder under
``--runs``; a folder whose ``summary.json`` is complete and whose ``protocol_run.json`` names the same
settings is not run again, any other folder is cleared and redone. Stop the study at any time and
start it with the same command: it continues. What the tables need of each finished run
(``summary.json``, ``protocol_run.json``, ``metrics.csv``) is also kept in ``--out/run-records``,
so a study whose ``--out`` is committed resumes from a fresh checkout with an empty ``--runs``: its
records are restored, not retrained. Before starting it prints how many runs are cached
and to do and the expected duration (from the measured seconds per step of the runs already done,
else of a short timed probe run), and a progress line per run.

    python -m experiments.protocol --workload gpt --runs /work/protocol-runs/gpt
    python -m experiments.protocol --workload minilm --quick        # CI: tiny model, 2 methods, 1 seed

Writes ``runs.csv`` (every run), ``tuning.csv``, ``summary.csv``, ``targets.json``,
``curves.json`` and ``quality_vs_bytes.png`` into ``--out`` (default
``docs/results/protocol_<workload>``).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import functools
import gzip
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from experiments import common
from experiments.common import REPO, Study, mean_std
from igpolicy.controls import SPLIT_CONTROLS, split_controls

# in the order they train (a stopped study has the most telling comparisons first)
POLICIES = (
    "topk",
    "importance",
    "topk_equal",
    "powersgd1",
    "swapped",
    "random",
    "all_low",
    "powersgd2",
    "dense",
    "imp_nocatch",
    "imp_warm",
    "imp_small",
    "imp_online",
    "imp_online_r8",
    "topk_quarter",
    "imp_online_r8_fresh",
    "topk_fresh_equal",
    "imp_online_r8_fresh_cap",
    "imp_online_r8_thin",
    "imp_online_r8_thin_w10",
    "imp_online_r7_thin_w10",
    "imp_online_r8_thin_w10_fresh_cap",
    "imp_online_r8_thin_head",
    "imp_online_r8_thin_swapped",
    "imp_online_r8_thin_random",
    "imp_online_r8_thin_all_low",
)
QUICK_POLICIES = ("topk", "importance")
LABELS = {
    "dense": "dense",
    "topk": "Top-k+EF",
    "topk_equal": "Top-k+EF thinned to equal bytes",
    "importance": "importance (knee plan)",
    "all_low": "all-low plan",
    "random": "size-matched random split",
    "swapped": "swapped split (lowest scores sent)",
    "powersgd1": "PowerSGD rank 1",
    "powersgd2": "PowerSGD rank 2",
    "imp_nocatch": "importance, catch-up off",
    "imp_warm": "importance + sync warm-up",
    "imp_small": "importance + small vectors dense",
    "imp_online": "importance, online profiling",
    "imp_online_r8": "importance, online profiling, R = 8",
    "topk_quarter": "Top-k+EF thinned to 0.25 x bytes",
    "imp_online_r8_fresh": "importance, online profiling, R = 8, fresh head always sent",
    "topk_fresh_equal": "Top-k+EF thinned to 0.457 x bytes",
    "imp_online_r8_fresh_cap": "importance, online R = 8, fresh head sent, plans capped at 0.16 x bytes",
    "imp_online_r8_thin": "importance, online R = 8, low components thinned (every step at density / 8)",
    "imp_online_r8_thin_w10": "importance, online R = 8, thinned, re-planned every 10 steps on 10-step windows",
    "imp_online_r7_thin_w10": "importance, online R = 7, thinned, re-planned every 10 steps on 10-step windows",
    "imp_online_r8_thin_w10_fresh_cap": "importance, online R = 8, thinned, 10-step re-plans, fresh head sent, capped at 0.16 x",
    "imp_online_r8_thin_head": "importance, online R = 8, thinned, the whole task head (pooler + fresh classifier) sent every step",
    "imp_online_r8_thin_swapped": "online R = 8, thinned, every re-plan swapped (lowest scores sent)",
    "imp_online_r8_thin_random": "online R = 8, thinned, every re-plan a size-matched random split",
    "imp_online_r8_thin_all_low": "online R = 8, thinned, every re-plan all-low",
}
# Top-k+EF thinned to a share of its bytes: the knee plan's expected share (None: derived from the
# plan) or a fixed one (the bytes target's 0.25 x)
THINNED = {"topk_equal": None, "topk_quarter": 0.25, "topk_fresh_equal": 0.457}  # 0.457: imp_online_r8_fresh
# on MiniLM seed 0, measured (its equal-bytes control)
# the method's parts, each on its own (issue 15, item 2): a variant of the importance run with one
# switch changed; (the plan it follows or None, the extra ``igrt train`` flags, its release period or
# None for --release-period's). ``{warmup}`` is the LR warm-up's step count, the sync warm-up then
# covers the same steps.
VARIANTS = {
    "imp_nocatch": ("importance", ("--no-catch-up",), None),
    "imp_warm": ("importance", ("--sync-warmup-steps", "{warmup}"), None),
    "imp_small": ("importance", ("--dense-small", "4096"), None),
    "imp_online": (None, ("--online-profile", "--catch-up"), None),
    "imp_online_r8": (None, ("--online-profile", "--catch-up"), 8),
    # the freshly initialised task head (``--fresh auto``: MiniLM's classifier) its own always-sent component
    "imp_online_r8_fresh": (None, ("--online-profile", "--catch-up", "--fresh", "auto"), 8),
    # and every re-plan capped at 0.16 x Top-k's bytes per step (--max-share): with the all-send start
    # (25 of 300 steps) a run of about 0.23 x, under the 0.25 x target with the 10 % the fresh variant's
    # measured bytes ran above its plans' expected ones
    "imp_online_r8_fresh_cap": (
        None, ("--online-profile", "--catch-up", "--fresh", "auto", "--max-share", "0.16"), 8,
    ),
    # low components send every step at density / 8 instead of holding for 8 steps (--low-mode thin):
    # about the same bytes, and the optimizer steps every component every step
    "imp_online_r8_thin": (None, ("--online-profile", "--low-mode", "thin"), 8),
    # the same with the first plan at step 10 instead of 25 (window and re-plan period 10): the
    # all-send start (every component at Top-k's density until the first plan) is a third of the
    # 25-step variant's bytes over 300 steps; this one spends 10 steps there
    "imp_online_r8_thin_w10": (
        None, ("--online-profile", "--low-mode", "thin", "--online-window", "10", "--replan-every", "10"), 8,
    ),
    # the 10-step variant measured 0.207 x on MiniLM (3 seeds): R = 7 spends the headroom on the low
    # components (every step at density / 7), ~0.225 x by the 10-step runs' per-step low bytes
    "imp_online_r7_thin_w10": (
        None, ("--online-profile", "--low-mode", "thin", "--online-window", "10", "--replan-every", "10"), 7,
    ),
    # thinned, a low ``head`` (pooler + fresh classifier) sends the classifier's 3,080 entries at
    # density / 8 = 4 a step; pinned it sends all of them (12 kB dense), the cap keeps the knee's bytes
    "imp_online_r8_thin_w10_fresh_cap": (
        None,
        ("--online-profile", "--low-mode", "thin", "--online-window", "10", "--replan-every", "10",
         "--fresh", "auto", "--max-share", "0.16"),
        8,
    ),
    # thinned, the re-plans made ``head`` low (the final plan of every MiniLM seed), so the fresh
    # classifier sends 4 of its 3,080 entries a step; pinning the classifier alone moved the knee
    # (imp_online_r8_fresh). Pinned with the pooler, the whole head leaves the threshold's candidates
    # unchanged but for itself and sends at Top-k's density every step (~1.5 k pairs, < 1 % of
    # Top-k's bytes), no cap
    "imp_online_r8_thin_head": (
        None, ("--online-profile", "--low-mode", "thin", "--fresh", "auto", "--fresh", "pooler"), 8,
    ),
    # the split controls of the thinned online run (igpolicy.controls): every re-plan's important set
    # replaced, the all-send start and the thinning unchanged
    **{
        f"imp_online_r8_thin_{c}": (None, ("--online-profile", "--low-mode", "thin", "--online-control", c), 8)
        for c in SPLIT_CONTROLS
    },
}
PLAN_POLICIES = ("importance", *SPLIT_CONTROLS)  # their own plans (the knee plan, controls)
QUALITY = {"minilm": ("accuracy", +1), "gpt": ("loss", -1)}  # metric, +1 = higher is better
# peak learning rates tried per method: the workload's own (minilm 1e-4, gpt 3e-4) first
LR_GRID = {"minilm": (1e-4, 3e-4, 5e-5), "gpt": (3e-4, 1e-3, 1e-4)}
FULL_STEPS = {"minilm": 300, "gpt": 300}
QUICK = {"steps": 6, "lrs": (1e-3,), "seeds": 1, "eval_every": 3}
# payload encodings (``--wire``; issue 15, item 3): the igrt train flags of every run but PowerSGD's
# (PyTorch's hook sends its own fp32 factors). Every method of one study travels in the same encoding,
# so each byte ratio compares like with like; the rounding error of bf16 / int8 values stays in the
# residual (igrt.sync.residuals), and bucket-local 16-bit indices are exact.
WIRES = {
    "fp32": (),
    "compact": ("--value-bytes", "2", "--index-bytes", "2"),  # bf16 values, 16-bit indices: 4 B a pair
    "int8": ("--value-bytes", "1", "--index-bytes", "2"),  # int8 values + one scale, 16-bit indices: 3 B
}
SUMMARY_NAME, MARK_NAME = "summary.json", "protocol_run.json"
# what the tables need of a finished run: kept in ``--out/run-records`` (small enough to commit) so a
# study survives the loss of its ``--runs`` cache (checkpoints, logs) and resumes from a fresh checkout
RECORD_FILES = (SUMMARY_NAME, MARK_NAME, "metrics.csv")  # metrics.csv is kept gzipped: metrics.csv.gz
RECORDS_DIR = "run-records"


# ------------------------------------------------------------------------------------ runs


@dataclasses.dataclass(frozen=True, kw_only=True)
class Run:
    """One training run: ``tag`` (a method of :data:`POLICIES`), its peak ``lr`` and ``seed``."""

    workload: str
    tiny: bool
    tag: str
    lr: float
    seed: int
    steps: int
    warmup_steps: int
    eval_every: int
    nproc: int
    batch_size: int
    density: float
    release_period: int
    plan_path: str | None = None
    plan_id: str | None = None  # common.plan_decision_id: what the plan decides
    extra: str = ""  # a VARIANTS run's extra igrt train flags, space-separated
    wire: str = "fp32"  # the payload encoding, a key of WIRES

    @property
    def name(self) -> str:
        suffix = "" if self.wire == "fp32" else f"-{self.wire}"
        return f"{self.tag}-lr{self.lr:g}-s{self.seed}{suffix}"

    def settings(self) -> dict[str, Any]:
        """What identifies the run (the plan by what it decides, not by path or fingerprint; the
        default fp32 wire is left out, so records made before ``--wire`` existed still match)."""
        d = dataclasses.asdict(self)
        d.pop("plan_path")
        if d["wire"] == "fp32":
            d.pop("wire")
        return d

    def command(self, folder: Path) -> list[str]:
        if self.tag.startswith("powersgd"):
            return [sys.executable, "-m", "experiments.protocol", "--powersgd-run", str(folder)]
        imp = {p: "importance" for p in (*PLAN_POLICIES, *VARIANTS)}
        policy = {**dict.fromkeys(THINNED, "topk"), **imp}.get(self.tag, self.tag)
        cmd = [sys.executable, "-m", "igrt", "train", "--workload", self.workload, "--policy", policy]
        cmd += ["--steps", str(self.steps), "--seed", str(self.seed), "--lr", f"{self.lr:g}"]
        cmd += ["--schedule", "cosine", "--warmup-steps", str(self.warmup_steps)]
        cmd += ["--eval-every", str(self.eval_every), "--ranks", str(self.nproc), "--backend", "gloo"]
        cmd += ["--batch-size", str(self.batch_size), "--density", f"{self.density:g}"]
        cmd += [
            "--release-period",
            str(self.release_period),
            "--out",
            str(folder),
            "--overwrite",
            "--no-progress",
        ]
        if self.plan_path:
            cmd += ["--plan", self.plan_path]
        cmd += self.extra.split()
        cmd += WIRES[self.wire]
        return cmd + (["--tiny"] if self.tiny else [])


def is_complete(folder: Path, run: Run) -> bool:
    """The folder holds a finished run of exactly these settings: a parseable ``summary.json`` of
    ``run.steps`` steps with its evaluations, and a ``protocol_run.json`` naming ``run``'s settings."""
    try:
        summary = json.loads((folder / SUMMARY_NAME).read_text())
        mark = json.loads((folder / MARK_NAME).read_text())
    except (OSError, ValueError):
        return False
    return (
        mark.get("settings") == run.settings()
        and summary.get("steps") == run.steps
        and summary.get("stats", {}).get("num_steps") == run.steps
        and bool(summary.get("eval", {}).get("history"))
    )


def keep_record(folder: Path, records: Path) -> None:
    """Copy a finished run's :data:`RECORD_FILES` into ``records/<folder name>``."""
    dest = records / folder.name
    dest.mkdir(parents=True, exist_ok=True)
    for name in RECORD_FILES:
        if not (folder / name).is_file():
            continue
        if name.endswith(".csv"):
            # GzipFile with mtime 0 and no file name: the same metrics give the same bytes each time
            with (
                open(folder / name, "rb") as src,
                open(dest / f"{name}.gz", "wb") as raw,
                gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as out,
            ):
                shutil.copyfileobj(src, out)
        else:
            shutil.copy2(folder / name, dest / name)


def restore_records(todo: Sequence[Run], runs_dir: Path, records: Path) -> int:
    """Bring back into ``runs_dir`` every run of ``todo`` that is not complete there but whose
    record in ``records`` is (same settings): the number restored. A record is a complete cached
    run for :func:`is_complete` and :func:`load_result`; it is not retrained."""
    n = 0
    for r in todo:
        src, dst = records / r.name, runs_dir / r.name
        if is_complete(dst, r) or not is_complete(src, r):
            continue
        if dst.exists():
            shutil.rmtree(dst)
        dst.mkdir(parents=True)
        for name in RECORD_FILES:
            if (src / name).is_file():
                shutil.copy2(src / name, dst / name)
            elif (src / f"{name}.gz").is_file():
                with gzip.open(src / f"{name}.gz", "rb") as f, open(dst / name, "wb") as out:
                    shutil.copyfileobj(f, out)
        n += 1
    return n


def execute(run: Run, folder: Path) -> float:
    """Run ``run`` into ``folder`` (cleared first) as one subprocess; its wall time in seconds.
    ``protocol_run.json`` is written only after the subprocess succeeded. RuntimeError with the
    log's tail when it fails."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    log_path = folder.parent / f"{folder.name}.log"
    if run.tag.startswith("powersgd"):
        folder.mkdir()
        common.write_json({"settings": run.settings()}, folder / "powersgd_request.json")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.run(
            run.command(folder), stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO, check=False
        )
    wall_s = time.monotonic() - t0
    if proc.returncode != 0 or not (folder / SUMMARY_NAME).is_file():
        tail = log_path.read_text()[-1500:]
        raise RuntimeError(f"run {run.name} failed (exit {proc.returncode}); log {log_path}:\n{tail}")
    common.write_json({"settings": run.settings(), "wall_s": wall_s, "code": code_version()}, folder / MARK_NAME)
    return wall_s


_TRAINING_CODE = ("igpolicy", "igrt")  # what an igrt train run executes (igsim and igplot do not train)


@functools.cache
def code_version(root: Path = REPO) -> str:
    """A fingerprint of the training code (every ``.py`` file of :data:`_TRAINING_CODE` under ``root``):
    12 hex digits, the same for a git checkout and a ``git archive`` snapshot of one commit.

    It is recorded with every run (``protocol_run.json``, ``runs.csv``'s ``code``) and is *not* part of
    the cache key: a multi-session study would otherwise retrain every cached run after any commit,
    most of which do not change what a run computes. The report names the versions its runs came
    from, so a table mixing them says so."""
    h = hashlib.sha256()
    for pkg in _TRAINING_CODE:
        for f in sorted((root / pkg).rglob("*.py")):
            h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def _claim(lock: Path) -> Path | None:
    """Take ``lock`` for this process (a file holding its pid); None while a live process holds it.
    Two invocations of the study on one ``--runs`` folder then train different runs side by side."""
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                pid = int(lock.read_text().strip() or 0)
                os.kill(pid, 0)
                return None  # alive: another invocation trains this run
            except (ValueError, ProcessLookupError, FileNotFoundError):
                lock.unlink(missing_ok=True)  # stale: its process is gone
                continue
            except PermissionError:
                return None
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        return lock
    return None


def _seconds_per_step(done: Sequence[tuple[Run, Path]]) -> float | None:
    rates = []
    for run, folder in done:
        with contextlib.suppress(OSError, ValueError, KeyError):
            rates.append(json.loads((folder / MARK_NAME).read_text())["wall_s"] / run.steps)
    return float(np.median(rates)) if rates else None


def probe_seconds_per_step(study: Study, base: Run, runs_dir: Path) -> float | None:
    """Seconds per step (start-up and evaluation included) of a short run of ``base`` (Top-k+EF), timed
    once and cached in ``runs_dir/_probe``; None (the duration unknown until a run is done) while
    another invocation times it or when it fails."""
    probe = dataclasses.replace(base, steps=min(base.steps, 2 if base.tiny else 10), eval_every=0)
    folder = runs_dir / "_probe"
    if not is_complete(folder, probe):
        lock = _claim(runs_dir / "_probe.lock")
        if lock is None:
            return None
        study.log(f"timing a {probe.steps}-step probe run to estimate the duration")
        try:
            execute(probe, folder)
        except RuntimeError as e:
            study.log(f"the probe run failed, duration unknown: {str(e)[-300:]}")
            return None
        finally:
            lock.unlink(missing_ok=True)
    return json.loads((folder / MARK_NAME).read_text())["wall_s"] / probe.steps


# ------------------------------------------------------------------------------------ results


def load_result(run: Run, folder: Path) -> dict[str, Any]:
    """A finished run's numbers: pre- and post-flush quality, bytes (steps, flush), curve points."""
    summary = json.loads((folder / SUMMARY_NAME).read_text())
    mark = json.loads((folder / MARK_NAME).read_text())
    metric = QUALITY[run.workload][0]
    history = summary["eval"]["history"]
    pre = [e for e in history if e.get("before_flush")]
    post = [e for e in history if e.get("after_flush")]
    last = pre[-1] if pre else (post[-1] if post else history[-1])  # no flush (PowerSGD): its last eval
    per_step = _per_step_bytes(folder)
    cum = np.cumsum(per_step) if per_step.size else np.zeros(0)
    points = [e for e in history if not e.get("after_flush")]
    return {
        "summary": summary,
        "quality": float(last[metric]),
        "quality_after_flush": float(post[-1][metric]) if post else math.nan,
        # MiniLM's second metric: held-out cross-entropy, resolved far finer than 730 docstrings' accuracy
        "heldout_loss": float(last["loss"]) if "loss" in last else math.nan,
        "floor": float(last["majority_floor"]) if "majority_floor" in last else math.nan,
        "bytes_per_step": float(summary["stats"]["bytes_per_step"]["wire_bytes"]),
        "flush_bytes": float(summary.get("flush_bytes_per_rank", {}).get("wire_bytes", 0.0)),
        "curve_bytes": [
            float(cum[int(e["step"]) - 1]) if int(e["step"]) > 0 and cum.size else 0.0 for e in points
        ],
        "curve_values": [float(e[metric]) for e in points],
        "wall_s": mark.get("wall_s", math.nan),
        "code": mark.get("code", "unknown"),  # runs of older protocol versions did not record it
    }


def _per_step_bytes(folder: Path) -> np.ndarray:
    """Mean over ranks of each step's wire bytes (``metrics.csv``)."""
    path = folder / "metrics.csv"
    if not path.is_file():
        return np.zeros(0)
    by_step: dict[int, list[float]] = {}
    for row in common.read_csv(path):
        wire = row.get("wire_bytes")
        if wire in (None, ""):
            wire = sum(
                float(row.get(k) or 0)
                for k in ("values_bytes", "indices_bytes", "dense_bytes", "metadata_bytes")
            )
        by_step.setdefault(int(row["step"]), []).append(float(wire))
    return np.asarray([np.mean(by_step[s]) for s in sorted(by_step)], dtype=float)


def majority_floor(workload: str, *, tiny: bool) -> float | None:
    """MiniLM: the held-out share of the training split's most common class (what a model that
    always answers that class scores); None for GPT (a loss has no such floor)."""
    if workload != "minilm":
        return None
    from collections import Counter

    from igrt.workloads.data import docstring_dataset

    data = docstring_dataset()
    majority = Counter(data.train_labels).most_common(1)[0][0]
    return sum(y == majority for y in data.heldout_labels) / len(data.heldout_labels)


def _better(workload: str, a: float, b: float) -> bool:
    return (a > b) if QUALITY[workload][1] > 0 else (a < b)


def _delta(workload: str, q: float, ref: float) -> float:
    """Quality difference to the reference: accuracy points (MiniLM) or relative loss in % (GPT;
    negative = lower loss = better)."""
    return (q - ref) * 100.0 if workload == "minilm" else (q - ref) / ref * 100.0


# ------------------------------------------------------------------------------------ the study


def plan_for(study: Study, workload: str, *, tiny: bool, nproc: int, density: float, release_period: int):
    """The knee plan of the workload's trace (the shipped sample, else ``igrt record``), its
    controls saved beside it in ``--out/plans``, and the profiling run's size."""
    steps = 12 if tiny else 100
    trace = common.trace_for(workload, seed=0, steps=steps, tiny=tiny, cache=study.cache, nproc=nproc,
                             density=density, inprocess=tiny)  # fmt: skip
    from traces.reader import read_manifest

    manifest = read_manifest(trace)
    plan, _, _ = common.profile(trace, release_period=release_period)
    plans = {"importance": plan, **split_controls(plan, seed=0)}
    paths = {tag: p.save(study.out / "plans" / f"{tag}.json") for tag, p in plans.items()}
    recorded_steps = common.num_steps(trace)
    num_params = int(manifest.extra.get("num_params", 0))
    recording = {
        "trace": str(trace.relative_to(REPO)) if trace.is_relative_to(REPO) else str(trace),
        "recorded_steps": recorded_steps,
        "num_params": num_params,
        "recording_bytes_per_rank": 4.0 * num_params * recorded_steps,  # one dense fp32 all-reduce per step
    }
    return plans, paths, recording


def build_runs(settings: Mapping[str, Any], plans: Mapping[str, Any], paths: Mapping[str, Path]) -> list[Run]:
    """Every run in the order it will train: seed 0 of every method at the first LR, then the other LRs
    (the tuning), then the other seeds at the best LR (added by :func:`seed_runs` once tuned)."""
    runs = []
    for lr in settings["lrs"]:
        for tag in settings["policies"]:
            runs.append(_run(settings, tag, lr=lr, seed=0, plans=plans, paths=paths))
    return runs


def _run(settings, tag: str, *, lr: float, seed: int, plans, paths) -> Run:
    density = settings["density"]
    if tag in THINNED:
        share = THINNED[tag]
        density = round(density * (plans["importance"].expected_share if share is None else share), 6)
    plan_tag, extra, period = VARIANTS.get(tag, (tag if tag in PLAN_POLICIES else None, (), None))
    plan = plans.get(plan_tag) if plan_tag else None
    return Run(
        workload=settings["workload"], tiny=settings["tiny"], tag=tag, lr=lr, seed=seed, steps=settings["steps"],
        warmup_steps=settings["warmup_steps"], eval_every=settings["eval_every"], nproc=settings["nproc"],
        batch_size=settings["batch_size"], density=density, release_period=period or settings["release_period"],
        plan_path=str(paths[plan_tag]) if plan is not None else None,
        plan_id=common.plan_decision_id(plan) if plan is not None else None,
        extra=" ".join(x.format(warmup=settings["warmup_steps"]) for x in extra),
        wire="fp32" if tag.startswith("powersgd") else settings.get("wire", "fp32"),
    )  # fmt: skip


def best_lrs(settings, results: Mapping[str, dict[str, Any]], tuning: Sequence[Run]) -> dict[str, float]:
    """Per method, the LR of the grid with the best pre-flush quality on seed 0 (among finished runs)."""
    wl, best = settings["workload"], {}
    for tag in settings["policies"]:
        tried = [(r.lr, results[r.name]["quality"]) for r in tuning if r.tag == tag and r.name in results]
        tried = [(lr, q) for lr, q in tried if math.isfinite(q)]
        if tried:
            pick = tried[0]
            for lr, q in tried[1:]:
                if _better(wl, q, pick[1]):
                    pick = (lr, q)
            best[tag] = pick[0]
    return best


def run_all(study: Study, todo: Sequence[Run], runs_dir: Path, results: dict[str, dict[str, Any]], *,
            estimate_s_per_step: float | None, stop_at: float | None) -> bool:  # fmt: skip
    """Train the runs of ``todo`` that are not cached, one after another, a progress line each, and
    keep each finished run's record in ``--out/run-records`` (a cached run's too, where it is missing:
    the records of an ``--out`` cover every run of its tables). False when ``stop_at`` (a
    time.monotonic deadline) came first."""
    records = study.out / RECORDS_DIR
    restore_records(todo, runs_dir, records)
    pending = [r for r in todo if not is_complete(runs_dir / r.name, r)]
    for r in todo:
        if r not in pending and r.name not in results:
            results[r.name] = load_result(r, runs_dir / r.name)
        if r not in pending and not is_complete(records / r.name, r):  # a run cached before this --out
            keep_record(runs_dir / r.name, records)
    done = [(r, runs_dir / r.name) for r in todo if r not in pending]
    rate = _seconds_per_step(done) or estimate_s_per_step
    eta = f"~{rate * sum(r.steps for r in pending) / 60:.1f} min" if rate else "unknown"
    study.log(f"{len(todo) - len(pending)} run(s) cached, {len(pending)} to do; expected {eta}"
              + (f" ({rate:.2f} s/step)" if rate else ""))  # fmt: skip
    for i, r in enumerate(pending, 1):
        if stop_at is not None and stop_at < 0:
            study.log(f"--report-only: {len(pending)} run(s) not trained")
            return False
        if stop_at is not None and time.monotonic() > stop_at:
            study.log(
                f"stopping: --budget-min reached with {len(pending) - i + 1} run(s) to do (rerun to continue)"
            )
            return False
        if is_complete(runs_dir / r.name, r):  # another invocation finished it meanwhile
            results[r.name] = load_result(r, runs_dir / r.name)
            continue
        lock = _claim(runs_dir / f"{r.name}.lock")
        if lock is None:
            study.log(f"[{i}/{len(pending)}] {r.name}: being trained by another invocation, skipped")
            continue
        study.log(f"[{i}/{len(pending)}] {r.name}: training {r.steps} steps")
        try:
            wall = execute(r, runs_dir / r.name)
        except RuntimeError as e:  # the folder stays incomplete: the next invocation redoes it
            study.log(f"[{i}/{len(pending)}] {r.name}: FAILED, left to redo; {str(e)[-600:]}")
            continue
        finally:
            lock.unlink(missing_ok=True)
        keep_record(runs_dir / r.name, records)
        res = results[r.name] = load_result(r, runs_dir / r.name)
        done.append((r, runs_dir / r.name))
        rate = _seconds_per_step(done)
        left = sum(x.steps for x in pending[i:]) * (rate or 0) / 60
        floor = f" (floor {res['floor'] * 100:.2f})" if math.isfinite(res["floor"]) else ""
        study.log(f"[{i}/{len(pending)}] {r.name}: {wall:.0f} s; pre-flush {QUALITY[r.workload][0]} "
                  f"{res['quality']:.4g}{floor}, {res['bytes_per_step'] / 1e6:.3f} MB/step; ~{left:.1f} min left")  # fmt: skip
    return True


def code_versions(run_rows: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """How many of the tables' runs each training-code version trained (``unknown``: not recorded)."""
    return dict(collections.Counter(row.get("code", "unknown") for row in run_rows))


def tables(
    settings, results, runs: Sequence[Run], best: Mapping[str, float], recording, floor
) -> dict[str, Any]:
    """runs.csv rows, tuning rows, summary rows (paired differences vs Top-k+EF) and the targets."""
    wl = settings["workload"]
    metric = QUALITY[wl][0]
    run_rows, tuning_rows = [], []
    for r in runs:
        if r.name not in results:
            continue
        res = results[r.name]
        total = res["bytes_per_step"] * r.steps + res["flush_bytes"]
        rec = recording["recording_bytes_per_rank"] if r.plan_path else 0.0
        run_rows.append({
            "method": r.tag, "lr": r.lr, "seed": r.seed, "steps": r.steps, "density": r.density,
            f"{metric}_pre_flush": res["quality"], f"{metric}_after_flush": res["quality_after_flush"],
            **({"loss_pre_flush": res["heldout_loss"]} if wl == "minilm" else {}),
            "majority_floor": floor if floor is not None else math.nan,
            "bytes_per_step": res["bytes_per_step"], "flush_bytes": res["flush_bytes"],
            "run_bytes_incl_flush": total, "recording_bytes": rec, "run_bytes_incl_flush_and_recording": total + rec,
            "catch_up": res["summary"].get("config", {}).get("catch_up"), "wall_s": res["wall_s"],
            "code": res.get("code", "unknown"),
        })  # fmt: skip
        if r.seed == 0:
            tuning_rows.append({"method": r.tag, "lr": r.lr, f"{metric}_pre_flush": res["quality"],
                                "best": best.get(r.tag) == r.lr})  # fmt: skip
    by = {(row["method"], row["lr"], row["seed"]): row for row in run_rows}
    ref_lr = best.get("topk")
    summary_rows = []
    for tag in settings["policies"]:
        lr = best.get(tag)
        if lr is None:
            continue
        rows = [by[tag, lr, s] for s in range(settings["seeds"]) if (tag, lr, s) in by]
        q_mean, q_std = mean_std(x[f"{metric}_pre_flush"] for x in rows)
        diffs = _paired(rows, by, ref_lr, f"{metric}_pre_flush", wl)
        d_mean, d_std = mean_std(diffs)
        second = {}
        if wl == "minilm":  # the paired held-out loss too, in % of Top-k+EF's (negative = lower = better)
            loss_d = _paired(rows, by, ref_lr, "loss_pre_flush", "gpt")
            second = dict(zip(("loss_paired_diff_pct", "loss_paired_diff_std"), mean_std(loss_d)))
        ref_rows = [
            by["topk", ref_lr, s]
            for s in range(settings["seeds"])
            if ref_lr is not None and ("topk", ref_lr, s) in by
        ]
        topk_b = float(np.mean([x["bytes_per_step"] for x in ref_rows])) if ref_rows else math.nan
        b = float(np.mean([x["bytes_per_step"] for x in rows]))
        summary_rows.append({
            "method": tag, "label": LABELS[tag], "best_lr": lr, "seeds": len(rows),
            f"{metric}_pre_flush_mean": q_mean, f"{metric}_pre_flush_std": q_std,
            f"{metric}_after_flush_mean": mean_std(x[f"{metric}_after_flush"] for x in rows)[0],
            "majority_floor": floor if floor is not None else math.nan,
            "paired_diff_vs_topk": d_mean, "paired_diff_std": d_std, "pairs": len(diffs),
            "diff_unit": "accuracy points" if wl == "minilm" else "% of Top-k+EF's loss",
            **second,
            "bytes_per_step": b, "bytes_vs_topk": b / topk_b if topk_b else math.nan,
            "flush_bytes": float(np.mean([x["flush_bytes"] for x in rows])),
            "recording_bytes": rows[0]["recording_bytes"],
            "recording_bytes_per_step_amortised": rows[0]["recording_bytes"] / settings["steps"],
            "run_bytes_incl_flush_and_recording": float(np.mean([x["run_bytes_incl_flush_and_recording"] for x in rows])),
        })  # fmt: skip
    return {"runs": run_rows, "tuning": tuning_rows, "summary": summary_rows,
            "targets": targets(wl, {row["method"]: row for row in summary_rows}, metric)}  # fmt: skip


def _paired(rows, by: Mapping[tuple, Mapping[str, Any]], ref_lr: float | None, key: str, kind: str) -> list[float]:
    """Per run of ``rows``, ``key``'s difference to Top-k+EF's (at ``ref_lr``) on the same seed
    (:func:`_delta` of ``kind``: accuracy points for ``minilm``, % of the loss for ``gpt``)."""
    return [_delta(kind, x[key], by["topk", ref_lr, x["seed"]][key])
            for x in rows if ref_lr is not None and ("topk", ref_lr, x["seed"]) in by]  # fmt: skip


def targets(wl: str, s: Mapping[str, dict[str, Any]], metric: str) -> list[dict[str, Any]]:
    """Issue 15's targets for the importance policy, each with its measured value (None: a run missing)."""
    imp, topk, eq, psgd = (s.get(k) for k in ("importance", "topk", "topk_equal", "powersgd1"))
    key = f"{metric}_pre_flush_mean"
    tol = 0.5 if wl == "minilm" else 1.0
    out = []

    def add(name: str, value: Any, ok: bool | None) -> None:
        out.append({"target": name, "value": value, "met": ok})

    if imp and topk:
        add("bytes/step <= 0.25 x Top-k+EF", imp["bytes_vs_topk"], imp["bytes_vs_topk"] <= 0.25)
        d = imp["paired_diff_vs_topk"]
        ok = (d >= -tol) if wl == "minilm" else (d <= tol)
        add(
            f"quality within {tol:g} {'points' if wl == 'minilm' else '% loss'} of tuned Top-k+EF (paired mean)",
            d,
            ok,
        )
    if imp and eq:
        add("better than Top-k+EF thinned to equal bytes", imp[key] - eq[key], _better(wl, imp[key], eq[key]))
    if imp and psgd:
        ok = imp["bytes_per_step"] < psgd["bytes_per_step"] and not _better(wl, psgd[key], imp[key])
        add("fewer bytes than PowerSGD rank 1 at equal or better quality",
            {"bytes_ratio": imp["bytes_per_step"] / psgd["bytes_per_step"], "quality_diff": imp[key] - psgd[key]}, ok)  # fmt: skip
    return out


def curves(settings, results, best: Mapping[str, float]) -> list[dict[str, Any]]:
    """Seed 0 of each method at its best LR: quality at every evaluation against cumulative bytes."""
    out = []
    for tag in settings["policies"]:
        name = f"{tag}-lr{best[tag]:g}-s0" if tag in best else None
        if name in results:
            res = results[name]
            out.append({"label": f"{LABELS[tag]} (lr {best[tag]:g})", "method": tag, "bytes": res["curve_bytes"],
                        "values": res["curve_values"], "flush_bytes": res["flush_bytes"] or None,
                        "flush_value": res["quality_after_flush"] if math.isfinite(res["quality_after_flush"]) else None})  # fmt: skip
    return out


def run(study: Study) -> dict[str, Any]:
    a, quick = study.args, study.quick
    wl = a.workload
    steps = a.steps or (QUICK["steps"] if quick else FULL_STEPS[wl])
    settings = {
        "workload": wl,
        "tiny": quick,
        "steps": steps,
        "warmup_steps": max(1, round(a.warmup * steps)),
        "eval_every": a.eval_every or (QUICK["eval_every"] if quick else max(1, steps // 6)),
        "lrs": tuple(float(x) for x in a.lrs.split(","))
        if a.lrs
        else (QUICK["lrs"] if quick else LR_GRID[wl]),
        "seeds": a.seeds or (QUICK["seeds"] if quick else 3),
        "policies": tuple(a.policies.split(",")) if a.policies else (QUICK_POLICIES if quick else POLICIES),
        "nproc": a.nproc,
        "batch_size": a.batch_size,
        "density": a.density,
        "release_period": a.release_period,
        "wire": a.wire,
    }
    unknown = [p for p in settings["policies"] if p not in POLICIES]
    if unknown:
        raise ValueError(f"--policies: unknown {unknown} (choose from {', '.join(POLICIES)})")
    if "topk" not in settings["policies"]:
        raise ValueError("--policies must include topk (the reference of every paired difference)")
    runs_dir = (
        Path(a.runs)
        if a.runs
        else (study.out / "runs" if quick else common.default_cache().parent / "protocol" / wl)
    )
    runs_dir.mkdir(parents=True, exist_ok=True)
    study.log(f"{wl}: {steps} steps, warm-up {settings['warmup_steps']} + cosine, LR grid {settings['lrs']}, "
              f"{settings['seeds']} seed(s), methods {','.join(settings['policies'])}, wire {a.wire} "
              f"({' '.join(WIRES[a.wire]) or 'fp32 values, int32 indices'}); runs in {runs_dir}")  # fmt: skip
    (study.out / "plans").mkdir(exist_ok=True)
    plans, paths, recording = plan_for(study, wl, tiny=quick, nproc=a.nproc, density=a.density,
                                       release_period=a.release_period)  # fmt: skip
    study.log(f"knee plan {plans['importance'].fingerprint}: {len(plans['importance'].important)} important / "
              f"{len(plans['importance'].low)} low, {plans['importance'].expected_share:.3f} x Top-k's "
              f"expected bytes; profiling run {recording['recorded_steps']} dense steps = "
              f"{recording['recording_bytes_per_rank'] / 1e9:.2f} GB per rank")  # fmt: skip
    floor = majority_floor(wl, tiny=quick)
    if floor is not None:
        study.log(f"majority-class floor of the held-out split: {floor * 100:.2f} %")
    tuning = build_runs(settings, plans, paths)
    results: dict[str, dict[str, Any]] = {}
    seed_runs_planned = [_run(settings, t, lr=settings["lrs"][0], seed=s, plans=plans, paths=paths)
                         for t in settings["policies"] for s in range(1, settings["seeds"])]  # fmt: skip
    restored = restore_records([*tuning, *seed_runs_planned], runs_dir, study.out / RECORDS_DIR)
    if restored:
        study.log(f"{restored} finished run(s) restored from {study.out / RECORDS_DIR} into {runs_dir}")
    cached = [(r, runs_dir / r.name) for r in tuning if is_complete(runs_dir / r.name, r)]
    rate = _seconds_per_step(cached) or _seconds_per_step(
        [(r, runs_dir / r.name) for r in seed_runs_planned if is_complete(runs_dir / r.name, r)]
    )
    if rate is None and not (a.no_probe or a.report_only):
        topk = _run(settings, "topk", lr=settings["lrs"][0], seed=0, plans=plans, paths=paths)
        rate = probe_seconds_per_step(study, topk, runs_dir)
    total_steps = steps * (len(tuning) + len(seed_runs_planned))
    if rate:
        study.log(f"the whole protocol: {len(tuning) + len(seed_runs_planned)} runs x {steps} steps, "
                  f"~{rate * total_steps / 3600:.1f} h at {rate:.2f} s/step (cached runs are not rerun)")  # fmt: skip
    stop_at = time.monotonic() + a.budget_min * 60 if a.budget_min else None
    if a.report_only:
        stop_at = -1.0  # tables of the cached runs only: start nothing
    study.log("tuning: every method at every LR of the grid on seed 0")
    finished = run_all(study, tuning, runs_dir, results, estimate_s_per_step=rate, stop_at=stop_at)
    best = best_lrs(settings, results, tuning)
    seed_runs = [_run(settings, t, lr=best[t], seed=s, plans=plans, paths=paths)
                 for s in range(1, settings["seeds"]) for t in settings["policies"] if t in best]  # fmt: skip
    if finished and seed_runs:
        study.log(f"seeds 1..{settings['seeds'] - 1} at each method's best LR: {best}")
        finished = run_all(study, seed_runs, runs_dir, results, estimate_s_per_step=rate, stop_at=stop_at)
    all_runs = [*tuning, *seed_runs]
    for r in all_runs:  # runs cached before records were kept get one too
        if is_complete(runs_dir / r.name, r) and not is_complete(study.out / RECORDS_DIR / r.name, r):
            keep_record(runs_dir / r.name, study.out / RECORDS_DIR)
    t = tables(settings, results, all_runs, best, recording, floor)
    common.write_csv(t["runs"], study.out / "runs.csv")
    common.write_csv(t["tuning"], study.out / "tuning.csv")
    common.write_csv(t["summary"], study.out / "summary.csv")
    common.write_json(t["targets"], study.out / "targets.json")
    c = curves(settings, results, best)
    common.write_json(c, study.out / "curves.json")
    from igplot import plot_quality_vs_bytes

    metric = QUALITY[wl][0]
    plot_quality_vs_bytes(c, study.out / "quality_vs_bytes.png", metric=metric,
                          floor=floor if floor is not None else None,
                          title=f"{wl}: held-out {metric} before the flush vs cumulative bytes (seed 0)")  # fmt: skip
    for row in t["summary"]:
        fl = f" (floor {row['majority_floor'] * 100:.2f})" if floor is not None else ""
        q = row[f"{metric}_pre_flush_mean"] * (100 if wl == "minilm" else 1)
        study.log(f"  {row['method']:>11} lr {row['best_lr']:g}: {metric} {q:.4g}{fl} ± "
                  f"{row[f'{metric}_pre_flush_std'] * (100 if wl == 'minilm' else 1):.3g} over {row['seeds']} seed(s); "
                  f"paired diff vs Top-k+EF {row['paired_diff_vs_topk']:+.3g} ± {row['paired_diff_std']:.3g} "
                  f"({row['diff_unit']}); {row['bytes_vs_topk']:.3f} x Top-k's bytes/step"
                  + (f"; held-out loss {row['loss_paired_diff_pct']:+.3g} ± {row['loss_paired_diff_std']:.3g} %"
                     if "loss_paired_diff_pct" in row else ""))  # fmt: skip
    for tg in t["targets"]:
        study.log(f"  target {tg['target']}: {tg['value']} -> {'met' if tg['met'] else 'missed'}")
    versions = code_versions(t["runs"])
    study.log(f"  training code of these runs: {', '.join(f'{v} ({n} run(s))' for v, n in versions.items())}"
              + (" -- more than one version" if len(versions) > 1 else "") + f"; this checkout {code_version()}")  # fmt: skip
    return study.finish(
        settings={k: list(v) if isinstance(v, tuple) else v for k, v in settings.items()},
        runs_dir=str(runs_dir), complete=finished, runs_done=len(t["runs"]),
        runs_planned=len(tuning) + len(seed_runs_planned), best_lr=best, recording=recording,
        majority_floor=floor, targets=t["targets"], code_versions=versions, code=code_version(),
    )  # fmt: skip


# ------------------------------------------------------------------------------------ PowerSGD


def _powersgd_main(folder: Path) -> int:
    """One PowerSGD run (``powersgd_request.json`` in ``folder``): ranks spawned on loopback gloo."""
    from igrt.train.launch import launch

    settings = json.loads((folder / "powersgd_request.json").read_text())["settings"]
    from igrt.workloads import prepare_workload

    prepare_workload(settings["workload"], tiny=settings["tiny"], seed=settings["seed"])
    launch(
        _powersgd_rank,
        nproc=settings["nproc"],
        backend="gloo",
        args=(settings, str(folder)),
        timeout_s=3600.0,
    )
    return 0


def _powersgd_rank(ctx: Any, settings: Mapping[str, Any], folder: str) -> int:
    """PyTorch's PowerSGD hook on DDP (one bucket), registered by ``igrt bench``'s own code path,
    trained like ``igrt train`` (same workload, seed, data streams, AdamW and schedule), evaluated
    every ``eval_every`` steps on rank 0; rank 0 writes ``metrics.csv`` and ``summary.json`` in the
    shape :func:`load_result` reads (bytes: every tensor handed to ``all_reduce``, per rank)."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from igrt.integrations.peers import CollectiveMeter, register_peer
    from igrt.train.loop import rank_seed
    from igrt.workloads import WorkloadSpec, make_workload

    s = settings
    spec = WorkloadSpec(lr=s["lr"], schedule="cosine", warmup_steps=s["warmup_steps"], total_steps=s["steps"])
    w = make_workload(s["workload"], tiny=s["tiny"], seed=s["seed"], spec=spec)
    torch.manual_seed(rank_seed(s["seed"], ctx.rank))
    model = w.model.to(ctx.device)
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    ddp = DistributedDataParallel(model, bucket_cap_mb=2 * grad_bytes / 2**20 + 1)  # one bucket (igrt bench)
    meter = CollectiveMeter()
    register_peer(ddp, s["tag"], meter)
    optimizer = w.optimizer(model)
    batches = w.train_batches(ctx.rank, ctx.world_size, s["batch_size"])
    evals = [{"step": 0, **w.evaluate(model)}] if ctx.rank == 0 else []
    rows = []
    t_start = time.perf_counter()
    with meter.counting():
        for step in range(s["steps"]):
            meter.reset()
            t0 = time.perf_counter()
            loss = w.loss(ddp, next(batches))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            rows.append({"step": step, "rank": ctx.rank, "wire_bytes": meter.bytes, "loss": float(loss.detach()),
                         "step_s": time.perf_counter() - t0, "num_collectives": meter.num_collectives})  # fmt: skip
            done = step + 1
            if ctx.rank == 0 and s["eval_every"] and done % s["eval_every"] == 0 and done < s["steps"]:
                evals.append({"step": done, **w.evaluate(model)})
    if ctx.rank == 0:
        evals.append({"step": s["steps"], "no_flush": True, **w.evaluate(model)})
    got: list[Any] = [None] * ctx.world_size if ctx.rank == 0 else None  # type: ignore[assignment]
    import torch.distributed as dist

    dist.gather_object(rows, got, dst=0)
    if ctx.rank != 0:
        return 0
    every = sorted((r for part in got for r in part), key=lambda r: (r["step"], r["rank"]))
    out = Path(folder)
    common.write_csv(every, out / "metrics.csv")
    wire = [np.mean([r["wire_bytes"] for r in every if r["step"] == st]) for st in range(s["steps"])]
    summary = {
        "command": f"python -m experiments.protocol --powersgd-run {folder}",
        "method": s["tag"], "workload": s["workload"], "seed": s["seed"], "steps": s["steps"],
        "world_size": ctx.world_size, "settings": dict(s),
        "stats": {"num_steps": s["steps"], "bytes_per_step": {"wire_bytes": float(np.mean(wire))},
                  "step_s_mean": float(np.mean([r["step_s"] for r in every]))},
        "flush_bytes_per_rank": {"wire_bytes": 0.0},
        "train_s": time.perf_counter() - t_start,
        "eval": {"history": evals, "final": evals[-1]},
    }  # fmt: skip
    common.write_json(summary, out / SUMMARY_NAME)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--powersgd-run"]:
        return _powersgd_main(Path(argv[1]))
    parser = argparse.ArgumentParser(prog="experiments.protocol", description=__doc__.split("\n")[0])
    Study.add_arguments(parser)
    parser.add_argument("--workload", choices=tuple(QUALITY), required=True)
    parser.add_argument(
        "--runs",
        default=None,
        help="run folders (the cache; default ~/.cache/importance-gradient/protocol/<workload>)",
    )
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default 300; quick 6)")
    parser.add_argument(
        "--warmup", type=float, default=0.1, help="linear warm-up share of the steps (default 0.1)"
    )
    parser.add_argument(
        "--eval-every", type=int, default=None, help="evaluation every K steps (default steps/6)"
    )
    parser.add_argument(
        "--lrs", default=None, help="comma-separated LR grid (default: per workload, LR_GRID)"
    )
    parser.add_argument("--seeds", type=int, default=None, help="paired seeds (default 3; quick 1)")
    parser.add_argument(
        "--policies", default=None, help=f"comma-separated methods (default all: {','.join(POLICIES)})"
    )
    parser.add_argument("--density", type=float, default=0.01, help="Top-k density (default 0.01)")
    parser.add_argument("--release-period", type=int, default=4, help="R of the plans (default 4)")
    parser.add_argument("--batch-size", type=int, default=16, help="examples per rank per step (default 16)")
    parser.add_argument(
        "--wire",
        choices=tuple(WIRES),
        default="fp32",
        help="payload encoding of every method but PowerSGD: fp32 (default), compact (bf16 values, "
        "bucket-local 16-bit indices), int8 (int8 values with one scale, 16-bit indices)",
    )
    parser.add_argument(
        "--budget-min", type=float, default=None, help="start no new run after this many minutes"
    )
    parser.add_argument("--no-probe", action="store_true", help="no timed probe run when nothing is cached")
    parser.add_argument(
        "--report-only", action="store_true", help="write the tables of the cached runs; train nothing"
    )
    args = parser.parse_args(argv)
    if args.out is None:
        args.out = str(REPO / "docs" / "results" / f"protocol_{args.workload}")
    study = Study(f"protocol_{args.workload}", args, argv)
    study.meta["command"] = " ".join(["python -m experiments.protocol", *argv])
    run(study)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
