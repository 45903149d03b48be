"""Plots of runs and replays, one style for igsim and igrt: matplotlib (Agg) and numpy only.

- :func:`plot_run`: an ``igrt train`` run — training loss, the held-out metric, bytes per step and
  step time, over steps (``OUT/run.png``);
- :func:`plot_replay`: an ``igsim replay`` — measured against predicted step time, exposed/total
  communication time and bytes per step (``replay.png``).

Inputs are plain sequences (no torch, no igsim/igrt objects), so either package can call them.
"""

from igplot.plots import plot_replay, plot_run

__all__ = ["plot_replay", "plot_run"]
