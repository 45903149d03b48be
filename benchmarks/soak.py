"""Soak: a long run of random schedules, densities and empty payloads on real gloo ranks.

    /work/venv/bin/python benchmarks/soak.py                        # 1,000 steps on 3 gloo ranks
    /work/venv/bin/python benchmarks/soak.py --steps 200 --nproc 2 --seed 7

Every ``--segment-steps`` steps all ranks draw the same random :class:`PolicyConfig` and
:class:`SyncPlan` (seeded by segment; the policy takes each of the five in turn): sparsifier (top-k, threshold, random-k), density in
[0.001, 1], release period 1..6 (the plan's own period differs from it half the time), staggered or
not, packing, bucket count and cap, sparse / dense / auto collectives, fp32 or bf16 values, int32 or
int64 indices, ``skip_unsent``. They build a fresh :class:`~igrt.sync.synchronizer.Synchronizer` (the
start-up agreement runs each time) and, at the segment's end, flush it. Each step every rank draws
its own gradients per parameter: absent (``None``), all zero, dense, 95 % zeros, tiny (1e-6) or huge
(1e3); the threshold sparsifier's threshold often exceeds every value, so whole buckets travel empty
on some or all ranks. The model's parameters include a 1-element and an empty (0-element) one.

Checked on every step, on every rank (an AssertionError stops the run):

- conservation: ``max |Σg − Σsent − e| <= (t + 1) · 2 · eps32 · M`` per parameter, where t counts
  the segment's steps and M bounds every |u| = |g + e| seen (each step rounds u once to fp32 and the
  residual update once more);
- the wire: every synchronized gradient equals the rank average of what the ranks recorded as sent
  (Σsent increments, all-reduced in fp64): relative error <= 1e-5, or the bf16 rounding of a sum of
  ``world`` values for dense buckets in bf16; a parameter that sent nothing has ``grad None`` (or 0);
- after each flush: every residual is exactly zero;
- non-finite gradients: on about 3 % of steps (the same steps on every rank) one rank gets a NaN or
  an inf in one parameter's gradient. Every residual stays finite; a step whose non-finite gradient
  travelled is skipped on every rank alike (no gradient anywhere, nothing sent on balance), and
  conservation holds with that gradient left out (it was discarded before any residual saw it).

Memory: RSS (``/proc/self/statm``) after step ``min(100, steps // 4)`` against the end. The table
prints per rank: steps, wall seconds, largest conservation gap (absolute and over its bound), the
largest wire error, steps on which this rank sent no pair at all, RSS at the mark and at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from igpolicy.config import PACKINGS, POLICIES, PolicyConfig
from igpolicy.plan import ComponentPlan, SyncPlan
from igpolicy.vocab import ComponentClass
from igrt.sync.sparsifiers import make_sparsifier
from igrt.sync.synchronizer import Synchronizer, build_param_infos

EPS32 = float(torch.finfo(torch.float32).eps)
BF16_EPS = float(torch.finfo(torch.bfloat16).eps)


@dataclass(frozen=True, kw_only=True)
class SoakResult:
    """One rank's figures (bytes in MiB, times in seconds)."""

    rank: int
    steps: int
    segments: int
    wall_s: float
    max_gap: float
    max_gap_over_bound: float
    max_wire_error: float
    empty_steps: int
    nonfinite_steps: int  # steps on which some rank injected a NaN / inf
    skipped_steps: int  # of those, steps skipped on every rank (the bad gradient travelled)
    rss_mark_mib: float
    rss_end_mib: float
    mark_step: int  # the step after which RSS was first read (in the last process of a resumed run)
    policies: tuple[str, ...]
    resumed_from: tuple[int, ...] = ()  # the checkpoint steps this rank resumed from


