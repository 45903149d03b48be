"""Small inputs that asked for hours or gigabytes, and errors that reached the user as tracebacks.

Each count has a documented limit (a constant in ``igpolicy.limits``): above it, the command exits 2
with one line naming the flag (or the file), the value and the limit, at once. Each case runs in a
forked child with 4 s and 1 GiB of extra address space, so that a regression is reported as a hang
or an out-of-memory instead of taking the machine with it. Every OSError, OverflowError and
MemoryError that reaches ``dispatch`` is one line naming the file (exit 2), never a traceback.
"""

from __future__ import annotations

import io
import json
import multiprocessing as mp
import sys
import types
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from igpolicy import limits
from igpolicy.cli_util import dispatch

SAMPLE = Path(__file__).resolve().parents[2] / "traces" / "samples" / "minilm"
STAR = ["--bandwidth", "10Gbps", "--size", "1MB"]
SIM = ["simulate", "--model", "pythia-160m", "--policy", "dense"]


def _run(prog: str, argv: list[str]) -> tuple[int, str]:
    if prog == "igsim":
        from igsim.cli import main
    else:
        from igrt.cli import main
    err, out = io.StringIO(), io.StringIO()
    with redirect_stderr(err), redirect_stdout(out):
        code = main(argv)
    return code, err.getvalue()


def _child(conn, prog: str, argv: list[str]) -> None:
    import resource

    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            cap = int(line.split()[1]) * 1024 + 2**30
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    try:
        conn.send(_run(prog, argv))
    except BaseException as e:  # reported to the parent
        conn.send((-1, f"{type(e).__name__}: {e}"))


def _in_child(prog: str, argv: list[str], timeout_s: float = 4.0) -> tuple[int, str]:
    ctx = mp.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_child, args=(send, prog, argv), daemon=True)
    child.start()
    send.close()
    try:
        if receive.poll(timeout_s):
            try:
                return receive.recv()
            except EOFError:
                return -2, f"crashed (exit code {child.exitcode})"
        return -3, f"hang (still running after {timeout_s} s)"
    finally:
        child.kill()
        child.join(timeout=5)


def _assert_one_line(code: int, err: str, *needles: str) -> None:
    assert code == 2, (code, err)
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("inputs")
    builder = {"bandwidth": "10Gbps", "latency": "1us"}
    (d / "star.json").write_text(json.dumps({"builder": "star", "num_ranks": 65_536, **builder}))
    two = {"builder": "two_level", "num_nodes": 65_536, "ranks_per_node": 65_536, "shared_nic": False,
           "intra_bandwidth": "300GB/s", "intra_latency": "1us", "inter_bandwidth": "100Gbps",
           "inter_latency": "2us"}  # fmt: skip
    (d / "two_level.json").write_text(json.dumps(two))
    n = 100_000
    graph = {"ranks": [f"r{i}" for i in range(n)], "switches": ["sw"],
             "links": [{"a": f"r{i}", "b": "sw", **builder} for i in range(n)]}  # fmt: skip
    (d / "graph.json").write_text(json.dumps(graph))
    return {p.stem: p for p in d.iterdir()}


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["collective", "--ranks", "1000000", *STAR], ["--ranks 1000000", "16,384", "MAX_RANKS"]),
        ([*SIM, "--ranks", "1000000", "--steps", "2"], ["--ranks 1000000", "MAX_RANKS"]),
        ([*SIM, "--ranks", "8", "--steps", str(10**7)], ["--steps 10000000", "100,000", "MAX_SIM_STEPS"]),
        ([*SIM, "--ranks", "8", "--steps", "2", "--policy", "periodic", "--release-period", str(10**9)],
         ["--release-period 1000000000", "MAX_RELEASE_PERIOD"]),
        ([*SIM, "--ranks", "8", "--steps", "2", "--policy", "periodic", "--release-period", str(10**23)],
         ["--release-period", "MAX_RELEASE_PERIOD"]),
        (["sweep", "--model", "pythia-160m", "--ranks", "8", "--steps", "2", "--policies", "dense",
          "--workers", "100000", "--no-progress"], ["--workers 100000", "MAX_WORKERS"]),
        (["sweep", "--model", "pythia-160m", "--ranks", "8,1000000", "--steps", "2", "--policies", "dense",
          "--no-progress"], ["1000000", "MAX_RANKS"]),
    ],
    ids=["collective-ranks", "simulate-ranks", "simulate-steps", "release-period-1e9", "release-period-1e23",
         "sweep-workers", "sweep-ranks"],
)  # fmt: skip
def test_huge_counts_are_one_line_errors_at_once(argv, needles) -> None:
    _assert_one_line(*_in_child("igsim", argv), *needles)


