"""Commits of whole steps (the writer) and incomplete traces (the reader, igsim profile/simulate)."""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from igsim.cli import main as igsim_main
from traces.reader import TraceWarning, read_trace
from traces.samples import synthetic_params, write_synthetic_trace
from traces.schema import Manifest, TraceError, parse_part_name, part_files
from traces.writer import TraceWriter, write_manifest

PARAMS = synthetic_params(num_layers=1, hidden=8, vocab=10)
NAMES = np.array([p.name for p in PARAMS])
NUMEL = np.array([p.numel for p in PARAMS])


def _add_step(w: TraceWriter, step: int, *, keep: np.ndarray | None = None, unions: bool = False) -> None:
    """One step the way the recorder writes it: params rows, (unions rows,) then the steps row."""
    keep = np.ones(len(PARAMS), dtype=bool) if keep is None else keep
    n = int(keep.sum())
    w.add_param_rows(step=np.full(n, step), param=NAMES[keep], numel=NUMEL[keep], k=np.ones(n, dtype=np.int64),
                     grad_norm=np.ones(n), sel_norm=np.full(n, 0.5), sel_max_abs=np.full(n, 0.25),
                     overlap=np.full(n, 0.5), ready_s=np.full(n, 1e-3))  # fmt: skip
    if unions:
        w.add_union_rows(
            step=np.full(len(PARAMS), step), param=NAMES, union_k=np.ones(len(PARAMS), dtype=np.int64)
        )
    w.add_step_row(step=step, forward_s=0.01, backward_s=0.02, optimizer_s=0.001, loss=1.0)


def _on_disk(directory: Path) -> dict[str, set[int]]:
    """{table: steps in its committed parts} (read with pyarrow alone)."""
    out: dict[str, set[int]] = {"params": set(), "steps": set(), "unions": set()}
    for path in part_files(directory):
        out[parse_part_name(path.name).table] |= set(
            pq.read_table(path, columns=["step"]).column(0).to_pylist()
        )
    return out


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**32 - 1),
    every=st.one_of(st.none(), st.integers(1, 5)),
    rows_per_part=st.integers(3, 40),
)
def test_commits_hold_whole_steps_and_the_steps_part_comes_last(
    tmp_path_factory, seed, every, rows_per_part
) -> None:
    directory = tmp_path_factory.mktemp("commits")
    rng = np.random.default_rng(seed)
    w = TraceWriter(
        directory, rank=0, rows_per_part=rows_per_part, commit_every_steps=every, commit_every_s=None
    )
    last_commit = 0
    for ended, step in enumerate(range(12), start=1):
        before = len(w.parts_written)
        _add_step(w, step, keep=rng.random(len(PARAMS)) < 0.7, unions=True)
        new = w.parts_written[before:]
        disk = _on_disk(directory)
        if new:  # a commit: every step ended so far is on disk, in every table; the steps part is last
            assert disk["params"] | disk["steps"] | disk["unions"] <= set(range(ended))
            assert disk["steps"] == disk["unions"] == set(range(ended))
            assert [parse_part_name(p.name).table for p in new][-1] == "steps"
            assert all(pq.read_metadata(p).num_rows <= rows_per_part for p in new)
            last_commit = ended
        assert disk["params"] <= disk["steps"]  # never a params row of a step whose steps row is missing
        if every is not None:  # at most ``every`` steps are ever uncommitted at a step boundary
            assert ended - last_commit < every, f"{ended - last_commit} steps uncommitted, every={every}"
    w.close()
    assert _on_disk(directory)["steps"] == set(range(12))


