"""Compact payloads: bytes per step the runtime counts at each wire width, and what they cost in loss.

    /work/venv/bin/python benchmarks/wire_bench.py
    /work/venv/bin/python benchmarks/wire_bench.py --steps 100 --density 0.01 --integration ddp-hook

Trains the tiny GPT (``igrt train --tiny``'s model and data) on 2 gloo ranks, once per (policy,
width), every run from the same seed: Top-k+EF and the importance policy at (index, value) bytes
(8,4), (4,4), (4,2), (2,2), (2,1) — int64 / int32 / bucket-local 16-bit indices, fp32 / bf16 / int8
values (docs/runtime.md, wire format). The bytes are the runtime's own StepMetrics (mean per step
and rank, from each run's summary.json), not computed; the loss is the held-out loss **before** the
final flush (the flush sends every residual in fp32 and would hide the cost of the rounding), next
to the final training loss. The importance policy follows a fixed hand plan (embedding, MLP and
attention-output components low, released every ``--period`` steps; the rest every step), the
plan tests/test_sim_matches_runtime.py uses, so the byte split is reproducible without a profiling
run. Prints one table; nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

WIDTHS = ((8, 4), (4, 4), (4, 2), (2, 2), (2, 1))
POLICIES = ("topk", "importance")
LOW_KINDS = {"embedding", "mlp_up", "mlp_down", "attn_o"}


def _hand_plan(infos, period: int):
    from igpolicy.plan import ComponentPlan, SyncPlan
    from igpolicy.vocab import ComponentClass, ComponentId

    comps, j = [], 0
    for key in sorted({i.component for i in infos}):
        if ComponentId.from_key(key).kind.value in LOW_KINDS:
            comps.append(
                ComponentPlan(key=key, score=0.1, cls=ComponentClass.LOW, phase=j % period, expected_bytes=8)
            )
            j += 1
        else:
            comps.append(ComponentPlan(key=key, score=1.0, cls=ComponentClass.IMPORTANT))
    return SyncPlan(release_period=period, components=tuple(comps))


def _train_all(ctx, root: str, args: dict) -> int:
    from igpolicy.config import PolicyConfig
    from igrt.sync.synchronizer import build_param_infos, named_parameters
    from igrt.train.loop import TrainOptions, train_on_rank
    from igrt.workloads import make_workload

    seed = args["seed"]
    infos = build_param_infos(named_parameters(make_workload("gpt", tiny=True, seed=seed).model))
    plan = _hand_plan(infos, args["period"])
    for policy in POLICIES:
        for ib, vb in WIDTHS:
            config = PolicyConfig(
                policy=policy, density=args["density"], release_period=args["period"], index_bytes=ib,
                value_bytes=vb, collective="sparse", seed=seed,
            )  # fmt: skip
            options = TrainOptions(
                workload="gpt", tiny=True, config=config, steps=args["steps"], batch_size=args["batch_size"],
                integration=args["integration"], plan=plan if policy == "importance" else None, seed=seed,
                evaluate=True, progress=False, quiet=True, out=str(Path(root) / f"{policy}-{ib}-{vb}"),
            )  # fmt: skip
            train_on_rank(ctx, options, workload=make_workload("gpt", tiny=True, seed=seed))
    return 0


def _row(run: Path) -> dict:
    s = json.loads((run / "summary.json").read_text())
    ev = json.loads((run / "eval.json").read_text())
    history = ev["history"] if isinstance(ev, dict) else ev  # igrt train's file, or train_on_rank's list
    before = [h for h in history if h.get("before_flush")]
    return {
        **s["stats"]["bytes_per_step"],
        "loss_before_flush": before[-1]["loss"] if before else float("nan"),
        "final_train_loss": s["final_loss"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60, help="optimizer steps per run (default 60)")
    ap.add_argument("--density", type=float, default=0.01, help="Top-k density (default 0.01)")
    ap.add_argument("--period", type=int, default=4, help="importance: release period R (default 4)")
    ap.add_argument("--batch-size", type=int, default=8, help="examples per rank (default 8)")
    ap.add_argument("--integration", choices=("sync", "ddp-hook"), default="sync")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="keep the runs here (default: a temporary folder)")
    ap.add_argument("--table-only", action="store_true", help="print the table of the runs already in --out")
    a = ap.parse_args()
    from igrt.train.launch import launch

    with tempfile.TemporaryDirectory() as tmp:
        root = a.out or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        settings = {
            k: getattr(a, k) for k in ("steps", "density", "period", "batch_size", "integration", "seed")
        }
        print(
            f"tiny GPT, 2 gloo ranks, {settings}; bytes = runtime StepMetrics per step and rank", flush=True
        )
        if not a.table_only:
            launch(_train_all, nproc=2, backend="gloo", args=(str(root), settings), timeout_s=900)
        print(
            f"{'policy':<11} {'idx,val B':>9} {'wire B/step':>11} {'values':>8} {'indices':>8} {'meta':>5} "
            f"{'dense':>6} {'x (8,4)':>8} {'x (4,4)':>8} {'eval loss':>9} {'train loss':>10}"
        )
        for policy in POLICIES:
            rows = {w: _row(root / f"{policy}-{w[0]}-{w[1]}") for w in WIDTHS}
            for (ib, vb), r in rows.items():
                print(
                    f"{policy:<11} {f'{ib},{vb}':>9} {r['wire_bytes']:>11.0f} {r['values_bytes']:>8.0f} "
                    f"{r['indices_bytes']:>8.0f} {r['metadata_bytes']:>5.0f} {r['dense_bytes']:>6.0f} "
                    f"{r['wire_bytes'] / rows[(8, 4)]['wire_bytes']:>8.3f} "
                    f"{r['wire_bytes'] / rows[(4, 4)]['wire_bytes']:>8.3f} "
                    f"{r['loss_before_flush']:>9.4f} {r['final_train_loss']:>10.4f}"
                )


if __name__ == "__main__":
    main()
