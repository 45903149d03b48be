"""Online profiling on real ranks: measure the window, reduce it once per re-plan, agree, switch plans.

:class:`OnlineProfiler` is what a :class:`~igrt.sync.state.SyncState` holds when
``PolicyConfig.replan_every > 0`` (the schedule and the plan rule are :mod:`igpolicy.online`'s).
Per step, :meth:`OnlineProfiler.observe` measures each parameter's *raw local* gradient as
``igrt record`` does (the run's own sparsifier at the nominal k of its kind's density: the selected
norm, the gradient norm, k, and the Jaccard overlap with this rank's previous selection), before any
residual is added: a held component has no selection of its own on a held step, and an accumulated
residual would inflate the magnitude of exactly the components that were held. It runs only at the
steps of a window (:meth:`igpolicy.online.OnlineSchedule.observes`) and costs compute, not bytes.

After a step ``t`` with ``t + 1`` a boundary, :meth:`OnlineProfiler.after_step` all-reduces the
flat float64 window vector (one collective; its bytes and those of the agreement check are added to
the step's ``metadata_bytes`` through the step's :class:`~igpolicy.step_plan.WireTally`), builds the
plan from the reduced vector alone (:func:`igpolicy.online.online_plan`), checks with
:func:`igrt.sync.comm.check_agreement` that every rank got the same plan (a ValueError on every rank
otherwise, never a hang), and installs it with :meth:`SyncState.apply_plan` for step ``t + 1``.
Residuals are keyed by parameter and never touched by a re-plan: a component that turns important
sends its accumulated residual through error feedback on its next step, one that turns low holds.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from igpolicy.controls import split_control
from igpolicy.online import (
    AGREE_PARTS,
    AGREE_WIDTH,
    OnlineSchedule,
    StatsWindow,
    component_rows,
    important_set,
    online_plan,
    replan_op_bytes,
    start_plan,
    window_complete,
)
from igpolicy.plan import SyncPlan
from igpolicy.vocab import ComponentClass, ComponentId
from igpolicy.wire import nominal_k
from igrt.sync import comm

__all__ = ["ONLINE_FORMAT", "OnlineProfiler", "expected_bytes", "initial_plan"]

ONLINE_FORMAT = "igonline/1"


def expected_bytes(sync: Any) -> dict[str, int]:
    """Per component, the nominal bytes it puts on the wire per release (the run's payload blocks)."""
    out: dict[str, int] = {}
    for b in sync.blocks:
        out[b.component] = out.get(b.component, 0) + int(b.size_bytes)
    return out


def initial_plan(sync: Any) -> SyncPlan:
    """The start plan of an online run without an offline plan: every component sends every step."""
    return start_plan(expected_bytes=expected_bytes(sync), release_period=sync.config.release_period)


def _jaccard_count(current: torch.Tensor, previous: torch.Tensor | None) -> float:
    """|A ∩ B| / |A ∪ B| of two unique index sets; NaN without a previous set or when both are empty
    (:func:`igrt.trace.recorder.jaccard`'s rule)."""
    if previous is None:
        return math.nan
    inter = (
        int(torch.isin(current, previous, assume_unique=True).sum()) if len(current) and len(previous) else 0
    )
    union = len(current) + len(previous) - inter
    return math.nan if union == 0 else inter / union


class OnlineProfiler:
    """One rank's online profiling state for ``sync`` (a SyncState): the window of component rows,
    the previous selections (for overlap), the current plan and the history of re-plans."""

    def __init__(self, sync: Any) -> None:
        cfg = sync.config
        self.sync = sync
        self.schedule = OnlineSchedule(window=cfg.online_window, every=cfg.replan_every)
        self.keys = tuple(sorted({i.component for i in sync.infos}))
        numel: dict[str, int] = {}
        for i in sync.infos:
            numel[i.component] = numel.get(i.component, 0) + i.numel
        self.numel = tuple(numel[k] for k in self.keys)
        self.param_component = {i.name: i.component for i in sync.infos}
        self.k = {
            i.name: nominal_k(i.numel, cfg.density_for(ComponentId.from_key(i.component).kind.value))
            for i in sync.infos
        }
        self.window = StatsWindow(keys=self.keys, window=cfg.online_window)
        self.previous: dict[str, torch.Tensor] = {}
        self.previous_step = -1  # the step self.previous was selected at
        self.expected = expected_bytes(sync)
        self.history: list[dict[str, Any]] = [self._entry(sync.plan, step=0, nbytes=0)]

    # ------------------------------------------------------------------ per step
    def observe(self, step: int, grads: Callable[[str], torch.Tensor | None]) -> bool:
        """Measure ``grads`` (the raw local gradients) at ``step`` when the window needs it; True if it did."""
        if not self.schedule.observes(step):
            return False
        contiguous = self.previous_step == step - 1
        stats: dict[str, tuple[float, float, float, float]] = {}
        sel_sq, grad_sq, ks, names = [], [], [], []
        for name in self.param_component:
            g = grads(name)
            if g is None:
                idx = torch.empty(0, dtype=torch.int64, device=self.sync.device)
                zero = torch.zeros((), dtype=torch.float64, device=self.sync.device)
                sel_sq.append(zero)
                grad_sq.append(zero)
            else:
                u = g.detach().reshape(-1).float()
                idx = self.sync.sparsifier.select(u, self.k[name], step=step, key=name)
                sel_sq.append(torch.linalg.vector_norm(u[idx], dtype=torch.float64) ** 2)
                grad_sq.append(torch.linalg.vector_norm(u, dtype=torch.float64) ** 2)
            prev = self.previous.get(name) if contiguous else None
            jac = _jaccard_count(idx, prev)
            ks.append(int(idx.numel()))
            names.append((name, jac))
            self.previous[name] = idx
        sels = torch.stack(sel_sq).sqrt().tolist()  # one host sync for every parameter
        norms = torch.stack(grad_sq).sqrt().tolist()
        for (name, jac), s, n, k in zip(names, sels, norms, ks):
            stats[name] = (s, n, float(k), jac)
        self.previous_step = step
        self.window.add(step, component_rows(stats, param_component=self.param_component, keys=self.keys))
        return True

    def after_step(self, step: int, run: Any) -> dict[str, float]:
        """After ``step`` (its ops done): re-plan if ``step + 1`` is a boundary; the row's extras."""
        if not self.schedule.replans_after(step):
            return {}
        t0 = time.perf_counter()
        boundary = step + 1
        mine = torch.from_numpy(self.window.vector(boundary)).to(self.sync.device)
        ops = replan_op_bytes(
            num_components=len(self.keys), window=self.schedule.window, world_size=self.sync.world_size
        )
        nbytes = ops[0].wire_size_bytes
        assert mine.numel() * mine.element_size() == nbytes, "the window vector's size is igpolicy.online's"
        if self.sync.world_size > 1:
            dist.all_reduce(mine, group=self.sync.group)
        run.tally.add(ops[0])
        reduced = mine.to("cpu").numpy()
        if not window_complete(reduced):  # some rank missed a step of the window: every rank skips
            return {"online_replan": 0.0, "online_skipped": 1.0, "online_bytes": float(nbytes),
                    "online_replan_s": time.perf_counter() - t0}  # fmt: skip
        plan, _, _ = online_plan(
            reduced=reduced,
            keys=self.keys,
            numel=self.numel,
            expected_bytes=self.expected,
            release_period=self.sync.config.release_period,
            window=self.schedule.window,
            world_size=self.sync.world_size,
            boundary=boundary,
            max_share=self.sync.config.max_share or None,
        )
        if self.sync.config.online_control:  # an experiment's split control: same on every rank
            plan = split_control(plan, self.sync.config.online_control, seed=(self.sync.config.seed, boundary))
        parts = dict(zip(AGREE_PARTS, (plan.fingerprint[:AGREE_WIDTH], str(boundary))))
        if len(ops) > 1:  # more than one rank: agree on the plan
            run.tally.add(ops[1])
            nbytes += ops[1].wire_size_bytes
            comm.check_agreement(
                parts, group=self.sync.group, device=self.sync.device, width=AGREE_WIDTH,
                who=f"online re-plan at step {boundary} (rank {self.sync.rank})",
            )  # fmt: skip
        changed = plan.fingerprint != self.sync.plan.fingerprint
        self.sync.apply_plan(plan)
        self.history.append(self._entry(plan, step=boundary, nbytes=nbytes))
        return {
            "online_replan": 1.0,
            "online_changed": float(changed),
            "online_bytes": float(nbytes),
            "online_replan_s": time.perf_counter() - t0,
        }

    # ------------------------------------------------------------------ history and checkpoints
    def _entry(self, plan: SyncPlan, *, step: int, nbytes: int) -> dict[str, Any]:
        """One plans.jsonl row: from which step the plan applies, its classes, bytes, the plan itself."""
        return {
            "step": int(step),
            "fingerprint": plan.fingerprint,
            "important": sorted(important_set(plan)),
            "pinned": sorted(c.key for c in plan.components if c.cls == ComponentClass.PINNED),
            "low": sorted(plan.low),
            "online_bytes_per_rank": int(nbytes),
            "plan": plan.to_json(),
        }

    def state_dict(self) -> dict[str, Any]:
        """The window, the previous selections, the history and the current plan (plain containers
        and tensors, for ``torch.load(weights_only=True)``)."""
        import json

        return {
            "format": ONLINE_FORMAT,
            "window": self.window.state_dict(),
            "previous": {n: t.detach().to("cpu").clone() for n, t in sorted(self.previous.items())},
            "previous_step": int(self.previous_step),
            "history": json.dumps(self.history),
            "plan": json.dumps(self.sync.plan.to_json()),
        }

    def load_state_dict(self, sd: Any, *, same_world: bool) -> None:
        """Restore :meth:`state_dict` and install its plan. At another world size (a flushed state)
        the per-rank window is dropped: the next re-plan whose window lacks steps is skipped."""
        import json

        if not isinstance(sd, dict) or sd.get("format") != ONLINE_FORMAT:
            raise ValueError(f"sync state: the online-profiling state is not {ONLINE_FORMAT}")
        plan = SyncPlan.from_json(json.loads(sd["plan"]), where="sync state: online plan")
        self.history = json.loads(sd["history"])
        if same_world:
            self.window.load_state_dict(sd["window"])
            self.previous = {n: t.to(self.sync.device) for n, t in sd["previous"].items()}
            self.previous_step = int(sd["previous_step"])
        else:
            self.window.clear()
            self.previous, self.previous_step = {}, -1
        self.sync.apply_plan(plan)