def rss_mib() -> float:
    """Resident set size of this process, MiB (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def soak_parameters(
    *, d: int = 16, num_layers: int = 2, vocab: int = 64
) -> list[tuple[str, torch.nn.Parameter]]:
    """Llama-style names (so they map to components), plus a 1-element and an empty parameter."""
    shapes = {"model.embed_tokens.weight": (vocab, d)}
    for i in range(num_layers):
        p = f"model.layers.{i}"
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            shapes[f"{p}.self_attn.{proj}.weight"] = (d, d)
        shapes[f"{p}.mlp.up_proj.weight"] = (2 * d, d)
        shapes[f"{p}.mlp.down_proj.weight"] = (d, 2 * d)
        shapes[f"{p}.input_layernorm.weight"] = (d,)
    shapes["model.layers.0.self_attn.q_proj.bias"] = (1,)
    shapes["model.layers.1.self_attn.k_proj.bias"] = (0,)
    shapes["model.norm.weight"] = (d,)
    shapes["lm_head.weight"] = (vocab, d)
    return [(n, torch.nn.Parameter(torch.zeros(s))) for n, s in shapes.items()]


def random_setup(rng: np.random.Generator, components: list[str], *, policy: str):
    """(PolicyConfig, SyncPlan, sparsifier) for ``policy``, the rest drawn from ``rng`` (identical
    on every rank)."""
    kind = "adtopk" if policy == "adtopk" else str(rng.choice(["topk", "threshold", "randomk"]))
    period = int(rng.integers(1, 7))
    config = PolicyConfig(
        policy=policy,
        sparsifier=kind,
        density=float(10 ** rng.uniform(-3, 0)),
        release_period=period,
        staggered=bool(rng.random() < 0.7),
        packing=str(rng.choice(PACKINGS)),
        num_buckets=[None, 1, 2, 3, 5][int(rng.integers(5))],
        bucket_cap_bytes=[64, 1024, 25 * 2**20][int(rng.integers(3))],
        collective=str(rng.choice(["auto", "sparse", "dense"])),
        index_bytes=int(rng.choice([4, 8])),
        value_bytes=int(rng.choice([2, 4])),
        skip_unsent=bool(rng.random() < 0.7),
        seed=int(rng.integers(2**31)),
    )
    plan_period = period if rng.random() < 0.5 else int(rng.integers(1, 7))
    comps = []
    for j, key in enumerate(components):
        cls = [ComponentClass.IMPORTANT, ComponentClass.LOW, ComponentClass.PINNED][
            int(rng.choice(3, p=[0.4, 0.5, 0.1]))
        ]
        low = cls == ComponentClass.LOW
        comps.append(
            ComponentPlan(
                key=key,
                score=float(len(components) - j),
                cls=cls,
                phase=int(rng.integers(plan_period)) if low else None,
                expected_bytes=int(rng.integers(0, 10_000)),
            )
        )
    plan = SyncPlan(release_period=plan_period, components=tuple(comps))
    sparsifier = make_sparsifier(
        kind,
        seed=config.seed,
        threshold=float(10 ** rng.uniform(-2, 2)),
        shared_indices=bool(rng.random() < 0.5),
    )
    return config, plan, sparsifier


def _draw_grad(rng: np.random.Generator, shape: tuple[int, ...]) -> torch.Tensor | None:
    mode = rng.choice(["none", "zero", "dense", "sparse", "tiny", "huge"], p=[0.1, 0.1, 0.35, 0.25, 0.1, 0.1])
    if mode == "none":
        return None
    g = torch.from_numpy(rng.standard_normal(shape).astype(np.float32))
    if mode == "zero":
        return torch.zeros(shape)
    if mode == "sparse":
        g *= torch.from_numpy(rng.random(shape) < 0.05)
    return g * {"tiny": 1e-6, "huge": 1e3}.get(str(mode), 1.0)


class _Tally:
    """One rank's running figures; saved in every checkpoint so a resumed run reports all its steps."""

    FIELDS = ("max_gap", "max_ratio", "max_wire", "empty", "nonfinite", "skipped", "segments",
              "policies", "bound_m", "log_bytes", "resumed_from", "wall_s")  # fmt: skip

    def __init__(self) -> None:
        self.max_gap = self.max_ratio = self.max_wire = self.wall_s = 0.0
        self.empty = self.nonfinite = self.skipped = self.segments = self.log_bytes = 0
        self.policies: list[str] = []
        self.bound_m: dict[str, float] = {}
        self.resumed_from: list[int] = []

    def state(self) -> dict:
        return {k: getattr(self, k) for k in self.FIELDS}

    def restore(self, sd: dict) -> None:
        for k in self.FIELDS:
            setattr(self, k, sd[k])


