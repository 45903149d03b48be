"""RQ1 — are the important components the same across workloads, seeds and profiling windows?

For each workload (MiniLM fine-tuning, GPT post-training) and seed, a gradient trace is recorded
(``igrt record``; seed 0 of a full run is the shipped sample) and profiled with ``igsim profile``'s
pipeline over the whole run and over consecutive windows. Compared:

- **seeds** — every pair of seeds of one workload, each profiled over the same first steps:
  Jaccard of the important sets, Spearman of the component scores;
- **windows** — three consecutive windows of each trace, and the first against the last;
- **workloads** — each workload's plan carried onto the other model by (component kind, relative
  depth) with :func:`igsim.step.architectures.transfer_plan`, against that model's own plan (components
  without a counterpart are left out and counted);
- **threshold drift** — each of the six threshold methods' value and important count per window.

Outputs in ``--out``: ``pairs.csv`` (one row per comparison), ``thresholds.csv``, ``summary.json``
and ``rq1_jaccard.png``, ``rq1_thresholds.png``, ``rq1_membership.png``.

    python -m experiments.rq1_stability            # full: 3 seeds x 2 workloads (seeds 1, 2: 50 steps)
    python -m experiments.rq1_stability --quick    # CI: tiny models, 2 seeds, 12 steps
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from experiments import common
from experiments.common import Study, jaccard, mean_std, spearman

WORKLOADS = ("minilm", "gpt")
METHODS = ("knee", "otsu", "gmm", "kmeans2", "percentile", "fixed_ratio")


def _params(trace):
    from traces.reader import read_manifest

    return read_manifest(trace).params


def _important(plan) -> set[str]:
    return set(plan.important)


def _scores(scores) -> dict[str, float]:
    return scores.as_dict()


def _compare(kind: str, label: str, plan_a, scores_a, plan_b, scores_b, keys=None) -> dict[str, Any]:
    keys = sorted(set(scores_a) & set(scores_b)) if keys is None else sorted(keys)
    imp_a = _important(plan_a) & set(keys)
    imp_b = _important(plan_b) & set(keys)
    return {
        "comparison": kind,
        "pair": label,
        "num_components": len(keys),
        "important_a": len(imp_a),
        "important_b": len(imp_b),
        "jaccard": jaccard(imp_a, imp_b),
        "spearman": spearman([scores_a[k] for k in keys], [scores_b[k] for k in keys]),
    }


def _windows(num_steps: int, count: int) -> list[tuple[int, int]]:
    edges = np.linspace(0, num_steps, count + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in itertools.pairwise(edges) if b > a]


def _transfer(src_plan, src_params, dst_plan, dst_params, density: float):
    """(carried plan restricted to matched components, matched keys)."""
    from igsim.step.architectures import transfer_plan

    carried = transfer_plan(src_plan, src_params, dst_params, density=density)
    unmatched = set(carried.source.get("unmatched", []))
    matched = sorted(set(carried.by_key) - unmatched)
    return carried, matched


def run(study: Study) -> dict[str, Any]:
    quick = study.quick
    seeds = (0, 1) if quick else (0, 1, 2)
    steps = 12 if quick else 50  # recorded per extra seed; seed 0 is the shipped sample (full length)
    num_windows = 2 if quick else 3
    density = 0.01
    traces: dict[tuple[str, int], Any] = {}
    for wl, seed in itertools.product(WORKLOADS, seeds):
        study.log(f"trace {wl} seed {seed} ({steps} steps)")
        traces[wl, seed] = common.trace_for(
            wl, seed=seed, steps=steps, tiny=quick, cache=study.cache, nproc=study.args.nproc,
            density=density, inprocess=quick,
        )  # fmt: skip

    full: dict[tuple[str, int], tuple[Any, dict[str, float]]] = {}  # whole trace
    prefix: dict[tuple[str, int], tuple[Any, dict[str, float]]] = {}  # first `steps` steps (seeds)
    pairs: list[dict[str, Any]] = []
    thresholds: list[dict[str, Any]] = []
    for (wl, seed), trace in traces.items():
        num_steps = common.num_steps(trace)
        plan, scores, _ = common.profile(trace, window=(0, num_steps))
        full[wl, seed] = (plan, _scores(scores))
        plan, scores, _ = common.profile(trace, window=(0, steps))
        prefix[wl, seed] = (plan, _scores(scores))
        per_window = []
        for w, window in enumerate(_windows(num_steps, num_windows)):
            for method in METHODS:
                p, s, result = common.profile(trace, window=window, method=method)
                thresholds.append(
                    {
                        "workload": wl,
                        "seed": seed,
                        "window": f"{window[0]}:{window[1]}",
                        "window_index": w,
                        "method": method,
                        "threshold": result.threshold,
                        "num_important": len(p.important),
                        "num_components": len(p.components),
                        "low_byte_share": common.plan_byte_share(p),
                    }
                )
                if method == "knee":
                    per_window.append((window, p, _scores(s)))
        index_pairs = sorted({(i, i + 1) for i in range(len(per_window) - 1)} | {(0, len(per_window) - 1)})
        for i, j in index_pairs:
            if i == j:
                continue
            (wa, pa, sa), (wb, pb, sb) = per_window[i], per_window[j]
            label = f"{wl} s{seed} {wa[0]}:{wa[1]} vs {wb[0]}:{wb[1]}"
            pairs.append({**_compare("windows", label, pa, sa, pb, sb), "workload": wl})

    for wl in WORKLOADS:
        for a, b in itertools.combinations(seeds, 2):
            (pa, sa), (pb, sb) = prefix[wl, a], prefix[wl, b]
            label = f"{wl} s{a} vs s{b} (steps 0:{steps})"
            pairs.append({**_compare("seeds", label, pa, sa, pb, sb), "workload": wl})

    for seed in seeds:
        for src, dst in (("gpt", "minilm"), ("minilm", "gpt")):
            (sp, _), (dp, ds) = full[src, seed], full[dst, seed]
            carried, matched = _transfer(
                sp, _params(traces[src, seed]), dp, _params(traces[dst, seed]), density
            )
            carried_scores = {c.key: c.score for c in carried.components}
            row = _compare(
                "workloads", f"{src}->{dst} s{seed}", carried, carried_scores, dp, ds, keys=matched
            )
            row["unmatched"] = len(carried.by_key) - len(matched)
            row["workload"] = f"{src}->{dst}"
            pairs.append(row)

    common.write_csv(pairs, study.out / "pairs.csv")
    common.write_csv(thresholds, study.out / "thresholds.csv")
    summary = _summarise(pairs, thresholds)
    common.write_json(summary, study.out / "summary.json")
    _plot_jaccard(study, pairs)
    _plot_thresholds(study, thresholds)
    _plot_membership(study, full, seeds)
    return summary


def _summarise(pairs: Sequence[dict[str, Any]], thresholds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"pairs": {}, "threshold_drift": {}}
    for kind in ("seeds", "windows", "workloads"):
        rows = [r for r in pairs if r["comparison"] == kind]
        jm, js = mean_std(r["jaccard"] for r in rows)
        sm, ss = mean_std(r["spearman"] for r in rows)
        out["pairs"][kind] = {
            "num_pairs": len(rows),
            "jaccard_mean": jm,
            "jaccard_std": js,
            "spearman_mean": sm,
            "spearman_std": ss,
        }
    for (wl, method), rows in itertools.groupby(
        sorted(thresholds, key=lambda r: (r["workload"], r["method"])),
        key=lambda r: (r["workload"], r["method"]),
    ):
        rows = list(rows)
        t = np.array([r["threshold"] for r in rows])
        n = np.array([r["num_important"] for r in rows])
        out["threshold_drift"][f"{wl}/{method}"] = {
            "threshold_min": float(t.min()),
            "threshold_max": float(t.max()),
            "threshold_std": float(t.std(ddof=1)) if len(t) > 1 else 0.0,
            "important_min": int(n.min()),
            "important_max": int(n.max()),
            "low_byte_share_mean": float(np.mean([r["low_byte_share"] for r in rows])),
        }
    return out


def _plot_jaccard(study: Study, pairs: Sequence[dict[str, Any]]) -> None:
    plt = common.plt()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    kinds = ("seeds", "windows", "workloads")
    for ax, metric in zip(axes, ("jaccard", "spearman")):
        data = [[r[metric] for r in pairs if r["comparison"] == k and np.isfinite(r[metric])] for k in kinds]
        for i, vals in enumerate(data):
            ax.scatter(
                np.full(len(vals), i) + np.linspace(-0.15, 0.15, max(len(vals), 1))[: len(vals)], vals, s=18
            )
            if vals:
                ax.hlines(np.mean(vals), i - 0.3, i + 0.3, color="k")
        ax.set_xticks(range(len(kinds)), kinds)
        ax.set_ylim(-1.05 if metric == "spearman" else -0.05, 1.05)
        ax.set_title(f"{metric} of {'important sets' if metric == 'jaccard' else 'scores'} (bar = mean)")
        ax.grid(alpha=0.3)
    fig.suptitle("RQ1 stability" + (" (quick)" if study.quick else ""))
    fig.tight_layout()
    fig.savefig(study.out / "rq1_jaccard.png", dpi=90)
    plt.close(fig)


def _plot_thresholds(study: Study, thresholds: Sequence[dict[str, Any]]) -> None:
    plt = common.plt()
    fig, axes = plt.subplots(1, len(WORKLOADS), figsize=(10, 3.6), sharey=True)
    for ax, wl in zip(np.atleast_1d(axes), WORKLOADS):
        for method in METHODS:
            rows = [r for r in thresholds if r["workload"] == wl and r["method"] == method]
            for seed in sorted({r["seed"] for r in rows}):
                rs = sorted((r for r in rows if r["seed"] == seed), key=lambda r: r["window_index"])
                ax.plot([r["window_index"] for r in rs], [r["threshold"] for r in rs], marker="o",
                        color=f"C{METHODS.index(method)}", alpha=0.8,
                        label=method if seed == 0 else None)  # fmt: skip
        ax.set_title(f"{wl}: threshold per window (lines = seeds)")
        ax.set_xlabel("profiling window")
        ax.grid(alpha=0.3)
    np.atleast_1d(axes)[0].set_ylabel("score threshold")
    np.atleast_1d(axes)[-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(study.out / "rq1_thresholds.png", dpi=90)
    plt.close(fig)


def _plot_membership(study: Study, full: dict, seeds: Sequence[int]) -> None:
    plt = common.plt()
    fig, axes = plt.subplots(1, len(WORKLOADS), figsize=(10, 6))
    for ax, wl in zip(np.atleast_1d(axes), WORKLOADS):
        keys = sorted(full[wl, seeds[0]][1], key=lambda k: -full[wl, seeds[0]][1][k])
        mat = np.array([[full[wl, s][1].get(k, np.nan) for s in seeds] for k in keys])
        imp = np.array([[k in full[wl, s][0].important for s in seeds] for k in keys])
        ax.imshow(mat, aspect="auto", cmap="viridis", vmin=0, vmax=1)
        ys, xs = np.nonzero(imp)
        ax.scatter(xs, ys, marker="s", s=6, color="w", label="important")
        ax.set_yticks(range(len(keys)), keys, fontsize=5 if len(keys) > 40 else 7)
        ax.set_xticks(range(len(seeds)), [f"seed {s}" for s in seeds])
        ax.set_title(f"{wl}: scores (colour), important (white)")
    fig.tight_layout()
    fig.savefig(study.out / "rq1_membership.png", dpi=90)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="experiments.rq1_stability", description=__doc__.split("\n")[0])
    Study.add_arguments(parser)
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    study = Study("rq1_stability", args, argv)
    summary = run(study)
    for kind, s in summary["pairs"].items():
        study.log(
            f"{kind:9s}: {s['num_pairs']} pairs, Jaccard {s['jaccard_mean']:.2f} ± {s['jaccard_std']:.2f}, "
            f"Spearman {s['spearman_mean']:.2f} ± {s['spearman_std']:.2f}"
        )
    study.finish(summary=summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
