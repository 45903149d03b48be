"""python -m traces: inspect and validate gradient traces."""

from __future__ import annotations

from collections.abc import Sequence

from igpolicy.cli_util import dispatch

COMMANDS = {
    "inspect": ("traces.cmd_inspect", "validate a trace directory and print a summary"),
}


def main(argv: Sequence[str] | None = None) -> int:
    return dispatch(prog="traces", description=__doc__ or "", commands=COMMANDS, argv=argv)
