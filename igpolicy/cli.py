"""python -m igpolicy: inspect a SyncPlan."""

from __future__ import annotations

from collections.abc import Sequence

from igpolicy.cli_util import dispatch

COMMANDS = {
    "show-plan": ("igpolicy.cmd_show_plan", "validate a SyncPlan file and print its components"),
}


def main(argv: Sequence[str] | None = None) -> int:
    return dispatch(prog="igpolicy", description=__doc__ or "", commands=COMMANDS, argv=argv)
