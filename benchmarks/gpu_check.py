"""GPU check of igrt's sparse synchronization: kernel timings and the Synchronizer over NCCL.

    python benchmarks/gpu_check.py                 # on a CUDA machine
    python benchmarks/gpu_check.py --cpu-smoke     # the same code paths on the CPU, shapes / 64, gloo

1. Times the per-parameter pieces of a step (median over ``--reps`` after a warm-up, device
   synchronized around each): residual update ``u = g + e``, Top-k and ADTopk selection, packing
   (gather + cast + encode), the residual update after a send, and the scatter of the averaged
   pairs back into a gradient; on 4096x4096, 4096x11008 and 32000x4096 in fp32 and bf16, at
   ``--density`` (default 0.01).
2. Runs the Synchronizer on CUDA tensors over NCCL, at world size 1 and (when more than one GPU is
   visible) at all visible GPUs, for the dense, topk, adtopk and importance policies in fp32 and
   bf16; checks conservation (Σg == Σsent + e), that dense equals the plain all-reduce mean, and that
   every rank holds the same gradient; prints one table row per (policy, dtype, world size).

Without CUDA it prints "no CUDA" and exits 0.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist

from igpolicy.config import PolicyConfig
from igpolicy.decide import nominal_k
from igpolicy.plan import ComponentPlan, SyncPlan
from igpolicy.vocab import ComponentClass
from igrt.sync.comm import aggregate_pairs, encode_pairs
from igrt.sync.residuals import ResidualState
from igrt.sync.sparsifiers import ADTopK, TopK
from igrt.sync.synchronizer import Synchronizer

SHAPES = {
    "model.layers.0.self_attn.q_proj.weight": (4096, 4096),
    "model.layers.0.mlp.up_proj.weight": (4096, 11008),
    "model.embed_tokens.weight": (32000, 4096),
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
POLICIES = ("dense", "topk", "adtopk", "importance")


def _shapes(scale: int) -> dict[str, tuple[int, int]]:
    return {n: (max(2, a // scale), max(2, b // scale)) for n, (a, b) in SHAPES.items()}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_ms(fn, device: torch.device, reps: int) -> float:
    fn()  # warm-up (allocations, kernel selection)
    times = []
    for _ in range(reps):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _grad(shape, dtype, device, *, row_sparse: bool, seed: int) -> torch.Tensor:
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(shape, generator=g, device=device, dtype=torch.float32)
    if row_sparse:  # an embedding gradient: a batch touches a few hundred rows
        keep = torch.zeros(shape[0], dtype=torch.bool, device=device)
        keep[torch.randint(0, shape[0], (512,), generator=g, device=device)] = True
        x[~keep] = 0.0
    return x.to(dtype)


# --------------------------------------------------------------------------- 1. kernels
def kernel_table(device: torch.device, *, scale: int, reps: int, density: float) -> None:
    cols = ("shape", "dtype", "k", "residual", "topk", "adtopk", "pack", "after_send", "scatter")
    print(f"\n== per-parameter kernels (ms, median of {reps}) on {device} ==")
    print(" | ".join(f"{c:>11}" for c in cols))
    for name, shape in _shapes(scale).items():
        for dname, dtype in DTYPES.items():
            g = _grad(shape, dtype, device, row_sparse=False, seed=1)
            k = nominal_k(g.numel(), density)
            res = ResidualState()
            u = res.accumulate(name, g)
            idx = TopK().select(u, k)
            wire = torch.float32 if dtype == torch.float32 else torch.bfloat16
            vals = u.view(-1)[idx].to(wire)
            grad_out = torch.empty(shape, dtype=dtype, device=device)

            def pack(u=u, idx=idx, wire=wire, k=k):
                v = u.view(-1)[idx].to(wire)
                return encode_pairs(idx.to(torch.int32), v, capacity=k)

            def after_send(u=u, idx=idx, res=res, name=name):
                res.after_send(name, u, idx)

            numel = g.numel()

            def scatter(idx=idx, vals=vals, grad_out=grad_out, numel=numel):
                acc = aggregate_pairs([(idx.to(torch.int32), vals)] * 2, numel=numel, device=device)
                grad_out.view(-1).copy_(acc)

            row = [
                "x".join(map(str, shape)),
                dname,
                str(k),
                _time_ms(lambda g=g, res=res, name=name: res.accumulate(name, g), device, reps),
                _time_ms(lambda u=u, k=k: TopK().select(u, k), device, reps),
                _time_ms(lambda u=u, k=k: ADTopK().select(u, k), device, reps),
                _time_ms(pack, device, reps),
                _time_ms(after_send, device, reps),
                _time_ms(scatter, device, reps),
            ]
            print(" | ".join(f"{c:>11}" if isinstance(c, str) else f"{c:>11.3f}" for c in row))
            del g, u, idx, vals, grad_out, res
    if device.type == "cuda":
        torch.cuda.empty_cache()


# --------------------------------------------------------------------------- 2. the synchronizer
def _plan(names) -> SyncPlan:
    from igpolicy.components import param_infos

    infos = param_infos([(n, (1, 1), "float32") for n in names])
    keys = sorted({i.component for i in infos})
    comps = [
        ComponentPlan(
            key=k,
            score=1.0,
            cls=ComponentClass.LOW if "embedding" in k else ComponentClass.IMPORTANT,
            phase=0 if "embedding" in k else None,
            expected_bytes=1,
        )
        for k in keys
    ]
    return SyncPlan(release_period=2, components=tuple(comps))


def _check_run(rank: int, world: int, device: torch.device, policy: str, dtype, *, scale: int, steps: int):
    shapes = _shapes(scale)
    params = [(n, torch.nn.Parameter(torch.zeros(s, dtype=dtype, device=device))) for n, s in shapes.items()]
    cfg = PolicyConfig(
        policy=policy, density=0.01, release_period=2, value_bytes=4 if dtype == torch.float32 else 2
    )
    plan = _plan(shapes) if policy == "importance" else None
    sync = Synchronizer(params, config=cfg, plan=plan, track_sums=True)
    worst_gap, mismatch, dense_err = 0.0, 0.0, 0.0
    for t in range(steps):
        for j, (n, p) in enumerate(params):
            p.grad = _grad(p.shape, dtype, device, row_sparse="embed" in n, seed=1000 * rank + 10 * t + j)
        local = {n: p.grad.float().clone() for n, p in params} if policy == "dense" else {}
        row = sync.step()
        gaps = sync.residuals.conservation_gap()
        scale_g = max(float(sync.residuals.sums(n)[0].abs().max()) for n in gaps) + 1.0
        worst_gap = max(worst_gap, max(gaps.values()) / scale_g)
        for n, p in params:
            if p.grad is None:
                continue
            if local:  # the oracle: the plain all-reduce mean of the local gradients
                ref = local[n]
                if world > 1:
                    dist.all_reduce(ref)
                ref /= world
                tol = 1e-6 if dtype == torch.float32 else 1e-2
                dense_err = max(
                    dense_err, float((p.grad.float() - ref).abs().max()) / (float(ref.abs().max()) + tol)
                )
            if world > 1:
                mine = torch.tensor([float(p.grad.double().sum())], device=device, dtype=torch.float64)
                both = [torch.zeros_like(mine) for _ in range(world)]
                dist.all_gather(both, mine)
                mismatch = max(mismatch, max(abs(float(b - mine)) for b in both))
    x = row.extra
    return {
        "policy": policy,
        "dtype": "fp32" if dtype == torch.float32 else "bf16",
        "world": world,
        "wire_MB": row.wire_bytes / 2**20,
        "collectives": row.num_collectives,
        "select_ms": 1e3 * x.get("select_s", 0.0),
        "pack_ms": 1e3 * x.get("pack_s", 0.0),
        "comm_ms": 1e3 * row.comm_s,
        "scatter_ms": 1e3 * x.get("scatter_s", 0.0),
        "step_ms": 1e3 * row.step_s,
        "conservation_gap": worst_gap,
        "rank_mismatch": mismatch,
        "dense_rel_err": dense_err,
    }


def _rank_main(rank: int, world: int, port: int, backend: str, scale: int, steps: int, out) -> None:
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        rows = []
        for policy in POLICIES:
            for dtype in DTYPES.values():
                rows.append(_check_run(rank, world, device, policy, dtype, scale=scale, steps=steps))
                if device.type == "cuda":
                    torch.cuda.empty_cache()
        if out is not None:
            out.put((rank, rows))
        elif rank == 0:
            _print_rows(rows)
    finally:
        dist.destroy_process_group()


def _print_rows(rows) -> None:
    cols = list(rows[0])
    print(" | ".join(f"{c:>13}" for c in cols))
    for r in rows:
        print(" | ".join(f"{v:>13.4g}" if isinstance(v, float) else f"{v!s:>13}" for v in r.values()))
    bad = [
        r for r in rows if r["conservation_gap"] > 1e-5 or r["rank_mismatch"] > 0 or r["dense_rel_err"] > 1e-2
    ]
    print(
        "checks:",
        "all passed" if not bad else f"FAILED for {[(r['policy'], r['dtype'], r['world']) for r in bad]}",
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def synchronizer_table(*, backend: str, world: int, scale: int, steps: int) -> None:
    print(f"\n== Synchronizer over {backend}, world size {world} (last of {steps} steps) ==")
    if world == 1:
        _rank_main(0, 1, _free_port(), backend, scale, steps, None)
        return
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_rank_main, args=(r, world, port, backend, scale, steps, out))
        for r in range(world)
    ]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=600) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    _print_rows(results[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=10, help="timed repetitions per kernel (median)")
    parser.add_argument("--density", type=float, default=0.01, help="Top-k density for the kernel table")
    parser.add_argument("--steps", type=int, default=3, help="synchronizer steps per configuration")
    parser.add_argument("--cpu-smoke", action="store_true", help="run on the CPU with shapes / 64 over gloo")
    args = parser.parse_args(argv)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    if args.cpu_smoke:
        torch.set_num_threads(1)
        device, backend, scale, worlds = torch.device("cpu"), "gloo", 64, [1, 2]
    elif not torch.cuda.is_available():
        print("gpu_check: no CUDA device visible (torch.cuda.is_available() is False); nothing to check.")
        return 0
    else:
        device, backend, scale = torch.device("cuda", 0), "nccl", 1
        n = torch.cuda.device_count()
        worlds = [1] if n == 1 else [1, n]
        print(f"gpu_check: {n} x {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    kernel_table(device, scale=scale, reps=args.reps, density=args.density)
    for world in worlds:
        synchronizer_table(backend=backend, world=world, scale=scale, steps=args.steps)
    if not args.cpu_smoke and worlds == [1]:
        print("\n(one GPU visible: the multi-GPU run needs more than one)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
