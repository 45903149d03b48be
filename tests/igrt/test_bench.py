"""``igrt bench``: PyTorch's DDP and comm hooks beside our policies, in one process set and table.

Oracles: the bytes of PyTorch's hooks counted at ``torch.distributed.all_reduce`` equal DDP's
gradient buckets for the plain all-reduce hook and half of them for the fp16 hook; the meter's own
time excludes the wire; the command's table holds every method and judges the PowerSGD target.
"""

from __future__ import annotations

import time

import pytest
import torch

from igrt.cli import main
from igrt.cli.bench import CollectiveMeter, format_methods_table, peer_statistics, target_report
from tests.igrt.dist_util import run_distributed


def _meter_worker(rank: int, world_size: int) -> dict:
    import torch.distributed as dist

    meter = CollectiveMeter()
    original = dist.all_reduce
    x = torch.ones(1000)
    with meter.counting():
        assert dist.all_reduce is not original
        dist.all_reduce(x)  # blocking
        work = dist.all_reduce(torch.ones(10, dtype=torch.float16), async_op=True)
        work.wait()
        counted = meter.bytes, meter.num_collectives
        meter.reset()

        def slow_hook(_state, bucket):  # 20 ms of own work, then a collective
            time.sleep(0.02)
            return dist.all_reduce(bucket, async_op=True).get_future()

        fut = meter.hook(slow_hook)(None, torch.ones(250))
        fut.wait()
    assert dist.all_reduce is original
    return {
        "counted": counted,
        "bytes": meter.bytes,
        "own_s": meter.own_s,
        "comm_s": meter.comm_s,
        "x": float(x[0]),
    }


def test_collective_meter_counts_bytes_and_own_time():
    outs = run_distributed(_meter_worker, world_size=2, timeout_s=120)
    for out in outs:
        assert out["counted"] == (1000 * 4 + 10 * 2, 2)
        assert out["bytes"] == 250 * 4
        assert out["x"] == 2.0  # the wrapped call still reduces
        assert 0.015 <= out["own_s"] < 0.5 and out["comm_s"] > 0  # the hook's sleep, not the wire


def test_statistics_and_table_from_rows():
    rows = [
        {
            "step": t,
            "rank": r,
            "step_s": 0.1 + 0.01 * r,
            "cpu_s": 0.05,
            "own_s": 0.01,
            "bytes": 1000.0 * (t + 1),
            "num_collectives": 3.0,
        }
        for t in range(4)
        for r in range(2)
    ]
    s = peer_statistics(rows, warmup_steps=2)
    assert s["bytes_per_step"] == pytest.approx(3500.0)  # steps 2 and 3 only
    assert s["step_ms"] == pytest.approx(110.0)  # the slowest rank
    assert s["own_pct"] == pytest.approx(100 * 0.01 / 0.11)
    stats = {
        "ddp": dict(s, cpu_vs_ddp=1.0, bytes_vs_ddp=1.0),
        "powersgd1": dict(s, cpu_vs_ddp=1.2, bytes_vs_ddp=0.1),
    }
    stats["importance"] = dict(s, bytes_per_step=10.0, cpu_vs_ddp=1.1)
    table = format_methods_table(stats)
    assert "x DDP CPU" in table and table.splitlines()[2].split()[4] == "-"  # ddp has no own time
    (line,) = [x for x in target_report(stats) if "powersgd1" in x]
    assert line.endswith("met")


@pytest.mark.slow
def test_bench_runs_pytorch_peers_and_our_policies_in_one_table(capsys, tmp_path):
    methods = "ddp,allreduce,fp16,powersgd1,topk,importance"
    argv = ["bench", "--tiny", "--steps", "4", "--warmup", "2", "--ranks", "2", "--policies", methods,
            "--record-steps", "3", "--plot", str(tmp_path / "bench.png")]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    first = out[out.index("x DDP CPU") : out.index("our policies in detail")]  # the methods table
    table = {line.split()[0]: line.split() for line in first.splitlines()[2:] if line.strip()}
    for m in methods.split(","):
        assert m in table, out
    kb = {m: float(table[m][1]) for m in methods.split(",")}
    assert kb["allreduce"] == pytest.approx(kb["ddp"], rel=1e-3)  # every gradient, once
    assert kb["fp16"] == pytest.approx(kb["ddp"] / 2, rel=1e-3)  # the same, in half precision
    assert kb["powersgd1"] < kb["fp16"] and kb["importance"] < kb["topk"] < kb["ddp"]
    assert "fewer bytes than powersgd1" in out


def test_bench_refuses_an_unwritable_plot_before_the_work(capsys, tmp_path):
    assert main(["bench", "--tiny", "--plot", str(tmp_path / "no" / "such" / "b.png")]) == 2
    assert "--plot" in capsys.readouterr().err


def test_bench_rejects_bad_methods_and_warmup(capsys):
    assert main(["bench", "--tiny", "--policies", "ddp,zip"]) == 2
    assert "'zip'" in capsys.readouterr().err
    assert main(["bench", "--tiny", "--steps", "3", "--warmup", "3"]) == 2
    assert "--warmup 3" in capsys.readouterr().err
