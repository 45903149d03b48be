"""igsim: profile traces, simulate policies on clusters, sweep scenarios, run the demo."""

from __future__ import annotations

from collections.abc import Sequence

from igpolicy.cli_util import dispatch

COMMANDS = {
    "demo": ("igsim.cli.demo", "the whole pipeline on the shipped sample trace: profile, simulate, compare"),
    "profile": ("igsim.cli.profile", "profile a gradient trace into a SyncPlan (JSON)"),
    "simulate": ("igsim.cli.simulate", "simulate training steps of a policy on a topology"),
    "sweep": ("igsim.cli.sweep", "sweep bandwidths x world sizes x policies, in parallel"),
    "replay": ("igsim.cli.replay", "replay an igrt train --record-trace run and compare it step by step"),
    "collective": ("igsim.cli.collective", "predict the time of one collective"),
    "validate-against": ("igsim.cli.validate", "compare a prediction with a runtime measurement"),
    "validate-report": ("igsim.cli.validate_report", "fit a calibration to testbed measurements and report errors"),
    "calibrate": ("igsim.cli.calibrate", "refit the testbed calibration from one igrt validate run; check it on others"),
}
FOLDERS = {"demo": None, "replay": None}  # commands that claim an output folder (igpolicy.cli_outputs)


def main(argv: Sequence[str] | None = None) -> int:
    return dispatch(prog="igsim", description=__doc__ or "", commands=COMMANDS, argv=argv, folders=FOLDERS)
