"""Shared command-line plumbing: sub-commands as modules, user errors without tracebacks.

Each sub-command is a module with ``add_arguments(parser)`` and ``run(args) -> int``; it is imported
only when chosen, so ``igsim --help`` stays fast and ``igsim demo`` never imports torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Mapping, Sequence

__all__ = ["dispatch"]


def dispatch(
    *, prog: str, description: str, commands: Mapping[str, tuple[str, str]], argv: Sequence[str] | None
) -> int:
    """Parse ``argv`` and run the chosen sub-command; ``commands`` maps name -> (module, help).

    A ValueError, FileNotFoundError or KeyboardInterrupt from a command is a user-facing error:
    printed as ``prog: error: ...`` with exit status 2 (1 for an interrupt), no traceback.
    """
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
            p.set_defaults(_run=module.run)
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 0 if args.command is None else 2
    try:
        return int(args._run(args) or 0)
    except (ValueError, FileNotFoundError) as e:
        print(f"{prog} {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog} {args.command}: interrupted", file=sys.stderr)
        return 1
