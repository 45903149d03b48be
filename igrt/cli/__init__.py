"""igrt: train with importance-aware sync, record traces, validate on a testbed, benchmark."""

from __future__ import annotations

import os
from collections.abc import Sequence

from igpolicy.cli_util import dispatch

COMMANDS = {
    "train": ("igrt.cli.train", "train a reference workload with a sync policy on real processes"),
    "record": ("igrt.cli.record", "record a gradient trace from a reference workload"),
    "bench": ("igrt.cli.bench", "print the synchronizer overhead table"),
    "testbed": ("igrt.cli.testbed", "set up / tear down the network-namespace testbed (root)"),
    "validate": ("igrt.cli.validate", "measure collectives and steps on the testbed, compare with igsim"),
}
# commands that write an output folder (igpolicy.cli_outputs): the argument dispatch claims before
# the command runs, or None where the command claims its folder itself
FOLDERS = {"train": None, "record": "out", "validate": None}


def _launcher_rank() -> int:
    """Under torchrun every rank runs the command; rank 0 (``RANK``) owns the output folder."""
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def main(argv: Sequence[str] | None = None) -> int:
    return dispatch(
        prog="igrt",
        description=__doc__ or "",
        commands=COMMANDS,
        argv=argv,
        folders=FOLDERS,
        launcher_rank=_launcher_rank,
    )
