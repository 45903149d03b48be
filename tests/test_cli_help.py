"""Every command line documents itself: every flag of every sub-command has help text (no reST
backticks, no internal issue numbers), and ``--version`` prints the installed package version."""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import re
from pathlib import Path

import pytest

from igpolicy.cli_util import DISTRIBUTION, build_parser, package_version

CLIS = {"igsim": "igsim.cli", "igrt": "igrt.cli", "igpolicy": "igpolicy.cli", "traces": "traces.cli"}
ISSUE = re.compile(r"\bissues?\s*#?\d+|\(#\d+\)|#\d+\b", re.IGNORECASE)


def _parser(prog: str) -> argparse.ArgumentParser:
    module = importlib.import_module(CLIS[prog])
    return build_parser(
        prog=prog,
        description=module.__doc__ or "",
        commands=module.COMMANDS,
        folders=getattr(module, "FOLDERS", None),
        load=module.COMMANDS,
    )


def _walk(parser: argparse.ArgumentParser, path: str):
    """(where, text) for the parser's description and every action's help, sub-parsers included."""
    yield f"{path} (description)", parser.description or ""
    for action in parser._actions:
        if action.help == argparse.SUPPRESS:
            continue  # a hidden deprecated alias
        where = f"{path} {'/'.join(action.option_strings) or action.dest}"
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                yield f"{path} {choice.dest}", choice.help or ""
            for name, sub in action.choices.items():
                yield from _walk(sub, f"{path} {name}")
        else:
            yield where, action.help or ""


def _texts() -> list[tuple[str, str]]:
    return [item for prog in CLIS for item in _walk(_parser(prog), prog)]


def test_every_flag_has_clean_help() -> None:
    texts = _texts()
    assert len(texts) > 150  # every sub-command's flags were walked, not only the top level
    missing = [where for where, text in texts if not text.strip()]
    backticks = [where for where, text in texts if "`" in text]
    issues = [f"{where}: {ISSUE.search(text).group(0)}" for where, text in texts if ISSUE.search(text)]
    assert not missing, f"no help text: {missing}"
    assert not backticks, f"backticks in help: {backticks}"
    assert not issues, f"internal issue numbers in help: {issues}"


def test_walk_sees_every_sub_command() -> None:
    walked = {where.split(" (")[0] for where, _ in _texts()}
    for prog, module_name in CLIS.items():
        for command in importlib.import_module(module_name).COMMANDS:
            assert f"{prog} {command}" in walked


@pytest.mark.parametrize("prog", sorted(CLIS))
def test_version(prog: str, capsys: pytest.CaptureFixture[str]) -> None:
    main = importlib.import_module(CLIS[prog]).main
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"{prog} {importlib.metadata.version(DISTRIBUTION)}"
    assert package_version() == importlib.metadata.version(DISTRIBUTION)


@pytest.mark.parametrize(
    ("command", "old", "new", "dest", "value"),
    [
        ("train", "--nproc", "--ranks", "nproc", 3),
        ("train", "--grad-accum", "--grad-accum-steps", "grad_accum", 2),
        ("train", "--timeout", "--timeout-s", "timeout", 9.0),
        ("record", "--nproc", "--ranks", "nproc", 3),
        ("bench", "--timeout", "--timeout-s", "timeout", 9.0),
        ("validate", "--rate", "--bandwidth", "rate", "20Mbit"),
        ("testbed", "--slow-rate", "--slow-bandwidth", "slow_rate", "5Mbit"),
        ("record", "--output", "--out", "out", Path("t")),
    ],
)
def test_renamed_flags_keep_working_hidden(command, old, new, dest, value, capsys) -> None:
    parser = _parser("igrt")
    extra = {"record": ["--workload", "gpt"] + ([] if dest == "out" else ["-o", "x"]), "testbed": ["up"]}.get(command, [])
    args = parser.parse_args([command, *extra, old, str(value)])
    assert getattr(args, dest) == value
    assert f"{old} is deprecated, use {new}" in capsys.readouterr().err
    assert getattr(parser.parse_args([command, *extra, new, str(value)]), dest) == value
    assert capsys.readouterr().err == ""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    assert new in sub.format_help() and f"{old} " not in sub.format_help()
