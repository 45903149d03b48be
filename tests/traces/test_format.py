"""The trace format round trip: writer -> Parquet parts -> reader, the series helpers and inspect."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from igpolicy.vocab import ComponentId, ParamInfo
from traces.cli import main as traces_main
from traces.reader import TraceWarning, read_trace
from traces.samples import available_samples, sample_trace_path, synthetic_params, write_synthetic_trace
from traces.schema import TABLE_SCHEMAS, Manifest, PartName, TraceError, parse_part_name, part_files
from traces.writer import TraceWriter, write_manifest

PARAMS = synthetic_params(num_layers=1, hidden=8, vocab=20)


def _random_rows(
    rng: np.random.Generator, *, num_steps: int, world_size: int
) -> dict[str, dict[str, np.ndarray]]:
    """Rows for every table, as the oracle the reader must reproduce (some params absent, some NaN)."""
    names = np.array([p.name for p in PARAMS])
    numel = np.array([p.numel for p in PARAMS])
    params: dict[str, list] = {f.name: [] for f in TABLE_SCHEMAS["params"]}
    steps: dict[str, list] = {f.name: [] for f in TABLE_SCHEMAS["steps"]}
    for step in range(num_steps):
        for rank in range(world_size):
            keep = rng.random(len(names)) < 0.8
            n = int(keep.sum())
            params["step"].append(np.full(n, step))
            params["rank"].append(np.full(n, rank))
            params["param"].append(names[keep])
            params["numel"].append(numel[keep])
            params["k"].append(rng.integers(0, numel[keep] + 1))
            grad_norm = rng.random(n)
            sel_norm = grad_norm * rng.random(n)  # sel_max_abs <= sel_norm <= grad_norm
            params["grad_norm"].append(grad_norm)
            params["sel_norm"].append(sel_norm)
            params["sel_max_abs"].append(sel_norm * rng.random(n))
            params["ready_s"].append(rng.random(n))
            overlap = rng.random(n)
            overlap[rng.random(n) < 0.3] = np.nan
            params["overlap"].append(overlap)
            steps["step"].append([step])
            steps["rank"].append([rank])
            for col in ("forward_s", "backward_s", "optimizer_s", "loss"):
                steps[col].append(rng.random(1))
    unions = {
        "step": np.repeat(np.arange(num_steps), len(names)),
        "param": np.tile(names, num_steps),
        "union_k": rng.integers(0, np.tile(np.minimum(numel, 9), num_steps) + 1),  # <= numel
    }
    return {
        "params": {c: np.concatenate(v) for c, v in params.items()},
        "steps": {c: np.concatenate(v) for c, v in steps.items()},
        "unions": unions,
    }


def _write(directory: Path, rows: dict, *, world_size: int, rows_per_part: int, chunk: int = 7) -> Manifest:
    writers = [TraceWriter(directory, rank=r, rows_per_part=rows_per_part) for r in range(world_size)]
    for table, add in (("params", "add_param_rows"), ("steps", "add_step_rows")):
        cols = rows[table]
        for r, w in enumerate(writers):
            mine = cols["rank"] == r
            idx = np.flatnonzero(mine)
            for start in range(0, len(idx), chunk):  # many small batches: exercises buffering
                sel = idx[start : start + chunk]
                getattr(w, add)(**{c: a[sel] for c, a in cols.items()})
    writers[0].add_union_rows(**rows["unions"])
    for w in writers:
        w.close()
    manifest = Manifest(workload="test", params=PARAMS, world_size=world_size, density=0.1, command="pytest")
    write_manifest(directory, manifest)
    return manifest


def _sorted(cols: dict[str, np.ndarray], names: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Rows ordered by (param name, step, rank), with ``param`` as names."""
    out = {c: np.asarray(a) for c, a in cols.items()}
    if "param" in out and names is not None:
        out["param"] = names[out["param"]]
    keys = [out[c] for c in ("param", "step", "rank") if c in out]
    order = np.lexsort(keys[::-1])
    return {c: a[order] for c, a in out.items()}


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**32 - 1),
    world_size=st.integers(1, 3),
    num_steps=st.integers(1, 6),
    rows_per_part=st.integers(5, 60),
)
def test_round_trip_reads_back_every_row(
    tmp_path_factory, seed, world_size, num_steps, rows_per_part
) -> None:
    directory = tmp_path_factory.mktemp("trace")
    rows = _random_rows(np.random.default_rng(seed), num_steps=num_steps, world_size=world_size)
    manifest = _write(directory, rows, world_size=world_size, rows_per_part=rows_per_part)
    trace = read_trace(directory)
    assert trace.manifest == manifest
    assert not list(directory.rglob("*.tmp")) and not list(directory.rglob(".*"))
    names = np.asarray(trace.param_names)
    for table in TABLE_SCHEMAS:
        got = getattr(trace, table)
        for f in TABLE_SCHEMAS[table]:
            expected_dtype = np.int32 if f.name == "param" else np.dtype(f.type.to_pandas_dtype())
            assert got[f.name].dtype == expected_dtype, (table, f.name)
        a, b = _sorted(got, names), _sorted(rows[table])
        for c in a:
            np.testing.assert_array_equal(a[c], b[c], err_msg=f"{table}.{c}")
    # each part holds at most rows_per_part rows and the part count is the minimum possible
    num_params_parts = sum(1 for p in trace.parts if p.name.startswith("params-"))
    per_rank = [int((rows["params"]["rank"] == r).sum()) for r in range(world_size)]
    assert num_params_parts == sum(math.ceil(n / rows_per_part) for n in per_rank)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("synthetic")
    write_synthetic_trace(directory, num_steps=6, world_size=2, rows_per_part=25, seed=3)
    return directory


