"""RQ2 — partition ablation: which adaptive threshold splits components best?

The six threshold methods of :mod:`igpolicy.thresholds` (knee, Otsu, two-Gaussian mixture, optimal
1-D 2-means, percentile q=75, fixed ratio 0.25) each turn the same importance scores (the
workload's trace, ``igsim profile``'s pipeline, release period R) into a plan; every plan runs
under the same online policy (importance, R, density) with ``igrt.train.loop``. Top-k+EF at the same
density is the reference. Reported per method: the threshold and the split (important / low
components, the low components' share of Top-k's bytes), measured bytes per step and their ratio
to Top-k+EF, held-out quality and its difference from Top-k+EF (mean over seeds).

Methods that produce the same plan share one training run (runs are cached by content).

    python -m experiments.rq2_partition                     # full: GPT and MiniLM, 1 seed
    python -m experiments.rq2_partition --quick             # CI: tiny GPT, 8 steps
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from experiments import common
from experiments.common import Study, mean_std

METHODS = ("knee", "otsu", "gmm", "kmeans2", "percentile", "fixed_ratio")
QUALITY = {"minilm": ("accuracy", 100.0, "points"), "gpt": ("loss", None, "%")}
FULL_STEPS = {"minilm": 50, "gpt": 100}


def _delta(wl: str, q: float, ref: float) -> float:
    """Quality difference to the reference: accuracy points (MiniLM) or relative loss in % (GPT)."""
    _, scale, _ = QUALITY[wl]
    return (q - ref) * scale if scale else (q - ref) / ref * 100


def run(study: Study) -> dict[str, Any]:
    a, quick = study.args, study.quick
    workloads = ["gpt"] if quick else a.workloads.split(",")
    seeds = list(range(1 if quick else a.seeds))
    (study.out / "plans").mkdir(exist_ok=True)
    jobs, keys, splits = [], [], {}
    for wl in workloads:
        steps = 8 if quick else (a.steps or FULL_STEPS[wl])
        trace = common.trace_for(wl, seed=0, steps=12 if quick else 100, tiny=quick, cache=study.cache,
                                 nproc=a.nproc, density=a.density, inprocess=quick)  # fmt: skip
        base = {
            "workload": wl,
            "steps": steps,
            "tiny": quick,
            "density": a.density,
            "release_period": a.release_period,
        }
        for s in seeds:
            jobs.append(common.job(policy="topk", seed=s, **base))
            keys.append((wl, "topk", s))
        for method in METHODS:
            plan, _, result = common.profile(trace, method=method, release_period=a.release_period)
            path = plan.save(study.out / "plans" / f"{wl}-{method}.json")
            splits[wl, method] = {
                "threshold": result.threshold,
                "num_important": len(plan.important),
                "num_low": len(plan.low),
                "low_byte_share": common.plan_byte_share(plan),
                "plan": plan.fingerprint,
            }
            for s in seeds:
                jobs.append(common.job(policy="importance", seed=s, plan_path=path, **base))
                keys.append((wl, method, s))
    results = dict(
        zip(keys, common.run_jobs(jobs, cache=study.cache, nproc=a.nproc, log=study.log, inprocess=quick))
    )
    rows = []
    for wl in workloads:
        metric = QUALITY[wl][0]

        def agg(method: str, wl: str = wl, metric: str = metric) -> tuple[float, float, float]:
            res = [results[wl, method, s] for s in seeds]
            q, q_std = mean_std((r.get("final_eval") or {}).get(metric, math.nan) for r in res)
            return float(np.mean([r["stats"]["bytes_per_step"]["wire_bytes"] for r in res])), q, q_std

        topk_b, topk_q, topk_std = agg("topk")
        rows.append({"workload": wl, "method": "Top-k+EF", "threshold": math.nan, "num_important": math.nan,
                     "num_low": 0, "low_byte_share": 0.0, "bytes_per_step": topk_b, "bytes_vs_topk": 1.0,
                     "quality_metric": metric, "quality_mean": topk_q, "quality_std": topk_std,
                     "quality_delta_vs_topk": 0.0, "delta_unit": QUALITY[wl][2], "plan": ""})  # fmt: skip
        for method in METHODS:
            b, q, q_std = agg(method)
            rows.append({"workload": wl, "method": method, **splits[wl, method], "bytes_per_step": b,
                         "bytes_vs_topk": b / topk_b, "quality_metric": metric, "quality_mean": q,
                         "quality_std": q_std, "quality_delta_vs_topk": _delta(wl, q, topk_q),
                         "delta_unit": QUALITY[wl][2]})  # fmt: skip
    common.write_csv(rows, study.out / "rq2_table.csv")
    _plot(study, rows)
    return {"rows": rows}


def _plot(study: Study, rows: Sequence[dict[str, Any]]) -> None:
    plt = common.plt()
    workloads = sorted({r["workload"] for r in rows})
    fig, axes = plt.subplots(1, len(workloads), figsize=(6 * len(workloads), 4), squeeze=False)
    for ax, wl in zip(axes[0], workloads):
        rs = [r for r in rows if r["workload"] == wl and r["method"] != "Top-k+EF"]
        groups: dict[str, list[dict[str, Any]]] = {}  # methods that split the same way share a point
        for r in rs:
            groups.setdefault(r["plan"], []).append(r)
        for i, same in enumerate(groups.values()):
            r = same[0]
            ax.scatter(r["bytes_vs_topk"], r["quality_delta_vs_topk"], color=f"C{i}", s=40)
            names = " = ".join(x["method"] for x in same)
            ax.annotate(f"{names} ({r['num_important']} imp.)", (r["bytes_vs_topk"], r["quality_delta_vs_topk"]),
                        fontsize=7, xytext=(4, 4 + 10 * (i % 2)), textcoords="offset points")  # fmt: skip
        ax.axvline(0.25, color="k", ls=":", label="bytes target 0.25")
        bound = -0.5 if wl == "minilm" else 1.0
        ax.axhline(bound, color="r", ls=":", label=f"quality bound {bound:+g} {rs[0]['delta_unit']}")
        ax.axhline(0, color="k", lw=0.5)
        ax.set_xlabel("bytes/step ÷ Top-k+EF")
        unit = rs[0]["delta_unit"]
        better = "higher" if wl == "minilm" else "lower"
        ax.set_ylabel(f"{rs[0]['quality_metric']} − Top-k+EF ({unit}; {better} is better)")
        ax.set_title(f"{wl}: threshold methods under one policy")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("RQ2 partition ablation" + (" (quick)" if study.quick else ""))
    fig.tight_layout()
    fig.savefig(study.out / "rq2_partition.png", dpi=90)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="experiments.rq2_partition", description=__doc__.split("\n")[0])
    Study.add_arguments(parser)
    parser.add_argument("--workloads", default="gpt,minilm", help="comma-separated (default gpt,minilm)")
    parser.add_argument("--seeds", type=int, default=1, help="seeds per method (default 1)")
    parser.add_argument("--steps", type=int, default=None, help="training steps (default minilm 50, gpt 100)")
    parser.add_argument("--density", type=float, default=0.01, help="sparsifier density (default 0.01)")
    parser.add_argument("--release-period", type=int, default=4, help="R (default 4)")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    study = Study("rq2_partition", args, argv)
    result = run(study)
    for r in result["rows"]:
        study.log(
            f"{r['workload']:6s} {r['method']:11s}: {r['bytes_vs_topk']:.3f} x Top-k bytes, "
            f"{r['quality_metric']} {r['quality_mean']:.4f} ({r['quality_delta_vs_topk']:+.2f} {r['delta_unit']})"
        )
    study.finish()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
