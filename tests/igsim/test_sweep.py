"""Sweeps: the same rows from every executor and worker count, streamed as points finish, and the
CLI's executor flags. The Ray test starts a local Ray cluster of 2 CPUs (skipped without Ray)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from igpolicy.config import PolicyConfig
from igpolicy.vocab import ParamInfo
from igsim.cli import main
from igsim.step.workload import Workload
from igsim.studies import sweep as sw


def _workload() -> Workload:
    params = tuple(
        ParamInfo(
            name=f"l{i}.w", shape=(256, 64 * (1 + i % 3)), dtype="float32", component=f"{i}.mlp_up", order=i
        )
        for i in range(6)
    )
    return Workload(
        name="unit", params=params, ready_s=np.linspace(0.01, 0.001, 6)[None, :], forward_s=np.array([0.01]),
        backward_s=np.array([0.02]), optimizer_s=np.array([0.002]),
    )  # fmt: skip


GRID = {
    "policies": ("dense", "topk"),
    "bandwidths_bytes_per_s": (1.25e8, 1.25e9),
    "world_sizes": (2, 8),
    "num_steps": 3,
}


def _rows(**kw) -> list[dict]:
    cfg = PolicyConfig(policy="topk", density=0.05, num_buckets=2)
    return sw.run_sweep(workload=_workload(), plan=None, config=cfg, progress=False, **GRID, **kw)


def test_rows_do_not_depend_on_the_workers_and_stream_in():
    seen = []
    one = _rows(max_workers=1, on_row=seen.append)
    two = _rows(max_workers=2)
    assert one == two
    assert len(seen) == 8 and sorted(map(repr, seen)) == sorted(map(repr, one))  # every row, once
    assert [(r["world_size"], r["bandwidth_bytes_per_s"], r["policy"]) for r in one] == sorted(
        ((r["world_size"], r["bandwidth_bytes_per_s"], r["policy"]) for r in one),
        key=lambda x: (x[0], x[1], GRID["policies"].index(x[2])),
    )


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="executor 'dask'"):
        _rows(executor="dask")
    with pytest.raises(ValueError, match="max_workers"):
        _rows(max_workers=0)
    assert sw.available_cpus() >= 1


def test_cli_flags(capsys, monkeypatch):
    args = ["sweep", "--model", "pythia-160m", "--policies", "dense", "--bandwidths", "10Gbps", "--ranks", "4",
            "--steps", "2", "--no-progress"]  # fmt: skip
    assert main([*args, "--address", "auto"]) == 2
    assert "--address needs --executor ray" in capsys.readouterr().err
    assert main([*args, "--workers", "0"]) == 2
    monkeypatch.setattr(sw, "available_cpus", lambda: 1)
    import igsim.cli.sweep as cli_sweep

    monkeypatch.setattr(cli_sweep, "available_cpus", lambda: 1)
    assert main([*args, "--workers", "64"]) == 0
    assert "--workers 64 > the 1 CPUs available here: using 1" in capsys.readouterr().out


@pytest.mark.skipif(
    importlib.util.find_spec("ray") is None, reason="ray is not installed (pip install -e '.[ray]')"
)
def test_ray_executor_gives_the_process_pools_rows(tmp_path, capsys):
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=80 * 2**20)
    try:
        seen = []
        on_ray = _rows(max_workers=8, executor="ray", on_row=seen.append)  # capped at the cluster's 2 CPUs
        assert ray.is_initialized()  # a cluster it did not start is left running
        args = ["sweep", "--model", "pythia-160m", "--policies", "dense,topk", "--bandwidths", "10Gbps",
                "--ranks", "4,16", "--steps", "2", "--no-progress"]  # fmt: skip
        assert main([*args, "--executor", "ray", "--csv", str(tmp_path / "ray.csv")]) == 0
        assert "(ray)" in capsys.readouterr().out
    finally:
        ray.shutdown()
    assert main([*args, "--csv", str(tmp_path / "pool.csv")]) == 0
    assert (tmp_path / "ray.csv").read_text() == (tmp_path / "pool.csv").read_text()
    assert on_ray == _rows(max_workers=2, executor="process")
    assert len(seen) == len(on_ray)
