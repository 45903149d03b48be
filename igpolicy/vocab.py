"""The shared vocabulary: what the profiler, the simulator and the runtime talk about.

Every type here is a frozen, keyword-only dataclass (or an enum). Units live in field names:
``size_bytes``, ``time_s``, ``bandwidth_bytes_per_s``. Nothing here imports torch, simpy or pyarrow.

A *component* is a group of parameters that share one importance score: one projection of one layer
(``decoder.3.attn_q``), an embedding table, a norm, a head. A *payload block* is what one parameter
(or one head-aware slice of a fused parameter) puts on the wire in one step. Blocks are packed into
*buckets*; each bucket travels as one collective.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields

__all__ = [
    "Bucket",
    "CollectiveKind",
    "ComponentClass",
    "ComponentId",
    "ComponentKind",
    "PackingPlan",
    "ParamInfo",
    "PayloadBlock",
    "ReleaseDecision",
    "StepMetrics",
    "StepView",
]


class ComponentKind(str, enum.Enum):
    """What a component is inside a Transformer; the unit importance is carried over by."""

    EMBEDDING = "embedding"  # token embeddings (row-sparse gradients)
    POS_EMBEDDING = "pos_embedding"  # learned position / token-type embeddings
    ATTN_Q = "attn_q"
    ATTN_K = "attn_k"
    ATTN_V = "attn_v"
    ATTN_QKV = "attn_qkv"  # a fused q/k/v weight that was not split
    ATTN_O = "attn_o"
    XATTN_Q = "xattn_q"  # cross-attention (encoder-decoder models)
    XATTN_K = "xattn_k"
    XATTN_V = "xattn_v"
    XATTN_O = "xattn_o"
    MLP_UP = "mlp_up"
    MLP_GATE = "mlp_gate"
    MLP_GATE_UP = "mlp_gate_up"  # fused gate+up (Phi-3 style)
    MLP_DOWN = "mlp_down"
    ROUTER = "router"  # MoE gate / router
    NORM = "norm"
    HEAD = "head"  # LM head, classifier, pooler
    FRESH = "fresh"  # freshly initialised parameters (a new task head): always sent, never low
    OTHER = "other"  # unrecognised: reported, never silently treated as low-importance


class ComponentClass(str, enum.Enum):
    """The profiler's verdict for one component."""

    IMPORTANT = "important"  # synchronised every step
    LOW = "low"  # held in residuals, released on its phase
    PINNED = "pinned"  # always synchronised by rule (e.g. unmapped 'other' parameters)


class CollectiveKind(str, enum.Enum):
    """How one bucket travels."""

    SPARSE_GATHER = "sparse_gather"  # all-gather of (int32 index, value) pairs, sizes first
    DENSE_ALLREDUCE = "dense_allreduce"  # zero-filled dense tensor, ring all-reduce


@dataclass(frozen=True, kw_only=True, order=True)
class ComponentId:
    """One component: ``stack.layer.kind`` plus an optional expert index.

    ``stack`` is "" for decoder-only and encoder-only models, ``"encoder"`` / ``"decoder"`` where a
    model has both (T5), so their blocks stay apart. ``layer`` is None for embeddings, final norms and
    heads. ``key`` is the canonical string used in plans and traces.
    """

    kind: ComponentKind
    layer: int | None = None
    stack: str = ""
    expert: int | None = None

    @property
    def key(self) -> str:
        parts = []
        if self.stack:
            parts.append(self.stack)
        if self.layer is not None:
            parts.append(str(self.layer))
        if self.expert is not None:
            parts.append(f"expert{self.expert}")
        parts.append(self.kind.value)
        return ".".join(parts)

    @classmethod
    def from_key(cls, key: str) -> ComponentId:
        """Inverse of :attr:`key`. Raises ValueError on a malformed key."""
        parts = key.split(".")
        if not parts or not parts[-1]:
            raise ValueError(f"malformed component key {key!r}")
        try:
            kind = ComponentKind(parts[-1])
        except ValueError:
            raise ValueError(f"component key {key!r}: unknown kind {parts[-1]!r}") from None
        stack, layer, expert = "", None, None
        for part in parts[:-1]:
            if part.isdigit():
                layer = int(part)
            elif part.startswith("expert") and part[6:].isdigit():
                expert = int(part[6:])
            elif part in ("encoder", "decoder") and not stack:
                stack = part
            else:
                raise ValueError(f"component key {key!r}: unexpected part {part!r}")
        return cls(kind=kind, layer=layer, stack=stack, expert=expert)

    def __str__(self) -> str:
        return self.key


