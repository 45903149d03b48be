"""Measuring a real step: phase timers and the StepMetrics rows the runtime emits.

The runtime emits :class:`igpolicy.vocab.StepMetrics` with ``source="real"``, column for column
what the simulator emits with ``source="sim"``. Phase times (select, pack, comm, scatter, …) go in
``extra`` as ``<phase>_s``. On CUDA the timer synchronizes the device at phase boundaries, so a
phase's time is its device time, not its launch time.
"""

from __future__ import annotations

import csv
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from igpolicy.vocab import StepMetrics

__all__ = ["MetricsLog", "PhaseTimer"]


class PhaseTimer:
    """Accumulates wall seconds per named phase; ``sync_cuda`` waits for the device at boundaries."""

    def __init__(self, *, sync_cuda: bool = False) -> None:
        self.sync_cuda = bool(sync_cuda) and torch.cuda.is_available()
        self.seconds: dict[str, float] = {}

    def _sync(self) -> None:
        if self.sync_cuda:
            torch.cuda.synchronize()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self._sync()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._sync()
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0

    def get(self, name: str) -> float:
        return self.seconds.get(name, 0.0)

    def as_extra(self) -> dict[str, float]:
        """{``<phase>_s``: seconds}."""
        return {f"{k}_s": v for k, v in sorted(self.seconds.items())}


class MetricsLog:
    """The StepMetrics rows of one rank, in step order, with a CSV writer."""

    def __init__(self) -> None:
        self.rows: list[StepMetrics] = []

    def append(self, row: StepMetrics) -> None:
        self.rows.append(row)

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[StepMetrics]:
        return iter(self.rows)

    def __getitem__(self, index: int) -> StepMetrics:
        return self.rows[index]

    def totals(self) -> dict[str, float]:
        """Sums of the byte, collective and time columns over all rows."""
        keys = (
            "values_bytes",
            "indices_bytes",
            "dense_bytes",
            "metadata_bytes",
            "num_collectives",
            "comm_s",
            "step_s",
        )
        out = {k: float(sum(getattr(r, k) for r in self.rows)) for k in keys}
        out["wire_bytes"] = float(sum(r.wire_bytes for r in self.rows))
        return out

    def write_csv(self, path: str | Path) -> Path:
        """Write every row (StepMetrics columns, then the union of ``x_`` extras, sorted)."""
        path = Path(path)
        rows = [r.to_row() for r in self.rows]
        extra = sorted({k for row in rows for k in row if k.startswith("x_")})
        columns = [*StepMetrics.columns(), *extra]
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            for row in rows:
                writer.writerow({c: row.get(c, "") for c in columns})
        return path