@pytest.mark.parametrize("name", ["star", "two_level", "graph"])
def test_huge_topologies_are_one_line_errors_naming_the_file(files, name) -> None:
    code, err = _in_child("igsim", ["collective", "--topology", str(files[name]), "--size", "1MB"])
    _assert_one_line(code, err, str(files[name]), "MAX_RANKS")


def test_a_plan_with_a_huge_score_is_a_one_line_error_naming_it(tmp_path) -> None:
    from igsim.cli import main

    plan = tmp_path / "plan.json"
    assert main(["profile", str(SAMPLE), "-o", str(plan), "--quiet"]) == 0
    text = plan.read_text()
    data = json.loads(text)
    score = repr(data["components"][0]["score"])
    assert score in text
    plan.write_text(text.replace(score, "1" + "0" * 400, 1))  # a valid JSON integer, too large for a float
    code, err = _in_child("igsim", ["simulate", "--trace", str(SAMPLE), "--plan", str(plan), "--policy", "importance", "--steps", "2"])
    _assert_one_line(code, err, str(plan), "too large", "MAX_SCORE")


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["train", "--workload", "minilm", "--tiny", "--policy", "topk", "--ranks", "100000"],
         ["--ranks 100000", "MAX_LOCAL_RANKS"]),
        (["train", "--workload", "minilm", "--tiny", "--policy", "topk", "--steps", str(10**7)],
         ["--steps 10000000", "MAX_TRAIN_STEPS"]),
        (["train", "--workload", "minilm", "--tiny", "--policy", "periodic", "--release-period", str(10**9)],
         ["release", "1000000000", "MAX_RELEASE_PERIOD"]),  # the flag, or the config key it sets
        (["bench", "--tiny", "--ranks", "100000"], ["--ranks 100000", "MAX_LOCAL_RANKS"]),
        (["bench", "--tiny", "--steps", str(10**7)], ["--steps 10000000", "MAX_TRAIN_STEPS"]),
    ],
    ids=["train-nproc", "train-steps", "train-release-period", "bench-nproc", "bench-steps"],
)  # fmt: skip
def test_igrt_counts_are_refused_before_any_rank_starts(argv, needles, tmp_path) -> None:
    code, err = _run("igrt", [*argv, "--out", str(tmp_path / "o")] if argv[0] == "train" else argv)
    _assert_one_line(code, err, *needles)
    assert not (tmp_path / "o").exists()  # refused before the output folder was made


def test_the_limits_are_far_above_real_use() -> None:
    assert limits.MAX_RANKS >= 16_384 and limits.MAX_SIM_STEPS >= 100_000 and limits.MAX_WORKERS >= 32
    assert limits.MAX_TOPOLOGY_NODES >= 2 * limits.MAX_RANKS + 2 and limits.MAX_TOPOLOGY_LINKS >= 4 * limits.MAX_RANKS


# ----------------------------------------------------------------------------- errors reaching dispatch
def _fake_command(tmp_path: Path, exc: BaseException) -> str:
    name = f"_fake_cmd_{abs(hash((type(exc).__name__, str(tmp_path)))) % 10**8}"
    module = types.ModuleType(name)
    module.add_arguments = lambda p: None

    def run(args):
        raise exc

    module.run = run
    sys.modules[name] = module
    return name


