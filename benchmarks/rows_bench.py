"""Row-sparse embeddings: bytes per step and held-out loss with and without them.

    /work/venv/bin/python benchmarks/rows_bench.py
    /work/venv/bin/python benchmarks/rows_bench.py --steps 100 --integration ddp-hook

A sibling of benchmarks/wire_bench.py (same tiny GPT on 2 gloo ranks, same seed, same hand plan for
the importance policy): Top-k+EF and the importance policy at (index, value) bytes (4,4) and
(2,1), each with ``row_sparse_embeddings`` off and on. Bytes are the runtime's own StepMetrics
(mean per step and rank); the loss is the held-out loss **before** the final flush. With rows on,
the token embedding sends ``ceil(k / dim)`` whole rows of largest accumulated norm instead of its
k largest entries: the same values, ``dim`` times fewer index bytes, a different selection.
Prints one table; nothing is asserted.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

try:
    import benchmarks.wire_bench as wb
except ImportError:  # run as a script: benchmarks/ is on sys.path
    import wire_bench as wb

WIDTHS = ((4, 4), (2, 1))
POLICIES = ("topk", "importance")


def _train_all(ctx, root: str, args: dict) -> int:
    from igpolicy.config import PolicyConfig
    from igrt.sync.synchronizer import build_param_infos, named_parameters
    from igrt.train.loop import TrainOptions, train_on_rank
    from igrt.workloads import make_workload

    seed = args["seed"]
    infos = build_param_infos(
        named_parameters(make_workload(args["workload"], tiny=args["tiny"], seed=seed).model)
    )
    plan = wb._hand_plan(infos, args["period"])
    for policy in args["policies"]:
        for ib, vb in args["widths"]:
            for rows in (False, True):
                config = PolicyConfig(
                    policy=policy, density=args["density"], release_period=args["period"], index_bytes=ib,
                    value_bytes=vb, collective="sparse", seed=seed, row_sparse_embeddings=rows,
                )  # fmt: skip
                options = TrainOptions(
                    workload=args["workload"], tiny=args["tiny"], config=config, steps=args["steps"],
                    batch_size=args["batch_size"], integration=args["integration"],
                    plan=plan if policy == "importance" else None, seed=seed, evaluate=True, progress=False,
                    quiet=True, out=str(Path(root) / f"{policy}-{ib}-{vb}-{int(rows)}"),
                )  # fmt: skip
                train_on_rank(
                    ctx, options, workload=make_workload(args["workload"], tiny=args["tiny"], seed=seed)
                )
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="gpt", help="gpt (the tiny GPT, default) or minilm")
    ap.add_argument("--steps", type=int, default=60, help="optimizer steps per run (default 60)")
    ap.add_argument("--density", type=float, default=0.01, help="Top-k density (default 0.01)")
    ap.add_argument("--period", type=int, default=4, help="importance: release period R (default 4)")
    ap.add_argument("--batch-size", type=int, default=8, help="examples per rank (default 8)")
    ap.add_argument("--integration", choices=("sync", "ddp-hook"), default="sync")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--policies", default=",".join(POLICIES), help="comma-separated (default topk,importance)"
    )
    ap.add_argument(
        "--widths", default="4:4,2:1", help="index:value byte pairs, comma-separated (default 4:4,2:1)"
    )
    ap.add_argument("--out", type=Path, default=None, help="keep the runs here (default: a temporary folder)")
    ap.add_argument("--table-only", action="store_true", help="print the table of the runs already in --out")
    a = ap.parse_args()
    from igrt.train.launch import launch

    with tempfile.TemporaryDirectory() as tmp:
        root = a.out or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        settings = {
            k: getattr(a, k)
            for k in ("workload", "steps", "density", "period", "batch_size", "integration", "seed")
        }
        settings["tiny"] = a.workload == "gpt"
        settings["policies"] = a.policies.split(",")
        settings["widths"] = [tuple(int(x) for x in w.split(":")) for w in a.widths.split(",")]
        print(f"{a.workload}{' (tiny)' if settings['tiny'] else ''}, 2 gloo ranks, {settings}", flush=True)
        if not a.table_only:
            launch(_train_all, nproc=2, backend="gloo", args=(str(root), settings), timeout_s=3600)
        print(
            f"{'policy':<11} {'idx,val':>7} {'rows':>4} {'wire B/step':>11} {'values':>8} {'indices':>8} "
            f"{'meta':>5} {'x rows off':>10} {'eval loss':>9} {'train loss':>10}"
        )
        for policy in settings["policies"]:
            for ib, vb in settings["widths"]:
                off = wb._row(root / f"{policy}-{ib}-{vb}-0")
                for rows in (0, 1):
                    r = wb._row(root / f"{policy}-{ib}-{vb}-{rows}")
                    print(
                        f"{policy:<11} {f'{ib},{vb}':>7} {'on' if rows else 'off':>4} {r['wire_bytes']:>11.0f} "
                        f"{r['values_bytes']:>8.0f} {r['indices_bytes']:>8.0f} {r['metadata_bytes']:>5.0f} "
                        f"{r['wire_bytes'] / off['wire_bytes']:>10.3f} {r['loss_before_flush']:>9.4f} "
                        f"{r['final_train_loss']:>10.4f}"
                    )


if __name__ == "__main__":
    main()
