"""``igsim``: profile traces, simulate policies on clusters, sweep scenarios, run the demo."""

from __future__ import annotations

from collections.abc import Sequence

from igpolicy.cli_util import dispatch

COMMANDS = {
    "demo": ("igsim.cmd_demo", "the whole pipeline on the shipped sample trace: profile, simulate, compare"),
    "profile": ("igsim.cmd_profile", "profile a gradient trace into a SyncPlan (JSON)"),
    "simulate": ("igsim.cmd_simulate", "simulate training steps of a policy on a topology"),
    "sweep": ("igsim.cmd_sweep", "sweep bandwidths x world sizes x policies, in parallel"),
    "replay": ("igsim.cmd_replay", "replay an igrt train --record-trace run and compare it step by step"),
    "collective": ("igsim.cmd_collective", "predict the time of one collective"),
    "validate-against": ("igsim.cmd_validate", "compare a prediction with a runtime measurement"),
    "validate-report": ("igsim.cmd_validate_report", "fit a calibration to testbed measurements and report errors"),
}


def main(argv: Sequence[str] | None = None) -> int:
    return dispatch(prog="igsim", description=__doc__ or "", commands=COMMANDS, argv=argv)
