"""RQ4 — packing ablation: DDP order vs round robin vs LPT vs Karmarkar–Karp (+ local search).

The same step's payload blocks (the importance policy's senders at density d, release period R)
are packed into buckets by each method of :func:`igpolicy.packing.pack` — ``num_buckets`` buckets for
round robin / LPT / KK, and for DDP order a bucket cap of total / ``num_buckets`` bytes (DDP packs by
a cap, not a count). Measured per method:

- **bucket imbalance** (max / mean bucket bytes, over the R steps of a period) and the largest
  bucket's gap to the lower bound max(total / buckets, largest block);
- **simulated step time** — igsim on (a) each workload's trace on a star of ``--nproc`` ranks at
  the shaped rate, synchronizer after backward (``overlap=False``, what ``igrt train`` does) and
  with the DDP hook's overlap (``overlap=True``), and (b) LLaMA-7B (roofline, H100) on 64 ranks at
  100 Gbit/s with overlap, the GPT plan carried over;
- **testbed step time** — ``igrt train`` (importance, each packing) for a few steps on the shaped
  namespace testbed (``--no-testbed`` skips it; quick mode never touches it).

    python -m experiments.rq4_packing                  # full
    python -m experiments.rq4_packing --quick          # CI: tiny GPT trace, simulation only
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

PACKINGS = ("ddp", "round_robin", "lpt", "kk")


def packing_report(
    params, plan, *, packing: str, num_buckets: int, density: float, release_period: int, world_size: int
):
    """(mean imbalance, max imbalance, mean gap to the lower bound, bucket cap used) over one period."""
    from igpolicy.config import PolicyConfig
    from igpolicy.decide import decide_step, payload_blocks, release_phases

    probe = PolicyConfig(policy="importance", density=density, release_period=release_period)
    cap = cap_for(params, plan, probe, num_buckets)
    config = PolicyConfig(policy="importance", density=density, release_period=release_period, packing=packing,
                          num_buckets=None if packing == "ddp" else num_buckets, bucket_cap_bytes=cap)  # fmt: skip
    phases = release_phases(plan=plan, config=config, component_keys=[p.component for p in params])
    blocks = payload_blocks(params, config)
    imb, gaps, counts = [], [], []
    for t in range(release_period):
        d = decide_step(
            step=t, config=config, params=params, world_size=world_size, phases=phases, blocks=blocks
        )
        imb.append(d.packing.imbalance)
        gaps.append(d.packing.gap_to_lower_bound)
        counts.append(len(d.packing.buckets))
    return float(np.mean(imb)), float(np.max(imb)), float(np.mean(gaps)), float(np.mean(counts)), cap


def cap_for(params, plan, config, num_buckets: int) -> int:
    """DDP's bucket cap that gives about ``num_buckets`` buckets on an average step of ``config``."""
    from igpolicy.decide import decide_step, payload_blocks, release_phases

    phases = release_phases(plan=plan, config=config, component_keys=[p.component for p in params])
    blocks = payload_blocks(params, config)
    totals = [
        sum(b.size_bytes for b in blocks
            if b.component in decide_step(step=t, config=config, params=params, world_size=2, phases=phases,
                                          blocks=blocks).release.send)
        for t in range(config.release_period)
    ]  # fmt: skip
    return max(1, math.ceil(float(np.mean(totals)) / num_buckets))


def _sim_rows(study: Study, name: str, workload, plan, *, topology, overlap: bool, a) -> list[dict[str, Any]]:
    from igpolicy.config import PolicyConfig
    from igsim.step.engine import simulate

    rows = []
    params = list(workload.params)
    for packing in PACKINGS:
        imb, imb_max, gap, nb, cap = packing_report(
            params, plan, packing=packing, num_buckets=a.num_buckets, density=a.density,
            release_period=a.release_period, world_size=len(topology.ranks),
        )  # fmt: skip
        config = PolicyConfig(policy="importance", density=a.density, release_period=a.release_period,
                              packing=packing, num_buckets=None if packing == "ddp" else a.num_buckets,
                              bucket_cap_bytes=cap)  # fmt: skip
        res = simulate(workload=workload, config=config, plan=plan, topology=topology,
                       num_steps=4 * a.release_period, integration="ddp-hook" if overlap else "sync").summary()  # fmt: skip
        rows.append({"source": "igsim", "case": name, "overlap": overlap, "packing": packing,
                     "num_buckets": nb, "imbalance_mean": imb, "imbalance_max": imb_max,
                     "gap_to_lower_bound": gap, "step_s": res["step_s_mean"],
                     "exposed_comm_s": res["exposed_comm_s_mean"], "wire_bytes": res["wire_bytes"],
                     "payload_bytes": res["values_bytes"] + res["indices_bytes"] + res["dense_bytes"]})  # fmt: skip
    return rows


