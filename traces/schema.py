"""The trace format: manifest, the three tables, part-file names, and the error type.

A trace is a directory::

    manifest.json                                  what was recorded, by whom, from which model (Manifest)
    parts/params/params-r000-000001.parquet ...    one row per (step, rank, parameter)
    parts/steps/steps-r000-000001.parquet ...      one row per (step, rank)
    parts/unions/unions-r000-000001.parquet ...    one row per (step, parameter), distributed recordings only

One folder per table, so that a folder is one Parquet dataset (``pandas.read_parquet(DIR /
"parts" / "steps")``). Traces written before that layout keep their parts beside ``manifest.json``;
the reader reads both layouts (:func:`part_files` lists both). Every part is written under a
temporary name in its folder (``.params-r000-000001.parquet.tmp``) and renamed into place. A writer commits whole steps at a bounded interval, every table at once and the ``steps``
part last (:mod:`traces.writer`), so a crash loses at most the steps since the last commit; the
reader reports a trace whose steps are not complete on every rank and table, and reads its complete
prefix on request (:mod:`traces.validate`). Trace files are regular files (no links). ``step`` is
the optimizer step (the gradient-accumulation boundary), counted from 0 by the recorder.

Each (step, rank, param) has at most one ``params`` row, each (step, rank) one ``steps`` row and
each (step, param) one ``unions`` row.

Column meanings (the recorder in ``igrt.trace.recorder`` fills them; the sparsifier is the manifest's):

``params``
    - ``numel``: entries of the parameter. ``k``: entries the sparsifier selected from ``u`` (below),
      0 <= k <= numel.
    - ``grad_norm``: L2 norm, in fp32-accumulated float64, of ``u = g_t + e_{t-1}`` on this rank —
      the local gradient accumulated over the step's micro-batches (before any cross-rank averaging)
      plus the rank's residual, i.e. exactly the tensor the sparsifier ranked by magnitude.
    - ``sel_norm``: L2 norm of ``u[S]``, the selected entries; ``sel_max_abs``: max |u[S]| (0 when k = 0).
      Norms are >= 0 and ``sel_max_abs <= sel_norm <= grad_norm`` up to a relative ``NORM_RTOL``.
    - ``overlap``: Jaccard |S_t ∩ S_p| / |S_t ∪ S_p| of this step's selected index set with the same
      rank's set at the previous *recorded* step p of this parameter; NaN on its first recorded step
      and when both sets are empty.
    - ``ready_s``: when the parameter's gradient became ready in the step's last backward pass,
      seconds since that backward pass started (finite and >= 0; NaN when it never became ready).
``steps``
    ``forward_s``, ``backward_s``, ``optimizer_s``: wall seconds of the step's phases on this rank
    (forward and backward summed over micro-batches; finite and >= 0); ``loss``: the step's mean
    training loss.
``unions``
    ``union_k``: size of the union of the selected index sets of all ranks for (step, param) —
    what a sparse all-reduce would carry after summation, 0 <= union_k <= numel. Written by one
    rank (usually rank 0).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa

from igpolicy.config import SPARSIFIERS, check_keys
from igpolicy.vocab import ComponentId, ParamInfo

__all__ = [
    "MANIFEST_NAME",
    "NORM_RTOL",
    "PARTS_DIR",
    "RUN_SUMMARY_FORMAT",
    "RUN_TRACE_K",
    "SCHEMA_VERSION",
    "TABLES",
    "TABLE_SCHEMAS",
    "Manifest",
    "PartName",
    "TraceError",
    "parse_part_name",
    "part_files",
]

SCHEMA_VERSION = 1
MANIFEST_NAME = "manifest.json"
PARTS_DIR = "parts"  # DIR/parts/<table>/<part file>: one Parquet dataset per table
# summary.json of an igrt train output folder (2: integration, DDP caps, plan.json, trace/, ops.csv),
# written by igrt.train.loop and read by igsim.studies.replay
RUN_SUMMARY_FORMAT = "igrt-train/2"
# manifest.extra["k"] of a training run's own trace: k is what each rank sent (0 where it held)
RUN_TRACE_K = "sent"
# relative rounding slack of sel_max_abs <= sel_norm <= grad_norm (norms of fp32 values in float64)
NORM_RTOL = 1e-6

_PARAM_TYPE = pa.dictionary(pa.int32(), pa.string())

TABLE_SCHEMAS: dict[str, pa.Schema] = {
    "params": pa.schema(
        [
            ("step", pa.int64()),
            ("rank", pa.int32()),
            ("param", _PARAM_TYPE),
            ("numel", pa.int64()),
            ("k", pa.int64()),
            ("grad_norm", pa.float64()),
            ("sel_norm", pa.float64()),
            ("sel_max_abs", pa.float64()),
            ("overlap", pa.float64()),
            ("ready_s", pa.float64()),
        ]
    ),
    "steps": pa.schema(
        [
            ("step", pa.int64()),
            ("rank", pa.int32()),
            ("forward_s", pa.float64()),
            ("backward_s", pa.float64()),
            ("optimizer_s", pa.float64()),
            ("loss", pa.float64()),
        ]
    ),
    "unions": pa.schema([("step", pa.int64()), ("param", _PARAM_TYPE), ("union_k", pa.int64())]),
}
TABLES = tuple(TABLE_SCHEMAS)


class TraceError(ValueError):
    """A trace (or one of its files) is missing, unreadable or does not follow the format.

    The message starts with the offending file's path and says what is wrong with it.
    """


# ------------------------------------------------------------------------------------ part files
_PART_RE = re.compile(r"^(?P<table>[a-z_]+)-r(?P<rank>\d{3,})-(?P<seq>\d{6,})\.parquet$")


@dataclass(frozen=True, kw_only=True, order=True)
class PartName:
    """One part file's identity: ``{table}-r{rank:03d}-{seq:06d}.parquet`` (seq counts from 1)."""

    table: str
    rank: int
    seq: int

    @property
    def file_name(self) -> str:
        return f"{self.table}-r{self.rank:03d}-{self.seq:06d}.parquet"

    @property
    def tmp_name(self) -> str:
        """The name the part is written under before it is renamed into place."""
        return f".{self.file_name}.tmp"

    def path_in(self, directory: str | Path) -> Path:
        """Where a writer puts this part in the trace ``directory``: ``parts/<table>/<file_name>``."""
        return Path(directory) / PARTS_DIR / self.table / self.file_name


