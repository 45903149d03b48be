"""``python -m igpolicy show-plan PLAN``."""

from __future__ import annotations

import argparse

from igpolicy.plan import SyncPlan
from igpolicy.units import format_bytes


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("plan", help="SyncPlan JSON file")


def run(args: argparse.Namespace) -> int:
    plan = SyncPlan.load(args.plan)
    print(f"SyncPlan {plan.fingerprint}: {len(plan.components)} components, release period {plan.release_period}")
    print(f"  important/pinned: {len(plan.important)}   low: {len(plan.low)}")
    print(f"{'component':40s} {'class':10s} {'phase':>5s} {'score':>8s} {'bytes/release':>14s}")
    for c in sorted(plan.components, key=lambda c: -c.score):
        phase = "-" if c.phase is None else str(c.phase)
        print(f"{c.key:40s} {c.cls.value:10s} {phase:>5s} {c.score:8.4f} {format_bytes(c.expected_bytes):>14s}")
    return 0
