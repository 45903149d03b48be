"""Shared command-line plumbing: sub-commands as modules, user errors without tracebacks.

Each sub-command is a module with ``add_arguments(parser)`` and ``run(args) -> int``; it is imported
only when chosen, so ``igsim --help`` stays fast and ``igsim demo`` never imports torch.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path

from igpolicy.cli_outputs import claim_output_dir, command_scope

__all__ = [
    "DISTRIBUTION",
    "add_deprecated_alias",
    "build_parser",
    "dispatch",
    "error_message",
    "package_version",
    "reading",
]

DISTRIBUTION = "importance-gradient"  # the distribution every command line belongs to (pyproject.toml)


def package_version() -> str:
    """The installed version of :data:`DISTRIBUTION` (importlib.metadata), what ``--version`` prints."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"


class _DeprecatedAlias(argparse.Action):
    """An old option string kept working: stores into the new option's ``dest`` and warns once."""

    def __init__(self, option_strings, dest, *, new: str, **kwargs) -> None:
        self.new = new
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(f"{parser.prog}: warning: {option_string} is deprecated, use {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)


def add_deprecated_alias(parser: argparse.ArgumentParser, old: str, new: argparse.Action) -> None:
    """Keep the renamed option ``old`` working as a hidden alias of the action ``new`` (what
    ``add_argument`` returned): same value and type, left out of ``--help``, a deprecation warning
    on stderr when used."""
    parser.add_argument(
        old,
        action=_DeprecatedAlias,
        new=new.option_strings[-1],
        dest=new.dest,
        nargs=new.nargs,
        const=new.const,
        type=new.type,
        choices=new.choices,
        metavar=new.metavar,
        default=argparse.SUPPRESS,
        help=argparse.SUPPRESS,
    )


def build_parser(
    *,
    prog: str,
    description: str,
    commands: Mapping[str, tuple[str, str]],
    folders: Mapping[str, str | None] | None = None,
    load: Iterable[str] = (),
) -> argparse.ArgumentParser:
    """The parser of a command line: ``--version`` and one sub-parser per command, the arguments
    of the commands in ``load`` added (their modules imported; a missing package raises
    ModuleNotFoundError). :func:`dispatch` loads the chosen command only; tests load them all."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {package_version()}", help="print the version and exit"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    load = set(load)
    for name, (module_name, help_text) in commands.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name in load:
            module = importlib.import_module(module_name)
            module.add_arguments(p)
            if folders and name in folders:
                p.add_argument(
                    "--overwrite",
                    action="store_true",
                    help="replace the contents of a non-empty output folder (default: refuse it)",
                )
            p.set_defaults(_run=module.run)
    return parser


def dispatch(
    *,
    prog: str,
    description: str,
    commands: Mapping[str, tuple[str, str]],
    argv: Sequence[str] | None,
    folders: Mapping[str, str | None] | None = None,
    launcher_rank: Callable[[], int] | None = None,
) -> int:
    """Parse ``argv`` and run the chosen sub-command; ``commands`` maps name -> (module, help).

    ``folders`` names the commands that write an output folder: each gets ``--overwrite``, and each
    runs inside :func:`igpolicy.cli_outputs.command_scope` (the folders it claims stay locked until
    it returns). The value is the ``args`` attribute holding the folder when dispatch claims it
    before the command runs, None when the command claims it itself (after its own checks).
    ``launcher_rank`` (igrt: torchrun's ``RANK``): only rank 0 claims. ``PROG --version`` prints
    the package version.

    A ValueError, OSError (e.g. FileNotFoundError, PermissionError), OverflowError, MemoryError or
    RecursionError from a command is a user-facing error: printed as ``prog command: error: ...``
    (naming the file of an OSError) with exit status 2, no traceback; a KeyboardInterrupt exits 1.
    """
    folders = dict(folders or {})
    argv = list(sys.argv[1:] if argv is None else argv)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    try:
        parser = build_parser(
            prog=prog, description=description, commands=commands, folders=folders, load=[chosen] if chosen else []
        )
    except ModuleNotFoundError as e:
        print(f"{prog} {chosen}: needs the Python package {e.name!r}, which is not installed", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 0 if args.command is None else 2
    try:
        with command_scope():
            dest = folders.get(args.command)
            if dest is not None and getattr(args, dest, None) is not None:
                claim_output_dir(
                    getattr(args, dest),
                    overwrite=args.overwrite,
                    flag="--" + dest.replace("_", "-"),
                    rank=launcher_rank() if launcher_rank is not None else 0,
                )
            return int(args._run(args) or 0)
    except KeyboardInterrupt:
        print(f"{prog} {args.command}: interrupted", file=sys.stderr)
        return 1
    except (ValueError, OSError, OverflowError, MemoryError, RecursionError) as e:
        message = error_message(e)
        if not isinstance(e, ValueError) and not (isinstance(e, OSError) and e.filename is not None):
            inputs = _input_files(args)  # the error does not say which file: name the candidates
            message += f" (while reading {', '.join(inputs)})" if inputs else ""
        print(f"{prog} {args.command}: error: {message}", file=sys.stderr)
        return 2


def error_message(e: BaseException) -> str:
    """The message of a user-facing error: a ValueError's own; one line naming the file(s) for an
    OSError; one line saying what went wrong for an OverflowError, MemoryError or RecursionError."""
    if isinstance(e, ValueError):
        return str(e)
    if isinstance(e, OSError):
        files = [str(f) for f in (e.filename, e.filename2) if f is not None]
        reason = e.strerror or str(e) or type(e).__name__
        text = f"{' -> '.join(files)}: {reason}" if files else reason
    elif isinstance(e, MemoryError):
        text = f"out of memory (MemoryError{': ' + str(e) if str(e) else ''}): an input asks for too much"
    elif isinstance(e, RecursionError):
        text = f"an input is nested too deeply (RecursionError: {e})"
    else:
        text = f"a number is too large ({type(e).__name__}: {e})"
    return " ".join(text.split())


def _input_files(args: argparse.Namespace) -> list[str]:
    """The arguments of a command that name existing files (its inputs), in argument order."""
    found = []
    for key, value in vars(args).items():
        if key.startswith("_") or not isinstance(value, (str, Path)):
            continue
        with contextlib.suppress(OSError, ValueError):
            if Path(value).is_file():
                found.append(str(value))
    return found


@contextlib.contextmanager
def reading(path: str | Path | None, what: str = "file") -> Iterator[None]:
    """Turn an OSError, OverflowError, MemoryError, RecursionError or UnicodeDecodeError raised
    while ``path`` is read into a ValueError naming it (ValueErrors pass through unchanged)."""
    try:
        yield
    except UnicodeDecodeError as e:  # a ValueError, but one that does not name the file
        raise ValueError(f"{what} {path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except (OSError, OverflowError, MemoryError, RecursionError) as e:
        reason = f"cannot read ({e.strerror or e})" if isinstance(e, OSError) else error_message(e)
        raise ValueError(f"{what} {path}: {reason}") from None