def parse_part_name(file_name: str) -> PartName | None:
    """The PartName of a ``*.parquet`` file name, None when it does not match the pattern.

    The table prefix is not checked here (the reader reports unknown prefixes as errors).
    """
    m = _PART_RE.match(file_name)
    if m is None:
        return None
    return PartName(table=m["table"], rank=int(m["rank"]), seq=int(m["seq"]))


def part_files(directory: str | Path, *, table: str | None = None, rank: int | None = None) -> list[Path]:
    """The part files of the trace in ``directory``, in both layouts, sorted by (table, rank, seq).

    ``table`` / ``rank``: only that table's / rank's parts. A listing by name, for tools and tests:
    nothing is opened or checked (:func:`traces.read_trace` and :func:`traces.open` validate).
    """
    directory = Path(directory)
    folders = [directory] + [directory / PARTS_DIR / t for t in ([table] if table else TABLES)]
    found = []
    for folder in folders:
        if not folder.is_dir():
            continue
        for path in folder.iterdir():
            part = parse_part_name(path.name)
            if part is None or (table and part.table != table) or (rank is not None and part.rank != rank):
                continue
            if folder == directory or part.table == folder.name:
                found.append((part, path))
    return [path for _, path in sorted(found, key=lambda x: (x[0], str(x[1])))]


# -------------------------------------------------------------------------------------- manifest
_MANIFEST_KEYS = frozenset(
    {
        "schema_version",
        "workload",
        "command",
        "created_utc",
        "torch_version",
        "world_size",
        "sparsifier",
        "density",
        "grad_accum_steps",
        "params",
        "extra",
    }
)
_PARAM_KEYS = frozenset({"name", "shape", "dtype", "component", "order"})


def utc_now_iso() -> str:
    """The current UTC time as ISO 8601 with an explicit ``+00:00`` offset, to the second."""
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()


