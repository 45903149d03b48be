"""RQ5 — end to end: dense vs Top-k+EF vs ADTopk+EF vs the importance policy, measured and simulated.

Per workload (MiniLM fine-tuning: held-out accuracy; GPT post-training: held-out loss):

1. **Plan.** The workload's trace (the shipped sample for full runs) is profiled with ``igsim
   profile``'s pipeline (knee threshold, release period R) into ``plans/<workload>.json``.
2. **Quality and bytes** — every policy x seed trained with ``igrt.train.loop`` on ``--nproc`` gloo ranks
   on loopback (the arithmetic, hence bytes and quality, does not depend on the link).
3. **Speed on a shaped link** — seed 0 of every policy for a few steps on the namespace testbed
   (``igrt.testbed.namespaces``: one rank per namespace, each link shaped both ways with tbf) at a rate where
   Top-k's communication takes about twice the compute (``--rate``; auto from the trace: Top-k's
   nominal bytes / (2 x recorded compute)). Dense moves ~100x more bytes, so it runs 1 step
   (whose time includes the warm-up; the other policies' first step is left out).
4. **Prediction** — igsim replays the same runs (same trace, policy, plan, world size, a star at
   the testbed rate, synchronizer after backward) with compute scaled to the measured compute.
5. **Extrapolation** — igsim on LLaMA-7B / 70B (roofline compute on H100s) on 100–400 Gbit/s stars
   of 64–1,024 ranks, the GPT plan carried over by (kind, relative depth).

Targets (issue 8): importance bytes/step <= 0.25 x Top-k+EF at equal density; held-out quality
within 0.5 accuracy points (MiniLM) / 1 % relative loss (GPT) of Top-k+EF (mean of seeds); steps/s
>= 1.3 x Top-k+EF on the shaped link. ``targets.json`` states each with its measured value and miss.

    python -m experiments.rq5_end_to_end               # full (see docs/results.md for its runtime)
    python -m experiments.rq5_end_to_end --quick       # CI: tiny models, 1 seed, 8 steps, no testbed
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from experiments import common
from experiments.common import Study, mean_std

POLICIES = ("dense", "topk", "adtopk", "importance")
LABELS = {"dense": "dense", "topk": "Top-k+EF", "adtopk": "ADTopk+EF", "importance": "importance"}
QUALITY = {"minilm": ("accuracy", +1), "gpt": ("loss", -1)}  # metric, +1 = higher is better
FULL_STEPS = {"minilm": 50, "gpt": 100}
EXTRAPOLATION = {"archs": ("llama-7b", "llama-70b"), "gbps": (100, 200, 400), "ranks": (64, 256, 1024)}


def _quality(result: dict[str, Any], workload: str) -> float:
    final = result.get("final_eval") or {}
    return float(final.get(QUALITY[workload][0], math.nan))


def _trace_compute_s(trace: Path) -> float:
    from igsim.step.workload import Workload

    w = Workload.from_trace(trace)
    return float(np.mean(w.forward_s + w.backward_s + w.optimizer_s))


def _topk_bytes(plan) -> float:
    return float(sum(c.expected_bytes for c in plan.components))


def auto_rate(trace: Path, plan, num_ranks: int) -> float:
    """Bytes/s at which one rank's Top-k gather ((p-1) peers' pairs in) takes 2x the recorded compute."""
    need_s = 2.0 * _trace_compute_s(trace)
    rate = _topk_bytes(plan) * (num_ranks - 1) / need_s
    mbit = max(1.0, float(np.round(rate * 8 / 1e6)))
    return mbit * 1e6 / 8


def run(study: Study) -> dict[str, Any]:
    a, quick = study.args, study.quick
    workloads = a.workloads.split(",")
    seeds = list(range(1 if quick else a.seeds))
    rows: list[dict[str, Any]] = []
    runs: dict[tuple[str, str, int], dict[str, Any]] = {}
    testbed_runs: dict[tuple[str, str], dict[str, Any]] = {}
    plans: dict[str, Any] = {}
    rates: dict[str, float] = {}
    (study.out / "plans").mkdir(exist_ok=True)
    jobs: list[dict[str, Any]] = []
    tags: list[str] = []  # the policy, or a diagnostic variant of the importance policy
    variants: dict[str, list[dict[str, Any]]] = {}
    for wl in workloads:
        steps = 8 if quick else (a.steps or FULL_STEPS[wl])
        trace = common.trace_for(wl, seed=0, steps=12 if quick else 100, tiny=quick, cache=study.cache,
                                 nproc=a.nproc, density=a.density, inprocess=quick)  # fmt: skip
        plan, _, _ = common.profile(trace, release_period=a.release_period)
        plan_path = plan.save(study.out / "plans" / f"{wl}.json")
        plans[wl] = (plan, trace)
        study.log(f"{wl}: plan {plan.fingerprint}: {len(plan.important)} important / {len(plan.low)} low, "
                  f"low share of bytes {common.plan_byte_share(plan):.1%}")  # fmt: skip
        variants[wl] = _variants(study, wl, trace, plan, plan_path)
        for s in seeds:
            for v in variants[wl]:
                jobs.append(common.job(workload=wl, policy=v["policy"], seed=s, steps=steps, tiny=quick,
                                       plan_path=v["plan_path"], release_period=a.release_period,
                                       **{"density": a.density, **v["config"]}))  # fmt: skip
                tags.append(v["tag"])
        rates[wl] = common_rate(a, trace, plan)
    order = sorted(range(len(jobs)), key=lambda i: jobs[i]["seed"])  # seed 0 of everything first
    jobs, tags = [jobs[i] for i in order], [tags[i] for i in order]
    results = common.run_jobs(jobs, cache=study.cache, nproc=a.nproc, log=study.log, inprocess=quick)
    for j, tag, res in zip(jobs, tags, results):
        runs[j["workload"], tag, j["seed"]] = res
    for wl in workloads:
        if not quick and not a.no_testbed:
            plan_path = study.out / "plans" / f"{wl}.json"
            testbed_runs.update(_testbed(study, wl, plan_path, rates[wl]))

    for wl in workloads:
        plan, trace = plans[wl]
        topk_q = mean_std(_quality(runs[wl, "topk", s], wl) for s in seeds)[0]
        topk_b = np.mean([runs[wl, "topk", s]["stats"]["bytes_per_step"]["wire_bytes"] for s in seeds])
        tb_topk = testbed_runs.get((wl, "topk"))
        measured_compute = (tb_topk or runs[wl, "topk", 0])["stats"]["compute_s_mean"]
        scale = measured_compute / _trace_compute_s(trace)
        for v in variants[wl]:
            tag, p, plan_p = v["tag"], v["policy"], v["plan"]
            res = [runs[wl, tag, s] for s in seeds]
            q_mean, q_std = mean_std(_quality(r, wl) for r in res)
            b = float(np.mean([r["stats"]["bytes_per_step"]["wire_bytes"] for r in res]))
            sim = common.simulate_star(
                trace=trace, policy=p, plan=plan_p, num_ranks=a.nproc, bandwidth_bytes_per_s=rates[wl],
                num_steps=4 * a.release_period, density=v["config"].get("density", a.density),
                release_period=a.release_period,
                compute_scale=scale,
            )  # fmt: skip
            tb = testbed_runs.get((wl, tag))
            rows.append(
                {
                    "workload": wl,
                    "policy": v["label"],
                    "seeds": len(res),
                    "steps": res[0]["job"]["steps"],
                    "bytes_per_step": b,
                    "bytes_vs_topk": b / topk_b if topk_b else math.nan,
                    "low_bytes_per_step": float(
                        np.mean([r["stats"]["bytes_per_step"]["low_bytes"] for r in res])
                    ),
                    "peak_to_median": float(np.mean([r["stats"]["peak_to_median"] for r in res])),
                    "quality_metric": QUALITY[wl][0],
                    "quality_mean": q_mean,
                    "quality_std": q_std,
                    "quality_delta_vs_topk": q_mean - topk_q,
                    "loopback_steps_per_s": float(np.mean([r["stats"]["steps_per_s"] for r in res])),
                    "link_rate_mbit": rates[wl] * 8 / 1e6,
                    "testbed_steps_per_s": tb["stats"]["steps_per_s"] if tb else math.nan,
                    "testbed_steps": tb["stats"]["num_steps"] if tb else 0,
                    "testbed_bytes_per_step": tb["stats"]["bytes_per_step"]["wire_bytes"] if tb else math.nan,
                    "sim_steps_per_s": sim["steps_per_s"],
                    "sim_bytes_per_step": sim["wire_bytes"],
                    "sim_exposed_comm_s": sim["exposed_comm_s_mean"],
                }
            )
    common.write_csv(rows, study.out / "rq5_table.csv")
    targets = _targets(rows)
    common.write_json(targets, study.out / "targets.json")
    curves = {f"{wl}/{p}/s{s}": r["per_step"]["loss"] for (wl, p, s), r in runs.items()}
    common.write_json(curves, study.out / "loss_curves.json")
    extra = _extrapolate(study, plans)
    _plot(study, rows, extra)
    return {"rows": rows, "targets": targets, "rates_mbit": {k: v * 8 / 1e6 for k, v in rates.items()}}


def _variants(study: Study, wl: str, trace: Path, plan, plan_path: Path) -> list[dict[str, Any]]:
    """The four policies, then diagnostic variants of the importance policy (not target rows):
    ``--pin`` components always sent; ``--zero-unsent``: parameters that sent nothing get a zero
    gradient instead of None (``skip_unsent=False``), so AdamW still steps them every step;
    ``--catch-up``: each update scaled by the steps its gradient carries (``catch_up=True``);
    ``--equal-bytes``: Top-k+EF at the density that sends the importance policy's expected bytes."""
    a = study.args
    out = [{"tag": p, "label": LABELS[p], "policy": p, "plan": plan, "plan_path": plan_path, "config": {}}
           for p in POLICIES]  # fmt: skip
    pin = [k for k in (a.pin.split(",") if a.pin else []) if k in plan.by_key]
    if pin:
        pplan, _, _ = common.profile(trace, release_period=a.release_period, pinned=pin)
        path = pplan.save(study.out / "plans" / f"{wl}-pinned.json")
        out.append({"tag": "pinned", "label": f"importance, {','.join(pin)} pinned", "policy": "importance",
                    "plan": pplan, "plan_path": path, "config": {}})  # fmt: skip
    if a.zero_unsent:
        out.append({"tag": "zero_unsent", "label": "importance, zero grads for unsent", "policy": "importance",
                    "plan": plan, "plan_path": plan_path, "config": {"skip_unsent": False}})  # fmt: skip
    if a.equal_bytes:  # Top-k+EF thinned to the importance policy's expected bytes per step
        low = common.plan_byte_share(plan)
        d = a.density * ((1.0 - low) + low / a.release_period)
        out.append({"tag": "topk_equal_bytes", "label": f"Top-k+EF at equal bytes (density {d:.4f})",
                    "policy": "topk", "plan": None, "plan_path": None, "config": {"density": round(d, 6)}})  # fmt: skip
    if a.catch_up:
        out.append({"tag": "catch_up", "label": "importance, catch-up", "policy": "importance",
                    "plan": plan, "plan_path": plan_path, "config": {"catch_up": True}})  # fmt: skip
    return out