@pytest.mark.parametrize(
    ("exc", "needles"),
    [
        (PermissionError(13, "Permission denied", "/data/plan.json"), ["/data/plan.json", "Permission denied"]),
        (IsADirectoryError(21, "Is a directory", "/data/out"), ["/data/out", "Is a directory"]),
        (OSError(28, "No space left on device", "/data/run/model.pt"), ["/data/run/model.pt", "No space"]),
        (OverflowError("int too large to convert to float"), ["too large", "OverflowError"]),
        (MemoryError(), ["out of memory"]),
    ],
    ids=["permission", "is-a-directory", "disk-full", "overflow", "memory"],
)  # fmt: skip
def test_os_overflow_and_memory_errors_are_one_line(tmp_path, capsys, exc, needles) -> None:
    module = _fake_command(tmp_path, exc)
    try:
        code = dispatch(prog="igx", description="", commands={"cmd": (module, "a command")}, argv=["cmd"])
    finally:
        sys.modules.pop(module)
    _assert_one_line(code, capsys.readouterr().err, "igx cmd: error:", *needles)


def test_a_folder_given_as_an_input_file_is_one_line_naming_it(tmp_path) -> None:
    (tmp_path / "pred.csv").write_text("step,rank\n0,0\n")
    code, err = _run("igsim", ["validate-against", str(tmp_path), str(tmp_path / "pred.csv")])
    _assert_one_line(code, err, str(tmp_path))


def test_a_rank_os_error_reaches_the_launcher_as_an_os_error() -> None:
    """A spawned rank's OSError comes back as an OSError naming the file (the CLI prints it in one
    line), not as a RuntimeError with the rank's traceback."""
    from igrt.train.launch import _kept_error, _raise_rank_error

    e = OSError(28, "No space left on device", "/data/run/checkpoint/step-000004/train-state.pt.tmp")
    info = ("OSError", str(e), "Traceback ...", _kept_error(e), 0.0)
    with pytest.raises(OSError) as got:
        _raise_rank_error({1: info}, 1, RuntimeError("x"))
    assert got.value.errno == 28 and got.value.filename.endswith("train-state.pt.tmp")
    assert "rank 1" in got.value.strerror
    info = ("MemoryError", "", "Traceback ...", _kept_error(MemoryError()), 0.0)
    with pytest.raises(MemoryError, match="rank 0"):
        _raise_rank_error({0: info}, 0, RuntimeError("x"))



def test_an_overflow_outside_a_wrapped_read_still_names_the_input_file(tmp_path, capsys) -> None:
    """``igpolicy show-plan`` reads its plan without :func:`igpolicy.cli_util.reading`: dispatch names
    the command's input files itself."""
    from igpolicy.cli import main
    from igpolicy.plan import ComponentPlan, SyncPlan
    from igpolicy.vocab import ComponentClass

    plan = SyncPlan(release_period=2, components=(ComponentPlan(key="0.attn_q", score=0.5, cls=ComponentClass.IMPORTANT),))
    path = plan.save(tmp_path / "plan.json")
    path.write_text(path.read_text().replace("0.5", "1" + "0" * 400, 1))
    code = main(["show-plan", str(path)])
    _assert_one_line(code, capsys.readouterr().err, "too large", str(path))


# ----------------------------------------------------------------------------- release periods and scores
@pytest.mark.parametrize("period", [limits.MAX_RELEASE_PERIOD + 1, 10**9, 10**30])
def test_a_huge_release_period_is_refused_by_the_config_and_the_plan(period) -> None:
    """PolicyConfig and SyncPlan check MAX_RELEASE_PERIOD themselves (a config or plan file is
    refused however it is read), one ValueError naming the limit, never an OverflowError later."""
    from igpolicy.config import PolicyConfig
    from igpolicy.plan import SyncPlan

    with pytest.raises(ValueError, match=r"release_period.*10,000 \(igpolicy.limits.MAX_RELEASE_PERIOD\)"):
        PolicyConfig(release_period=period)
    with pytest.raises(ValueError, match=r"release_period.*MAX_RELEASE_PERIOD"):
        SyncPlan(release_period=period, components=())
    with pytest.raises(ValueError, match=r"^plan.json: .*release_period .*MAX_RELEASE_PERIOD"):
        SyncPlan.from_json({"schema_version": 1, "release_period": period, "components": []}, where="plan.json")
    assert PolicyConfig(release_period=limits.MAX_RELEASE_PERIOD).release_period == limits.MAX_RELEASE_PERIOD


