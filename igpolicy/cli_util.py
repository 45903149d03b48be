"""Shared command-line plumbing: sub-commands as modules, user errors without tracebacks.

Each sub-command is a module with ``add_arguments(parser)`` and ``run(args) -> int``; it is imported
only when chosen, so ``igsim --help`` stays fast and ``igsim demo`` never imports torch.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from igpolicy.cli_outputs import claim_output_dir, command_scope

__all__ = ["dispatch", "error_message", "reading"]


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
    ``launcher_rank`` (igrt: torchrun's ``RANK``): only rank 0 claims.

    A ValueError, OSError (e.g. FileNotFoundError, PermissionError), OverflowError, MemoryError or
    RecursionError from a command is a user-facing error: printed as ``prog command: error: ...``
    (naming the file of an OSError) with exit status 2, no traceback; a KeyboardInterrupt exits 1.
    """
    folders = dict(folders or {})
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog=prog, description=description)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, (module_name, help_text) in commands.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            try:
                module = importlib.import_module(module_name)
            except ModuleNotFoundError as e:
                print(f"{prog} {name}: needs the Python package {e.name!r}, which is not installed", file=sys.stderr)
                return 2
            module.add_arguments(p)
            if name in folders:
                p.add_argument(
                    "--overwrite",
                    action="store_true",
                    help="replace the contents of a non-empty output folder (default: refuse it)",
                )
            p.set_defaults(_run=module.run)
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
