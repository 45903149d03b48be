"""One rule for every command that writes a folder or a file (issue 17, item 4).

Every folder-writing command (``igrt train``, ``record``, ``validate``; ``igsim demo``, ``replay``)
refuses an existing non-empty folder unless ``--overwrite``, locks the folder for the whole run (a
second run into it is refused, naming the holder), and checks its outputs before the work starts:
``--out FILE``, ``--csv DIR`` and ``--json /proc/version`` are one-line errors (exit 2) in well under a
second, not tracebacks after the work. The refusals happen before any rank is spawned, so these
tests are cheap; the lock is held by a real second process (``fcntl.flock`` across processes).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from igpolicy.cli_outputs import LOCK_NAME, claim_output_dir, command_scope
from igrt.cli import main as igrt_main
from igsim.cli import main as igsim_main
from traces.samples import write_synthetic_trace

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ["train", "--workload", "minilm", "--tiny", "--policy", "topk", "--nproc", "1", "--backend", "gloo",
         "--steps", "2", "--no-eval", "--no-progress"]  # fmt: skip
RECORD = ["record", "--workload", "minilm", "--tiny", "--nproc", "1", "--steps", "2", "--no-eval", "--no-progress"]
HOLDER = """
import sys, time
from igpolicy.cli_outputs import claim_output_dir
claim = claim_output_dir(sys.argv[1], overwrite=False, flag="--out")
print("held", flush=True)
time.sleep(120)
"""


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("trace")
    write_synthetic_trace(d, num_steps=4, world_size=2, density=0.05, seed=1)
    return d


def _commands(out: Path, trace_dir: Path) -> dict[str, tuple]:
    """Each folder-writing command with ``out`` as its folder: (main, argv)."""
    return {
        "igrt train": (igrt_main, [*TRAIN, "--out", str(out)]),
        "igrt record": (igrt_main, [*RECORD, "-o", str(out)]),
        "igrt validate": (igrt_main, ["validate", "--ranks", "2", "--quick", "--out", str(out)]),
        "igsim demo": (igsim_main, ["demo", "--trace", str(trace_dir), "--quick", "--out", str(out), "--no-progress"]),
    }  # fmt: skip


def _one_line_error(capsys, *needles: str) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def holder(tmp_path):
    """A second process that holds the lock of ``tmp_path / "busy"`` until the test ends."""
    folder = tmp_path / "busy"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "held"
        yield folder, proc.pid
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("command", ["igrt train", "igrt record", "igrt validate", "igsim demo"])
def test_a_folder_in_use_by_another_run_is_refused_naming_it(command, holder, trace_dir, capsys) -> None:
    folder, pid = holder
    main, argv = _commands(folder, trace_dir)[command]
    t0 = time.monotonic()
    assert main(argv) == 2
    assert time.monotonic() - t0 < 20  # refused before any work (no rank was started)
    _one_line_error(capsys, str(folder), "in use by another run", f"pid {pid}")
    assert sorted(p.name for p in folder.iterdir()) == [LOCK_NAME]  # nothing was written into it


@pytest.mark.parametrize("command", ["igrt train", "igrt record", "igrt validate", "igsim demo"])
def test_a_non_empty_folder_is_refused_without_overwrite(command, tmp_path, trace_dir, capsys) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.json").write_text("{}")  # a previous run's file
    main, argv = _commands(out, trace_dir)[command]
    assert main(argv) == 2
    _one_line_error(capsys, str(out), "not empty", "summary.json", "--overwrite")
    assert (out / "summary.json").read_text() == "{}"
    assert not (out / LOCK_NAME).exists()  # a refused folder is not marked as one of ours


@pytest.fixture
def one_rank_here(monkeypatch):
    """torchrun's environment for one rank: ``igrt train`` runs in this process (no spawn)."""
    from tests.igrt.dist_util import free_port

    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port())}  # fmt: skip
    for k, v in env.items():
        monkeypatch.setenv(k, v)


