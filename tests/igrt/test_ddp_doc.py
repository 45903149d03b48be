"""The plain-DDP script of docs/integrations.md (``snippet: ddp``) runs as written on 2 gloo ranks.

It is saved as ``ddp_example.py`` and started with ``python -m torch.distributed.run`` (torchrun),
given a SyncPlan over the script's own model, as the page shows; then each rank's saved state loads
with ``weights_only=True`` at the step the run ended.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "integrations.md"


def _snippet(name: str) -> str:
    match = re.search(rf"<!-- snippet: {re.escape(name)} -->\s*```\w*\n(.*?)```", DOC.read_text(), re.S)
    assert match, f"docs/integrations.md has no snippet {name!r}"
    return match.group(1)


@pytest.mark.slow
def test_the_plain_ddp_script_runs_on_two_gloo_ranks(tmp_path) -> None:
    from igrt.sync.setup import build_param_infos, named_parameters
    from tests.igrt.tiny_model import make_plan

    script = _snippet("ddp")
    assert "ddp.register_comm_hook(state, importance_hook)" in script
    (tmp_path / "ddp_example.py").write_text(script)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)
    )  # the script's
    make_plan(build_param_infos(named_parameters(model)), release_period=2).save(tmp_path / "plan.json")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
        "GLOO_SOCKET_IFNAME": "lo",
    }
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "ddp_example.py",
        "plan.json",
    ]
    proc = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    got = re.search(
        r"^importance: 50 steps, (\d+) of (\d+) dense bytes a step, loss ([\d.]+)$", proc.stdout, re.M
    )
    assert got, proc.stdout
    sent, dense = int(got[1]), int(got[2])
    assert dense == 4 * sum(p.numel() for p in model.parameters()) and 0 < sent < dense
    states = [torch.load(tmp_path / f"igsync-rank{r:03d}.pt", weights_only=True) for r in (0, 1)]
    assert [s["rank"] for s in states] == [0, 1] and all(
        s["step"] == 50 and s["world_size"] == 2 for s in states
    )
