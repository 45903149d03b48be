"""Every command of the README's tour parses with today's command lines, and none uses a hidden
deprecated alias; every one says, in the comment above it, how long it took.

The commands are not run here (the longest take minutes); the README states how they were timed.
"""

from __future__ import annotations

import argparse
import importlib
import re
import shlex
from pathlib import Path

import pytest

from igpolicy.cli_util import build_parser

README = Path(__file__).resolve().parents[1] / "README.md"
CLIS = {"igsim": "igsim.cli", "igrt": "igrt.cli", "traces": "traces.cli"}


def _tour() -> list[tuple[str, list[str]]]:
    """(comment above, argv) of every igsim / igrt / traces command in the tour's code block."""
    text = README.read_text()
    block = re.search(r"## A tour\n.*?```bash\n(.*?)```", text, re.S)
    assert block, "README.md has no tour code block"
    out, comment = [], []
    for line in block.group(1).splitlines():
        if line.startswith("#"):
            comment.append(line)
            continue
        argv = shlex.split(line, comments=True)
        while argv and argv[0] in ("sudo",):
            argv = argv[1:]
        if argv[:2] == ["python", "-m"]:
            argv = argv[2:]
        if argv and argv[0] == "torchrun":
            argv = argv[argv.index("-m") + 1 :]
        if argv and argv[0] in CLIS:
            out.append((" ".join(comment), argv))
        comment = []
    return out


def _parser(prog: str) -> argparse.ArgumentParser:
    module = importlib.import_module(CLIS[prog])
    return build_parser(prog=prog, description="", commands=module.COMMANDS,
                        folders=getattr(module, "FOLDERS", None), load=module.COMMANDS)  # fmt: skip


def _hidden_options(parser: argparse.ArgumentParser, command: str) -> set[str]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    return {o for a in sub._actions if a.help == argparse.SUPPRESS for o in a.option_strings}


def test_the_tour_has_commands() -> None:
    progs = {argv[0] for _, argv in _tour()}
    assert progs == set(CLIS) and len(_tour()) >= 10


@pytest.mark.parametrize(
    ("comment", "argv"), _tour(), ids=lambda x: " ".join(x[:2]) if isinstance(x, list) else ""
)
def test_a_tour_command_parses_and_says_how_long_it_takes(comment, argv) -> None:
    prog, rest = argv[0], argv[1:]
    parser = _parser(prog)
    try:
        parser.parse_args(rest)
    except SystemExit as e:
        pytest.fail(f"README tour: {shlex.join(argv)} does not parse (exit {e.code})")
    hidden = {a.split("=")[0] for a in rest if a.startswith("--")} & _hidden_options(parser, rest[0])
    assert not hidden, f"README tour: {shlex.join(argv)} uses deprecated flag(s) {sorted(hidden)}"
    assert re.search(r"\d+(\.\d+)? (s|min)\b", comment), f"README tour: no duration above {shlex.join(argv)}"