class _SoakState:
    """The "model" of the soak's checkpoints: every rank's :class:`_Tally` (gathered before a save;
    a rank takes its own back on load)."""

    def __init__(self, rank: int, tally: _Tally) -> None:
        self.rank, self.tally, self.everyone = rank, tally, []

    def state_dict(self) -> dict:
        return {"ranks": self.everyone}

    def load_state_dict(self, sd: dict) -> None:
        self.tally.restore(sd["ranks"][self.rank])


class _NoOptimizer:
    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, sd: dict) -> None:
        pass


class _SegmentLoader:
    """What :func:`load_checkpoint` restores the sync state into: it builds the synchronizer of the
    checkpoint's segment (known from the saved step) and loads the state into it."""

    def __init__(self, build) -> None:
        self.build, self.built = build, None

    def load_state_dict(self, sd: dict) -> None:
        self.built = self.build(int(sd["step"]))
        self.built.load_state_dict(sd)

    @property
    def step_index(self) -> int:
        return self.built.step_index


def soak(
    rank: int, world_size: int, steps: int, seed: int, segment_steps: int, *,
    out: str | None = None, checkpoint_every: int = 0, resume: bool = False,
) -> SoakResult:  # fmt: skip
    """Run the soak on this rank of an initialized gloo group (see the module docstring).

    With ``out``: every step appends one JSON row to ``out/steps-rank{r:03d}.jsonl``, every
    ``checkpoint_every`` steps an ``igrt train`` checkpoint goes to ``out/checkpoint`` (this rank's
    residuals, running sums and sync step; every rank's figures and log length), and ``resume``
    continues from the newest complete one: the log is cut back to the checkpoint's length (the
    rows cut off are appended to ``out/rolled-back-rank{r:03d}.jsonl``) and the steps after it
    are done again.
    """
    from igrt.train.checkpoint import load_checkpoint, save_checkpoint

    torch.set_num_threads(1)
    named = soak_parameters()
    params = dict(named)
    components = sorted({i.component for i in build_param_infos(named)})
    tally = _Tally()
    holder = _SoakState(rank, tally)
    meta = {"workload": "soak", "seed": seed, "batch_size": segment_steps}
    root = Path(out) if out else None

    def build(at_step: int) -> Synchronizer:
        segment = at_step // segment_steps
        policy = POLICIES[(seed + segment) % len(POLICIES)]  # every policy in turn, the rest at random
        config, plan, sparsifier = random_setup(
            np.random.default_rng([seed, segment]), components, policy=policy
        )
        made = Synchronizer(named, config=config, plan=plan, sparsifier=sparsifier, track_sums=True)
        made.restore_step(segment * segment_steps)  # the schedule runs on the global step
        return made

    sync: Synchronizer | None = None
    start = 0
    if root is not None:
        (root / f"pid-rank{rank:03d}").write_text(str(os.getpid()))
    if resume:
        loader = _SegmentLoader(build)
        start = load_checkpoint(root / "checkpoint", model=holder, optimizer=_NoOptimizer(), sync=loader,
                                rank=rank, world_size=world_size, meta=meta)  # fmt: skip
        sync = loader.built
        tally.resumed_from.append(start)
        _cut_log(root, rank, tally.log_bytes)
    if root is not None and rank == 0:
        (root / "started-at").write_text(str(start))
    log = open(root / f"steps-rank{rank:03d}.jsonl", "a") if root is not None else None  # noqa: SIM115
    mark_step = start + min(100, max(1, (steps - start) // 4))
    rss_mark = 0.0
    t0 = time.perf_counter()
    step = start
    while step < steps:
        segment, t = divmod(step, segment_steps)
        if sync is None:
            sync = build(step)
            tally.policies.append(sync.config.policy)
            tally.bound_m = dict.fromkeys(params, 0.0)
        if log is not None and checkpoint_every and step % checkpoint_every == 0 and step != start:
            log.flush()
            tally.log_bytes = log.tell()
            tally.wall_s += time.perf_counter() - t0
            t0 = time.perf_counter()
            holder.everyone = [None] * world_size
            dist.all_gather_object(holder.everyone, tally.state())
            save_checkpoint(root / "checkpoint", step=step, model=holder, optimizer=_NoOptimizer(), sync=sync,
                            rank=rank, world_size=world_size, meta=meta)  # fmt: skip
        bound_m = tally.bound_m
        rng = np.random.default_rng([seed, segment, t, rank])
        bad = _nonfinite_injection(np.random.default_rng([seed, segment, t, 10**6]), params, world_size)
        for n, p in params.items():
            p.grad = _draw_grad(rng, tuple(p.shape))
            e = sync.residuals.get(n)
            g_max = float(p.grad.abs().max()) if p.grad is not None and p.numel() else 0.0
            e_max = float(e.abs().max()) if e is not None and e.numel() else 0.0
            bound_m[n] = max(bound_m[n], g_max + e_max)
        if bad is not None:
            tally.nonfinite += 1
            if bad[0] == rank:  # after the bound: a discarded gradient is not part of Σg
                p = params[bad[1]]
                p.grad = torch.zeros(p.shape) if p.grad is None else p.grad.clone()
                p.grad.view(-1)[bad[2] % p.numel()] = bad[3]
        before = {n: sync.residuals.sums(n)[1].clone() for n in sync.residuals.names()}
        row = sync.step()
        assert all(bool(torch.isfinite(sync.residuals.get(n)).all()) for n in sync.residuals.names()), (
            "non-finite residual"
        )
        skipped = bool(row.extra["nonfinite_skipped"])
        empty = False
        if skipped:
            tally.skipped += 1
            _check_skipped(sync, params, before)
        else:
            empty = row.values_bytes == 0 and row.dense_bytes == 0
            tally.empty += int(empty)
            tally.max_wire = max(tally.max_wire, _check_wire(sync, params, before, world_size))
        gap, ratio = _check_conservation(sync, bound_m, t)
        tally.max_gap, tally.max_ratio = max(tally.max_gap, gap), max(tally.max_ratio, ratio)
        step += 1
        if log is not None:
            log.write(
                json.dumps(_log_row(step - 1, segment, bad is not None, skipped, empty, row, sync)) + "\n"
            )
            log.flush()
        if step == mark_step:
            rss_mark = rss_mib()
        if step % segment_steps == 0 or step == steps:  # the segment's end
            sync.flush()
            assert sync.residuals.is_zero(), "residuals are not zero after a flush"
            gap, ratio = _check_conservation(sync, bound_m, t + 1)
            tally.max_gap, tally.max_ratio = max(tally.max_gap, gap), max(tally.max_ratio, ratio)
            tally.segments += 1
            sync = None
    if log is not None:
        log.close()
    tally.wall_s += time.perf_counter() - t0
    return SoakResult(
        rank=rank, steps=steps, segments=tally.segments, wall_s=tally.wall_s, max_gap=tally.max_gap,
        max_gap_over_bound=tally.max_ratio, max_wire_error=tally.max_wire, empty_steps=tally.empty,
        nonfinite_steps=tally.nonfinite, skipped_steps=tally.skipped,
        rss_mark_mib=rss_mark, rss_end_mib=rss_mib(), mark_step=mark_step, policies=tuple(tally.policies),
        resumed_from=tuple(tally.resumed_from),
    )  # fmt: skip


def _log_row(step: int, segment: int, injected: bool, skipped: bool, empty: bool, row, sync) -> dict:
    """The step's log row: everything that must come out the same after a resume (no times)."""
    residual_sum = sum(float(sync.residuals.get(n).double().abs().sum()) for n in sync.residuals.names())
    return {
        "step": step, "segment": segment, "injected": injected, "skipped": skipped, "empty": empty,
        "values_bytes": row.values_bytes, "indices_bytes": row.indices_bytes, "dense_bytes": row.dense_bytes,
        "metadata_bytes": row.metadata_bytes, "num_collectives": row.num_collectives, "residual_sum": residual_sum,
    }  # fmt: skip


def _cut_log(root: Path, rank: int, length: int) -> None:
    """Cut this rank's step log back to ``length`` bytes (the checkpoint's); keep what was cut."""
    path = root / f"steps-rank{rank:03d}.jsonl"
    with open(path, "rb+") as f:
        f.seek(length)
        tail = f.read()
        f.truncate(length)
    with open(root / f"rolled-back-rank{rank:03d}.jsonl", "ab") as f:
        f.write(b"".join(line + b"\n" for line in tail.split(b"\n") if line.endswith(b"}")))


def _nonfinite_injection(rng: np.random.Generator, params, world_size: int):
    """(rank, parameter, flat position, NaN or inf) on about 3 % of steps, else None (same on every rank)."""
    if rng.random() >= 0.03:
        return None
    names = [n for n, p in params.items() if p.numel()]
    return (int(rng.integers(world_size)), str(rng.choice(names)), int(rng.integers(2**31)),
            float(rng.choice([float("nan"), float("inf"), -float("inf")])))  # fmt: skip


def _check_skipped(sync: Synchronizer, params, before: dict[str, torch.Tensor]) -> None:
    """A skipped step: no parameter has a gradient and, on balance, nothing was sent."""
    for n, p in params.items():
        assert p.grad is None, f"{n}: a gradient on a skipped step"
        if n in sync.residuals.names() and p.numel():
            now = sync.residuals.sums(n)[1]
            moved = float((now - before.get(n, 0.0)).abs().max())
            assert moved <= 1e-6 * (1.0 + float(now.abs().max())), (
                f"{n}: Σsent moved by {moved:.3e} on a skipped step"
            )


def _check_conservation(sync: Synchronizer, bound_m: dict[str, float], t: int) -> tuple[float, float]:
    """(largest gap, largest gap over its bound); asserts every gap is within its bound."""
    worst = worst_ratio = 0.0
    for n, gap in sync.residuals.conservation_gap().items():
        bound = (t + 1) * 2 * EPS32 * bound_m[n] + 1e-30
        assert gap <= bound, f"conservation broken for {n}: |Σg - Σsent - e| = {gap:.3e} > {bound:.3e}"
        worst, worst_ratio = max(worst, gap), max(worst_ratio, gap / bound)
    return worst, worst_ratio


def _check_wire(sync: Synchronizer, params, before: dict[str, torch.Tensor], world_size: int) -> float:
    """Every p.grad is the rank average of the Σsent increments; returns the largest error relative
    to the mean |sent| (the scale of the rounding: sums over ranks run in fp32, or bf16 for dense
    bf16 buckets, whose error is at most eps · Σ|x_r|)."""
    names = sorted(params)
    sent = [
        (sync.residuals.sums(n)[1] - before.get(n, 0.0)).flatten() if n in sync.residuals.names()
        else torch.zeros(params[n].numel(), dtype=torch.float64)
        for n in names
    ]  # fmt: skip
    flat = torch.cat(sent)
    both = torch.cat([flat, flat.abs()])
    dist.all_reduce(both)
    both /= world_size
    mean, mean_abs = both[: flat.numel()], both[flat.numel() :]
    eps = BF16_EPS if sync.config.value_bytes == 2 else 4 * EPS32
    off, worst = 0, 0.0
    for n in names:
        p, size = params[n], params[n].numel()
        want, scale_t = mean[off : off + size].view(p.shape), mean_abs[off : off + size]
        off += size
        if p.grad is None:
            assert sync.config.skip_unsent, f"{n}: grad None although skip_unsent is off"
            assert not bool(torch.any(want != 0)), f"{n}: grad None, but the ranks sent {want.abs().max()}"
            continue
        if not size:
            continue
        scale = float(scale_t.max())
        err = float((p.grad.double() - want).abs().max())
        tol = world_size * eps * scale + 1e-30
        assert err <= tol, (
            f"{n}: synchronized gradient differs from the average sent by {err:.3e} (tol {tol:.3e})"
        )
        worst = max(worst, err / scale if scale else 0.0)
    return worst


def _rank_entry(ctx, steps: int, seed: int, segment_steps: int, out=None, checkpoint_every=0, resume=False):
    return soak(ctx.rank, ctx.world_size, steps, seed, segment_steps, out=out,
                checkpoint_every=checkpoint_every, resume=resume)  # fmt: skip


# ----------------------------------------------------------------------------- kill -9 and resume
@dataclass(frozen=True, kw_only=True)
class Phase:
    """One launch of the ranks: from which checkpoint step, how it ended, how long it took."""

    started_at: int  # the step it started from (0, or the checkpoint it resumed from)
    killed: str  # "" (ran to the end), "rank N" or "all ranks": who got SIGKILL
    killed_at: int  # rank 0's logged steps when the SIGKILL was sent (-1: none)
    wall_s: float  # launch to return, start-up included
    exit_s: float  # SIGKILL to the launcher's return (-1: no kill): how long the survivors took
    error: str  # what the launcher raised ("" when it returned)


def _child_pids() -> list[int]:
    """Every child process of this one (the spawned ranks and their helpers)."""
    pids = []
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):
            pids += [int(p) for p in (task / "children").read_text().split()]
    return pids


def _logged_steps(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            return f.read().count(b"\n")
    except FileNotFoundError:
        return 0


def _rank_pids(out: Path, ranks: list[int]) -> list[int] | None:
    try:
        return [int((out / f"pid-rank{r:03d}").read_text()) for r in ranks]
    except (FileNotFoundError, ValueError):
        return None


def run_phase(out: Path, *, nproc: int, steps: int, seed: int, segment_steps: int, checkpoint_every: int,
              resume: bool, kill_at: int | None, kill_ranks: list[int], timeout_s: float) -> Phase:  # fmt: skip
    """Launch the soak (resuming from ``out/checkpoint`` when ``resume``); with ``kill_at``, send
    SIGKILL to ``kill_ranks`` once rank 0 has logged that many steps. Every child is killed when the
    phase runs past ``timeout_s`` (a hang): AssertionError."""
    from igrt.train.launch import launch

    for f in [*out.glob("pid-rank*"), out / "started-at"]:
        f.unlink(missing_ok=True)
    log0 = out / "steps-rank000.jsonl"
    stop, seen = threading.Event(), {}

    def watch() -> None:
        end = time.monotonic() + timeout_s
        while not stop.wait(0.02):
            if time.monotonic() > end:
                seen["hang"] = True
                for pid in _child_pids():
                    os.kill(pid, signal.SIGKILL)
                return
            if kill_at is not None and "kill_s" not in seen and _logged_steps(log0) >= kill_at:
                pids = _rank_pids(out, kill_ranks)
                if pids:
                    seen["killed_at"] = _logged_steps(log0)
                    for pid in pids:
                        os.kill(pid, signal.SIGKILL)
                    seen["kill_s"] = time.monotonic()

    watcher = threading.Thread(target=watch, daemon=True)
    t0 = time.monotonic()
    watcher.start()
    error = ""
    try:
        launch(_rank_entry, nproc=nproc, backend="gloo", timeout_s=60.0,
               args=(steps, seed, segment_steps, str(out), checkpoint_every, resume))  # fmt: skip
    except Exception as e:  # a killed rank: the launcher names it and stops the others
        first = (str(e).splitlines() or [""])[0]
        error = f"{type(e).__name__}: {first[:100]}" + ("..." if len(first) > 100 else "")
    finally:
        stop.set()
        watcher.join()
    done = time.monotonic()
    started_at = _started_at(out)
    assert not seen.get("hang"), (
        f"the phase from step {started_at} ran past {timeout_s:.0f} s (a hang); {error}"
    )
    if kill_at is not None:
        assert "kill_s" in seen, f"the run ended before the kill at step {kill_at} ({error or 'no error'})"
        assert error, "the launcher returned normally although a rank was killed"
    elif error:
        raise AssertionError(f"the phase from step {started_at} failed: {error}")
    who = "" if kill_at is None else ("all ranks" if len(kill_ranks) == nproc else f"rank {kill_ranks[0]}")
    return Phase(started_at=started_at, killed=who, killed_at=seen.get("killed_at", -1), wall_s=done - t0,
                 exit_s=done - seen["kill_s"] if "kill_s" in seen else -1.0, error=error)  # fmt: skip


def _started_at(out: Path) -> int:
    try:
        return int((out / "started-at").read_text())
    except (FileNotFoundError, ValueError):
        return -1  # killed before it had loaded its checkpoint


def _read_rows(path: Path) -> list[dict]:
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            raise AssertionError(f"{path}:{number}: not a complete JSON row: {line[:80]!r}") from None
    return rows


def verify_run(out: Path, *, steps: int, nproc: int, results: dict[int, SoakResult],
               reference: Path | None = None) -> dict[str, int]:  # fmt: skip
    """The invariants of a soak that was killed and resumed (AssertionError naming the first broken
    one): each rank's log holds steps 0..steps-1 once each, in order; a step was injected / skipped
    on every rank alike, and the logged counts equal the rank's figures; every row cut back on a
    resume was done again with the same bytes, collectives and residual sum; with ``reference`` (an
    uninterrupted run's folder) every row equals its row there. Returns counts for the report."""
    logs = {r: _read_rows(out / f"steps-rank{r:03d}.jsonl") for r in range(nproc)}
    redone = compared = 0
    for r, rows in logs.items():
        got = [row["step"] for row in rows]
        if got != list(range(steps)):
            lost = sorted(set(range(steps)) - set(got))
            twice = sorted({s for s in got if got.count(s) > 1})
            raise AssertionError(
                f"rank {r}: {len(got)} log rows; lost steps {lost[:5]}, duplicated {twice[:5]}"
            )
        res = results[r]
        assert sum(row["skipped"] for row in rows) == res.skipped_steps, f"rank {r}: skipped steps differ"
        assert sum(row["injected"] for row in rows) == res.nonfinite_steps, f"rank {r}: injected steps differ"
        assert sum(row["empty"] for row in rows) == res.empty_steps, f"rank {r}: empty steps differ"
        for key in ("injected", "skipped", "segment"):
            assert [row[key] for row in rows] == [row[key] for row in logs[0]], (
                f"rank {r}: {key!r} differs from rank 0"
            )
        assert all(np.isfinite(row["residual_sum"]) for row in rows), f"rank {r}: a non-finite residual sum"
        back = out / f"rolled-back-rank{r:03d}.jsonl"
        for old in _read_rows(back) if back.exists() else []:
            assert old == rows[old["step"]], (
                f"rank {r}: step {old['step']} done again differs: {old} != {rows[old['step']]}"
            )
            redone += 1
        if reference is not None:
            want = _read_rows(reference / f"steps-rank{r:03d}.jsonl")
            diff = [s for s, (a, b) in enumerate(zip(rows, want, strict=True)) if a != b]
            assert not diff, (
                f"rank {r}: {len(diff)} rows differ from the uninterrupted run, first step {diff[0]}"
            )
            compared += len(rows)
    return {"rows": sum(len(v) for v in logs.values()), "redone": redone, "compared": compared,
            "skipped": results[0].skipped_steps, "injected": results[0].nonfinite_steps}  # fmt: skip


def crash_soak(out: Path, *, steps: int, nproc: int, seed: int, segment_steps: int, checkpoint_every: int,
               kills: list[tuple[int, list[int]]], reference: bool, phase_timeout_s: float):  # fmt: skip
    """The soak with SIGKILLs: for each ``(step, ranks)`` of ``kills`` a launch that is killed there,
    then a last launch resuming to the end; ``reference`` also runs it uninterrupted into
    ``out/reference``. Returns (phases, results of the last launch, verify_run's counts)."""
    from igrt.train.launch import launch

    phases = []
    for i, (at, ranks) in enumerate(kills):
        phases.append(run_phase(out, nproc=nproc, steps=steps, seed=seed, segment_steps=segment_steps,
                                checkpoint_every=checkpoint_every, resume=i > 0, kill_at=at, kill_ranks=ranks,
                                timeout_s=phase_timeout_s))  # fmt: skip
    t0 = time.monotonic()
    results = _bounded(lambda: launch(_rank_entry, nproc=nproc, backend="gloo", timeout_s=60.0,
                                      args=(steps, seed, segment_steps, str(out), checkpoint_every, bool(kills))),
                       phase_timeout_s)  # fmt: skip
    phases.append(
        Phase(
            started_at=_started_at(out),
            killed="",
            killed_at=-1,
            wall_s=time.monotonic() - t0,
            exit_s=-1.0,
            error="",
        )
    )
    ref = None
    if reference:
        ref = out / "reference"
        ref.mkdir()
        t0 = time.monotonic()
        _bounded(lambda: launch(_rank_entry, nproc=nproc, backend="gloo", timeout_s=60.0,
                                args=(steps, seed, segment_steps, str(ref), checkpoint_every, False)), phase_timeout_s)  # fmt: skip
        phases.append(
            Phase(
                started_at=0,
                killed="(reference)",
                killed_at=-1,
                wall_s=time.monotonic() - t0,
                exit_s=-1.0,
                error="",
            )
        )
    return phases, results, verify_run(out, steps=steps, nproc=nproc, results=results, reference=ref)


def _bounded(run, timeout_s: float):
    """``run()``, every child killed (AssertionError: a hang) when it takes longer than ``timeout_s``."""
    stop, hung = threading.Event(), []

    def watch() -> None:
        if not stop.wait(timeout_s):
            hung.append(True)
            for pid in _child_pids():
                os.kill(pid, signal.SIGKILL)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        return run()
    except Exception:
        if hung:
            raise AssertionError(f"a launch ran past {timeout_s:.0f} s (a hang)") from None
        raise
    finally:
        stop.set()
        watcher.join()


def default_kills(steps: int, nproc: int, count: int) -> list[tuple[int, list[int]]]:
    """``count`` kills spread over the run: the first of the last rank alone, the next of every rank,
    alternately."""
    return [
        (steps * (i + 1) // (count + 1) + 3, [nproc - 1] if i % 2 == 0 else list(range(nproc)))
        for i in range(count)
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--nproc", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--segment-steps", type=int, default=25, help="steps per random schedule")
    parser.add_argument(
        "--checkpoint-every", type=int, default=60, help="steps between checkpoints (default 60)"
    )
    parser.add_argument("--kills", type=int, default=2, help="SIGKILLs during the run (default 2; 0: none)")
    parser.add_argument(
        "--reference", action="store_true", help="also run uninterrupted and compare every row"
    )
    parser.add_argument(
        "--phase-timeout", type=float, default=900.0, help="seconds one launch may take (default 900)"
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="folder for logs and checkpoints (default: a temporary one)"
    )
    args = parser.parse_args(argv)
    if args.kills and not 0 < args.checkpoint_every < args.steps // (args.kills + 1):
        parser.error(
            f"--checkpoint-every must be in [1, {args.steps // (args.kills + 1)}) for {args.kills} kills"
        )

    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        out = args.out or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        phases, results, counts = crash_soak(
            out, steps=args.steps, nproc=args.nproc, seed=args.seed, segment_steps=args.segment_steps,
            checkpoint_every=args.checkpoint_every, kills=default_kills(args.steps, args.nproc, args.kills),
            reference=args.reference, phase_timeout_s=args.phase_timeout,
        )  # fmt: skip
        total_s = time.perf_counter() - t0
    first = results[0]
    print(f"soak: {args.steps} steps on {args.nproc} gloo ranks, {first.segments} random schedules "
          f"(policies: {', '.join(sorted(set(first.policies)))}), seed {args.seed}, a checkpoint every "
          f"{args.checkpoint_every} steps, {args.kills} kill -9; {total_s:.1f} s in all")  # fmt: skip
    print(
        f"{'launch':>6} {'from_step':>9} {'SIGKILL':>11} {'at_step':>7} {'wall_s':>7} {'exit_s':>6}  launcher"
    )
    for i, p in enumerate(phases):
        exit_s = f"{p.exit_s:.1f}" if p.exit_s >= 0 else "-"
        print(f"{i:>6} {p.started_at:>9} {p.killed or '-':>11} {p.killed_at if p.killed_at >= 0 else '-':>7} "
              f"{p.wall_s:>7.1f} {exit_s:>6}  {p.error or 'returned'}")  # fmt: skip
    header = (f"{'rank':>4} {'steps':>6} {'wall_s':>7} {'steps/s':>8} {'max_gap':>10} {'gap/bound':>10} "
              f"{'wire_err':>9} {'empty':>6} {'nonfin':>6} {'skipped':>7} {'resumed_from':>12} "
              f"{'rss@' + str(first.mark_step) + '_MiB':>12} {'rss_end_MiB':>11} {'growth':>7}")  # fmt: skip
    print(header)
    for r in results.values():
        print(f"{r.rank:>4} {r.steps:>6} {r.wall_s:>7.1f} {r.steps / r.wall_s:>8.1f} {r.max_gap:>10.2e} "
              f"{r.max_gap_over_bound:>10.3f} {r.max_wire_error:>9.1e} {r.empty_steps:>6} {r.nonfinite_steps:>6} "
              f"{r.skipped_steps:>7} {','.join(map(str, r.resumed_from)) or '-':>12} {r.rss_mark_mib:>12.1f} "
              f"{r.rss_end_mib:>11.1f} {r.rss_end_mib - r.rss_mark_mib:>+7.1f}")  # fmt: skip
    print(f"log: {counts['rows']} rows ({args.nproc} ranks x steps 0..{args.steps - 1}, each once, in order); "
          f"{counts['redone']} rows cut back on resume and done again identically; {counts['injected']} steps "
          f"with a NaN / inf, {counts['skipped']} skipped on every rank alike"
          + (f"; all {counts['compared']} rows equal the uninterrupted run's" if args.reference else ""))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