def test_igrt_train_overwrites_its_own_previous_run_only_when_asked(tmp_path, capsys, one_rank_here) -> None:
    out = tmp_path / "run"
    assert igrt_main([*TRAIN, "--out", str(out)]) == 0
    first = (out / "summary.json").stat().st_mtime_ns
    (out / "stale.txt").write_text("from an older run")
    capsys.readouterr()
    assert igrt_main([*TRAIN, "--out", str(out)]) == 2  # the old behaviour overwrote it silently
    _one_line_error(capsys, "not empty", "--overwrite")
    assert (out / "summary.json").stat().st_mtime_ns == first
    assert igrt_main([*TRAIN, "--out", str(out), "--overwrite"]) == 0
    assert not (out / "stale.txt").exists() and (out / "summary.json").stat().st_mtime_ns != first
    # a resume of the run in its own folder continues it there, no --overwrite needed
    assert igrt_main([*TRAIN[:-4], "--steps", "3", "--no-eval", "--no-progress", "--out", str(out),
                      "--resume", str(out)]) == 0  # fmt: skip
    assert '"start_step": 2' in (out / "summary.json").read_text()


def test_overwrite_never_empties_a_folder_no_command_wrote(tmp_path, capsys) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "thesis.tex").write_text("precious")
    assert igrt_main([*TRAIN, "--out", str(home), "--overwrite"]) == 2
    _one_line_error(capsys, "no igrt/igsim command wrote")
    assert (home / "thesis.tex").read_text() == "precious" and not (home / LOCK_NAME).exists()


def test_the_lock_is_held_for_the_command_and_released_after(tmp_path) -> None:
    out = tmp_path / "o"
    with command_scope():
        claim = claim_output_dir(out, overwrite=False, flag="--out")
        probe = subprocess.run([sys.executable, "-c", HOLDER, str(out)], capture_output=True, text=True,
                               env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)  # fmt: skip
        assert probe.returncode != 0 and "in use by another run" in probe.stderr
        assert f"pid {os.getpid()}" in probe.stderr
    assert repr(claim).endswith("held=False)")
    with command_scope():  # released: the next command takes it
        claim_output_dir(out, overwrite=False, flag="--out")


@pytest.mark.parametrize(
    ("flag", "target", "needle"),
    [
        ("--csv", "DIR", "is a folder"),
        ("--json", "/proc/version", "cannot be written"),
        ("--chrome-trace", "MISSING/t.json", "does not exist"),
    ],
)
def test_igsim_simulate_checks_its_output_files_before_the_work(flag, target, needle, tmp_path, capsys) -> None:
    if target.startswith("/proc") and not Path(target).exists():
        pytest.skip("no /proc here")
    path = {"DIR": str(tmp_path), "MISSING/t.json": str(tmp_path / "missing" / "t.json")}.get(target, target)
    argv = ["simulate", "--model", "pythia-160m", "--ranks", "8", "--steps", "2", "--policy", "dense", flag, path]
    assert igsim_main(argv) == 2
    line = _one_line_error(capsys, flag, needle)
    assert path in line


def test_igsim_simulate_refuses_before_simulating(tmp_path, capsys) -> None:
    argv = ["simulate", "--model", "pythia-160m", "--ranks", "8", "--steps", "2", "--policy", "dense",
            "--csv", str(tmp_path)]  # fmt: skip
    assert igsim_main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "is a folder" in captured.err  # no summary printed: nothing was simulated


def test_igsim_sweep_checks_csv_and_png(tmp_path, capsys) -> None:
    argv = ["sweep", "--model", "pythia-160m", "--ranks", "8", "--steps", "2", "--policies", "dense",
            "--png", str(tmp_path), "--no-progress"]  # fmt: skip
    assert igsim_main(argv) == 2
    _one_line_error(capsys, "--png", "is a folder")


def test_igrt_train_out_that_is_a_file_is_refused(tmp_path, capsys) -> None:
    f = tmp_path / "passwd"
    f.write_text("root:x:0:0\n")
    assert igrt_main([*TRAIN, "--out", str(f)]) == 2
    _one_line_error(capsys, str(f), "not a folder")
    assert f.read_text() == "root:x:0:0\n"


