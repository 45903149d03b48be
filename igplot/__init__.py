"""Plots of runs and replays, one style for igsim and igrt: matplotlib (Agg) and numpy only.

- :func:`plot_run`: an ``igrt train`` run — training loss, the held-out metric, bytes per step and
  step time, over steps (``OUT/run.png``);
- :func:`plot_replay`: an ``igsim replay`` — measured against predicted step time, exposed/total
  communication time and bytes per step (``replay.png``);
- :func:`plot_sweep`: an ``igsim sweep`` / ``igsim demo`` — step time and bytes against bandwidth
  per policy, a column per world size, y axes shared per row (``sweep.png``);
- :func:`plot_bench`: an ``igrt bench`` table as bars (``bench.png``);
- :func:`plot_quality_vs_bytes`: held-out quality against cumulative bytes, a line per method
  (``experiments.protocol``'s ``quality_vs_bytes.png``).

Inputs are plain sequences (no torch, no igsim/igrt objects), so either package can call them.
"""

from igplot.plots import plot_bench, plot_quality_vs_bytes, plot_replay, plot_run, plot_sweep

__all__ = ["plot_bench", "plot_quality_vs_bytes", "plot_replay", "plot_run", "plot_sweep"]
