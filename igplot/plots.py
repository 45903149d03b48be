"""The figures of a training run and of a replay, drawn with one style.

Figures are built on ``matplotlib.figure.Figure`` with the Agg canvas (no pyplot, no global
backend switch, no display needed), so plotting is safe in any process, including a training rank.
Times are given in seconds and bytes in bytes; the axes choose readable units (ms, kB, MB, ...).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

__all__ = ["plot_bench", "plot_quality_vs_bytes", "plot_replay", "plot_run", "plot_sweep"]

MEASURED, PREDICTED, EXTRA, FLOOR = "#1f4e99", "#e07b00", "#2a9d5c", "#888888"
_RC = {
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.titleweight": "bold",
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "legend.frameon": False,
    "legend.fontsize": 8,
}


def _figure(num_rows: int, num_cols: int, *, width: float, height: float, title: str):
    import matplotlib

    with matplotlib.rc_context(_RC):
        fig = Figure(figsize=(width, height), dpi=110, layout="constrained")
        axes = fig.subplots(num_rows, num_cols, squeeze=False)
    fig.suptitle(title, fontsize=11)
    for ax in axes.flat:
        _apply_style(ax)
    return fig, axes


def _apply_style(ax) -> None:
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.grid(True, alpha=0.3)
    ax.tick_params(labelsize=8)
    ax.title.set_fontweight("bold")
    ax.title.set_fontsize(10)


def _save(fig: Figure, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, format="png")
    tmp.replace(path)
    return path


def _byte_unit(values: np.ndarray) -> tuple[float, str]:
    top = float(np.nanmax(values)) if values.size and np.isfinite(values).any() else 0.0
    for scale, unit in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if top >= scale:
            return scale, unit
    return 1.0, "B"


def _time_unit(values: np.ndarray) -> tuple[float, str]:
    top = float(np.nanmax(values)) if values.size and np.isfinite(values).any() else 0.0
    if top >= 10.0:
        return 1.0, "s"
    if top >= 1e-2:
        return 1e-3, "ms"
    return 1e-6, "µs"


def _arr(values: Sequence[float | None] | None) -> np.ndarray:
    if values is None:
        return np.array([], dtype=float)
    return np.array([np.nan if v is None else float(v) for v in values], dtype=float)


def _smooth(y: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over ``window`` points (NaNs ignored)."""
    out = np.full_like(y, np.nan)
    for i in range(len(y)):
        part = y[max(0, i - window + 1) : i + 1]
        if np.isfinite(part).any():
            out[i] = np.nanmean(part)
    return out


def _empty(ax, message: str) -> None:
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes, color=FLOOR)
    ax.set_xticks([])
    ax.set_yticks([])


