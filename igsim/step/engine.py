"""The step engine: cost every step's step plan on a topology, op for op.

Per simulated step ``t`` (timeline in seconds since the step started, all ranks starting together;
a replay on every rank's own times starts each rank when it finished its previous step):

1. The step's collectives are :class:`igpolicy.planner.StepPlanner`'s step plan for the
   ``integration`` (the object and the function the runtime executes): decisions from
   :func:`igpolicy.decide.decide_step` on nominal payload sizes, then the ordered ops of
   :func:`igpolicy.step_plan.build_step_plan` — for ``ddp-hook`` over DDP's own buckets
   (:func:`igpolicy.step_plan.ddp_buckets`: one bucket at step 0, rebuilt over the first
   backward's ready order from step 1 on, ``ddp_bucket_cap_bytes``).
2. Rank r runs forward for ``f_r`` and backward for ``b_r``; parameter i is ready at
   ``f_r + s_r · ready_s[i]`` (``s_r`` is the rank's jitter factor). An op gated by
   ``backward_end`` may start at ``f + b``; one gated by ``bucket_ready`` when its bucket's last
   gradient is ready on the slowest rank.
3. The ops run on ONE stream, each starting when its gate opens and the previous op has ended,
   in plan order. A sparse gather's capacity is the nominal pair count when the plan pads to it,
   else the largest selected count of any rank (skipped when that is 0). Each op is costed by
   :func:`igsim.collectives.predict.predict_collective` on its encoded size
   (:func:`igpolicy.step_plan.op_bytes`); alone on the stream, its time depends only on its spec,
   so costs are cached.
4. ``comm_end`` is the end of the last op (0 without one). Rank r's step time is
   ``max(f_r + b_r, comm_end) + o_r``; its exposed communication ``max(0, comm_end - (f_r + b_r))``;
   ``comm_s`` is the union of op intervals (their sum, on one stream). A replay whose workload
   carries every rank's combine times (``Workload.combine_s_by_rank``: the CPU work after each
   op that turns what arrived into the averaged gradient) ends rank r's op i at
   ``max(end_i, done_{i-1}) + combine_r,i`` instead, and ``comm_end`` is rank r's last such end;
   its ``Workload.finalize_s_by_rank`` (a ``ddp-hook`` run's: DDP's write-back after the last
   bucket) is added after ``max(f_r + b_r, comm_end)``, to the step and the exposed time, not to
   ``comm_s``.

Bytes per rank and step are :func:`igpolicy.step_plan.op_bytes` summed over the executed ops, as
the runtime's executor sums them. ``k`` is the workload's recorded count when it was recorded at
the simulated density (or the run's own per-rank counts, ``Workload.k_by_rank``), else nominal.
See docs/simulator.md.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from igpolicy.components import mark_fresh
from igpolicy.config import PolicyConfig
from igpolicy.decide import release_phases
from igpolicy.plan import SyncPlan
from igpolicy.step_plan import DDP_FIRST_BUCKET_CAP_BYTES, INTEGRATIONS, OpKind, WireTally, op_bytes
from igpolicy.vocab import ComponentId, ParamInfo, StepMetrics
from igpolicy.wire import (
    BOUNDED_SPARSIFIERS,
    COUNT_BYTES,
    config_k,
    encoded_pairs_bytes,
    nominal_k,
    pairs_of,
    row_dim,
)
from igsim.collectives.costs import CostCache
from igsim.step.decisions import PlanLayout, PlanSource
from igsim.step.results import SPAN_KINDS, SimResult
from igsim.step.workload import Jitter, Workload

__all__ = [
    "BOUNDED_SPARSIFIERS",
    "INTEGRATIONS",
    "METADATA_BYTES_PER_BUCKET",
    "MODES",
    "encoded_pairs_bytes",
    "simulate",
]

METADATA_BYTES_PER_BUCKET = COUNT_BYTES
MODES = ("auto", "flow", "analytic")
_META, _SPARSE, _DENSE = (SPAN_KINDS.index(k) for k in ("metadata", "sparse_gather", "dense_allreduce"))


def simulate(
    *,
    workload: Workload,
    config: PolicyConfig,
    plan: SyncPlan | None,
    topology: Any,
    calibration: Any = None,
    num_steps: int,
    seed: int = 0,
    mode: str = "auto",
    jitter: Jitter | None = None,
    integration: str = "ddp-hook",
    ddp_bucket_cap_bytes: int = 25 * 2**20,
    ddp_first_bucket_cap_bytes: int | None = DDP_FIRST_BUCKET_CAP_BYTES,
    dense_algorithm: str = "ring",
    sparse_algorithm: str = "ring",
    label: str | None = None,
    exact_costs: bool = False,
    plan_schedule: Sequence[tuple[int, SyncPlan]] | None = None,
    carry_skew: bool = True,
) -> SimResult:
    """Simulate ``num_steps`` training steps of ``config`` on ``topology``; returns a :class:`SimResult`.

    ``topology`` is an :class:`igsim.net.topology.Topology` (its ``ranks`` give the world size);
    ``calibration`` an optional :class:`igsim.net.calibration.Calibration`. ``integration`` is the
    runtime integration whose step plan is costed: ``ddp-hook`` (DDP's buckets, overlapped with
    backward; ``ddp_bucket_cap_bytes`` / ``ddp_first_bucket_cap_bytes`` as DDP's ``bucket_cap_mb``
    and first-bucket cap, ``None`` when ``bucket_cap_mb`` was given), ``sync`` or ``deepspeed``
    (after backward). ``mode`` is passed to ``predict_collective`` (``auto``: closed forms where the
    topology is contention-free, flow simulation otherwise). ``jitter`` makes ranks differ (seeded
    by ``seed`` and ``jitter.seed``); without it one representative rank is simulated, unless the
    workload carries per-rank counts (``k_by_rank``), which give one row per rank. ``label`` names
    the policy in the result (default: ``config.policy``). ``exact_costs=True`` evaluates every
    distinct collective size exactly (see :class:`igsim.collectives.costs.CostCache`).
    ``plan_schedule`` (an online-profiling run: ``config.online_profiling``): ``(first step, plan)``
    pairs ascending from step 0 — step t follows the last plan whose first step is <= t (new release
    phases and planner, as the runtime's ``SyncState.apply_plan``), ``plan`` is ignored, and after
    every step that a re-plan follows the ranks run its collectives
    (:func:`igpolicy.online.replan_op_bytes`: bytes counted as metadata, costed after the step's last
    op, before the optimizer). ``carry_skew`` (on every rank's own times, a replay): each rank starts
    a step when it finished its previous one, as in the runtime; False starts every rank of every
    step together (the model before 2026-12-03, kept for ablations). Deterministic: the same
    arguments give identical rows.

    Raises ValueError for ``num_steps < 1``, an unknown mode or integration, or a plan that does
    not cover the workload's components (from ``release_phases``).
    """
    if int(num_steps) < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {', '.join(MODES)}")
    if integration not in INTEGRATIONS:
        raise ValueError(f"integration {integration!r} is not one of {', '.join(INTEGRATIONS)}")
    if len(topology.ranks) < 1:
        raise ValueError("topology has no ranks")
    run = _Run(
        workload=workload, config=config, plan=plan, topology=topology, calibration=calibration,
        num_steps=int(num_steps), seed=seed, mode=mode, jitter=jitter, integration=integration,
        ddp_caps=(ddp_bucket_cap_bytes, ddp_first_bucket_cap_bytes), algorithms=(dense_algorithm, sparse_algorithm),
        exact_costs=exact_costs, plan_schedule=plan_schedule, carry_skew=carry_skew,
    )  # fmt: skip
    for t in range(int(num_steps)):
        run.step(t)
    return run.result(label=label or config.policy)


@dataclass(frozen=True, kw_only=True)
class _Stream:
    """One step's communication stream: when it ends (since step start), busy time, bytes per row."""

    comm_end_s: float
    comm_s: float
    tallies: list[WireTally]
    issued: list[tuple[int, float, float]] = field(default_factory=list)  # (op index, start, end)

    def rank_done(self, num_ranks: int, combine: np.ndarray | None = None) -> np.ndarray:
        """[R, issued ops]: when each rank is done with each issued op: the op's end on the wire
        (or the rank's previous op, whichever is later) plus the rank's combine time for it
        (``combine[r, i]``: its i-th plan op; a re-plan's ops have none). Ranks finish their ops
        in order, on one thread; the wire does not wait for them (every op is already issued)."""
        out = np.zeros((num_ranks, len(self.issued)))
        prev, i = np.zeros(num_ranks), 0
        for col, (j, _start, end) in enumerate(self.issued):
            c = 0.0
            if j >= 0:
                if combine is not None and i < combine.shape[1]:
                    c = combine[:, i]
                i += 1
            prev = np.maximum(end, prev) + c
            out[:, col] = prev
        return out

    def rank_comm_s(self, rank_gates: np.ndarray, done: np.ndarray | None = None) -> np.ndarray:
        """Seconds each rank spends inside collectives, as the runtime times them: a rank calls op
        j when it is ready for it (``rank_gates[r, j]``) and its previous op has ended, and leaves
        when it is done with the op (``done``, from :meth:`rank_done`; default: the op's end), so
        an early rank's wait for the last one counts. [R]."""
        out = np.zeros(rank_gates.shape[0])
        prev = np.zeros(rank_gates.shape[0])
        for col, (j, _start, end) in enumerate(self.issued):  # j < 0: a re-plan: every rank is there
            d = np.full(len(out), end) if done is None else done[:, col]
            out += d - (np.maximum(rank_gates[:, j], prev) if j >= 0 else prev)
            prev = d
        return out


class _Run:
    """One simulation's state: the plan source, the costs, the per-step columns."""

    def __init__(self, *, workload, config, plan, topology, calibration, num_steps, seed, mode, jitter,
                 integration, ddp_caps, algorithms, exact_costs, plan_schedule=None, carry_skew=True) -> None:  # fmt: skip
        schedule = _check_schedule(plan_schedule, config) if plan_schedule is not None else [(0, plan)]
        plan = schedule[0][1]
        self.workload, self.config, self.plan, self.integration = workload, config, plan, integration
        self.num_steps, self.seed, self.mode, self.jitter = num_steps, seed, mode, jitter
        self.world_size = p = len(topology.ranks)
        params = mark_fresh(workload.params, config.fresh_patterns)  # the runtime's components
        self.k_matrix, self.k_source = _k_matrix(workload, config, world_size=p, params=params)
        first_ready = workload.ready_since_backward(0) if integration == "ddp-hook" else None
        keys = [q.component for q in params]
        self.sources = [
            (start, PlanSource(
                config=config, params=params, world_size=p, integration=integration,
                phases=release_phases(plan=pl, config=config, component_keys=keys), first_ready_s=first_ready,
                ddp_bucket_cap_bytes=ddp_caps[0], ddp_first_bucket_cap_bytes=ddp_caps[1],
            ))
            for start, pl in schedule
        ]  # fmt: skip
        for _, src in self.sources:  # low_mode "thin": each plan's low components send k / R every step
            src.k_matrix = (
                self.k_matrix if src.planner.config is config
                else _k_matrix(workload, src.planner.config, world_size=p, params=params)[0]
            )  # fmt: skip
        self.replans = None
        if plan_schedule is not None:
            from igpolicy.online import OnlineSchedule, replan_op_bytes

            self.replans = OnlineSchedule(window=config.online_window, every=config.replan_every)
            self.replan_ops = replan_op_bytes(
                num_components=len(set(keys)), window=config.online_window, world_size=p
            )
        self.plan_fingerprints = tuple(pl.fingerprint if pl is not None else None for _, pl in schedule)
        self.costs = CostCache(
            topology=topology, calibration=calibration, mode=mode, world_size=p,
            dense_algorithm=algorithms[0], sparse_algorithm=algorithms[1], exact=bool(exact_costs),
        )  # fmt: skip
        self.algorithms = algorithms
        self.per_rank_k = self.k_matrix.ndim == 3
        self.representative = (jitter is None or jitter.is_identity) and not self.per_rank_k
        self.rows_per_step = 1 if self.representative else p
        jit = Jitter(seed=0) if jitter is None else jitter
        self.jit = Jitter(seed=_mix(seed, jit.seed), compute_cv=jit.compute_cv,
                          straggler_rank=jit.straggler_rank, straggler_slowdown=jit.straggler_slowdown)  # fmt: skip
        self.cols = _Columns(num_steps * self.rows_per_step)
        self.steps = {k: np.zeros(num_steps) for k in ("start_s", "step_s", "forward_s", "backward_end_s", "comm_end_s")}
        self.spans: dict[str, list] = {k: [] for k in ("step", "bucket", "kind", "start_s", "end_s", "size_bytes")}
        self.sent: list[frozenset[str]] = []
        self.clock = 0.0
        self.offsets: np.ndarray | None = None  # replay: when each rank starts the next step, after the first
        self.carry_skew = bool(carry_skew)

    def step(self, t: int) -> None:
        w, cfg = self.workload, self.config
        rec = w.recorded_index(t)
        src = self._source_at(t)
        lay = src.layout(t)
        self.sent.append(lay.plan.sending_params)
        f, b, o = w.forward_s[rec], w.backward_s[rec], w.optimizer_s[rec]
        ready = w.ready_since_backward(rec) if self.integration == "ddp-hook" else np.full(len(w.params), b)
        own = self._own_phases(rec)
        rank_gates = None
        if own is None:
            factors = self.jit.factors(step=t, num_ranks=self.world_size)
            s_max = float(factors.max())
            gate = lay.op_gate_s(s_max * (f + ready), s_max * (f + b))
            s = factors[:1] if self.representative else factors
            fw, bw, op_s, local = s * f, s * b, s * o, np.zeros(len(s))
        else:  # every rank on its own recorded times; the last to reach an op gates it
            fw, bw, op_s, local = own
            off = self.offsets if self.offsets is not None and len(self.offsets) == len(fw) else np.zeros(len(fw))
            fw = fw + off  # a rank starts when it finished its previous step (no barrier between steps)
            scale = bw / b if b > 0 else np.ones(len(bw))
            if self.integration == "ddp-hook":  # the hooks select inside backward, before each launch
                rank_gates = np.stack([
                    lay.op_gate_s(fw[r] + scale[r] * ready, fw[r] + bw[r]) for r in range(len(fw))
                ]) + local[:, None] * _select_shares(lay)[None, :]  # fmt: skip
                local = np.zeros(len(fw))  # already in backward's time
            else:
                rank_gates = np.stack([
                    lay.op_gate_s(fw[r] + scale[r] * ready + local[r], fw[r] + bw[r] + local[r]) for r in range(len(fw))
                ])  # fmt: skip
            gate = rank_gates.max(axis=0) if len(lay.ops) else np.zeros(0)
        k = src.k_matrix[rec]  # [P] or [R, P]
        k_rows = k if k.ndim == 2 else k[None, :]
        stream = self._stream(lay, gate, lay.op_k(k_rows), t)
        if self.replans is not None and self.replans.replans_after(t):
            stream = self._with_replan(stream)
        bend = fw + bw
        start = np.zeros(len(fw)) if own is None else off  # each rank's own start of the step
        combine = self._combine(rec) if rank_gates is not None else None
        done = stream.rank_done(len(fw), combine)
        ends = done[:, -1] if done.shape[1] else np.zeros(len(fw))  # each rank's end of communication
        fin = self._finalize(rec) if rank_gates is not None else 0.0
        finish = np.maximum(bend + local, ends) + fin + op_s
        step_s = finish - start  # as each rank times its own step
        comm_s = stream.comm_s if rank_gates is None else stream.rank_comm_s(rank_gates, done)
        rows = slice(t * self.rows_per_step, (t + 1) * self.rows_per_step)
        tallies = stream.tallies if len(stream.tallies) == self.rows_per_step else stream.tallies * self.rows_per_step
        ib, vb = cfg.index_bytes, cfg.value_bytes
        self.cols.fill(
            rows,
            step=t,
            rank=np.arange(self.rows_per_step),
            **{f_: np.array([getattr(x, f_) for x in tallies]) for f_ in _TALLY_FIELDS},
            num_sending_components=lay.plan.num_sending_components,
            low_bytes=np.array([lay.low_bytes(kr, index_bytes=ib, value_bytes=vb) for kr in k_rows])
            if len(k_rows) == self.rows_per_step else lay.low_bytes(k_rows[0], index_bytes=ib, value_bytes=vb),
            compute_s=bend - start + op_s,
            comm_s=comm_s,
            exposed_comm_s=np.maximum(0.0, ends - (bend + local)) + fin,
            step_s=step_s,
            bucket_imbalance=lay.plan.bucket_imbalance,
        )  # fmt: skip
        if own is None:
            global_step_s = float(max(step_s.max(), (bend + local + op_s).max()))
        else:  # from this step's first start to the next one's: the earliest rank to finish starts it
            global_step_s = float(finish.min()) if self.carry_skew else float(finish.max())
            self.offsets = finish - finish.min() if self.carry_skew else None
        for key, v in (("start_s", self.clock), ("step_s", global_step_s), ("forward_s", float(fw.max())),
                       ("backward_end_s", float(bend.max())), ("comm_end_s", stream.comm_end_s)):  # fmt: skip
            self.steps[key][t] = v
        self.clock += global_step_s

    def _source_at(self, t: int) -> PlanSource:
        """The plan source step ``t`` follows: the last whose first step is <= t."""
        out = self.sources[0][1]
        for start, src in self.sources:
            if start > t:
                break
            out = src
        return out

    def _with_replan(self, stream: _Stream) -> _Stream:
        """The step's stream followed by a re-plan's collectives (the window's all-reduce, the
        agreement all-gather): their bytes on every row, their time after the last op. They are
        not the step plan's ops (the runtime's op log does not list them), so they add no span."""
        cur, comm_s = stream.comm_end_s, stream.comm_s
        for i, ob in enumerate(self.replan_ops):
            for tally in stream.tallies:
                tally.add(ob)
            cost = self.costs.dense(ob.wire_size_bytes) if i == 0 else self.costs.metadata(-(-ob.wire_size_bytes // 8))
            cur, comm_s = cur + cost, comm_s + cost
        issued = [*stream.issued, (-1, stream.comm_end_s, cur)]
        return _Stream(comm_end_s=cur, comm_s=comm_s, tallies=stream.tallies, issued=issued)

    def _own_phases(self, rec: int) -> tuple[np.ndarray, ...] | None:
        """(forward, backward, optimizer, local) seconds per rank of recorded step ``rec`` when the
        workload carries every rank's own times (a replay), else None (nominal times x jitter)."""
        w, p = self.workload, self.world_size
        ph = w.phases_by_rank
        if ph is None or ph.shape[1] != p or not self.per_rank_k:
            return None
        local = w.local_s_by_rank[rec] if w.local_s_by_rank is not None and w.local_s_by_rank.shape[1] == p else np.zeros(p)
        return ph[rec, :, 0], ph[rec, :, 1], ph[rec, :, 2], local

    def _combine(self, rec: int) -> np.ndarray | None:
        """[R, J] each rank's combine seconds per issued op of recorded step ``rec`` (a replay's
        ``Workload.combine_s_by_rank``), or None."""
        c = self.workload.combine_s_by_rank
        return c[rec] if c is not None and c.shape[1] == self.world_size else None

    def _finalize(self, rec: int) -> np.ndarray | float:
        """[R] each rank's seconds from its end of communication and backward to backward's
        return in recorded step ``rec`` (a replay's ``Workload.finalize_s_by_rank``), else 0."""
        f = self.workload.finalize_s_by_rank
        return f[rec] if f is not None and f.shape[1] == self.world_size else 0.0

    def _stream(self, lay: PlanLayout, gate: np.ndarray, op_k: np.ndarray, step: int) -> _Stream:
        """The step's ops one after another on one stream (see the module docstring)."""
        cfg, costs = self.config, self.costs
        tallies = [WireTally() for _ in range(op_k.shape[0])]
        cur = comm_s = 0.0
        issued: list[tuple[int, float, float]] = []  # (op index, start, end)
        for j, op in enumerate(lay.ops):
            if op.kind == OpKind.SPARSE_GATHER:
                ks = op_k[:, j]
                cap = int(op.nominal_nnz) if op.padded_to_nominal else int(ks.max(initial=0))
                per_row = [op_bytes(op, k=min(int(x), cap), capacity=cap, config=cfg) for x in ks]
            else:
                per_row = [op_bytes(op, k=0, capacity=0, config=cfg)] * len(tallies)
            for tally, b_ in zip(tallies, per_row):
                tally.add(b_)
            b0 = per_row[0]
            if not b0.issued:
                continue
            if op.kind == OpKind.COUNT_EXCHANGE:
                kind, cost = _META, costs.metadata(len(op.buckets))
            elif op.kind == OpKind.DENSE_ALLREDUCE:
                kind, cost = _DENSE, costs.dense(b0.wire_size_bytes)
            else:
                kind, cost = _SPARSE, costs.sparse(b0.wire_size_bytes)
            start = max(float(gate[j]), cur)
            _span(self.spans, step, op.bucket, kind, start, start + cost, b0.wire_size_bytes)
            issued.append((j, start, start + cost))
            cur, comm_s = start + cost, comm_s + cost
        return _Stream(comm_end_s=cur, comm_s=comm_s, tallies=tallies, issued=issued)

    def result(self, *, label: str) -> SimResult:
        cfg, plan = self.config, self.plan
        return SimResult(
            policy=label,
            world_size=self.world_size,
            num_steps=self.num_steps,
            representative=self.representative,
            columns=self.cols.arrays,
            steps=self.steps,
            spans={k: np.asarray(v, dtype=np.float64 if k.endswith("_s") else np.int64) for k, v in self.spans.items()},
            sent_params=tuple(self.sent),
            settings={
                "config": cfg.to_dict(),
                "plan_fingerprint": plan.fingerprint if plan is not None else None,
                "plan_schedule": [[int(start), fp] for (start, _), fp in zip(self.sources, self.plan_fingerprints)]
                if self.replans is not None else None,
                "workload": self.workload.name,
                "world_size": self.world_size,
                "mode": self.mode,
                "integration": self.integration,
                "dense_algorithm": self.algorithms[0],
                "sparse_algorithm": self.algorithms[1],
                "k_source": self.k_source,
                "seed": self.seed,
                "jitter": None if self.jitter is None else vars(self.jitter).copy(),
                "num_collective_evaluations": self.costs.num_evaluations,
                "collective_costs": self.costs.methods(),
            },
        )


def _select_shares(lay: PlanLayout) -> np.ndarray:
    """Per op, its share of the step's selection work, done after its bucket is ready and before it
    is launched, in proportion to the entries its hook scans (sparse gathers' parameters); dense ops
    and count exchanges add nothing. Earlier hooks' work is already in the recorded readiness of
    later gradients (the hooks run on backward's thread). [num_ops]."""
    work = np.array(
        [float(sum(op.param_numel)) if op.kind == OpKind.SPARSE_GATHER else 0.0 for op in lay.ops]
    )
    total = work.sum()
    return work / total if total > 0 else np.zeros(len(work))


_TALLY_FIELDS = ("values_bytes", "indices_bytes", "dense_bytes", "metadata_bytes", "num_collectives")


def _check_schedule(schedule, config: PolicyConfig) -> list[tuple[int, SyncPlan]]:
    """``plan_schedule`` as a list, checked: an online-profiling config, steps ascending from 0."""
    out = [(int(start), pl) for start, pl in schedule]
    if not config.online_profiling:
        raise ValueError("plan_schedule needs an online-profiling config (online_window, replan_every > 0)")
    starts = [s for s, _ in out]
    if not out or starts[0] != 0 or any(b <= a for a, b in itertools.pairwise(starts)):
        raise ValueError(f"plan_schedule: first steps must ascend from 0, got {starts}")
    return out


def _mix(a: int, b: int) -> int:
    return (int(a) * 1_000_003 + int(b)) % (2**63)


def _span(
    spans: dict[str, list], step: int, bucket: int, kind: int, start: float, end: float, size: int
) -> None:
    spans["step"].append(step)
    spans["bucket"].append(bucket)
    spans["kind"].append(kind)
    spans["start_s"].append(start)
    spans["end_s"].append(end)
    spans["size_bytes"].append(size)


def _kind(param: ParamInfo) -> str:
    return ComponentId.from_key(param.component).kind.value


def _k_matrix(workload: Workload, config: PolicyConfig, *, world_size: int, params) -> tuple[np.ndarray, str]:
    """Selected entries per (recorded step, [rank,] param): a run's own per-rank counts when the
    workload carries them for this world size, the workload's when recorded at this density,
    else nominal."""
    numel = workload.numel
    kr = workload.k_by_rank
    if kr is not None and kr.shape[1] == world_size:
        return _whole(kr, workload, config, params), "run"
    if (
        workload.k is not None
        and config.sparse
        and workload.k_density is not None
        and not config.density_per_kind
        and not config.density_per_component
        and math.isclose(workload.k_density, config.density, rel_tol=1e-9)
    ):
        return _whole(workload.k, workload, config, params), "trace"
    nominal = np.array(  # the wire's own rule: k of the component's density, every entry when whole
        [pairs_of(p, config) if config.sparse else nominal_k(int(n), config.density_for(_kind(p)))
         for n, p in zip(numel, params)]
    )  # fmt: skip
    return np.broadcast_to(nominal.astype(np.int64), (workload.num_recorded_steps, len(numel))), "nominal"


def _whole(k: np.ndarray, workload: Workload, config: PolicyConfig, params) -> np.ndarray:
    """``k`` with every parameter that sends all its entries (``config_k`` None, e.g. within
    ``dense_small_numel``) at its numel, as the runtime's selection does."""
    if not config.sparse:
        return k
    whole = [i for i, p in enumerate(params) if config_k(p, config) is None]
    rows = [i for i, p in enumerate(params) if row_dim(p, config)]  # always exactly their rows
    if not whole and not rows:
        return k
    k = np.array(k, dtype=np.int64, copy=True)
    k[..., whole] = np.asarray(workload.numel, dtype=np.int64)[whole]
    for i in rows:
        k[..., i] = config_k(params[i], config)
    return k


# every numeric StepMetrics field, as a column ("extra" and the string fields are not stored)
_ROW_DTYPES: dict[str, Any] = {
    f.name: np.int64 if f.type == "int" else np.float64
    for f in fields(StepMetrics)
    if f.type in ("int", "float")
}


class _Columns:
    """Preallocated StepMetrics columns."""

    def __init__(self, n: int) -> None:
        self.arrays = {k: np.zeros(n, dtype=d) for k, d in _ROW_DTYPES.items()}

    def fill(self, rows: slice, **values: Any) -> None:
        for k, v in values.items():
            self.arrays[k][rows] = v
