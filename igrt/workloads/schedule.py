"""The learning-rate schedules of ``igrt train --schedule``: constant, or cosine with linear warm-up.

:func:`adamw` builds a workload's AdamW with the schedule attached as an optimizer step pre-hook.
The hook counts optimizer steps in each param group (``group["schedule_step"]``), so the count is
part of ``optimizer.state_dict()`` and a resumed run continues the schedule where it stopped.
"""

from __future__ import annotations

import math

import torch

__all__ = ["SCHEDULES", "adamw", "lr_factor"]

SCHEDULES = ("constant", "cosine")


def lr_factor(step: int, *, schedule: str, warmup_steps: int, total_steps: int | None) -> float:
    """The multiplier of the base learning rate at optimizer step ``step`` (0-based).

    ``constant``: 1 after a linear warm-up over ``warmup_steps`` steps. ``cosine``: the same warm-up,
    then a half cosine from 1 down to 0 at ``total_steps``. ValueError for an unknown schedule.

    >>> lr_factor(0, schedule="cosine", warmup_steps=2, total_steps=10)
    0.5
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"--schedule {schedule!r} is not one of {', '.join(SCHEDULES)}")
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant" or not total_steps:
        return 1.0
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def adamw(
    model: torch.nn.Module,
    *,
    lr: float,
    weight_decay: float = 0.01,
    schedule: str = "constant",
    warmup_steps: int = 0,
    total_steps: int | None = None,
) -> torch.optim.Optimizer:
    """AdamW over ``model``'s trainable parameters, its learning rate set before every step by
    :func:`lr_factor` (nothing is attached for a constant schedule without warm-up)."""
    if not lr > 0:
        raise ValueError(f"--lr must be > 0, got {lr}")
    if warmup_steps < 0:
        raise ValueError(f"--warmup-steps must be >= 0, got {warmup_steps}")
    lr_factor(0, schedule=schedule, warmup_steps=0, total_steps=total_steps)  # checks the name
    opt = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=weight_decay
    )
    if schedule == "constant" and warmup_steps == 0:
        return opt
    for group in opt.param_groups:
        group["base_lr"] = lr
        group["schedule_step"] = 0
        group["lr"] = lr * lr_factor(0, schedule=schedule, warmup_steps=warmup_steps, total_steps=total_steps)

    def before_step(optimizer, args, kwargs) -> None:
        for group in optimizer.param_groups:
            n = int(group["schedule_step"])
            f = lr_factor(n, schedule=schedule, warmup_steps=warmup_steps, total_steps=total_steps)
            group["lr"] = group["base_lr"] * f
            group["schedule_step"] = n + 1

    opt.register_step_pre_hook(before_step)
    return opt
