"""The simulator explains its sparse-vs-dense choice: every table has a ``collective`` column, a
footnote quotes the crossover density of the run's rank count, and that crossover is the one
:func:`igpolicy.choice.choose_collective` applies."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

from igpolicy.choice import choose_collective, crossover_density
from igpolicy.config import PolicyConfig
from igpolicy.vocab import CollectiveKind
from igsim.cli import main
from igsim.cli.options import collective_footnote
from igsim.step.results import collective_label
from traces.samples import write_synthetic_trace

SIM = ["simulate", "--model", "pythia-160m", "--steps", "2", "--mode", "analytic"]


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("trace")
    write_synthetic_trace(d, num_steps=4, world_size=2, density=0.01, seed=3)
    return d


@pytest.mark.parametrize("world_size", [2, 256, 1024])
@pytest.mark.parametrize(("index_bytes", "value_bytes"), [(4, 4), (4, 2)])
def test_crossover_is_where_the_choice_flips(world_size: int, index_bytes: int, value_bytes: int) -> None:
    d = crossover_density(world_size=world_size, index_bytes=index_bytes, value_bytes=value_bytes)
    assert d == pytest.approx(2 * value_bytes / (world_size * (index_bytes + value_bytes)))
    numel = 3 * 1024 * 1000  # crossover x numel is a whole number of pairs for every case here
    k = d * numel
    assert k == pytest.approx(round(k))

    def choice(nnz: int) -> CollectiveKind:
        return choose_collective(
            numel=numel, nnz_per_rank=[nnz] * world_size, index_bytes=index_bytes, value_bytes=value_bytes
        )

    assert choice(round(k)) == CollectiveKind.SPARSE_GATHER  # at the crossover: a tie, sparse
    assert choice(round(k) + 1) == CollectiveKind.DENSE_ALLREDUCE  # one pair more: dense
    assert choice(round(k) - 1) == CollectiveKind.SPARSE_GATHER


def test_one_rank_never_goes_dense() -> None:
    assert crossover_density(world_size=1) == float("inf")
    assert choose_collective(numel=10, nnz_per_rank=[10]) == CollectiveKind.SPARSE_GATHER


def test_labels() -> None:
    assert collective_label(64, 0) == "sparse gather"
    assert collective_label(0, 7) == "dense all-reduce"
    assert collective_label(52, 12) == "mixed 12/64 dense"
    assert collective_label(0, 0) == "none"


@pytest.mark.parametrize("world_size", [2, 256, 1024])
def test_footnote_quotes_the_choice_functions_crossover(world_size: int) -> None:
    text = collective_footnote(PolicyConfig(policy="topk", density=0.01), [world_size])
    assert text.startswith("collective:")
    flat = " ".join(text.split())
    assert f"{crossover_density(world_size=world_size):.3g} at {world_size} ranks" in flat
    goes_dense = crossover_density(world_size=world_size) < 0.01
    assert (f"go dense from {world_size} ranks on" in flat) == goes_dense
    forced = " ".join(collective_footnote(PolicyConfig(policy="topk", collective="dense"), [8]).split())
    assert "--collective dense: every bucket takes the dense path" in forced


@pytest.mark.parametrize(("world_size", "expected"), [(2, "sparse gather"), (256, "dense all-reduce")])
def test_simulate_names_the_collective(world_size: int, expected: str, capsys) -> None:
    assert main([*SIM, "--policy", "topk", "--density", "0.01", "--ranks", str(world_size)]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.strip().startswith("collective "))
    assert expected in line
    assert f"{crossover_density(world_size=world_size):.3g} at {world_size} ranks" in " ".join(out.split())


def test_sweep_table_has_a_collective_column(tmp_path: Path, capsys) -> None:
    args = ["sweep", "--model", "pythia-160m", "--policies", "dense,topk", "--bandwidths", "10Gbps"]
    args += ["--ranks", "8,1024", "--density", "0.01", "--steps", "2", "--mode", "analytic", "--workers", "1"]
    args += ["--no-progress", "--csv", str(tmp_path / "s.csv")]
    assert main(args) == 0
    out = capsys.readouterr().out
    header = next(x for x in out.splitlines() if "vs dense" in x)
    assert header.rstrip().endswith("collective")
    rows = {(r["policy"], int(r["world_size"])): r for r in csv.DictReader((tmp_path / "s.csv").open())}
    assert rows[("dense", 8)]["collective"] == "dense all-reduce"
    assert rows[("topk", 8)]["collective"] == "sparse gather"  # 0.01 < 1/8
    assert rows[("topk", 1024)]["collective"] == "dense all-reduce"  # 0.01 > 1/1024
    assert int(rows[("topk", 1024)]["sparse_gathers"]) == 0
    flat = " ".join(out.split())
    for w in (8, 1024):
        assert f"{crossover_density(world_size=w):.3g} at {w} ranks" in flat


def test_demo_table_and_footnote(trace_dir: Path, tmp_path: Path, capsys) -> None:
    assert main(["demo", "--trace", str(trace_dir), "--quick", "--out", str(tmp_path / "d"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"1024 .* topk .* dense all-reduce", out)
    assert re.search(r"\b8 .* topk .* sparse gather", out)
    assert "collective: how each policy's buckets were aggregated" in out


def test_collective_flag_is_documented(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    flat = " ".join(capsys.readouterr().out.split())
    assert "--collective {auto,sparse,dense}" in flat and "auto (default) = the one that moves fewer bytes" in flat


def test_units_and_policy_are_required(capsys) -> None:
    assert main([*SIM, "--policy", "dense", "--latency", "5"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "igsim simulate: error: --latency: give a unit, e.g. 5us or 2ms (got '5')"
    assert main([*SIM, "--policy", "dense", "--bandwidth", "100"]) == 2
    assert "--bandwidth: give a unit" in capsys.readouterr().err
    assert main([*SIM, "--policy", "dense", "--bucket-cap", "25"]) == 2
    assert "--bucket-cap: give a unit" in capsys.readouterr().err
    assert main([*SIM, "--policy", "dense", "--latency", "0", "--bandwidth", "10Gbit/s"]) == 0  # zero needs none
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(SIM)
    assert exc.value.code == 2
    assert "--policy" in capsys.readouterr().err