def test_commit_triggers(tmp_path) -> None:
    w = TraceWriter(tmp_path / "a", rank=0, commit_every_steps=3, commit_every_s=None)
    counts = []
    for step in range(7):
        _add_step(w, step)
        counts.append(len(w.parts_written))
    assert counts == [0, 0, 2, 2, 2, 4, 4]  # params + steps part after steps 2 and 5
    w.close()
    assert len(w.parts_written) == 6

    w = TraceWriter(tmp_path / "b", rank=0, commit_every_steps=None, commit_every_s=0.2)
    _add_step(w, 0)
    assert w.parts_written == []
    time.sleep(0.25)
    _add_step(w, 1)
    assert len(w.parts_written) == 2
    w.close()

    w = TraceWriter(
        tmp_path / "c", rank=0, rows_per_part=2 * len(PARAMS), commit_every_steps=None, commit_every_s=None
    )
    _add_step(w, 0)
    assert w.parts_written == []
    _add_step(w, 1)  # the params table fills a part: due at this step boundary
    assert [p.name for p in w.parts_written] == ["params-r000-000001.parquet", "steps-r000-000001.parquet"]
    w.close()

    w = TraceWriter(tmp_path / "d", rank=0, rows_per_part=1)
    for step in range(3):  # params rows alone have no step boundary: nothing is written before close
        w.add_param_row(step=step, param=NAMES[0], numel=int(NUMEL[0]), k=1, grad_norm=1.0, sel_norm=0.5,
                        sel_max_abs=0.1, overlap=0.5, ready_s=0.0)  # fmt: skip
    assert w.parts_written == []
    w.close()
    assert len(w.parts_written) == 3

    for bad in ({"commit_every_steps": 0}, {"commit_every_steps": 1.5}, {"commit_every_s": 0},
                {"commit_every_s": float("nan")}, {"commit_every_steps": True}):  # fmt: skip
        with pytest.raises(ValueError, match="commit_every"):
            TraceWriter(tmp_path / "e", rank=0, **bad)


# ------------------------------------------------------------------------------ incomplete traces
def _trace(
    directory: Path, *, steps_per_rank: dict[int, int], params_only_tail: int = 0, unions: bool = True
) -> Path:
    """A 2-rank trace with ``steps_per_rank`` complete steps per rank, plus ``params_only_tail``
    steps on rank 1 whose params are committed and whose steps rows are not."""
    for rank, num in steps_per_rank.items():
        w = TraceWriter(directory, rank=rank, commit_every_steps=1)
        for step in range(num):
            _add_step(w, step, unions=unions and rank == 0)
        if rank == 1 and params_only_tail:
            for step in range(num, num + params_only_tail):
                w.add_param_rows(step=np.full(len(PARAMS), step), param=NAMES, numel=NUMEL,
                                 k=np.ones(len(PARAMS), dtype=np.int64), grad_norm=np.ones(len(PARAMS)),
                                 sel_norm=np.ones(len(PARAMS)) * 0.5, sel_max_abs=np.ones(len(PARAMS)) * 0.1,
                                 overlap=np.full(len(PARAMS), np.nan), ready_s=np.zeros(len(PARAMS)))  # fmt: skip
            w.commit()
        w.close()
    write_manifest(directory, Manifest(workload="t", params=PARAMS, world_size=2, command="pytest"))
    return directory


def test_ranks_with_different_step_counts(tmp_path) -> None:
    d = _trace(tmp_path, steps_per_rank={0: 6, 1: 4})
    with pytest.raises(TraceError) as info:
        read_trace(d)
    message = str(info.value)
    assert message.startswith(f"{d}: rank(s) [1] have no rows of step 5 (world_size=2)"), message
    assert "2 of 6 steps are not complete" in message and "steps rows per rank: 6, 4" in message
    assert "steps 0..3 (4 steps)" in message and "\n" not in message
    trace = read_trace(d, complete_prefix=True)
    assert trace.truncated_at == 4 and trace.incomplete == message
    assert trace.step_ids.tolist() == [0, 1, 2, 3] and set(trace.params["step"].tolist()) == {0, 1, 2, 3}
    assert len(trace.steps["step"]) == 8 and len(trace.unions["step"]) == 4 * len(PARAMS)
    assert read_trace(d, steps=(0, 4)).incomplete is None  # a window inside the complete prefix
    with pytest.warns(TraceWarning, match="incomplete trace"):
        skipped = read_trace(d, on_error="skip")
    assert skipped.num_steps == 6 and skipped.truncated_at is None


