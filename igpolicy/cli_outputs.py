"""The output rule of every command: claim the output folder, check the output files, before any work.

Every command that writes a folder (``igrt train``, ``record``, ``validate``; ``igsim demo``,
``replay``) calls :func:`claim_output_dir` after parsing its arguments and before its work starts:

1. the path must be a folder or not exist (it is created); ``--out /etc/passwd`` is an error;
2. an exclusive lock (``fcntl.flock`` on ``FOLDER/.ig-lock``) is taken for the whole command: a
   second run into the same folder is refused, naming the process that holds it;
3. a folder holding anything besides the lock file is refused unless ``overwrite``: then its old
   contents are removed first — but only from a folder that carries the lock file of an earlier
   run of these commands (so ``--out ~ --overwrite`` can never empty a home folder);
4. the folder must take new files (a probe file is created and removed).

Files named on the command line (``--csv F``, ``--json F``, ``--png F``) are checked with
:func:`check_output_file`: not a folder, its folder exists, and it can be written. Every problem is
a ``ValueError`` naming the flag and the path, raised before the work, never a traceback after it.

The lock is held until :func:`release` or the end of the command: :func:`igpolicy.cli_util.dispatch`
runs each command inside :func:`command_scope`, which releases what the command claimed. The lock
file stays behind as the mark of a folder these commands wrote.

>>> import tempfile, pathlib
>>> root = pathlib.Path(tempfile.mkdtemp())
>>> with command_scope():
...     claim = claim_output_dir(root / "run", overwrite=False, flag="--out")
...     (root / "run" / "result.txt").write_text("1")
1
>>> with command_scope():
...     claim_output_dir(root / "run", overwrite=False, flag="--out")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
ValueError: --out ...run: the folder is not empty (result.txt); pass --overwrite to replace its contents, or choose another folder
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = ["LOCK_NAME", "OutputDir", "check_output_file", "claim_output_dir", "command_scope"]

LOCK_NAME = ".ig-lock"
_HELD: list[OutputDir] = []  # the claims of the running command (released by command_scope)


class OutputDir:
    """A claimed output folder: ``path`` and the open, exclusively locked lock file."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    def release(self) -> None:
        """Unlock and close the lock file (the file itself stays); idempotent."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
        if self in _HELD:
            _HELD.remove(self)

    def __enter__(self) -> OutputDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"OutputDir({str(self.path)!r}, held={self._fd is not None})"


@contextlib.contextmanager
def command_scope() -> Iterator[None]:
    """Release, at the end of the block, every folder claimed inside it."""
    start = len(_HELD)
    try:
        yield
    finally:
        while len(_HELD) > start:
            _HELD[-1].release()


def claim_output_dir(
    path: str | Path, *, overwrite: bool, flag: str = "--out", continue_in_place: bool = False, rank: int = 0
) -> OutputDir | None:
    """Create (or reuse) the output folder ``path``, lock it for this command and check it.

    ``overwrite``: remove the old contents of a non-empty folder (one these commands wrote) instead
    of refusing it. ``continue_in_place``: the command continues the run the folder holds (``igrt
    train --resume`` of the same folder): its contents are kept and no error is raised for them.
    ``rank``: under torchrun every rank runs the command; only rank 0 claims (others return None).
    Raises ValueError naming ``flag`` and the path (see the module docstring).
    """
    if rank != 0:
        return None
    out = Path(path)
    where = f"{flag} {out}"
    if overwrite and continue_in_place:
        raise ValueError(f"{where}: --overwrite would remove the run this command continues")
    if out.exists() and not out.is_dir():
        raise ValueError(f"{where}: exists and is not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"{where}: cannot create the folder ({e.strerror or e})") from None
    lock_path = out / LOCK_NAME
    marked = lock_path.is_file()
    fd = _lock(lock_path, where=where)
    claim = OutputDir(out, fd)
    _HELD.append(claim)
    try:
        others = sorted(p.name for p in out.iterdir() if p.name != LOCK_NAME)
        if others and not continue_in_place:
            if not overwrite:
                shown = ", ".join(others[:5]) + (f", ... ({len(others)} entries)" if len(others) > 5 else "")
                raise ValueError(
                    f"{where}: the folder is not empty ({shown}); pass --overwrite to replace its "
                    "contents, or choose another folder"
                )
            if not marked:
                raise ValueError(
                    f"{where}: the folder holds files that no igrt/igsim command wrote (it has no "
                    f"{LOCK_NAME}); --overwrite removes only such a command's outputs: empty it "
                    "yourself or choose another folder"
                )
            _remove_contents(out, where=where)
        _probe(out, where=where)
    except BaseException:
        claim.release()
        if not marked:  # the lock file this attempt created must not mark a foreign folder as ours
            with contextlib.suppress(OSError):
                lock_path.unlink()
        raise
    return claim


def check_output_file(path: str | Path, *, flag: str) -> Path:
    """Check that the file ``path`` can be written (without changing it); returns it as a Path.

    ValueError naming ``flag`` when it is a folder, when its folder does not exist or takes no new
    files, or when an existing file cannot be opened for writing (``/proc/version``).
    """
    p = Path(path)
    where = f"{flag} {p}"
    if p.is_dir():
        raise ValueError(f"{where}: is a folder; give a file name")
    if p.exists():
        try:
            with open(p, "ab"):  # opens for writing without touching the contents
                pass
        except OSError as e:
            raise ValueError(f"{where}: cannot be written ({e.strerror or e})") from None
        return p
    parent = p.parent
    if not parent.is_dir():
        raise ValueError(f"{where}: the folder {parent} does not exist")
    _probe(parent, where=where)
    return p


def _lock(lock_path: Path, *, where: str) -> int:
    """Open and exclusively lock ``lock_path``; write who holds it. ValueError when another holds it."""
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise ValueError(f"{where}: cannot create files in the folder ({e.strerror or e})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_holder(fd)
        os.close(fd)
        raise ValueError(
            f"{where}: the folder is in use by another run ({holder}); wait for it to end or choose "
            "another folder"
        ) from None
    except OSError as e:  # a file system without locks
        os.close(fd)
        raise ValueError(f"{where}: cannot lock {lock_path} ({e.strerror or e})") from None
    except BaseException:
        os.close(fd)
        raise
    info = f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}: "
    info += " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])[:500] + "\n"
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, info.encode(), 0)
    return fd


def _read_holder(fd: int) -> str:
    with contextlib.suppress(OSError):
        text = os.pread(fd, 600, 0).decode(errors="replace").strip()
        if text:
            return text
    return "a process that holds its lock"


def _remove_contents(out: Path, *, where: str) -> None:
    for p in out.iterdir():
        if p.name == LOCK_NAME:
            continue
        try:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
        except OSError as e:
            raise ValueError(f"{where}: cannot remove {p} ({e.strerror or e})") from None


def _probe(folder: Path, *, where: str) -> None:
    """Create and remove a file in ``folder``: the folder takes new files."""
    try:
        fd, name = tempfile.mkstemp(prefix=".ig-probe-", dir=folder)
    except OSError as e:
        raise ValueError(f"{where}: cannot create files in {folder} ({e.strerror or e})") from None
    os.close(fd)
    os.unlink(name)
