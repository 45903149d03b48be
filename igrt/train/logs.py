"""``igrt train --log tensorboard|csv|jsonl``: each step's numbers where users already look, live.

Rank 0 writes, while training runs: ``OUT/tensorboard/`` (a TensorBoard event file, through
``torch.utils.tensorboard.SummaryWriter``; needs the ``tensorboard`` package, the optional extra
``importance-gradient[tensorboard]``), ``OUT/log.csv`` and ``OUT/log.jsonl``. Every step gives
``train/loss``, ``train/lr``, ``comm/wire_bytes``, ``comm/num_collectives``, ``time/step_s``,
``time/exposed_comm_s`` (rank 0's values); every evaluation gives ``eval/<metric>``. CSV / JSONL
rows are ``{"step", "tag", "value"}``, flushed every row, so ``tail -f`` shows them.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import math
from pathlib import Path
from typing import Any

__all__ = ["LOG_FORMATS", "StepLogger", "check_log_formats"]

LOG_FORMATS = ("tensorboard", "csv", "jsonl")


def check_log_formats(formats: tuple[str, ...]) -> None:
    """ValueError for an unknown format, or ``tensorboard`` without the package."""
    for f in formats:
        if f not in LOG_FORMATS:
            raise ValueError(f"--log {f!r} is not one of {', '.join(LOG_FORMATS)}")
    if "tensorboard" in formats and importlib.util.find_spec("tensorboard") is None:
        raise ValueError(
            "--log tensorboard needs the tensorboard package (pip install 'importance-gradient[tensorboard]')"
        )


class StepLogger:
    """The live logs of one run (open on rank 0 only; a logger with no formats does nothing)."""

    def __init__(self, out: str | Path | None, formats: tuple[str, ...]) -> None:
        check_log_formats(formats)
        self._files: list[Any] = []
        self._csv = self._jsonl = self._tb = None
        if out is None or not formats:
            return
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        if "csv" in formats:
            f = (out / "log.csv").open("a", newline="")
            self._files.append(f)
            self._csv = (f, csv.writer(f))
            if f.tell() == 0:
                self._csv[1].writerow(["step", "tag", "value"])
        if "jsonl" in formats:
            self._jsonl = (out / "log.jsonl").open("a")
            self._files.append(self._jsonl)
        if "tensorboard" in formats:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(out / "tensorboard"))

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """Log ``{tag: value}`` at ``step`` (non-numbers and non-finite values are left out)."""
        clean = {k: float(v) for k, v in values.items() if isinstance(v, (int, float)) and math.isfinite(v)}
        if self._csv is not None:
            f, w = self._csv
            for k, v in clean.items():
                w.writerow([step, k, repr(v)])
            f.flush()
        if self._jsonl is not None:
            for k, v in clean.items():
                self._jsonl.write(json.dumps({"step": step, "tag": k, "value": v}) + "\n")
            self._jsonl.flush()
        if self._tb is not None:
            for k, v in clean.items():
                self._tb.add_scalar(k, v, global_step=step)

    def step(self, row, *, lr: float | None) -> None:
        """One training step's :class:`~igpolicy.vocab.StepMetrics` row (step ``row.step + 1`` done)."""
        self.scalars(
            row.step + 1,
            {
                "train/loss": row.extra.get("loss", math.nan),
                "train/lr": lr if lr is not None else math.nan,
                "comm/wire_bytes": row.wire_bytes,
                "comm/num_collectives": row.num_collectives,
                "time/step_s": row.step_s,
                "time/exposed_comm_s": row.exposed_comm_s if row.exposed_comm_s is not None else math.nan,
            },
        )

    def evaluation(self, record: dict[str, Any]) -> None:
        step = int(record.get("step", 0))
        self.scalars(step, {f"eval/{k}": v for k, v in record.items() if k not in ("step", "after_flush")})

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        for f in self._files:
            f.close()
        self._files.clear()
