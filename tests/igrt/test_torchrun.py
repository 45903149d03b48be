"""``igrt record`` under torchrun: the command of docs/integrations.md, compared with our own spawner.

The documented command (``snippet: torchrun``) runs as written, with ``torchrun`` spelled
``python -m torch.distributed.run`` (a subprocess with a timeout). The same recording through
``--ranks 2`` (our spawner) must give the same trace: same ranks, steps, parameters, k, selected
norms and losses — the launcher changes nothing but who starts the processes.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from traces.reader import read_trace

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "integrations.md"
DETERMINISTIC = ("step", "rank", "param", "numel", "k", "grad_norm", "sel_norm", "sel_max_abs", "overlap")


def doc_snippet(name: str) -> str:
    """The code block that follows ``<!-- snippet: name -->`` in docs/integrations.md."""
    match = re.search(rf"<!-- snippet: {re.escape(name)} -->\s*```\w*\n(.*?)```", DOC.read_text(), re.S)
    assert match, f"docs/integrations.md has no snippet {name!r}"
    return match.group(1)


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
        "GLOO_SOCKET_IFNAME": "lo",  # single host (see the doc's note)
    }


def _run(argv: list[str], cwd: Path) -> None:
    proc = subprocess.run(argv, env=_env(), cwd=cwd, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, f"{shlex.join(argv)}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"


def _sorted_rows(table: dict) -> dict[str, np.ndarray]:
    """The table's rows in (step, rank, param) order (part files may come in any order)."""
    keys = [np.asarray(table[k]) for k in ("param", "rank", "step") if k in table]
    order = np.lexsort(keys)
    return {k: np.asarray(table[k])[order] for k in table}


@pytest.mark.slow
def test_igrt_record_tiny_under_torchrun_matches_the_spawner(tmp_path):
    argv = shlex.split(doc_snippet("torchrun").strip())
    assert argv[0] == "torchrun" and "-m" in argv and argv[argv.index("-m") + 1] == "igrt"
    out = Path(argv[argv.index("-o") + 1])
    _run([sys.executable, "-m", "torch.distributed.run", *argv[1:]], tmp_path)

    # our spawner: the same igrt arguments, run by `python -m igrt ... --ranks 2`
    igrt_args = argv[argv.index("-m") + 2 :]
    nproc = argv[argv.index("--nproc-per-node") + 1]
    spawned = "trace-spawned"
    igrt_args[igrt_args.index("-o") + 1] = spawned
    _run([sys.executable, "-m", "igrt", *igrt_args, "--ranks", nproc, "--no-progress"], tmp_path)

    a, b = read_trace(tmp_path / out), read_trace(tmp_path / spawned)
    assert a.manifest.world_size == b.manifest.world_size == 2
    assert a.ranks == b.ranks == (0, 1) and a.num_steps == b.num_steps == 3
    assert a.param_names == b.param_names
    rows_a, rows_b = _sorted_rows(a.params), _sorted_rows(b.params)
    assert len(rows_a["step"]) == 3 * 2 * len(a.param_names)
    for column in DETERMINISTIC:
        np.testing.assert_allclose(rows_a[column], rows_b[column], rtol=1e-6, err_msg=column, equal_nan=True)
    np.testing.assert_allclose(_sorted_rows(a.steps)["loss"], _sorted_rows(b.steps)["loss"], rtol=1e-6)
    np.testing.assert_array_equal(a.unions["union_k"], b.unions["union_k"])