@pytest.mark.parametrize("score", [10**400, -(10**400), 1e301, -1e305])
def test_a_huge_score_is_refused_by_the_plan_naming_the_limit(score) -> None:
    from igpolicy.plan import ComponentPlan, SyncPlan
    from igpolicy.vocab import ComponentClass

    component = {"key": "0.attn_q", "score": score, "class": "important"}
    with pytest.raises(ValueError, match=r"^plan.json: components\[0\]: score .*igpolicy.limits.MAX_SCORE"):
        SyncPlan.from_json({"schema_version": 1, "release_period": 2, "components": [component]}, where="plan.json")
    with pytest.raises(ValueError, match=r"'0.attn_q' .*MAX_SCORE"):
        SyncPlan(release_period=2, components=(ComponentPlan(key="0.attn_q", score=score, cls=ComponentClass.IMPORTANT),))
    ok = ComponentPlan(key="0.attn_q", score=limits.MAX_SCORE, cls=ComponentClass.IMPORTANT)
    assert SyncPlan(release_period=2, components=(ok,)).components[0].score == limits.MAX_SCORE


# ----------------------------------------------------------------------------- Topology.validate at scale
def _star_graph(num_ranks: int):
    import networkx as nx

    g = nx.Graph()
    g.add_node("sw", kind="switch")
    link = {"bandwidth_bytes_per_s": 1e9, "latency_s": 1e-6, "link_class": "nic"}
    for i in range(num_ranks):
        g.add_node(f"r{i}", kind="rank")
        g.add_edge(f"r{i}", "sw", **link)
    return g


def test_validate_refuses_a_65536_rank_topology_object_in_one_line() -> None:
    """Not only the builders and files: a Topology built by hand is bounded by validate itself,
    before any per-rank check (the old checks were quadratic in the ranks)."""
    from igsim.net.topology import Topology

    g = _star_graph(65_536)
    topo = Topology(graph=g, ranks=tuple(f"r{i}" for i in range(65_536)))
    with pytest.raises(ValueError) as info:
        topo.validate(where="big.json")
    message = str(info.value)
    assert message.startswith("big.json: num_ranks 65536") and "igpolicy.limits.MAX_RANKS" in message
    assert "\n" not in message


def test_validate_of_the_largest_allowed_topology_and_its_errors() -> None:
    """MAX_RANKS ranks validate (linear checks: docs/reliability.md has the timings); errors on a
    list that large name at most 10 offenders on one line."""
    from igsim.net.topology import Topology

    n = limits.MAX_RANKS
    g = _star_graph(n)
    ranks = tuple(f"r{i}" for i in range(n))
    topo = Topology(graph=g, ranks=ranks)
    assert topo.validate() is topo
    doubled = ranks[:-20] + ranks[:20]  # 20 duplicates, and r16364.. left out of the order
    with pytest.raises(ValueError, match=r"duplicate ranks \['r0', .*\] and 10 more$"):
        Topology(graph=g, ranks=doubled).validate()
    with pytest.raises(ValueError, match=r"rank nodes \[.*\] are missing from the rank order \(20 in all\)$"):
        Topology(graph=g, ranks=ranks[:-20]).validate()


@pytest.mark.parametrize("steps", [limits.MAX_TRAIN_STEPS + 1, 10**7, 10**30])
def test_igrt_record_steps_are_bounded_like_train(tmp_path, steps) -> None:
    """``igrt record --steps`` has igrt train's limit (MAX_TRAIN_STEPS): one line, before any rank
    starts (the output folder, claimed first by every command that writes one, holds no trace)."""
    out = tmp_path / "trace"
    argv = ["record", "--workload", "gpt", "--tiny", "--steps", str(steps), "-o", str(out)]
    code, err = _in_child("igrt", argv, timeout_s=30.0)  # unbounded, it would record for hours: a "hang"
    _assert_one_line(code, err, f"--steps {steps}", "1,000,000", "MAX_TRAIN_STEPS")
    assert {p.name for p in out.iterdir()} <= {".ig-lock"} if out.exists() else True