@dataclass(frozen=True, kw_only=True)
class Manifest:
    """What a trace holds and how it was recorded (``manifest.json``).

    - ``params``: the model summary — every parameter the recorder tracked, with shape, dtype,
      component key and registration order (``ParamInfo``); names and orders are unique.
    - ``world_size``: ranks that recorded (>= 1); ``grad_accum_steps``: micro-batches per step.
    - ``sparsifier`` / ``density``: what selected the ``k`` entries (as in ``PolicyConfig``).
    - ``workload`` / ``command``: what was trained and the command line that recorded it.
    - ``created_utc``: ISO 8601 UTC time; ``torch_version``: the recording torch's version.
    - ``extra``: free-form JSON-able mapping (batch size, seed, model id, ...).
    """

    workload: str
    params: tuple[ParamInfo, ...]
    world_size: int = 1
    sparsifier: str = "topk"
    density: float = 0.01
    grad_accum_steps: int = 1
    torch_version: str = ""
    command: str = ""
    created_utc: str = field(default_factory=utc_now_iso)
    extra: Mapping[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        def bad(key: str, value: object, why: str) -> ValueError:
            return ValueError(f"manifest: {key}={value!r} {why}")

        if self.schema_version != SCHEMA_VERSION:
            raise bad("schema_version", self.schema_version, f"is not supported (expected {SCHEMA_VERSION})")
        if not _is_int(self.world_size) or self.world_size < 1:
            raise bad("world_size", self.world_size, "must be an integer >= 1")
        if not _is_int(self.grad_accum_steps) or self.grad_accum_steps < 1:
            raise bad("grad_accum_steps", self.grad_accum_steps, "must be an integer >= 1")
        if self.sparsifier not in SPARSIFIERS:
            raise bad("sparsifier", self.sparsifier, f"is not one of {', '.join(SPARSIFIERS)}")
        if not _is_number(self.density) or not (0.0 < float(self.density) <= 1.0):
            raise bad("density", self.density, "must be a number in (0, 1]")
        for key in ("workload", "torch_version", "command", "created_utc"):
            if not isinstance(getattr(self, key), str):
                raise bad(key, getattr(self, key), "must be a string")
        try:
            datetime.fromisoformat(self.created_utc)
        except ValueError:
            raise bad("created_utc", self.created_utc, "is not an ISO 8601 time") from None
        if not isinstance(self.extra, Mapping):
            raise bad("extra", self.extra, "must be a mapping")
        names: set[str] = set()
        orders: set[int] = set()
        for p in self.params:
            if not isinstance(p, ParamInfo):
                raise bad("params", p, "must hold ParamInfo entries")
            if p.name in names:
                raise bad("params", p.name, "appears twice")
            if p.order in orders:
                raise bad("params", p.name, f"repeats order {p.order}")
            if any(not _is_int(d) or d < 0 for d in p.shape):
                raise bad(f"params[{p.name}].shape", p.shape, "must be non-negative integers")
            try:
                ComponentId.from_key(p.component)
            except ValueError as e:
                raise bad(f"params[{p.name}].component", p.component, f"is malformed ({e})") from None
            names.add(p.name)
            orders.add(p.order)

    # ------------------------------------------------------------------------------------ views
    @property
    def param_names(self) -> tuple[str, ...]:
        """Parameter names in registration order."""
        return tuple(p.name for p in sorted(self.params, key=lambda p: p.order))

    @property
    def by_name(self) -> dict[str, ParamInfo]:
        return {p.name: p for p in self.params}

    @property
    def components(self) -> tuple[str, ...]:
        """Distinct component keys, sorted."""
        return tuple(sorted({p.component for p in self.params}))

    # ------------------------------------------------------------------------------ serialising
    def to_json(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["params"] = [
            {
                "name": p.name,
                "shape": list(p.shape),
                "dtype": p.dtype,
                "component": p.component,
                "order": p.order,
            }
            for p in sorted(self.params, key=lambda p: p.order)
        ]
        d["extra"] = json.loads(json.dumps(dict(self.extra), allow_nan=False, default=str))
        return d

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, where: str = "manifest") -> Manifest:
        """Parse and validate; raises TraceError naming ``where`` and the key at fault."""
        try:
            check_keys(
                data,
                allowed=_MANIFEST_KEYS,
                where=where,
                required=frozenset({"schema_version", "workload", "params"}),
            )
            version = data["schema_version"]
            if version != SCHEMA_VERSION:
                raise ValueError(
                    f"{where}: schema_version {version!r} is not supported by this reader "
                    f"(expected {SCHEMA_VERSION})"
                )
            raw = data["params"]
            if not isinstance(raw, list):
                raise ValueError(f"{where}: 'params' must be a list")
            params = tuple(_param_from_json(p, where=f"{where}: params[{i}]") for i, p in enumerate(raw))
            kwargs = {k: v for k, v in data.items() if k != "params"}
            return cls(params=params, **kwargs)
        except TraceError:
            raise
        except ValueError as e:
            msg = str(e)
            raise TraceError(msg if msg.startswith(where) else f"{where}: {msg}") from None

    def save(self, path: str | Path) -> None:
        """Write as JSON to ``path`` (not atomic; see :func:`traces.writer.write_manifest`)."""
        Path(path).write_text(json.dumps(self.to_json(), indent=2, allow_nan=False) + "\n")


def _param_from_json(p: Any, *, where: str) -> ParamInfo:
    check_keys(p, allowed=_PARAM_KEYS, where=where, required=_PARAM_KEYS)
    if (
        not isinstance(p["name"], str)
        or not isinstance(p["dtype"], str)
        or not isinstance(p["component"], str)
    ):
        raise ValueError(f"{where}: name, dtype and component must be strings")
    shape = p["shape"]
    if not isinstance(shape, list) or any(not _is_int(d) or d < 0 for d in shape):
        raise ValueError(f"{where}: shape must be a list of non-negative integers, got {shape!r}")
    if not _is_int(p["order"]):
        raise ValueError(f"{where}: order must be an integer, got {p['order']!r}")
    return ParamInfo(
        name=p["name"], shape=tuple(shape), dtype=p["dtype"], component=p["component"], order=p["order"]
    )


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