def common_rate(a: argparse.Namespace, trace: Path, plan) -> float:
    from igpolicy.units import parse_bandwidth

    return parse_bandwidth(a.rate, flag="--rate") if a.rate else auto_rate(trace, plan, a.nproc)


def _testbed(study: Study, wl: str, plan_path: Path, rate: float) -> dict[tuple[str, str], dict[str, Any]]:
    """Seed 0 of every policy on the shaped testbed; {} (logged) where it cannot run here."""
    from igrt.testbed import namespaces as testbed

    a = study.args
    try:
        testbed.check_support()
    except testbed.TestbedError as e:
        study.log(f"testbed skipped: {e}")
        return {}
    if not common.wait_for_testbed(a.testbed_wait, log=study.log):
        study.log(
            f"testbed skipped: namespaces {common.testbed_busy()} still exist (another run owns the testbed)"
        )
        return {}
    spec = testbed.TestbedSpec(num_ranks=a.nproc, rate_bytes_per_s=rate)
    jobs = [
        common.job(workload=wl, policy=p, seed=0, steps=1 if p == "dense" else a.testbed_steps, tiny=False,
                   plan_path=plan_path, density=a.density, release_period=a.release_period, evaluate=False,
                   flush=False)
        for p in POLICIES
    ]  # fmt: skip
    study.log(f"{wl}: testbed {a.nproc} ranks at {rate * 8 / 1e6:g} Mbit/s")
    with testbed.Testbed(spec):
        results = common.run_jobs(jobs, cache=study.cache, nproc=a.nproc, spec=spec, log=study.log)
    return {(wl, j["config"]["policy"]): r for j, r in zip(jobs, results)}