@dataclass(frozen=True, kw_only=True)
class ParamInfo:
    """One model parameter as the policy sees it (no tensor)."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # "float32", "bfloat16", ...
    component: str  # ComponentId.key
    order: int  # registration index in model.named_parameters()

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= int(d)
        return n


@dataclass(frozen=True, kw_only=True)
class PayloadBlock:
    """What one parameter (or slice) sends in one step, in bytes.

    ``order`` is the registration index; DDP-order packing walks blocks by descending ``order``
    (gradients become ready roughly in reverse registration order). ``ready_s`` is when the gradient
    became ready, seconds since backward start (0.0 when unknown).
    """

    name: str
    component: str
    size_bytes: int
    order: int = 0
    ready_s: float = 0.0

    def __post_init__(self) -> None:
        if self.size_bytes < 0:
            raise ValueError(f"payload block {self.name!r}: size_bytes must be >= 0, got {self.size_bytes}")


@dataclass(frozen=True, kw_only=True)
class StepView:
    """Everything a policy decision may depend on for one step: pure data, the same on every rank."""

    step: int
    blocks: tuple[PayloadBlock, ...]


@dataclass(frozen=True, kw_only=True)
class ReleaseDecision:
    """Which components send at ``step``.

    ``send`` holds component keys that go on the wire this step (important ones, plus low ones whose
    release phase is due); ``hold`` the ones that stay in residuals; ``phase`` the release phase due
    this step (None when the schedule has no phases).
    """

    step: int
    send: frozenset[str]
    hold: frozenset[str]
    phase: int | None = None

    def sends(self, component: str) -> bool:
        return component in self.send


@dataclass(frozen=True, kw_only=True)
class Bucket:
    """One collective's worth of payload blocks (block names, in wire order)."""

    index: int
    block_names: tuple[str, ...]
    size_bytes: int


@dataclass(frozen=True, kw_only=True)
class PackingPlan:
    """Blocks packed into buckets, with a balance report.

    ``imbalance`` is max/mean bucket bytes (1.0 is perfect; 0 buckets gives 1.0). ``lower_bound_bytes``
    is max(total/num_buckets, largest block): no packing can have a smaller largest bucket.
    """

    method: str
    buckets: tuple[Bucket, ...]
    imbalance: float
    lower_bound_bytes: int

    @property
    def max_bucket_bytes(self) -> int:
        return max((b.size_bytes for b in self.buckets), default=0)

    @property
    def total_bytes(self) -> int:
        return sum(b.size_bytes for b in self.buckets)

    @property
    def gap_to_lower_bound(self) -> float:
        """max bucket / lower bound - 1 (0.0 means provably optimal makespan)."""
        if self.lower_bound_bytes == 0:
            return 0.0
        return self.max_bucket_bytes / self.lower_bound_bytes - 1.0


@dataclass(frozen=True, kw_only=True)
class StepMetrics:
    """One row per (step, rank) — emitted identically by the simulator and the runtime.

    Bytes are the payload this rank hands to collectives in the step, by kind: sparse values (k ·
    value_bytes), sparse indices (k · index_bytes), dense all-reduce payload (n · value_bytes) and metadata
    (size exchanges) — before any algorithm's replication, so "traffic" means the same thing for every
    collective algorithm, in the simulator and in the runtime. Times are seconds.
    ``comm_s`` is the wall time collectives were in flight (union of intervals); ``exposed_comm_s`` is
    the part of the step that communication adds beyond compute (step end minus compute end, >= 0).
    """

    step: int
    rank: int
    source: str  # "sim" or "real"
    policy: str
    values_bytes: int = 0
    indices_bytes: int = 0
    dense_bytes: int = 0
    metadata_bytes: int = 0
    num_collectives: int = 0
    num_sending_components: int = 0
    low_bytes: int = 0  # bytes of low-importance components released this step
    compute_s: float = 0.0
    comm_s: float = 0.0
    exposed_comm_s: float = 0.0
    step_s: float = 0.0
    bucket_imbalance: float = 1.0
    residual_norm: float = 0.0
    extra: dict[str, float] = field(default_factory=dict, compare=False)

    @property
    def wire_bytes(self) -> int:
        return self.values_bytes + self.indices_bytes + self.dense_bytes + self.metadata_bytes

    def to_row(self) -> dict[str, object]:
        """Flat dict for CSV / JSON (``extra`` keys prefixed with ``x_``)."""
        row: dict[str, object] = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        row["wire_bytes"] = self.wire_bytes
        for k, v in sorted(self.extra.items()):
            row[f"x_{k}"] = v
        return row

    @staticmethod
    def columns() -> tuple[str, ...]:
        return (*(f.name for f in fields(StepMetrics) if f.name != "extra"), "wire_bytes")
