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
import os
import time
from dataclasses import dataclass

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
    mark_step: int
    policies: tuple[str, ...]


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


def soak(rank: int, world_size: int, steps: int, seed: int, segment_steps: int) -> SoakResult:
    """Run the soak on this rank of an initialized gloo group (see the module docstring)."""
    torch.set_num_threads(1)
    named = soak_parameters()
    params = dict(named)
    components = sorted({i.component for i in build_param_infos(named)})
    mark_step = min(100, max(1, steps // 4))
    max_gap = max_ratio = max_wire = 0.0
    empty = nonfinite = skipped = 0
    policies: list[str] = []
    rss_mark = rss_end = 0.0
    segments = 0
    t0 = time.perf_counter()
    step = 0
    while step < steps:
        policy = POLICIES[(seed + segments) % len(POLICIES)]  # every policy in turn, the rest at random
        config, plan, sparsifier = random_setup(
            np.random.default_rng([seed, segments]), components, policy=policy
        )
        policies.append(config.policy)
        sync = Synchronizer(named, config=config, plan=plan, sparsifier=sparsifier, track_sums=True)
        bound_m = {n: 0.0 for n in params}
        for t in range(min(segment_steps, steps - step)):
            rng = np.random.default_rng([seed, segments, t, rank])
            bad = _nonfinite_injection(np.random.default_rng([seed, segments, t, 10**6]), params, world_size)
            for n, p in params.items():
                p.grad = _draw_grad(rng, tuple(p.shape))
                e = sync.residuals.get(n)
                g_max = float(p.grad.abs().max()) if p.grad is not None and p.numel() else 0.0
                e_max = float(e.abs().max()) if e is not None and e.numel() else 0.0
                bound_m[n] = max(bound_m[n], g_max + e_max)
            if bad is not None:
                nonfinite += 1
                if bad[0] == rank:  # after the bound: a discarded gradient is not part of Σg
                    p = params[bad[1]]
                    p.grad = torch.zeros(p.shape) if p.grad is None else p.grad.clone()
                    p.grad.view(-1)[bad[2] % p.numel()] = bad[3]
            before = {n: sync.residuals.sums(n)[1].clone() for n in sync.residuals.names()}
            row = sync.step()
            assert all(bool(torch.isfinite(sync.residuals.get(n)).all()) for n in sync.residuals.names()), "non-finite residual"
            if row.extra["nonfinite_skipped"]:
                skipped += 1
                _check_skipped(sync, params, before)
            else:
                empty += int(row.values_bytes == 0 and row.dense_bytes == 0)
                max_wire = max(max_wire, _check_wire(sync, params, before, world_size))
            gap, ratio = _check_conservation(sync, bound_m, t)
            max_gap, max_ratio = max(max_gap, gap), max(max_ratio, ratio)
            step += 1
            if step == mark_step:
                rss_mark = rss_mib()
        sync.flush()
        assert sync.residuals.is_zero(), "residuals are not zero after a flush"
        gap, ratio = _check_conservation(sync, bound_m, segment_steps)
        max_gap, max_ratio = max(max_gap, gap), max(max_ratio, ratio)
        segments += 1
        del sync
    rss_end = rss_mib()
    return SoakResult(
        rank=rank, steps=steps, segments=segments, wall_s=time.perf_counter() - t0, max_gap=max_gap,
        max_gap_over_bound=max_ratio, max_wire_error=max_wire, empty_steps=empty,
        nonfinite_steps=nonfinite, skipped_steps=skipped,
        rss_mark_mib=rss_mark, rss_end_mib=rss_end, mark_step=mark_step, policies=tuple(policies),
    )  # fmt: skip


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
            assert moved <= 1e-6 * (1.0 + float(now.abs().max())), f"{n}: Σsent moved by {moved:.3e} on a skipped step"


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


def _rank_entry(ctx, steps: int, seed: int, segment_steps: int) -> SoakResult:
    return soak(ctx.rank, ctx.world_size, steps, seed, segment_steps)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--nproc", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--segment-steps", type=int, default=25, help="steps per random schedule")
    args = parser.parse_args(argv)
    from igrt.train.launch import launch

    t0 = time.perf_counter()
    results = launch(_rank_entry, nproc=args.nproc, backend="gloo", args=(args.steps, args.seed, args.segment_steps),
                     timeout_s=120.0)  # fmt: skip
    total_s = time.perf_counter() - t0
    first = results[0]
    print(f"soak: {args.steps} steps on {args.nproc} gloo ranks, {first.segments} random schedules "
          f"(policies: {', '.join(sorted(set(first.policies)))}), seed {args.seed}; {total_s:.1f} s with start-up")  # fmt: skip
    header = (f"{'rank':>4} {'steps':>6} {'wall_s':>7} {'steps/s':>8} {'max_gap':>10} {'gap/bound':>10} "
              f"{'wire_err':>9} {'empty':>6} {'nonfin':>6} {'skipped':>7} {'rss@' + str(first.mark_step) + '_MiB':>12} {'rss_end_MiB':>11} {'growth':>7}")  # fmt: skip
    print(header)
    for r in results.values():
        print(f"{r.rank:>4} {r.steps:>6} {r.wall_s:>7.1f} {r.steps / r.wall_s:>8.1f} {r.max_gap:>10.2e} "
              f"{r.max_gap_over_bound:>10.3f} {r.max_wire_error:>9.1e} {r.empty_steps:>6} {r.nonfinite_steps:>6} "
              f"{r.skipped_steps:>7} {r.rss_mark_mib:>12.1f} "
              f"{r.rss_end_mib:>11.1f} {r.rss_end_mib - r.rss_mark_mib:>+7.1f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