# ----------------------------------------------------------------------------- igrt validate --overwrite
def _validate_folder(out: Path) -> None:
    """A folder as an earlier ``igrt validate --steps N`` leaves it (written under its lock)."""
    with command_scope():
        claim_output_dir(out, overwrite=False, flag="--out")
    (out / "steps" / "trace").mkdir(parents=True)
    (out / "steps" / "trace" / "manifest.json").write_text("{}")
    (out / "steps" / "trace" / "params-r000-000001.parquet").write_bytes(b"recorded")
    (out / "steps" / "plan.json").write_text("{}")
    (out / "steps" / "real_topk").mkdir()
    (out / "steps" / "real_topk" / "metrics.csv").write_text("step\n")
    (out / "measurements.json").write_text("{}")
    (out / "report.json").write_text("{}")


def _tree(out: Path) -> set[str]:
    return {str(p.relative_to(out)) for p in out.rglob("*")}


def test_validate_overwrite_keeps_the_trace_it_reuses(tmp_path) -> None:
    """``--overwrite`` of a step validation removes the old measurements, reports and training runs
    but keeps ``steps/trace`` and ``steps/plan.json``, which the run reuses (they used to be deleted
    with the rest, so the reuse could never happen); the folder stays locked for the run."""
    from igrt.cli.validate import claim_out

    out = tmp_path / "val"
    _validate_folder(out)
    with command_scope():
        kept = claim_out(out, overwrite=True, reuse=True)
        assert kept == [out / "steps" / "trace", out / "steps" / "plan.json"]
        assert _tree(out) == {LOCK_NAME, "steps", "steps/trace", "steps/trace/manifest.json",
                              "steps/trace/params-r000-000001.parquet", "steps/plan.json"}  # fmt: skip
        assert (out / "steps" / "trace" / "params-r000-000001.parquet").read_bytes() == b"recorded"
        with pytest.raises(ValueError, match="--out"):  # held: a second run is refused
            claim_output_dir(out, overwrite=True, flag="--out")
    with command_scope():  # no step validation: nothing to reuse, everything goes
        assert claim_out(out, overwrite=True, reuse=False) == []
    assert _tree(out) == {LOCK_NAME}


def test_validate_overwrite_of_a_foreign_folder_still_refuses(tmp_path) -> None:
    from igrt.cli.validate import claim_out

    out = tmp_path / "mine"
    (out / "steps" / "trace").mkdir(parents=True)
    (out / "steps" / "trace" / "manifest.json").write_text("{}")
    with command_scope(), pytest.raises(ValueError, match="no igrt/igsim command wrote"):
        claim_out(out, overwrite=True, reuse=True)
    assert (out / "steps" / "trace" / "manifest.json").is_file() and not (out / LOCK_NAME).exists()


def test_igrt_validate_overwrite_reuses_the_recorded_trace(tmp_path, monkeypatch, capsys) -> None:
    """The command end to end up to the testbed (stopped there): the kept trace and plan are
    reused, nothing is recorded or profiled again."""
    import igrt.cli.validate as validate

    out = tmp_path / "val"
    _validate_folder(out)

    def no_subprocess(cmd, *, what):
        raise AssertionError(f"{what} although the trace and plan were kept")

    def stop(*args, **kwargs):
        raise ValueError("stopped before the testbed")

    monkeypatch.setattr(validate, "_subprocess", no_subprocess)
    monkeypatch.setattr(validate, "measure_on_testbed", stop)
    code = igrt_main(["validate", "--steps", "2", "--tiny", "--overwrite", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 2 and "stopped before the testbed" in captured.err, captured.err
    assert "keeps" in captured.out and str(out / "steps" / "trace") in captured.out
    assert (out / "steps" / "trace" / "params-r000-000001.parquet").read_bytes() == b"recorded"
    assert not (out / "measurements.json").exists() and not (out / "steps" / "real_topk").exists()
