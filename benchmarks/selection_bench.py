"""How fast is magnitude selection? torch.topk vs the old and the new TopK / ADTopK, side by side.

One process, ``--threads`` torch threads (default 1, for stable ratios on a shared machine). For each
size, a heavy-tailed gradient-like matrix (``randn * exp(randn)``, fp32, fixed seed) and
``k = ceil(density * numel)``; every method runs ``--runs`` times, round-robin (so a load spike hits
all of them alike), and the table gives min and median wall time, the ratio of torch.topk's median to
the method's, and whether the method selected exactly the indices of the old implementation.

- ``torch.topk``: ``torch.topk(x.abs().flatten(), k, sorted=False)`` — values and indices only, no
  zero handling, no sort of the indices: the floor the old TopK sat on.
- ``old topk`` / ``old adtopk``: the implementations before the sampled fast path (below, verbatim).
- ``topk`` / ``adtopk``: :class:`igrt.sync.sparsifiers.TopK` / :class:`igrt.sync.sparsifiers.ADTopK`.

    python benchmarks/selection_bench.py            # 1M, 10M and 50M entries at density 0.01
    python benchmarks/selection_bench.py --quick    # 1M only
    python benchmarks/selection_bench.py --device cuda --threads 16
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch

from igrt.sync.sparsifiers import ADTopK, TopK

SHAPES = {"1M": (1000, 1000), "10M": (2500, 4000), "50M": (5000, 10000)}


# --- the implementations before the sampled fast path (igrt/sync/sparsifiers.py at 7bad1e8) ------------


def _old_topk_nonzero(mag: torch.Tensor, k: int) -> torch.Tensor:
    nnz = int(torch.count_nonzero(mag))
    k = min(int(k), nnz)
    if k <= 0:
        return torch.empty(0, dtype=torch.int64, device=mag.device)
    if k == mag.numel():
        return torch.arange(k, device=mag.device, dtype=torch.int64)
    if k == nnz:
        return torch.nonzero(mag, as_tuple=True)[0]
    if 4 * nnz < mag.numel():
        nz = torch.nonzero(mag, as_tuple=True)[0]
        return nz[torch.topk(mag[nz], k, sorted=False).indices]
    return torch.topk(mag, k, sorted=False).indices


def old_topk(x: torch.Tensor, k: int) -> torch.Tensor:
    """TopK.select before the fast path (ties at the k-th magnitude: torch.topk's arbitrary order)."""
    return torch.sort(_old_topk_nonzero(x.detach().flatten().abs(), k)).values


def old_adtopk(x: torch.Tensor, k: int) -> torch.Tensor:
    """ADTopK.select before the fast path (ties at a cut: torch.topk's arbitrary order)."""
    mag = x.detach().abs()
    if mag.dim() < 2 or mag.shape[0] <= 1 or mag.numel() // mag.shape[0] <= 1:
        return torch.sort(_old_topk_nonzero(mag.flatten(), k)).values
    mag = mag.reshape(mag.shape[0], -1)
    nonzero = mag != 0
    nnz = int(nonzero.sum())
    k = min(int(k), nnz)
    if k <= 0:
        return torch.empty(0, dtype=torch.int64, device=x.device)
    if k == nnz:
        return torch.nonzero(nonzero.flatten()).flatten()
    chosen = torch.zeros_like(nonzero)
    half = k // 2
    for dim, budget in ((1, half), (0, k - half)):
        live = nonzero.any(dim=dim)
        num_live = int(live.sum())
        share = budget // num_live if num_live else 0
        share = min(share, mag.shape[dim])
        if share == 0:
            continue
        idx = torch.topk(mag, share, dim=dim, sorted=False).indices
        chosen.scatter_(dim, idx, True)
    chosen &= nonzero
    flat_chosen = chosen.flatten()
    missing = k - int(flat_chosen.sum())
    if missing > 0:
        rest = mag.flatten().masked_fill(flat_chosen, 0)
        flat_chosen[_old_topk_nonzero(rest, missing)] = True
    return torch.nonzero(flat_chosen).flatten()


# --- the benchmark ------------------------------------------------------------------------------------


def _methods() -> dict:
    return {
        "torch.topk": lambda x, k: torch.topk(x.abs().flatten(), k, sorted=False),
        "old topk": old_topk,
        "topk": lambda x, k: TopK().select(x, k),
        "old adtopk": old_adtopk,
        "adtopk": lambda x, k: ADTopK().select(x, k),
    }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bench(size: str, *, density: float, runs: int, device: torch.device) -> list[tuple]:
    gen = torch.Generator().manual_seed(0)
    shape = SHAPES[size]
    x = (torch.randn(shape, generator=gen) * torch.exp(torch.randn(shape, generator=gen))).to(device)
    k = math.ceil(density * x.numel())
    methods = _methods()
    times: dict[str, list[float]] = {name: [] for name in methods}
    picks: dict[str, torch.Tensor] = {}
    for _ in range(runs):
        for name, fn in methods.items():
            _sync(device)
            t0 = time.perf_counter()
            out = fn(x, k)
            _sync(device)
            times[name].append(time.perf_counter() - t0)
            picks[name] = out
    base = statistics.median(times["torch.topk"])
    same = {
        "torch.topk": "-",
        "old topk": "-",
        "topk": "yes" if torch.equal(picks["topk"], picks["old topk"]) else "NO",
        "old adtopk": "-",
        "adtopk": "yes" if torch.equal(picks["adtopk"], picks["old adtopk"]) else "NO",
    }
    rows = []
    for name, ts in times.items():
        med = statistics.median(ts)
        rows.append((size, f"{shape[0]}x{shape[1]}", name, min(ts) * 1e3, med * 1e3, base / med, same[name]))
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1M entries only")
    ap.add_argument("--sizes", default="1M,10M,50M", help=f"comma-separated, of {', '.join(SHAPES)}")
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    if args.runs < 1:
        raise SystemExit("--runs must be >= 1")
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    sizes = ["1M"] if args.quick else [s.strip() for s in args.sizes.split(",") if s.strip()]
    unknown = [s for s in sizes if s not in SHAPES]
    if unknown:
        raise SystemExit(f"unknown size(s) {unknown}; known: {', '.join(SHAPES)}")
    print(
        f"density {args.density}, fp32, {args.runs} runs each (round-robin), {args.threads} thread(s), "
        f"device {device}, torch {torch.__version__}"
    )
    print("| size | shape | method | min ms | median ms | x torch.topk | same as old |")
    print("|---|---|---|---|---|---|---|")
    for size in sizes:
        for row in bench(size, density=args.density, runs=args.runs, device=device):
            print("| {} | {} | {} | {:.1f} | {:.1f} | {:.2f} | {} |".format(*row))


if __name__ == "__main__":
    main()