def _series(ax, x: np.ndarray, y: np.ndarray, *, color: str, label: str | None, smooth: bool = True) -> None:
    """A per-step series: the raw points, and a trailing mean on top when there are many."""
    if len(x) > 30 and smooth:
        window = max(5, len(x) // 20)
        ax.plot(x, y, color=color, alpha=0.25, linewidth=0.8)
        mean = f"mean of {window} steps"
        ax.plot(x, _smooth(y, window), color=color, linewidth=1.6, label=f"{label}, {mean}" if label else mean)
    else:
        ax.plot(x, y, color=color, linewidth=1.4, marker="o" if len(x) <= 30 else None, markersize=3, label=label)


def plot_run(
    path: str | Path,
    *,
    title: str,
    steps: Sequence[int],
    loss: Sequence[float],
    wire_bytes: Sequence[float],
    step_s: Sequence[float],
    exposed_comm_s: Sequence[float | None] | None = None,
    eval_steps: Sequence[int] = (),
    eval_values: Sequence[float] = (),
    eval_name: str = "loss",
    floor: float | None = None,
    flush_bytes: float | None = None,
) -> Path:
    """Write the 2 x 2 figure of a training run to ``path`` (PNG) and return ``path``.

    ``steps`` are optimizer steps (1-based: step 1 is the first update); ``loss``, ``wire_bytes``
    (bytes per rank on the wire) and ``step_s`` (seconds) are per step; ``eval_*`` are the held-out
    evaluations (step 0 = before training); ``floor`` draws a majority-class floor on the metric
    panel; ``flush_bytes`` notes the end-of-training flush on the bytes panel.
    """
    x = np.asarray(steps, dtype=float)
    fig, axes = _figure(2, 2, width=10, height=6.4, title=title)
    (a_loss, a_eval), (a_bytes, a_time) = axes

    a_loss.set_title("training loss")
    if len(x):
        _series(a_loss, x, _arr(loss), color=MEASURED, label=None)
        if len(x) > 30:
            a_loss.legend(loc="best")
    else:
        _empty(a_loss, "no steps")
    a_loss.set_xlabel("step")
    a_loss.set_ylabel("loss (mean over ranks)")

    a_eval.set_title(f"held-out {eval_name}")
    ev_x, ev_y = np.asarray(eval_steps, dtype=float), _arr(eval_values)
    if len(ev_x):
        a_eval.plot(ev_x, ev_y, color=EXTRA, marker="o", markersize=4, linewidth=1.4, label=f"held-out {eval_name}")
        for xi, yi in zip(ev_x, ev_y):
            a_eval.annotate(f"{yi:.3g}", (xi, yi), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7)
        if floor is not None:
            a_eval.axhline(floor, color=FLOOR, linestyle="--", linewidth=1.0, label=f"majority-class floor {floor:.3g}")
            a_eval.legend(loc="lower right")
        if eval_name == "accuracy":
            a_eval.set_ylim(-0.02, 1.08)
        else:
            lo, hi = float(np.nanmin(ev_y)), float(np.nanmax(ev_y))
            pad = 0.1 * (hi - lo) if hi > lo else 0.05 * max(abs(hi), 1e-9)
            a_eval.set_ylim(lo - pad, hi + 2 * pad)
        a_eval.set_xlabel("step (0: before training; last: after the final flush)")
        a_eval.set_ylabel(eval_name)
    else:
        _empty(a_eval, "no held-out evaluation (--no-eval)")

    b = _arr(wire_bytes)
    scale, unit = _byte_unit(b)
    flush = "" if flush_bytes is None else f"; final flush {flush_bytes / scale:.3g} {unit}"
    a_bytes.set_title(f"bytes on the wire per step, per rank{flush}")
    if len(x):
        a_bytes.fill_between(x, b / scale, step="mid", color=MEASURED, alpha=0.25, linewidth=0)
        a_bytes.step(x, b / scale, where="mid", color=MEASURED, linewidth=1.2)
        a_bytes.set_ylabel(unit)
        a_bytes.set_ylim(0, 1.15 * float(np.nanmax(b / scale)) if np.nanmax(b) > 0 else 1.0)
    else:
        _empty(a_bytes, "no steps")
    a_bytes.set_xlabel("step")

    a_time.set_title("step time (slowest rank)")
    t = _arr(step_s)
    if len(x):
        exp = _arr(exposed_comm_s)
        scale, unit = _time_unit(t)
        _series(a_time, x, t / scale, color=MEASURED, label="step")
        if exp.size and np.isfinite(exp).any():
            _series(a_time, x, exp / scale, color=PREDICTED, label="exposed comm")
        a_time.set_ylabel(unit)
        a_time.set_ylim(bottom=0)
        a_time.legend(loc="best")
    else:
        _empty(a_time, "no steps")
    a_time.set_xlabel("step")
    return _save(fig, path)


def plot_replay(
    path: str | Path,
    *,
    title: str,
    steps: Sequence[int],
    measured_step_s: Sequence[float],
    predicted_step_s: Sequence[float],
    measured_comm_s: Sequence[float],
    predicted_comm_s: Sequence[float],
    measured_bytes: Sequence[float],
    predicted_bytes: Sequence[float],
    note: str | None = None,
) -> Path:
    """Write the 1 x 3 figure of a replay (measured vs predicted, per step) to ``path`` (PNG).

    Times in seconds (``*_comm_s``: communication time per step, mean over ranks), bytes per rank.
    ``note`` is printed under the title (e.g. that the topology is a nominal one).
    """
    x = np.asarray(steps, dtype=float)
    fig, axes = _figure(1, 3, width=12, height=3.9, title=title)
    a_step, a_comm, a_bytes = axes[0]
    for ax, name, m, p in (
        (a_step, "step time", measured_step_s, predicted_step_s),
        (a_comm, "communication time", measured_comm_s, predicted_comm_s),
    ):
        m, p = _arr(m), _arr(p)
        scale, unit = _time_unit(np.concatenate([m, p]))
        ax.set_title(f"{name} per step")
        _series(ax, x, m / scale, color=MEASURED, label="measured")
        _series(ax, x, p / scale, color=PREDICTED, label="predicted")
        ax.set_xlabel("step")
        ax.set_ylabel(unit)
        ax.set_ylim(bottom=0)
        ax.legend(loc="best")
    m, p = _arr(measured_bytes), _arr(predicted_bytes)
    scale, unit = _byte_unit(np.concatenate([m, p]))
    a_bytes.set_title("bytes per step (per rank)")
    a_bytes.plot(x, m / scale, color=MEASURED, linewidth=3.0, alpha=0.6, label="measured")
    a_bytes.plot(x, p / scale, color=PREDICTED, linewidth=1.2, linestyle="--", label="predicted")
    exact = bool(len(m) == len(p) and np.array_equal(m, p))
    a_bytes.text(
        0.99, 0.03, "identical on every step" if exact else "differ on some steps", transform=a_bytes.transAxes,
        ha="right", va="bottom", fontsize=8, color=EXTRA if exact else "#c0392b",
    )  # fmt: skip
    a_bytes.set_xlabel("step")
    a_bytes.set_ylabel(unit)
    a_bytes.set_ylim(bottom=0)
    a_bytes.legend(loc="upper left")
    if note:  # under the title, where constrained layout leaves room for it
        import textwrap

        a_step.figure.suptitle(title + "\n" + "\n".join(textwrap.wrap(note, 140)), fontsize=9)
    return _save(fig, path)


# one look per policy: colour, line style and marker differ, and the marker shrinks with the order,
# so a policy whose line lies exactly on another's (Top-k = dense bytes where its buckets fall back
# to a dense all-reduce) still shows as a ring around it
_LOOKS = [
    ("#1f4e99", "-", "o"),
    ("#e07b00", "--", "s"),
    ("#2a9d5c", ":", "^"),
    ("#b0306a", "-.", "D"),
    ("#6b4fa0", (0, (5, 1)), "v"),
    ("#8c6d31", (0, (1, 1)), "P"),
]


def _look(i: int) -> dict:
    color, style, marker = _LOOKS[i % len(_LOOKS)]
    size = max(3.0, 8.0 - 1.6 * i)
    return {"color": color, "linestyle": style, "marker": marker, "markersize": size,
            "markerfacecolor": "none" if i == 0 else color, "linewidth": 1.5, "zorder": 3 + i}  # fmt: skip


def plot_sweep(rows: Sequence[dict], path: str | Path, *, title: str = "") -> Path:
    """A sweep's figure: mean step time (top row) and bytes per rank per step (bottom row) against
    link bandwidth, one line per policy, one column per world size; log-log axes, and each row
    shares its y axis so columns compare at a glance. ``rows``: the sweep's result rows
    (``world_size``, ``policy``, ``bandwidth_bytes_per_s``, ``step_s_mean``, ``wire_bytes``)."""
    sizes = sorted({int(r["world_size"]) for r in rows})
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    fig, axes = _figure(2, max(len(sizes), 1), width=3.6 * max(len(sizes), 1) + 0.8, height=6.2, title=title)
    if not rows:
        _empty(axes[0][0], "no rows")
        return _save(fig, path)
    tops = [float(r["step_s_mean"]) for r in rows if r["step_s_mean"] > 0]
    t_scale, t_unit = _time_unit(np.asarray(tops or [1.0]))
    b_scale, b_unit = _byte_unit(np.asarray([max(float(r["wire_bytes"]), 1.0) for r in rows]))
    for j, w in enumerate(sizes):
        for i, pol in enumerate(policies):
            pts = sorted((r for r in rows if int(r["world_size"]) == w and r["policy"] == pol),
                         key=lambda r: r["bandwidth_bytes_per_s"])  # fmt: skip
            if not pts:
                continue
            x = [r["bandwidth_bytes_per_s"] * 8 / 1e9 for r in pts]
            axes[0][j].plot(x, [r["step_s_mean"] / t_scale for r in pts], label=pol, **_look(i))
            axes[1][j].plot(x, [max(r["wire_bytes"], 1.0) / b_scale for r in pts], label=pol, **_look(i))
        axes[0][j].set_title(f"{w} ranks")
        axes[1][j].set_xlabel("link bandwidth (Gbit/s)")
        for ax in (axes[0][j], axes[1][j]):
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.grid(True, which="both", alpha=0.3)
    for row in (0, 1):  # one y range per row: the same scale in every column
        lo = min(ax.get_ylim()[0] for ax in axes[row])
        hi = max(ax.get_ylim()[1] for ax in axes[row])
        for ax in axes[row]:
            ax.set_ylim(lo, hi)
    axes[0][0].set_ylabel(f"mean step time ({t_unit})")
    axes[1][0].set_ylabel(f"bytes per rank per step ({b_unit})")
    axes[0][0].legend(loc="best")
    return _save(fig, path)


def plot_bench(stats: dict[str, dict[str, float]], path: str | Path, *, title: str = "") -> Path:
    """``igrt bench``'s table as bars, one per method: bytes per step (log), step time, own time
    and CPU against plain DDP's. ``stats``: method -> the bench's figures (``bytes_per_step``,
    ``step_ms``, ``own_ms``, ``cpu_vs_ddp`` where measured)."""
    methods = list(stats)
    fig, axes = _figure(2, 2, width=10, height=6.4, title=title)
    panels = [
        (axes[0][0], "bytes on the wire per step, per rank", "bytes_per_step", True),
        (axes[0][1], "step time (slowest rank, median)", "step_ms", False),
        (axes[1][0], "own time (selection, packing, bookkeeping; no wire)", "own_ms", False),
        (axes[1][1], "CPU per step vs plain DDP's", "cpu_vs_ddp", False),
    ]
    x = np.arange(len(methods))
    for ax, name, key, log in panels:
        ax.set_title(name)
        vals = np.array([float(stats[m].get(key, np.nan)) if m != "ddp" or key != "own_ms" else np.nan for m in methods])
        if not np.isfinite(vals).any():
            _empty(ax, "not measured")
            continue
        unit = ""
        if key == "bytes_per_step":
            scale, unit = _byte_unit(vals[np.isfinite(vals)])
            vals = vals / scale
        ours = [m in ("topk", "adtopk", "importance", "dense") for m in methods]
        ax.bar(x, np.nan_to_num(vals), color=[MEASURED if o else PREDICTED for o in ours], alpha=0.85)
        for xi, v in zip(x, vals):
            if np.isfinite(v):
                ax.annotate(f"{v:.3g}", (xi, v), textcoords="offset points", xytext=(0, 2), ha="center", fontsize=7)
            else:
                ax.annotate("-", (xi, 0), textcoords="offset points", xytext=(0, 2), ha="center", fontsize=7)
        if log:
            ax.set_yscale("log")
        if key == "cpu_vs_ddp":
            ax.axhline(1.0, color=FLOOR, linestyle="--", linewidth=1.0)
        ax.set_ylabel(unit or ("x DDP" if key == "cpu_vs_ddp" else "ms"))
        ax.set_xticks(x, methods, rotation=30, ha="right")
    axes[0][0].bar([], [], color=MEASURED, label="ours")
    axes[0][0].bar([], [], color=PREDICTED, label="PyTorch's")
    axes[0][0].legend(loc="best")
    return _save(fig, path)


def plot_quality_vs_bytes(
    curves: Sequence[dict],
    path: str | Path,
    *,
    metric: str,
    floor: float | None = None,
    title: str = "",
) -> Path:
    """Held-out quality against cumulative bytes per rank, one line per curve (a method).

    ``curves``: dicts with ``label``, ``bytes`` (cumulative bytes per rank at each evaluation) and
    ``values`` (the metric there); an optional ``flush_bytes`` draws the last point's flush as a
    dotted step to ``bytes[-1] + flush_bytes`` at ``flush_value`` (the metric after the flush).
    ``floor`` (e.g. the majority-class accuracy) is a grey dashed line. Log x axis: points at 0 bytes
    (the evaluation before training) are left out.
    """
    fig, axes = _figure(1, 1, width=7.0, height=4.4, title=title)
    ax = axes[0][0]
    usable = [c for c in curves if len(c.get("bytes", ())) and len(c.get("values", ()))]
    if not usable:
        _empty(ax, "no curves")
        return _save(fig, path)
    tops = np.asarray([max(max(c["bytes"]), 1.0) + float(c.get("flush_bytes") or 0.0) for c in usable])
    scale, unit = _byte_unit(tops)
    for i, c in enumerate(usable):
        x, y = _arr(c["bytes"]) / scale, _arr(c["values"])
        keep = x > 0  # a log axis: the evaluation before any byte (step 0) is not drawn
        look = _look(i)
        ax.plot(x[keep], y[keep], label=c["label"], **look)
        if c.get("flush_bytes") and c.get("flush_value") is not None and keep.any():
            fx = (float(c["bytes"][-1]) + float(c["flush_bytes"])) / scale
            ax.plot([x[-1], fx], [float(c["values"][-1]), float(c["flush_value"])], color=look["color"],
                    linestyle=":", linewidth=1.0, marker="x", markersize=4)  # fmt: skip
    if floor is not None:
        label = f"majority-class floor {floor:.4g}"
        ax.axhline(floor, color=FLOOR, linestyle="--", linewidth=1.0, label=label)
    ax.set_xscale("log")
    ax.set_xlabel(f"cumulative bytes per rank ({unit}; dotted: the final flush)")
    ax.set_ylabel(f"held-out {metric}")
    if len(usable) <= 3:
        ax.legend(loc="best")
    else:  # more lines than fit beside them: the legend under the axes (the figure grows), never on a curve
        fig.set_figheight(fig.get_figheight() + 0.19 * (len(usable) + (floor is not None)))
        fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncol=1)
    return _save(fig, path)
