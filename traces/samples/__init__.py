"""Sample traces shipped as package data, and a synthetic trace for tests and benchmarks.

Recorded samples live in ``traces/samples/<name>/`` (a manifest plus Parquet parts); the recorder
(``igrt record``) writes them. :func:`sample_trace_path` finds one by name, :func:`available_samples`
lists them. :func:`write_synthetic_trace` writes a small, seeded trace of a made-up Transformer so
the format, the profiler and the simulator can be exercised without training anything; its numbers
are random draws, not measurements, and it says so in ``manifest.extra``.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from igpolicy.vocab import ParamInfo
from traces.schema import MANIFEST_NAME, Manifest
from traces.writer import TraceWriter, write_manifest

__all__ = [
    "SAMPLES_DIR",
    "available_samples",
    "sample_trace_path",
    "synthetic_params",
    "write_synthetic_trace",
]

SAMPLES_DIR = Path(__file__).resolve().parent


def available_samples() -> tuple[str, ...]:
    """Names of the shipped sample traces (sub-folders holding a manifest), sorted."""
    return tuple(sorted(p.name for p in SAMPLES_DIR.iterdir() if (p / MANIFEST_NAME).is_file()))


def sample_trace_path(name: str = "minilm") -> Path:
    """The directory of the shipped sample trace ``name``.

    Raises ValueError naming the available samples when ``name`` is not shipped (yet).
    """
    path = SAMPLES_DIR / name
    if not (path / MANIFEST_NAME).is_file():
        have = ", ".join(available_samples()) or "none recorded yet"
        raise ValueError(f"no sample trace {name!r} in {SAMPLES_DIR} (available: {have})")
    return path


def synthetic_params(*, num_layers: int = 2, hidden: int = 32, vocab: int = 100) -> tuple[ParamInfo, ...]:
    """A made-up decoder's parameters: embedding, per layer q/k/v/o, up/down and two norms, a final norm."""
    shapes: list[tuple[str, tuple[int, ...], str]] = [("embed.weight", (vocab, hidden), "embedding")]
    for layer in range(num_layers):
        pre = f"layers.{layer}"
        for proj, kind in (("q", "attn_q"), ("k", "attn_k"), ("v", "attn_v"), ("o", "attn_o")):
            shapes.append((f"{pre}.attn.{proj}.weight", (hidden, hidden), f"{layer}.{kind}"))
        shapes.append((f"{pre}.mlp.up.weight", (4 * hidden, hidden), f"{layer}.mlp_up"))
        shapes.append((f"{pre}.mlp.down.weight", (hidden, 4 * hidden), f"{layer}.mlp_down"))
        shapes.append((f"{pre}.norm1.weight", (hidden,), f"{layer}.norm"))
        shapes.append((f"{pre}.norm2.weight", (hidden,), f"{layer}.norm"))
    shapes.append(("final_norm.weight", (hidden,), "norm"))
    return tuple(
        ParamInfo(name=n, shape=s, dtype="float32", component=c, order=i)
        for i, (n, s, c) in enumerate(shapes)
    )


def write_synthetic_trace(
    directory: str | Path,
    *,
    num_steps: int = 8,
    world_size: int = 2,
    params: tuple[ParamInfo, ...] | None = None,
    density: float = 0.05,
    rows_per_part: int = 200_000,
    seed: int = 0,
) -> Manifest:
    """Write a seeded synthetic trace (every table, every rank) into ``directory``; returns its manifest.

    Per (step, rank, param): k ~ density · numel (jittered, clipped to [1, numel]); norms, overlap
    and ready times are random but consistent (sel_norm <= grad_norm, sel_max_abs <= sel_norm,
    overlap NaN on step 0). union_k lies in [max k over ranks, min(numel, Σ k)].
    """
    params = params if params is not None else synthetic_params()
    rng = np.random.default_rng(seed)
    names = np.array([p.name for p in params])
    numel = np.array([p.numel for p in params], dtype=np.int64)
    order = np.array([p.order for p in params], dtype=np.float64)
    num_params = len(params)
    writers = [TraceWriter(directory, rank=r, rows_per_part=rows_per_part) for r in range(world_size)]
    for step in range(num_steps):
        ks = []
        for w in writers:
            jitter = rng.uniform(0.5, 1.5, num_params)
            k = np.clip(np.ceil(density * numel * jitter), 1, numel).astype(np.int64)
            grad_norm = rng.gamma(2.0, 1.0, num_params)
            sel_norm = grad_norm * np.sqrt(np.minimum(1.0, k / numel * rng.uniform(5, 20, num_params)))
            sel_max_abs = sel_norm * rng.uniform(1.0 / np.sqrt(k), 1.0)
            overlap = np.full(num_params, np.nan) if step == 0 else rng.uniform(0.0, 1.0, num_params)
            ready_s = 0.001 * (num_params - order) + rng.uniform(0, 1e-4, num_params)
            w.add_param_rows(
                step=np.full(num_params, step),
                param=names,
                numel=numel,
                k=k,
                grad_norm=grad_norm,
                sel_norm=sel_norm,
                sel_max_abs=sel_max_abs,
                overlap=overlap,
                ready_s=ready_s,
            )
            w.add_step_row(
                step=step,
                forward_s=float(rng.uniform(0.05, 0.06)),
                backward_s=float(rng.uniform(0.1, 0.12)),
                optimizer_s=float(rng.uniform(0.005, 0.006)),
                loss=float(3.0 * math.exp(-step / 50) + rng.uniform(0, 0.05)),
            )
            ks.append(k)
        if world_size > 1:
            k_all = np.stack(ks)
            low, high = k_all.max(axis=0), np.minimum(numel, k_all.sum(axis=0))
            union_k = low + np.floor(rng.uniform(0, 1, num_params) * (high - low + 1)).astype(np.int64)
            writers[0].add_union_rows(
                step=np.full(num_params, step), param=names, union_k=np.minimum(union_k, high)
            )
    for w in writers:
        w.close()
    manifest = Manifest(
        workload="synthetic",
        params=params,
        world_size=world_size,
        sparsifier="topk",
        density=density,
        command="traces.samples.write_synthetic_trace",
        extra={"synthetic": True, "seed": seed, "note": "random draws, not measurements"},
    )
    write_manifest(directory, manifest)
    return manifest