def _targets(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for wl in sorted({r["workload"] for r in rows}):
        by = {r["policy"]: r for r in rows if r["workload"] == wl}
        imp, topk = by[LABELS["importance"]], by[LABELS["topk"]]
        ratio = imp["bytes_vs_topk"]
        out.append(_target(wl, "bytes/step <= 0.25 x Top-k+EF", ratio, 0.25, ratio <= 0.25, f"{ratio:.3f} x"))
        if wl == "minilm":
            d = (imp["quality_mean"] - topk["quality_mean"]) * 100
            out.append(
                _target(wl, "accuracy within 0.5 points of Top-k+EF", d, -0.5, d >= -0.5, f"{d:+.2f} points")
            )
        else:
            rel = (imp["quality_mean"] - topk["quality_mean"]) / topk["quality_mean"] * 100
            out.append(
                _target(wl, "held-out loss within 1 % of Top-k+EF", rel, 1.0, rel <= 1.0, f"{rel:+.2f} %")
            )
        s_imp, s_topk = imp["testbed_steps_per_s"], topk["testbed_steps_per_s"]
        speed = s_imp / s_topk if s_topk and math.isfinite(s_imp) else math.nan
        met = bool(speed >= 1.3) if math.isfinite(speed) else None
        out.append(_target(wl, "steps/s >= 1.3 x Top-k+EF on the shaped link", speed, 1.3, met,
                           f"{speed:.2f} x" if math.isfinite(speed) else "not measured (no testbed run)"))  # fmt: skip
    return out


def _target(wl: str, what: str, value: float, bound: float, met: bool | None, text: str) -> dict[str, Any]:
    return {"workload": wl, "target": what, "value": value, "bound": bound, "met": met, "measured": text}


def _extrapolate(study: Study, plans: dict[str, Any]) -> list[dict[str, Any]]:
    """igsim on LLaMA-7B/70B, 100-400 Gbit/s stars of 64-1,024 ranks, a workload's plan carried over."""
    from igpolicy.config import PolicyConfig
    from igsim.step.architectures import architecture_params, architecture_workload, transfer_plan
    from igsim.studies.sweep import run_sweep

    a = study.args
    src = "gpt" if "gpt" in plans else next(iter(plans))
    plan, trace = plans[src]
    from traces.reader import read_manifest

    src_params = read_manifest(trace).params
    grid = EXTRAPOLATION if not study.quick else {"archs": ("llama-7b",), "gbps": (100,), "ranks": (64,)}
    rows = []
    for arch in grid["archs"]:
        carried = transfer_plan(plan, src_params, architecture_params(arch), density=a.density)
        workload = architecture_workload(arch, accelerator="h100")
        study.log(
            f"extrapolating to {arch}: {len(grid['gbps']) * len(grid['ranks']) * len(POLICIES)} simulations"
        )
        got = run_sweep(
            workload=workload, plan=carried,
            config=PolicyConfig(policy="importance", density=a.density, release_period=a.release_period, num_buckets=16),
            policies=POLICIES, bandwidths_bytes_per_s=[g * 1e9 / 8 for g in grid["gbps"]],
            world_sizes=grid["ranks"], num_steps=2 * a.release_period, max_workers=1, progress=False,
        )  # fmt: skip
        for r in got:
            rows.append({"arch": arch, "plan_from": src, "gbps": r["bandwidth_bytes_per_s"] * 8 / 1e9,
                         **{k: r[k] for k in ("policy", "world_size", "step_s_mean", "wire_bytes",
                                              "exposed_comm_s_mean", "speedup_vs_dense")}})  # fmt: skip
    for r in rows:
        topk = next(x for x in rows if x["arch"] == r["arch"] and x["gbps"] == r["gbps"]
                    and x["world_size"] == r["world_size"] and x["policy"] == "topk")  # fmt: skip
        r["speedup_vs_topk"] = topk["step_s_mean"] / r["step_s_mean"]
        r["bytes_vs_topk"] = r["wire_bytes"] / topk["wire_bytes"] if topk["wire_bytes"] else math.nan
    common.write_csv(rows, study.out / "extrapolation.csv")
    return rows


def _plot(study: Study, rows: Sequence[dict[str, Any]], extra: Sequence[dict[str, Any]]) -> None:
    plt = common.plt()
    workloads = sorted({r["workload"] for r in rows})
    fig, axes = plt.subplots(len(workloads), 3, figsize=(13, 3.4 * len(workloads)), squeeze=False)
    for ax_row, wl in zip(axes, workloads):
        rs = [r for r in rows if r["workload"] == wl]
        names = [r["policy"].replace(", ", "\n") for r in rs]
        x = np.arange(len(rs))
        ax_row[0].bar(x, [r["bytes_per_step"] for r in rs], color="C0", label="measured")
        ax_row[0].plot(x, [r["sim_bytes_per_step"] for r in rs], "k_", ms=20, mew=2, label="igsim")
        ax_row[0].set_yscale("log")
        ax_row[0].set_title(f"{wl}: bytes per rank per step")
        ax_row[0].legend(fontsize=7)
        ax_row[1].errorbar(
            x, [r["quality_mean"] for r in rs], yerr=[r["quality_std"] for r in rs], fmt="o", capsize=4
        )
        ax_row[1].set_title(f"{wl}: held-out {rs[0]['quality_metric']} (mean ± std, {rs[0]['seeds']} seeds)")
        w = 0.27
        ax_row[2].bar(x - w, [r["loopback_steps_per_s"] for r in rs], w, label="loopback")
        ax_row[2].bar(
            x, [r["testbed_steps_per_s"] for r in rs], w, label=f"shaped {rs[0]['link_rate_mbit']:g} Mbit/s"
        )
        ax_row[2].bar(x + w, [r["sim_steps_per_s"] for r in rs], w, label="igsim (shaped)")
        ax_row[2].set_title(f"{wl}: steps/s")
        ax_row[2].legend(fontsize=7)
        for ax in ax_row:
            ax.set_xticks(x, names, fontsize=8)
            ax.grid(alpha=0.3)
    fig.suptitle("RQ5 end to end" + (" (quick)" if study.quick else ""))
    fig.tight_layout()
    fig.savefig(study.out / "rq5_end_to_end.png", dpi=90)
    plt.close(fig)
    if extra:
        archs = sorted({r["arch"] for r in extra})
        fig, axes = plt.subplots(1, len(archs), figsize=(6 * len(archs), 3.6), squeeze=False)
        for ax, arch in zip(axes[0], archs):
            for i, p in enumerate(POLICIES):
                for j, g in enumerate(sorted({r["gbps"] for r in extra})):
                    rs = sorted((r for r in extra if r["arch"] == arch and r["policy"] == p and r["gbps"] == g),
                                key=lambda r: r["world_size"])  # fmt: skip
                    ax.plot([r["world_size"] for r in rs], [r["speedup_vs_dense"] for r in rs], marker="o",
                            color=f"C{i}", ls=("-", "--", ":")[j % 3], label=f"{LABELS[p]} {g:g} Gbit/s")  # fmt: skip
            ax.set_xscale("log", base=2)
            ax.set_xlabel("accelerators")
            ax.set_ylabel("speed-up vs dense (igsim)")
            ax.set_title(f"{arch} on H100 (roofline), star")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=6, ncol=2)
        fig.tight_layout()
        fig.savefig(study.out / "rq5_extrapolation.png", dpi=90)
        plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="experiments.rq5_end_to_end", description=__doc__.split("\n")[0])
    Study.add_arguments(parser)
    parser.add_argument("--workloads", default="minilm,gpt", help="comma-separated (default minilm,gpt)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per policy (default 3)")
    parser.add_argument("--steps", type=int, default=None, help="training steps (default minilm 50, gpt 100)")
    parser.add_argument("--density", type=float, default=0.01, help="sparsifier density (default 0.01)")
    parser.add_argument(
        "--pin",
        default="head",
        help="also run the importance policy with these components pinned (default head; '' = no)",
    )
    for flag, what in (
        ("--zero-unsent", "the importance policy with skip_unsent=False"),
        ("--catch-up", "the importance policy with catch_up=True"),
        ("--equal-bytes", "Top-k+EF thinned to the importance policy's bytes"),
    ):  # diagnostic variants: rows of the table, not targets
        parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=False,
                            help=f"also run {what} (default off)")  # fmt: skip
    parser.add_argument("--release-period", type=int, default=4, help="R (default 4)")
    parser.add_argument(
        "--rate", default=None, help="shaped link rate, e.g. 20Mbit (default: auto per workload)"
    )
    parser.add_argument(
        "--testbed-steps", type=int, default=12, help="steps per policy on the testbed (default 12)"
    )
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    study = Study("rq5_end_to_end", args, argv)
    result = run(study)
    for t in result["targets"]:
        verdict = {True: "met", False: "MISSED", None: "n/a"}[t["met"]]
        study.log(f"{t['workload']}: {t['target']}: {t['measured']} -> {verdict}")
    study.finish(targets=result["targets"], rates_mbit=result["rates_mbit"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
