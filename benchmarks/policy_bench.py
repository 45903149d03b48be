"""Policy core speed and balance: packing methods, release-phase assignment, schedule decisions.

    /work/venv/bin/python benchmarks/policy_bench.py
    /work/venv/bin/python benchmarks/policy_bench.py --sizes 10000 100000 --buckets 64 --phases 4 --sigma 1.5

Payload sizes are drawn (seeded) from a heavy-tailed log-normal distribution: median 64 KiB,
``--sigma`` 1.5 by default, so the largest of 100k blocks is ~100x the median — the spread of
per-parameter Top-k payloads in a large Transformer (norms and biases, attention and MLP matrices,
embeddings). Times are the best of ``--repeats`` runs, in milliseconds. The first table gives, per
packing method and block count, the largest bucket over the mean (imbalance) and over the lower
bound max(ceil(total / buckets), largest block) minus one (gap). The second times
:func:`assign_phases` and one :meth:`ImportanceSchedule.decide` call (half the components
important) and reports the heaviest phase over the mean phase.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from igpolicy.packing import PACKING_METHODS, pack
from igpolicy.schedule import ImportanceSchedule, assign_phases
from igpolicy.vocab import PayloadBlock


def heavy_tailed_sizes(n: int, *, sigma: float, seed: int) -> np.ndarray:
    """``n`` payload sizes in bytes: log-normal, median 64 KiB, at least 8 bytes (one pair)."""
    rng = np.random.default_rng(seed)
    return np.maximum(8, rng.lognormal(mean=np.log(64 * 2**10), sigma=sigma, size=n)).astype(np.int64)


def best_time_s(fn, repeats: int):
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def bench_packing(sizes_list: list[int], *, num_buckets: int, sigma: float, seed: int, repeats: int) -> None:
    print(f"packing into {num_buckets} buckets (ddp: 25 MiB cap, bucket count varies)")
    print(
        f"{'method':<12} {'num_blocks':>10} {'buckets':>8} {'time_ms':>9} {'imbalance':>10} {'gap_to_lb':>10}"
    )
    for n in sizes_list:
        sizes = heavy_tailed_sizes(n, sigma=sigma, seed=seed)
        blocks = [
            PayloadBlock(name=f"layers.{i}.weight", component="norm", size_bytes=int(s), order=i)
            for i, s in enumerate(sizes)
        ]
        for method in PACKING_METHODS:
            t, plan = best_time_s(
                lambda m=method, b=blocks: pack(b, method=m, num_buckets=num_buckets), repeats
            )
            print(
                f"{method:<12} {n:>10} {len(plan.buckets):>8} {t * 1e3:>9.1f} "
                f"{plan.imbalance:>10.6f} {plan.gap_to_lower_bound:>10.2e}"
            )


def bench_schedule(sizes_list: list[int], *, num_phases: int, sigma: float, seed: int, repeats: int) -> None:
    print(f"\nrelease phases (R = {num_phases})")
    print(
        f"{'num_components':>14} {'assign_phases_ms':>17} {'max/mean_phase':>15} {'decide_ms':>10} {'sending':>8}"
    )
    for n in sizes_list:
        sizes = heavy_tailed_sizes(n, sigma=sigma, seed=seed + 1)
        expected = {f"{i}.mlp_up": int(s) for i, s in enumerate(sizes)}
        t_assign, phases = best_time_s(lambda e=expected: assign_phases(e, num_phases=num_phases), repeats)
        per_phase = np.zeros(num_phases, dtype=np.int64)
        for key, phase in phases.items():
            per_phase[phase] += expected[key]
        # half the components important (phase None), the other half on their assigned phase
        components = {k: (None if i % 2 else p) for i, (k, p) in enumerate(sorted(phases.items()))}
        sched = ImportanceSchedule(period=num_phases)
        t_decide, decision = best_time_s(
            lambda c=components, s=sched: s.decide(step=1, components=c), repeats
        )
        print(
            f"{n:>14} {t_assign * 1e3:>17.1f} {per_phase.max() / per_phase.mean():>15.6f} "
            f"{t_decide * 1e3:>10.1f} {len(decision.send):>8}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000], help="block counts")
    parser.add_argument("--buckets", type=int, default=64, help="buckets for the balanced methods")
    parser.add_argument("--phases", type=int, default=4, help="release period R")
    parser.add_argument("--sigma", type=float, default=1.5, help="log-normal shape of the payload sizes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    kw = dict(sigma=args.sigma, seed=args.seed, repeats=args.repeats)
    bench_packing(args.sizes, num_buckets=args.buckets, **kw)
    bench_schedule(args.sizes, num_phases=args.phases, **kw)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
