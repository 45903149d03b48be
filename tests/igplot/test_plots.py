"""igplot's figures: each writes a PNG and draws what it is given (checked on the figure's artists)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from igplot import plot_bench, plot_sweep

PNG = b"\x89PNG\r\n\x1a\n"


def _rows():
    rows = []
    for w in (8, 1024):
        for bw in (1e8, 1e9, 1e10):
            for pol, scale in (("dense", 1.0), ("topk", 1.0 if w == 1024 else 0.03), ("importance", 0.01)):
                rows.append({"world_size": w, "policy": pol, "bandwidth_bytes_per_s": bw,
                             "step_s_mean": 1e6 * scale / bw + 0.01, "wire_bytes": 1e8 * scale})  # fmt: skip
    return rows


def test_sweep_figure_shares_y_per_row_and_keeps_overlapping_lines_visible(tmp_path: Path, monkeypatch):
    import igplot.plots as plots

    seen = {}
    real_save = plots._save

    def capture(fig, path):
        seen["fig"] = fig
        return real_save(fig, path)

    monkeypatch.setattr(plots, "_save", capture)
    out = plot_sweep(_rows(), tmp_path / "sweep.png", title="t")
    assert out.read_bytes()[:8] == PNG
    axes = seen["fig"].axes
    assert len(axes) == 4  # 2 rows x 2 world sizes
    top, bottom = axes[:2], axes[2:]
    assert top[0].get_ylim() == top[1].get_ylim() and bottom[0].get_ylim() == bottom[1].get_ylim()
    # at 1,024 ranks topk's bytes equal dense's: the two lines coincide but differ in style and marker
    lines = {ln.get_label(): ln for ln in bottom[1].get_lines()}
    assert list(lines["topk"].get_ydata()) == list(lines["dense"].get_ydata())
    assert (lines["topk"].get_linestyle(), lines["topk"].get_marker()) != (
        lines["dense"].get_linestyle(),
        lines["dense"].get_marker(),
    )
    assert lines["dense"].get_markersize() > lines["topk"].get_markersize()


def test_bench_figure(tmp_path: Path):
    stats = {
        "ddp": {"bytes_per_step": 9e7, "step_ms": 1000.0, "own_ms": 0.0, "cpu_vs_ddp": 1.0},
        "powersgd1": {"bytes_per_step": 4e5, "step_ms": 1090.0, "own_ms": 170.0, "cpu_vs_ddp": 1.07},
        "importance": {"bytes_per_step": 4.7e5, "step_ms": 880.0, "own_ms": 130.0, "cpu_vs_ddp": 0.91},
    }
    out = plot_bench(stats, tmp_path / "b" / "bench.png", title="bench")
    assert out.read_bytes()[:8] == PNG


def test_sweep_figure_of_no_rows(tmp_path: Path):
    assert plot_sweep([], tmp_path / "e.png").read_bytes()[:8] == PNG
