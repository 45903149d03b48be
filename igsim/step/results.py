"""The result of one simulation: StepMetrics rows, a summary, and CSV / JSON / Chrome-trace output.

Rows are stored by column (numpy arrays in (step, rank) order) so a run of a thousand steps on a
thousand jittered ranks stays small; :attr:`SimResult.rows` builds the
:class:`igpolicy.vocab.StepMetrics` objects on first use. When every rank behaves the same, the
engine simulates one *representative* rank: rows then hold rank 0 only and stand for every rank
(``representative=True``); ``validate-against`` broadcasts them over a measurement's ranks.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from igpolicy.units import format_bytes, format_time
from igpolicy.vocab import StepMetrics

__all__ = ["SPAN_KINDS", "SimResult", "collective_label"]

# span kind codes in ``SimResult.spans["kind"]``
SPAN_KINDS = ("metadata", "sparse_gather", "dense_allreduce")
_INT_COLUMNS = frozenset(
    {
        "step",
        "rank",
        "values_bytes",
        "indices_bytes",
        "dense_bytes",
        "metadata_bytes",
        "num_collectives",
        "num_sending_components",
        "low_bytes",
    }
)
_STR_COLUMNS = frozenset({"source", "policy"})


@dataclass(frozen=True, kw_only=True, eq=False)
class SimResult:
    """One simulated run.

    - ``columns``: StepMetrics field -> array over rows (``source`` and ``policy`` are constants
      and not stored), rows in (step, rank) order.
    - ``steps``: per simulated step, the cluster timeline in seconds: ``start_s`` (cumulative),
      ``step_s`` (slowest rank), ``forward_s`` / ``backward_end_s`` (slowest rank, since step start),
      ``comm_end_s`` (end of the last collective since step start, 0 with no collective).
    - ``spans``: one entry per collective: ``step``, ``bucket``, ``kind`` (index into
      :data:`SPAN_KINDS`), ``start_s`` / ``end_s`` (since step start) and ``size_bytes`` (this
      rank's payload).
    - ``sent_params``: per simulated step, the parameters that went on the wire (decide_step's
      ``sending_params``).
    - ``settings``: how it was run (config, topology, mode, k source), JSON-able.
    """

    policy: str
    world_size: int
    num_steps: int
    representative: bool
    columns: Mapping[str, np.ndarray]
    steps: Mapping[str, np.ndarray]
    spans: Mapping[str, np.ndarray]
    sent_params: tuple[frozenset[str], ...] = ()
    settings: Mapping[str, Any] = field(default_factory=dict)

    @property
    def num_rows(self) -> int:
        return len(self.columns["step"])

    def column(self, name: str) -> np.ndarray:
        """One StepMetrics column over all rows (``wire_bytes`` is derived)."""
        if name == "wire_bytes":
            c = self.columns
            return c["values_bytes"] + c["indices_bytes"] + c["dense_bytes"] + c["metadata_bytes"]
        return self.columns[name]

    def iter_rows(self) -> Iterator[StepMetrics]:
        """StepMetrics rows (source "sim") in (step, rank) order, built one at a time."""
        names = [n for n in StepMetrics.columns() if n not in _STR_COLUMNS and n != "wire_bytes"]
        cols = [self.columns[n].tolist() for n in names]
        for values in zip(*cols):
            yield StepMetrics(source="sim", policy=self.policy, **dict(zip(names, values)))

    @cached_property
    def rows(self) -> tuple[StepMetrics, ...]:
        return tuple(self.iter_rows())

    # ----------------------------------------------------------------- summary
    def summary(self) -> dict[str, Any]:
        """Means per step (bytes per rank per step), and step-time quantiles of the slowest rank.

        Keys: policy, world_size, num_steps, step_s_mean / _median / _p95 (seconds), compute_s_mean,
        comm_s_mean, exposed_comm_s_mean (means over rows), bytes/step by kind
        (values_bytes, indices_bytes, dense_bytes, metadata_bytes, wire_bytes, low_bytes: means over
        rows), peak_wire_bytes (largest step), num_collectives_mean, bucket_imbalance_mean;
        sparse_gathers and dense_allreduces (payload collectives of the whole run, by kind) and
        collective (their :func:`collective_label`).
        """
        step_s = np.asarray(self.steps["step_s"], dtype=np.float64)
        out: dict[str, Any] = {
            "policy": self.policy,
            "world_size": self.world_size,
            "num_steps": self.num_steps,
            "step_s_mean": _stat(step_s, np.mean),
            "step_s_median": _stat(step_s, np.median),
            "step_s_p95": _stat(step_s, lambda a: np.percentile(a, 95)),
        }
        for name in ("compute_s", "comm_s", "exposed_comm_s"):
            out[f"{name}_mean"] = _stat(self.columns[name], np.mean)
        for name in (
            "values_bytes",
            "indices_bytes",
            "dense_bytes",
            "metadata_bytes",
            "wire_bytes",
            "low_bytes",
        ):
            out[name] = _stat(self.column(name).astype(np.float64), np.mean)
        wire = self.column("wire_bytes")
        out["peak_wire_bytes"] = int(wire.max()) if len(wire) else 0
        out["num_collectives_mean"] = _stat(self.columns["num_collectives"].astype(np.float64), np.mean)
        out["bucket_imbalance_mean"] = _stat(self.columns["bucket_imbalance"], np.mean)
        kinds = np.asarray(self.spans.get("kind", ()), dtype=np.int64)
        out["sparse_gathers"] = int(np.count_nonzero(kinds == SPAN_KINDS.index("sparse_gather")))
        out["dense_allreduces"] = int(np.count_nonzero(kinds == SPAN_KINDS.index("dense_allreduce")))
        out["collective"] = collective_label(out["sparse_gathers"], out["dense_allreduces"])
        return out

    def format_summary(self) -> str:
        """The summary as an aligned two-column text table."""
        s = self.summary()
        lines = [
            f"policy {s['policy']}  ranks {s['world_size']}  steps {s['num_steps']}"
            + ("  (one representative rank)" if self.representative else ""),
            f"  step time       mean {format_time(s['step_s_mean'])}  median {format_time(s['step_s_median'])}"
            f"  p95 {format_time(s['step_s_p95'])}",
            f"  compute         {format_time(s['compute_s_mean'])}",
            f"  communication   {format_time(s['comm_s_mean'])}  (exposed {format_time(s['exposed_comm_s_mean'])})",
            f"  bytes/step      {format_bytes(s['wire_bytes'])}  (values {format_bytes(s['values_bytes'])}, "
            f"indices {format_bytes(s['indices_bytes'])}, dense {format_bytes(s['dense_bytes'])}, "
            f"metadata {format_bytes(s['metadata_bytes'])}; low released {format_bytes(s['low_bytes'])})",
            f"  peak bytes/step {format_bytes(s['peak_wire_bytes'])}",
            f"  collectives     {s['num_collectives_mean']:.1f}/step  imbalance {s['bucket_imbalance_mean']:.3f}",
            f"  collective      {s['collective']}  ({s['sparse_gathers']} sparse gathers, "
            f"{s['dense_allreduces']} dense all-reduces in the run)",
        ]
        return "\n".join(lines)

    # ----------------------------------------------------------------- output
    def _row_dicts(self) -> Iterator[dict[str, object]]:
        names = StepMetrics.columns()
        cols = {n: self.column(n).tolist() for n in names if n not in _STR_COLUMNS}
        for i in range(self.num_rows):
            row: dict[str, object] = {}
            for n in names:
                if n == "source":
                    row[n] = "sim"
                elif n == "policy":
                    row[n] = self.policy
                else:
                    row[n] = cols[n][i]
            yield row

    def to_csv(self, path: str | Path) -> Path:
        """Write one line per row with the StepMetrics columns (``StepMetrics.columns()`` order)."""
        path = Path(path)
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(StepMetrics.columns()))
            writer.writeheader()
            for row in self._row_dicts():
                writer.writerow(row)
        return path

    def to_json(self, path: str | Path) -> Path:
        """Write {"summary", "settings", "representative", "rows"} as JSON."""
        path = Path(path)
        body = {
            "summary": self.summary(),
            "settings": self.settings,
            "representative": self.representative,
            "rows": list(self._row_dicts()),
        }
        path.write_text(json.dumps(body, indent=1, default=_json_default) + "\n")
        return path

    def to_chrome_trace(self, path: str | Path, *, max_steps: int | None = 200) -> Path:
        """Write a Chrome / Perfetto trace (open in chrome://tracing or ui.perfetto.dev).

        Track "compute" shows forward, backward and optimizer of the slowest rank; track
        "communication" one span per collective (metadata exchange, sparse gather, dense all-reduce)
        with its bucket and bytes. Steps are laid end to end; at most ``max_steps`` steps are written.
        """
        path = Path(path)
        n = self.num_steps if max_steps is None else min(self.num_steps, max_steps)
        st = self.steps
        events: list[dict[str, Any]] = [
            {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": f"igsim {self.policy}"}},
            {"ph": "M", "name": "thread_name", "pid": 0, "tid": 0, "args": {"name": "compute"}},
            {"ph": "M", "name": "thread_name", "pid": 0, "tid": 1, "args": {"name": "communication"}},
        ]

        def span(name: str, tid: int, start_s: float, dur_s: float, args: dict[str, Any]) -> None:
            events.append(
                {
                    "name": name,
                    "ph": "X",
                    "pid": 0,
                    "tid": tid,
                    "ts": start_s * 1e6,
                    "dur": dur_s * 1e6,
                    "args": args,
                }
            )

        for t in range(n):
            t0 = float(st["start_s"][t])
            fwd, bend, step_s = (
                float(st["forward_s"][t]),
                float(st["backward_end_s"][t]),
                float(st["step_s"][t]),
            )
            tail = max(bend, float(st["comm_end_s"][t]))
            span("forward", 0, t0, fwd, {"step": t})
            span("backward", 0, t0 + fwd, bend - fwd, {"step": t})
            span("optimizer", 0, t0 + tail, max(0.0, step_s - tail), {"step": t})
        sp = self.spans
        for i in np.flatnonzero(sp["step"] < n):
            t = int(sp["step"][i])
            t0 = float(st["start_s"][t])
            start, end = float(sp["start_s"][i]), float(sp["end_s"][i])
            kind = SPAN_KINDS[int(sp["kind"][i])]
            span(
                f"{kind} b{int(sp['bucket'][i])}",
                1,
                t0 + start,
                end - start,
                {"step": t, "bucket": int(sp["bucket"][i]), "size_bytes": int(sp["size_bytes"][i])},
            )
        path.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}) + "\n")
        return path


def collective_label(num_sparse: int, num_dense: int) -> str:
    """How a run's payload collectives were aggregated: "sparse gather", "dense all-reduce",
    "mixed D/N dense" (D of N went dense) or "none".

    >>> collective_label(52, 12)
    'mixed 12/64 dense'
    """
    if num_sparse and num_dense:
        return f"mixed {num_dense}/{num_sparse + num_dense} dense"
    return "sparse gather" if num_sparse else ("dense all-reduce" if num_dense else "none")


def _stat(arr: np.ndarray, fn: Any) -> float:
    arr = np.asarray(arr, dtype=np.float64)
    return float(fn(arr)) if arr.size else 0.0


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    return str(obj)
