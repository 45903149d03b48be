"""CLI smoke tests through igsim.cli.main on a synthetic trace: profile -> simulate -> sweep -> demo."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

import traces.samples
from igpolicy.plan import SyncPlan
from igpolicy.vocab import StepMetrics
from igsim.cli import main
from traces.samples import write_synthetic_trace


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("trace")
    write_synthetic_trace(d, num_steps=6, world_size=2, density=0.05, seed=2)
    return d


@pytest.fixture(scope="module")
def plan_path(trace_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    assert main(["profile", str(trace_dir), "-o", str(path), "--release-period", "3", "--quiet"]) == 0
    return path


def test_profile(trace_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "p.json"
    assert main(["profile", str(trace_dir), "-o", str(out), "--method", "otsu", "--window", "1:5"]) == 0
    text = capsys.readouterr().out
    assert "threshold otsu" in text and "component" in text and str(out) in text
    plan = SyncPlan.load(out)
    assert plan.release_period == 4
    assert plan.source["window"] == [1, 5]
    from traces.reader import read_trace

    assert {c.key for c in plan.components} == set(read_trace(trace_dir).manifest.components)
    assert main(["profile", str(trace_dir), "-o", str(out), "--window", "5:1"]) == 2
    assert "--window" in capsys.readouterr().err


def test_simulate_writes_outputs(trace_dir: Path, plan_path: Path, tmp_path: Path, capsys) -> None:
    args = ["simulate", "--trace", str(trace_dir), "--plan", str(plan_path), "--policy", "importance"]
    args += [
        "--release-period",
        "3",
        "--ranks",
        "4",
        "--bandwidth",
        "10Gbps",
        "--latency",
        "5us",
        "--steps",
        "7",
    ]
    args += [
        "--csv",
        str(tmp_path / "r.csv"),
        "--json",
        str(tmp_path / "r.json"),
        "--chrome-trace",
        str(tmp_path / "t.json"),
    ]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "policy importance" in text and "k from trace" in text
    with (tmp_path / "r.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 7 and list(rows[0]) == list(StepMetrics.columns())
    assert {r["source"] for r in rows} == {"sim"}
    assert len(json.loads((tmp_path / "r.json").read_text())["rows"]) == 7
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]


def test_simulate_costs_thinned_low_components(trace_dir: Path, plan_path: Path, tmp_path: Path, capsys) -> None:
    """``--low-mode thin``: every step sends every component (low ones at density / R), so the
    bytes per step are flat where holding's vary with the release phase, and about the same in total."""
    rows = {}
    for mode in ("hold", "thin"):
        out = tmp_path / f"{mode}.json"
        args = ["simulate", "--trace", str(trace_dir), "--plan", str(plan_path), "--policy", "importance",
                "--release-period", "3", "--ranks", "4", "--steps", "6", "--collective", "sparse",
                "--low-mode", mode, "--json", str(out)]  # fmt: skip
        assert main(args) == 0
        rows[mode] = json.loads(out.read_text())["rows"]
    capsys.readouterr()
    sent = {m: [r["values_bytes"] for r in rs] for m, rs in rows.items()}
    components = {m: {r["num_sending_components"] for r in rs} for m, rs in rows.items()}
    assert len(set(sent["thin"])) == 1 and len(components["thin"]) == 1
    assert len(components["hold"]) > 1 and max(components["hold"]) <= min(components["thin"])
    assert sum(sent["hold"]) <= sum(sent["thin"]) <= 1.5 * sum(sent["hold"]), sent
    assert main(["simulate", "--trace", str(trace_dir), "--policy", "topk", "--steps", "2", "--low-mode", "thin"]) == 0


def test_simulate_user_errors(trace_dir: Path, capsys) -> None:
    base = ["simulate", "--trace", str(trace_dir), "--steps", "2"]
    assert main([*base, "--policy", "dense", "--bandwidth", "100 Gbs"]) == 2
    assert "unknown unit" in capsys.readouterr().err
    assert main([*base, "--policy", "importance"]) == 2
    assert "needs --plan" in capsys.readouterr().err
    assert main([*base, "--policy", "dense", "--topology", "/nonexistent/topo.yaml"]) == 2
    capsys.readouterr()


def test_simulate_model_carries_the_plan_over(plan_path: Path, capsys) -> None:
    args = ["simulate", "--model", "pythia-160m", "--plan", str(plan_path), "--policy", "importance"]
    assert main([*args, "--release-period", "3", "--ranks", "16", "--steps", "6", "--mode", "analytic"]) == 0
    text = capsys.readouterr().out
    assert "carried over" in text and "pythia-160m" in text