def run(study: Study) -> dict[str, Any]:
    from igsim.net.topology import star
    from igsim.step.architectures import architecture_params, architecture_workload, transfer_plan
    from igsim.step.workload import Workload
    from traces.reader import read_manifest

    a, quick = study.args, study.quick
    workloads = ["gpt"] if quick else ["gpt", "minilm"]
    rows: list[dict[str, Any]] = []
    plans = {}
    (study.out / "plans").mkdir(exist_ok=True)
    for wl in workloads:
        trace = common.trace_for(wl, seed=0, steps=12 if quick else 100, tiny=quick, cache=study.cache,
                                 nproc=a.nproc, density=a.density, inprocess=quick)  # fmt: skip
        plan, _, _ = common.profile(trace, release_period=a.release_period)
        plans[wl] = (plan, trace, plan.save(study.out / "plans" / f"{wl}.json"))
        from experiments.rq5_end_to_end import auto_rate

        rate = auto_rate(trace, plan, a.nproc)
        workload = Workload.from_trace(trace)
        topo = star(num_ranks=a.nproc, bandwidth_bytes_per_s=rate, latency_s=50e-6)
        study.log(f"{wl}: simulating {len(PACKINGS)} packings at {rate * 8 / 1e6:g} Mbit/s, {a.nproc} ranks")
        for overlap in (False, True):
            rows += _sim_rows(study, f"{wl} {a.nproc} ranks {rate * 8 / 1e6:g} Mbit/s", workload, plan,
                              topology=topo, overlap=overlap, a=a)  # fmt: skip
        if not quick and not a.no_testbed:
            rows += _testbed(study, wl, plans[wl][2], list(workload.params), rate)
    plan, trace, _ = plans["gpt"]
    arch = "pythia-160m" if quick else "llama-7b"
    carried = transfer_plan(plan, read_manifest(trace).params, architecture_params(arch), density=a.density)
    ranks = 8 if quick else 64
    study.log(f"{arch}: simulating {len(PACKINGS)} packings on {ranks} ranks at 100 Gbit/s")
    rows += _sim_rows(study, f"{arch} {ranks} ranks 100 Gbit/s", architecture_workload(arch), carried,
                      topology=star(num_ranks=ranks, bandwidth_bytes_per_s=100e9 / 8, latency_s=5e-6),
                      overlap=True, a=a)  # fmt: skip
    for r in rows:
        ref = next(x for x in rows if x["case"] == r["case"] and x["source"] == r["source"]
                   and x["overlap"] == r["overlap"] and x["packing"] == "ddp")  # fmt: skip
        r["step_s_vs_ddp"] = r["step_s"] / ref["step_s"] if ref["step_s"] else math.nan
    common.write_csv(rows, study.out / "rq4_table.csv")
    _plot(study, rows)
    return {"rows": rows}