def test_per_param_series_is_the_nan_safe_mean_over_ranks(tmp_path) -> None:
    rows = _random_rows(np.random.default_rng(7), num_steps=5, world_size=3)
    _write(tmp_path, rows, world_size=3, rows_per_part=40)
    trace = read_trace(tmp_path)
    p = rows["params"]
    for column in ("k", "overlap", "grad_norm"):
        series = trace.per_param_series(column)
        assert set(series) == set(p["param"])
        for name, values in series.items():
            assert values.shape == (trace.num_steps,)
            for i, step in enumerate(trace.step_ids):
                sel = (p["param"] == name) & (p["step"] == step)
                vals = [v for v in p[column][sel].astype(float) if not math.isnan(v)]
                if vals:
                    assert values[i] == pytest.approx(sum(vals) / len(vals))
                else:
                    assert math.isnan(values[i])
    union = trace.union_k_series()
    u = rows["unions"]
    for name, values in union.items():
        np.testing.assert_array_equal(values, u["union_k"][u["param"] == name].astype(float))
    with pytest.raises(ValueError, match="no value column 'param'"):
        trace.per_param_series("param")


def test_step_times_align_steps_and_ranks(synthetic) -> None:
    trace = read_trace(synthetic)
    times = trace.step_times()
    assert times.ranks == (0, 1) == trace.ranks
    assert times.forward_s.shape == (6, 2)
    s = trace.steps
    for step, rank, fwd, loss in zip(s["step"], s["rank"], s["forward_s"], s["loss"]):
        i, j = int(np.searchsorted(times.step, step)), times.ranks.index(int(rank))
        assert times.forward_s[i, j] == fwd and times.loss[i, j] == loss
    np.testing.assert_allclose(times.compute_s, times.forward_s + times.backward_s + times.optimizer_s)


def test_synthetic_sample_is_consistent(synthetic) -> None:
    trace = read_trace(synthetic)
    p = trace.params
    assert np.all(p["sel_norm"] <= p["grad_norm"] + 1e-12)
    assert np.all(p["sel_max_abs"] <= p["sel_norm"] + 1e-12)
    assert np.all(np.isnan(p["overlap"][p["step"] == 0]))
    k = trace.per_param_series("k")
    for name, union in trace.union_k_series().items():
        numel = trace.manifest.by_name[name].numel
        assert np.all(union >= k[name] - 1e-9) and np.all(union <= numel)  # union >= mean k


def test_single_rank_union_is_its_own_k(tmp_path) -> None:
    write_synthetic_trace(tmp_path, num_steps=3, world_size=1)
    trace = read_trace(tmp_path)
    assert len(trace.unions["step"]) == 0
    k = trace.per_param_series("k")
    assert all(np.array_equal(trace.union_k_series()[n], k[n]) for n in k)


def test_step_window_equals_filtering_the_full_read(synthetic) -> None:
    full = read_trace(synthetic)
    part = read_trace(synthetic, steps=(2, 4))
    np.testing.assert_array_equal(part.step_ids, [2, 3])
    for table in TABLE_SCHEMAS:
        keep = (getattr(full, table)["step"] >= 2) & (getattr(full, table)["step"] < 4)
        for c, arr in getattr(part, table).items():
            np.testing.assert_array_equal(arr, getattr(full, table)[c][keep])
    assert len(read_trace(synthetic, steps=(100, 200)).params["k"]) == 0


def test_a_missing_rank_makes_the_trace_incomplete(tmp_path) -> None:
    rows = _random_rows(np.random.default_rng(1), num_steps=2, world_size=2)
    _write(tmp_path, rows, world_size=2, rows_per_part=1000)
    for path in part_files(tmp_path, rank=1):
        path.unlink()
    with pytest.raises(
        TraceError, match=r"rank\(s\) \[1\] have no rows of step 1 .*incomplete trace"
    ) as info:
        read_trace(tmp_path)
    assert str(info.value).startswith(f"{tmp_path}: ") and "\n" not in str(info.value)
    with pytest.warns(TraceWarning, match="incomplete trace"):
        trace = read_trace(tmp_path, on_error="skip")
    assert trace.ranks == (0,) and trace.incomplete == str(info.value) and trace.truncated_at is None
    prefix = read_trace(tmp_path, complete_prefix=True)
    assert prefix.num_steps == 0 and prefix.truncated_at == 0 and len(prefix.params["step"]) == 0


