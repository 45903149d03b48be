"""Walk the README as a new user would: its two set-up commands in a fresh virtual environment,
then every tour command at its documented step count, each timed, with its longest silence.

    python benchmarks/readme_tour.py --workdir /tmp/tour      # a fresh venv and clone under it

A silence is the longest stretch with no new byte on stdout or stderr (a progress bar's redraw
counts as output). Prints one row per command: wall time, longest silence, PNGs it wrote, exit.
"""

from __future__ import annotations

import argparse
import os
import re
import selectors
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _tour_lines(readme: str) -> list[str]:
    head = re.search(r"```bash\n(.*?)```", readme, re.S).group(1)
    tour = re.search(r"## A tour\n.*?```bash\n(.*?)```", readme, re.S).group(1)
    setup = [line.split("#")[0].strip() for line in head.splitlines() if line.strip()]
    cmds = [line.split("  #")[0].strip() for line in tour.splitlines() if line.strip() and not line.startswith("#")]
    return setup + cmds


def run_timed(cmd: str, *, cwd: Path, env: dict[str, str], timeout_s: float) -> tuple[int, float, float, str]:
    """(exit code, wall s, longest silence s, last output) of ``cmd`` in a shell."""
    t0 = last = time.monotonic()
    gap = 0.0
    proc = subprocess.Popen(["bash", "-c", cmd], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    sel = selectors.DefaultSelector()
    for f in (proc.stdout, proc.stderr):
        os.set_blocking(f.fileno(), False)
        sel.register(f, selectors.EVENT_READ)
    tail = b""
    open_streams = 2
    while open_streams:
        if time.monotonic() - t0 > timeout_s:
            proc.kill()
            break
        for key, _ in sel.select(timeout=0.5):
            chunk = key.fileobj.read1(65536) if hasattr(key.fileobj, "read1") else key.fileobj.read(65536)
            if not chunk:
                sel.unregister(key.fileobj)
                open_streams -= 1
                continue
            now = time.monotonic()
            gap = max(gap, now - last)
            last = now
            tail = (tail + chunk)[-2000:]
    rc = proc.wait()
    now = time.monotonic()
    return rc, now - t0, gap, tail.decode(errors="replace")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, required=True, help="an empty folder for the venv and the clone")
    ap.add_argument("--timeout-s", type=float, default=1200.0, help="per command (default 1200)")
    ap.add_argument("--skip", default="", help="comma-separated substrings: tour commands to leave out")
    args = ap.parse_args()
    work = args.workdir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    clone = work / "repo"
    if not clone.exists():
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    venv = work / "venv"
    if not venv.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {**os.environ, "PATH": f"{venv / 'bin'}:{os.environ['PATH']}", "VIRTUAL_ENV": str(venv),
           "PIP_DISABLE_PIP_VERSION_CHECK": "1"}  # fmt: skip
    env.pop("PYTHONPATH", None)
    lines = _tour_lines((clone / "README.md").read_text())
    skip = [s for s in args.skip.split(",") if s]
    print(f"{'wall s':>7s} {'silent s':>8s} {'exit':>4s}  PNGs  command", flush=True)
    worst = 0.0
    for cmd in lines:
        if any(s in cmd for s in skip):
            print(f"{'-':>7s} {'-':>8s} {'-':>4s}  -     {cmd}  (skipped)", flush=True)
            continue
        before = {p: p.stat().st_mtime for p in clone.rglob("*.png")}
        shell = cmd[5:] if cmd.startswith("sudo ") else cmd  # root here
        rc, wall, gap, tail = run_timed(shell, cwd=clone, env=env, timeout_s=args.timeout_s)
        pngs = sorted(str(p.relative_to(clone)) for p in clone.rglob("*.png") if before.get(p) != p.stat().st_mtime)
        installing = cmd.startswith("pip ")
        if not installing:
            worst = max(worst, gap)
        print(f"{wall:7.1f} {gap:8.1f} {rc:4d}  {', '.join(pngs) or '-':5s} {cmd}", flush=True)
        if rc:
            print("   last output: " + shlex.quote(tail[-600:]), flush=True)
    print(f"longest silence outside pip installs: {worst:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