def test_params_rows_without_steps_rows_name_the_part_and_row(tmp_path) -> None:
    d = _trace(tmp_path, steps_per_rank={0: 5, 1: 3}, params_only_tail=2)
    part = part_files(d, table="params", rank=1)[-1]
    with pytest.raises(TraceError) as info:
        read_trace(d)
    # the tail (steps 3 and 4) was committed as one part: step 4 starts after step 3's rows
    assert str(info.value).startswith(
        f"{part}: row {len(PARAMS)}: step 4 of rank 1 has params rows but no steps row;"
    )
    assert read_trace(d, complete_prefix=True).step_ids.tolist() == [0, 1, 2]


def test_a_trace_without_steps_rows_is_not_a_valid_trace(tmp_path) -> None:
    """The old failure: small parts, a crash, the steps table empty — read back as 0 compute."""
    d = _trace(tmp_path, steps_per_rank={0: 3, 1: 3})
    for path in part_files(d, table="steps"):
        path.unlink()
    with pytest.raises(
        TraceError, match=r"has params rows but no steps row \(the trace has no 'steps' rows at all\)"
    ):
        read_trace(d)
    prefix = read_trace(d, complete_prefix=True)
    assert prefix.num_steps == 0 and prefix.truncated_at == 0 and "no complete prefix" in prefix.incomplete


def test_a_step_without_unions_rows(tmp_path) -> None:
    d = _trace(tmp_path, steps_per_rank={0: 4, 1: 4})
    part = part_files(d, table="unions", rank=0)[2]  # step 2's unions
    part.unlink()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceWarning)  # the gap in the sequence numbers
        with pytest.raises(TraceError, match=rf"^{d}: step 2 has no unions rows \(other steps have\)"):
            read_trace(d)
        assert read_trace(d, complete_prefix=True).step_ids.tolist() == [0, 1]


def test_synthetic_and_sample_traces_are_complete() -> None:
    from traces.samples import available_samples, sample_trace_path

    for name in available_samples():
        assert read_trace(sample_trace_path(name)).incomplete is None


def test_profile_and_simulate_refuse_an_incomplete_trace_unless_told(tmp_path, capsys) -> None:
    d = _trace(tmp_path / "t", steps_per_rank={0: 6, 1: 4})
    plan = tmp_path / "plan.json"
    assert igsim_main(["profile", str(d), "-o", str(plan), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith(f"igsim profile: error: {d}: rank(s) [1] have no rows of step 5")
        and err.count("\n") == 1
    )
    assert igsim_main(["profile", str(d), "-o", str(plan), "--quiet", "--complete-prefix"]) == 0
    assert "profiled its complete prefix, 4 steps before step 4" in capsys.readouterr().out
    simulate = ["simulate", "--trace", str(d), "--ranks", "2", "--policy", "topk", "--steps", "3"]
    assert igsim_main(simulate) == 2
    assert "incomplete trace" in capsys.readouterr().err
    assert igsim_main([*simulate, "--complete-prefix", "--json", str(tmp_path / "sim.json")]) == 0
    assert "replaying its complete prefix, 4 recorded steps before step 4" in capsys.readouterr().out
    assert igsim_main([*simulate, "--complete-prefix", "--window", "4:6"]) == 2
    assert "no step is complete on every rank" in capsys.readouterr().err


def test_simulate_of_a_trace_without_steps_rows_is_refused(tmp_path, capsys) -> None:
    """The old failure reported 10 us steps (no compute time) for such a trace."""
    d = tmp_path / "t"
    write_synthetic_trace(d, num_steps=4, world_size=2, rows_per_part=10)
    for path in part_files(d, table="steps"):
        path.unlink()
    simulate = ["simulate", "--trace", str(d), "--ranks", "2", "--policy", "topk", "--steps", "3"]
    assert igsim_main(simulate) == 2
    assert "(the trace has no 'steps' rows at all)" in capsys.readouterr().err
    assert igsim_main([*simulate, "--complete-prefix"]) == 2
    assert "no step is complete on every rank" in capsys.readouterr().err