def test_writer_validates_rows_and_continues_sequence_numbers(tmp_path) -> None:
    row = dict(
        step=0,
        param="embed.weight",
        numel=160,
        k=3,
        grad_norm=1.0,
        sel_norm=0.5,
        sel_max_abs=0.4,
        overlap=0.1,
        ready_s=0.0,
    )
    with TraceWriter(tmp_path, rank=1) as w:
        w.add_param_row(**row)
        with pytest.raises(ValueError, match="unknown column"):
            w.add_param_row(**row, bogus=1)
        with pytest.raises(ValueError, match=r"missing column\(s\) \['k'\]"):
            w.add_param_row(**{c: v for c, v in row.items() if c != "k"})
        with pytest.raises(ValueError, match="k=161 is outside"):
            w.add_param_row(**{**row, "k": 161})
        with pytest.raises(ValueError, match="but this writer is rank 1"):
            w.add_param_row(**row, rank=0)
        with pytest.raises(ValueError, match="different lengths"):
            w.add_param_rows(**{c: [v, v] for c, v in row.items()} | {"k": [1]})
        with pytest.raises(ValueError, match="expected int64 values, got dtype float64"):
            w.add_param_row(**{**row, "k": 2.5})
        with pytest.raises(ValueError, match="expected parameter names"):
            w.add_param_row(**{**row, "param": 5})
    assert [p.name for p in w.parts_written] == ["params-r001-000001.parquet"]
    with pytest.raises(ValueError, match="is closed"):
        w.add_param_row(**row)
    w2 = TraceWriter(tmp_path, rank=1)
    w2.add_param_row(**row)
    w2.close()
    assert [p.name for p in w2.parts_written] == ["params-r001-000002.parquet"]
    for bad in ({"rank": -1}, {"rank": 0, "rows_per_part": 0}):
        with pytest.raises(ValueError):
            TraceWriter(tmp_path, **bad)


def test_part_names_round_trip() -> None:
    part = PartName(table="params", rank=12, seq=345)
    assert part.file_name == "params-r012-000345.parquet"
    assert part.tmp_name == ".params-r012-000345.parquet.tmp"
    assert parse_part_name(part.file_name) == part
    assert parse_part_name("params-r1-000001.parquet") is None


def test_manifest_json_round_trip_and_strict_keys() -> None:
    m = Manifest(workload="w", params=PARAMS, world_size=2, extra={"batch": 16}, torch_version="2.13")
    data = json.loads(json.dumps(m.to_json()))
    assert Manifest.from_json(data) == m
    with pytest.raises(TraceError, match="unknown key 'bogus'"):
        Manifest.from_json({**data, "bogus": 1})
    with pytest.raises(TraceError, match="missing required key 'params'"):
        Manifest.from_json({k: v for k, v in data.items() if k != "params"})
    bad_param = {**data, "params": [{**data["params"][0], "component": "nonsense"}]}
    with pytest.raises(TraceError, match="component"):
        Manifest.from_json(bad_param)
    dup = ParamInfo(name=PARAMS[0].name, shape=(1,), dtype="float32", component="norm", order=99)
    with pytest.raises(ValueError, match="appears twice"):
        Manifest(workload="w", params=(*PARAMS, dup))
    for key, value in (
        ("density", 0.0),
        ("world_size", 0),
        ("sparsifier", "magic"),
        ("created_utc", "yesterday"),
    ):
        with pytest.raises(ValueError, match=key):
            Manifest(workload="w", params=PARAMS, **{key: value})


def test_inspect_prints_a_summary(synthetic, capsys) -> None:
    assert traces_main(["inspect", str(synthetic)]) == 0
    out = capsys.readouterr().out
    assert "steps: 6 (0..5)" in out and "ranks: [0, 1]" in out and "topk at density 0.05" in out
    assert "skipped files: none" in out
    assert traces_main(["inspect", str(synthetic), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    trace = read_trace(synthetic)
    assert summary["num_steps"] == 6 and summary["num_params"] == len(trace.param_names)
    # oracle: bytes per step by kind = 8 bytes per selected entry, per (step, rank) pair
    by_kind: dict[str, float] = {}
    p = trace.params
    for code, k in zip(p["param"], p["k"]):
        kind = ComponentId.from_key(trace.manifest.by_name[trace.param_names[code]].component).kind.value
        by_kind[kind] = by_kind.get(kind, 0.0) + 8 * int(k)
    pairs = len({(int(s), int(r)) for s, r in zip(p["step"], p["rank"])})
    got = summary["bytes_per_step_by_kind"]
    assert set(got) == set(by_kind)
    for kind, total in by_kind.items():
        assert got[kind]["bytes_per_step"] == pytest.approx(total / pairs)


def test_samples_listing() -> None:
    names = available_samples()
    assert isinstance(names, tuple)
    with pytest.raises(ValueError, match="no sample trace 'no-such-sample'"):
        sample_trace_path("no-such-sample")
    for name in names:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert read_trace(sample_trace_path(name)).num_steps > 0