def _testbed(study: Study, wl: str, plan_path, params, rate: float) -> list[dict[str, Any]]:
    from igrt.testbed import namespaces as testbed

    a = study.args
    try:
        testbed.check_support()
    except testbed.TestbedError as e:
        study.log(f"testbed skipped: {e}")
        return []
    if not common.wait_for_testbed(a.testbed_wait, log=study.log):
        study.log(
            f"testbed skipped: namespaces {common.testbed_busy()} still exist (another run owns the testbed)"
        )
        return []
    from igpolicy.plan import SyncPlan

    plan = SyncPlan.load(plan_path)
    jobs = []
    for packing in PACKINGS:
        *_, cap = packing_report(params, plan, packing=packing, num_buckets=a.num_buckets, density=a.density,
                                 release_period=a.release_period, world_size=a.nproc)  # fmt: skip
        jobs.append(common.job(workload=wl, policy="importance", seed=0, steps=a.testbed_steps, tiny=False,
                               plan_path=plan_path, density=a.density, release_period=a.release_period,
                               packing=packing, num_buckets=None if packing == "ddp" else a.num_buckets,
                               bucket_cap_bytes=cap, evaluate=False, flush=False))  # fmt: skip
    spec = testbed.TestbedSpec(num_ranks=a.nproc, rate_bytes_per_s=rate)
    study.log(f"{wl}: testbed {a.nproc} ranks at {rate * 8 / 1e6:g} Mbit/s, {len(jobs)} packings")
    with testbed.Testbed(spec):
        results = common.run_jobs(jobs, cache=study.cache, nproc=a.nproc, spec=spec, log=study.log)
    rows = []
    for packing, res in zip(PACKINGS, results):
        st = res["stats"]
        rows.append({"source": "testbed", "case": f"{wl} {a.nproc} ranks {rate * 8 / 1e6:g} Mbit/s", "overlap": False,
                     "packing": packing, "num_buckets": st["num_collectives_per_step"],
                     "imbalance_mean": st["bucket_imbalance_mean"], "imbalance_max": st["bucket_imbalance_max"],
                     "gap_to_lower_bound": math.nan, "step_s": st["step_s_mean"],
                     "exposed_comm_s": st["exposed_comm_s_mean"], "wire_bytes": st["bytes_per_step"]["wire_bytes"],
                     "payload_bytes": st["bytes_per_step"]["wire_bytes"] - st["bytes_per_step"]["metadata_bytes"]})  # fmt: skip
    return rows


def _plot(study: Study, rows: Sequence[dict[str, Any]]) -> None:
    plt = common.plt()
    cases = list(dict.fromkeys((r["case"], r["source"], r["overlap"]) for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(12, 0.5 * len(cases) + 3))
    h = 0.8 / len(PACKINGS)
    for i, packing in enumerate(PACKINGS):
        rs = [
            next(r for r in rows if (r["case"], r["source"], r["overlap"]) == c and r["packing"] == packing)
            for c in cases
        ]
        y = np.arange(len(cases)) + (i - 1.5) * h
        axes[0].barh(y, [r["imbalance_mean"] for r in rs], h, label=packing, color=f"C{i}")
        axes[1].barh(y, [r["step_s_vs_ddp"] for r in rs], h, label=packing, color=f"C{i}")
    labels = [f"{c}\n{s}{' overlap' if o else ''}" for c, s, o in cases]
    for ax in axes:
        ax.set_yticks(range(len(cases)), labels, fontsize=7)
        ax.grid(alpha=0.3, axis="x")
        ax.legend(fontsize=7)
    axes[0].axvline(1.1, color="k", ls=":")
    axes[0].set_xlabel("bucket imbalance (max / mean bytes)")
    axes[1].set_xlabel("step time ÷ DDP order")
    axes[1].set_xlim(left=min(0.9, min(r["step_s_vs_ddp"] for r in rows) - 0.02))
    fig.suptitle("RQ4 packing" + (" (quick)" if study.quick else ""))
    fig.tight_layout()
    fig.savefig(study.out / "rq4_packing.png", dpi=90)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="experiments.rq4_packing", description=__doc__.split("\n")[0])
    Study.add_arguments(parser)
    parser.add_argument("--num-buckets", type=int, default=8, help="buckets per step (default 8)")
    parser.add_argument("--density", type=float, default=0.01, help="sparsifier density (default 0.01)")
    parser.add_argument("--release-period", type=int, default=4, help="R (default 4)")
    parser.add_argument(
        "--testbed-steps", type=int, default=12, help="steps per packing on the testbed (default 12)"
    )
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    study = Study("rq4_packing", args, argv)
    result = run(study)
    for r in result["rows"]:
        study.log(
            f"{r['source']:7s} {r['case']:32s} {'overlap' if r['overlap'] else 'after  '} {r['packing']:11s}: "
            f"imbalance {r['imbalance_mean']:.3f} (gap to bound {r['gap_to_lower_bound']:.3f}), step {r['step_s'] * 1e3:8.2f} ms ({r['step_s_vs_ddp']:.3f} x ddp)"
        )
    study.finish()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