def test_sweep_tiny(trace_dir: Path, plan_path: Path, tmp_path: Path, capsys) -> None:
    args = ["sweep", "--trace", str(trace_dir), "--plan", str(plan_path), "--release-period", "3"]
    args += ["--policies", "dense,topk,importance", "--bandwidths", "1Gbps,10Gbps", "--ranks", "2,4"]
    args += [
        "--steps",
        "3",
        "--workers",
        "2",
        "--no-progress",
        "--png",
        str(tmp_path / "s.png"),
        "--csv",
        str(tmp_path / "s.csv"),
    ]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "vs dense" in text
    with (tmp_path / "s.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3 * 2 * 2
    assert all(float(r["speedup_vs_dense"]) == pytest.approx(1.0) for r in rows if r["policy"] == "dense")
    assert (tmp_path / "s.png").stat().st_size > 1000
    # one worker gives the same numbers
    args1 = list(args)
    args1[args1.index("--workers") + 1] = "1"
    args1[args1.index("--csv") + 1] = str(tmp_path / "s1.csv")
    assert main(args1) == 0
    assert (tmp_path / "s1.csv").read_text() == (tmp_path / "s.csv").read_text()


def test_demo_on_a_trace(trace_dir: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "demo"
    assert main(["demo", "--trace", str(trace_dir), "--quick", "--out", str(out), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "[2/2]" in text and "ranks at" in text
    for name in ("plan.json", "sweep.csv", "sweep.png"):
        assert (out / name).exists()


def test_demo_without_the_sample_says_so(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(traces.samples, "SAMPLES_DIR", tmp_path)
    assert main(["demo", "--quick", "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert "not available yet" in err and "Traceback" not in err


def test_validate_against(trace_dir: Path, tmp_path: Path, capsys) -> None:
    pred = tmp_path / "pred.csv"
    assert (
        main(
            [
                "simulate",
                "--trace",
                str(trace_dir),
                "--policy",
                "topk",
                "--density",
                "0.05",
                "--steps",
                "4",
                "--csv",
                str(pred),
            ]
        )
        == 0
    )
    capsys.readouterr()
    # a "measurement" of 3 ranks whose step time is 10% longer than predicted
    with pred.open() as f:
        rows = list(csv.DictReader(f))
    measured = tmp_path / "meas.csv"
    with measured.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        for r in rows:
            for rank in range(3):
                w.writerow({**r, "rank": rank, "source": "real", "step_s": float(r["step_s"]) * 1.1})
    assert main(["validate-against", str(measured), str(pred), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["rows"] == 12 and report["broadcast_representative"]
    assert report["columns"]["step_s"]["mean_rel_error"] == pytest.approx(0.1 / 1.1)
    assert report["columns"]["wire_bytes"]["mean_abs_error"] == 0
    assert main(["validate-against", str(measured), str(pred)]) == 0
    assert "step_s" in capsys.readouterr().out
    assert main(["validate-against", str(tmp_path / "nope.csv"), str(pred)]) == 2


def test_demo_reruns_into_its_default_folder_but_not_a_named_one(trace_dir: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    """The README runs ``igsim demo`` twice: the second run replaces the first in ./igsim-demo; a
    folder the user named keeps its rule (refused unless --overwrite), and a foreign folder stays safe."""
    monkeypatch.chdir(tmp_path)
    argv = ["demo", "--trace", str(trace_dir), "--quick", "--no-progress"]
    assert main(argv) == 0
    assert main(argv) == 0
    assert "replacing the previous demo in igsim-demo/" in capsys.readouterr().err
    assert (tmp_path / "igsim-demo" / "sweep.png").exists()
    named = ["demo", "--trace", str(trace_dir), "--quick", "--no-progress", "--out", str(tmp_path / "mine")]
    assert main(named) == 0
    assert main(named) == 2
    assert "--overwrite" in capsys.readouterr().err
    foreign = tmp_path / "other"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep")
    monkeypatch.chdir(foreign)
    (foreign / "igsim-demo").mkdir()
    (foreign / "igsim-demo" / "notes.txt").write_text("keep")  # not a demo's folder: no lock file
    assert main(argv) == 2
    assert (foreign / "igsim-demo" / "notes.txt").read_text() == "keep"
