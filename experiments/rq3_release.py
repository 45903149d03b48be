"""RQ3 — release frequency: R in {1, 2, 4, 8, 16}, with and without residuals, staggered or not.

On one workload (GPT post-training by default: its held-out loss moves smoothly, so small effects
show), for each release period R a plan is profiled from the workload's trace (knee threshold) and
the importance policy is trained in three variants:

- **staggered + residuals** — the method: low components release on R phases of equal expected
  bytes, and whatever they hold stays in their residuals until it is sent;
- **drop held** — the same schedule, but held gradients are dropped (an experiment-side ablation,
  ``TrainOptions(drop_held_residuals=True)``, an ablation switch of the training loop). R = 1 holds
  nothing, so the ablation is the method there;
- **all at once** — ``PolicyConfig(staggered=False)``: every low component releases on the same
  step (the prototype's burst).

Top-k+EF (every component every step) is the reference. Measured per run: bytes per step, peak /
median step bytes, held-out quality, and the training loss right after release steps: the mean of
``loss[t] - mean(loss[t-R..t+R] without t)`` over steps that follow a burst (all at once: t mod R = 0),
minus the same over the other steps, in % of the mean loss ("post-release excess").

    python -m experiments.rq3_release                 # full: GPT, 100 steps, 13 runs + Top-k
    python -m experiments.rq3_release --quick         # CI: tiny GPT, R in {1, 4}, 8 steps
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from experiments import common
from experiments.common import Study

PERIODS = (1, 2, 4, 8, 16)
VARIANTS = ("staggered", "drop_held", "all_at_once")
QUALITY = {"minilm": "accuracy", "gpt": "loss"}
FULL_STEPS = {"minilm": 50, "gpt": 100}


def post_release_excess(loss: Sequence[float], period: int) -> float:
    """Mean local excess of the loss at steps t with t mod R == 0 (t >= R) over the other steps, in %
    of the mean loss; the local baseline of step t is the mean of loss[t-R .. t+R] without t.
    NaN for R = 1 or too short a series."""
    x = np.asarray(loss, dtype=float)
    if period < 2 or len(x) < 3 * period:
        return math.nan
    excess, after = [], []
    for t in range(period, len(x) - period):
        window = np.r_[x[t - period : t], x[t + 1 : t + period + 1]]
        excess.append(x[t] - window.mean())
        after.append(t % period == 0)
    excess, after = np.asarray(excess), np.asarray(after)
    if not after.any() or after.all():
        return math.nan
    return float((excess[after].mean() - excess[~after].mean()) / x.mean() * 100)


def run(study: Study) -> dict[str, Any]:
    a, quick = study.args, study.quick
    wl = a.workload
    periods = (1, 4) if quick else PERIODS
    steps = 8 if quick else (a.steps or FULL_STEPS[wl])
    trace = common.trace_for(wl, seed=0, steps=12 if quick else 100, tiny=quick, cache=study.cache,
                             nproc=a.nproc, density=a.density, inprocess=quick)  # fmt: skip
    (study.out / "plans").mkdir(exist_ok=True)
    jobs, labels = [], []
    base = {"workload": wl, "seed": a.seed, "steps": steps, "tiny": quick, "density": a.density}
    jobs.append(common.job(policy="topk", **base))
    labels.append(("topk", 1))
    for R in periods:
        plan, _, _ = common.profile(trace, release_period=R)
        path = plan.save(study.out / "plans" / f"R{R}.json")
        for variant in VARIANTS:
            if R == 1 and variant != "staggered":
                continue  # nothing is held and there is one phase: both variants are the method
            jobs.append(common.job(policy="importance", plan_path=path, release_period=R,
                                   staggered=variant != "all_at_once",
                                   ablation="drop_held" if variant == "drop_held" else None, **base))  # fmt: skip
            labels.append((variant, R))
    results = common.run_jobs(jobs, cache=study.cache, nproc=a.nproc, log=study.log, inprocess=quick)
    metric = QUALITY[wl]
    rows = []
    for (variant, R), res in zip(labels, results):
        st = res["stats"]
        rows.append(
            {
                "variant": variant,
                "release_period": R,
                "steps": res["job"]["steps"],
                "bytes_per_step": st["bytes_per_step"]["wire_bytes"],
                "low_bytes_per_step": st["bytes_per_step"]["low_bytes"],
                "peak_to_median": st["peak_to_median"],
                "quality_metric": metric,
                "quality": (res.get("final_eval") or {}).get(metric, math.nan),
                "final_train_loss": float(np.mean(res["per_step"]["loss"][-5:])),
                "post_release_excess_pct": post_release_excess(res["per_step"]["loss"], R)
                if variant != "topk"
                else math.nan,
                "flush_bytes": res["flush_wire_bytes"],
            }
        )
    topk = rows[0]
    for r in rows:
        r["bytes_vs_topk"] = r["bytes_per_step"] / topk["bytes_per_step"]
        r["quality_delta_vs_topk"] = r["quality"] - topk["quality"]
    common.write_csv(rows, study.out / "rq3_table.csv")
    series = {f"{v}/R{R}": res["per_step"] for (v, R), res in zip(labels, results)}
    common.write_json(series, study.out / "per_step.json")
    _plot(study, rows, series, periods)
    return {"rows": rows, "workload": wl}


def _plot(study: Study, rows: Sequence[dict[str, Any]], series: dict, periods: Sequence[int]) -> None:
    plt = common.plt()
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    topk = rows[0]
    for i, variant in enumerate(VARIANTS):
        rs = sorted((r for r in rows if r["variant"] == variant or (r["variant"] == "staggered" and r["release_period"] == 1)),
                    key=lambda r: r["release_period"])  # fmt: skip
        kw = {"marker": "o", "color": f"C{i}", "label": variant.replace("_", " ")}
        axes[0, 0].plot([r["release_period"] for r in rs], [r["bytes_vs_topk"] for r in rs], **kw)
        axes[0, 1].plot([r["release_period"] for r in rs], [r["quality"] for r in rs], **kw)
        axes[1, 1].plot([r["release_period"] for r in rs], [r["peak_to_median"] for r in rs], **kw)
    axes[0, 1].axhline(topk["quality"], color="k", ls="--", label="Top-k+EF")
    axes[0, 0].set_ylabel("bytes/step ÷ Top-k+EF")
    axes[0, 1].set_ylabel(f"held-out {topk['quality_metric']}")
    axes[1, 1].set_ylabel("peak ÷ median step bytes")
    show = max(p for p in periods if p > 1)
    for variant in ("staggered", "all_at_once"):
        s = series.get(f"{variant}/R{show}")
        if s:
            n = min(len(s["step"]), 4 * show + 1)
            axes[1, 0].step(
                s["step"][:n],
                np.asarray(s["wire_bytes"][:n]) / 1e3,
                where="post",
                label=f"{variant} R={show}",
            )
    axes[1, 0].set_xlabel("step")
    axes[1, 0].set_ylabel("kB per rank")
    axes[1, 0].set_title("bytes per step")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        if ax is not axes[1, 0]:
            ax.set_xscale("log", base=2)
            ax.set_xlabel("release period R")
    fig.suptitle("RQ3 release frequency" + (" (quick)" if study.quick else ""))
    fig.tight_layout()
    fig.savefig(study.out / "rq3_release.png", dpi=90)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="experiments.rq3_release", description=__doc__.split("\n")[0])
    Study.add_arguments(parser)
    parser.add_argument("--workload", default="gpt", choices=sorted(QUALITY), help="default gpt")
    parser.add_argument("--steps", type=int, default=None, help="training steps (default minilm 50, gpt 100)")
    parser.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    parser.add_argument("--density", type=float, default=0.01, help="sparsifier density (default 0.01)")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    study = Study("rq3_release", args, argv)
    result = run(study)
    for r in result["rows"]:
        study.log(
            f"{r['variant']:11s} R={r['release_period']:2d}: {r['bytes_vs_topk']:.3f} x Top-k bytes, "
            f"peak/median {r['peak_to_median']:.2f}, {r['quality_metric']} {r['quality']:.4f}, "
            f"post-release excess {r['post_release_excess_pct']:+.2f} %"
        )
    study.finish(workload=result["workload"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
