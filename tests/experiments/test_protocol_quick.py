"""``experiments.protocol``: its quick mode end to end, its run cache, and the split controls.

The quick study trains tiny MiniLM runs (Top-k+EF and the importance policy, 1 seed, 6 steps) as
``igrt train`` subprocesses on one rank each. A second invocation must train nothing (every run
folder is complete); a run folder whose ``summary.json`` is gone is trained again, alone.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from igpolicy.plan import ComponentPlan, SyncPlan
from igpolicy.vocab import ComponentClass

pytest.importorskip("torch")
pytest.importorskip("transformers")


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _argv(tmp: Path) -> list[str]:
    return ["--workload", "minilm", "--quick", "--out", str(tmp / "out"), "--runs", str(tmp / "runs"),
            "--cache", str(tmp / "cache"), "--nproc", "1"]  # fmt: skip


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    from experiments import protocol

    tmp = tmp_path_factory.mktemp("protocol")
    assert protocol.main(_argv(tmp)) == 0
    return tmp


def test_quick_writes_paired_pre_flush_tables_with_the_floor_and_bytes(study: Path) -> None:
    out = study / "out"
    runs = _rows(out / "runs.csv")
    assert sorted(r["method"] for r in runs) == ["importance", "topk"]
    by = {r["method"]: r for r in runs}
    floor = float(by["topk"]["majority_floor"])
    assert 0.0 < floor < 1.0 and all(float(r["majority_floor"]) == floor for r in runs)
    for r in runs:
        assert 0.0 <= float(r["accuracy_pre_flush"]) <= 1.0 and 0.0 <= float(r["accuracy_after_flush"]) <= 1.0
        assert float(r["flush_bytes"]) > 0  # both hold residuals: the flush is counted, not hidden
        total = float(r["bytes_per_step"]) * int(r["steps"]) + float(r["flush_bytes"])
        assert float(r["run_bytes_incl_flush"]) == pytest.approx(total, rel=1e-5)
    assert float(by["importance"]["bytes_per_step"]) < float(by["topk"]["bytes_per_step"])
    assert float(by["importance"]["recording_bytes"]) > 0 and float(by["topk"]["recording_bytes"]) == 0
    summary = {r["method"]: r for r in _rows(out / "summary.csv")}
    assert float(summary["topk"]["paired_diff_vs_topk"]) == 0.0 and int(summary["topk"]["pairs"]) == 1
    assert float(summary["topk"]["bytes_vs_topk"]) == 1.0
    # MiniLM's second metric: the pre-flush held-out loss per run, paired against Top-k+EF's in %
    def pre_flush_loss(method: str) -> float:  # from the run's own summary, at full precision
        run = study / "runs" / f"{method}-lr{float(by[method]['lr']):g}-s0" / "summary.json"
        return next(e["loss"] for e in json.loads(run.read_text())["eval"]["history"] if e.get("before_flush"))

    loss = {m: pre_flush_loss(m) for m in by}
    assert all(float(by[m]["loss_pre_flush"]) == pytest.approx(loss[m], rel=1e-5) for m in by)
    assert float(summary["topk"]["loss_paired_diff_pct"]) == 0.0
    want = (loss["importance"] - loss["topk"]) / loss["topk"] * 100
    assert want != 0.0 and float(summary["importance"]["loss_paired_diff_pct"]) == pytest.approx(want, rel=1e-3)
    curves = json.loads((out / "curves.json").read_text())
    for c in curves:  # evaluations at steps 0, 3 and 6 (before the flush), bytes growing with the steps
        assert len(c["bytes"]) == len(c["values"]) == 3 and c["bytes"][0] == 0.0
        assert c["bytes"][0] < c["bytes"][1] < c["bytes"][2]
    assert (out / "quality_vs_bytes.png").stat().st_size > 1000
    log = (out / "log.txt").read_text()
    assert "0 run(s) cached, 2 to do" in log and "majority-class floor" in log
    assert "expected ~" in log  # the duration, from the timed probe run
    meta = json.loads((out / "meta.json").read_text())
    assert meta["complete"] is True and meta["runs_done"] == meta["runs_planned"] == 2


def test_a_lost_run_cache_is_restored_from_the_committed_records_not_retrained(
    study: Path, tmp_path: Path, monkeypatch
) -> None:
    """A fresh checkout holds ``--out`` (committed, with its run records) but no ``--runs`` cache."""
    import shutil

    from experiments import protocol

    trained: list[str] = []
    real = protocol.execute
    monkeypatch.setattr(protocol, "execute", lambda run, folder: trained.append(run.name) or real(run, folder))
    records = study / "out" / protocol.RECORDS_DIR
    assert sorted(p.name for p in records.iterdir()) == ["importance-lr0.001-s0", "topk-lr0.001-s0"]
    for rec in records.iterdir():  # only what the tables need (the metrics gzipped): no checkpoint, no log
        assert sorted(p.name for p in rec.iterdir()) == ["metrics.csv.gz", protocol.MARK_NAME, protocol.SUMMARY_NAME]
    fresh = tmp_path / "fresh"
    shutil.copytree(study / "out", fresh / "out")
    argv = [*_argv(fresh), "--cache", str(study / "cache")]
    assert protocol.main(argv) == 0
    assert trained == []
    log = (fresh / "out" / "log.txt").read_text()
    assert "2 finished run(s) restored" in log and "2 run(s) cached, 0 to do" in log
    assert _rows(fresh / "out" / "runs.csv") == _rows(study / "out" / "runs.csv")
    # a record of other settings is not a finished run of these: it is trained, not restored
    mark = records / "topk-lr0.001-s0" / protocol.MARK_NAME
    other = tmp_path / "other"
    shutil.copytree(study / "out", other / "out")
    m = json.loads(mark.read_text())
    m["settings"]["steps"] += 1
    (other / "out" / protocol.RECORDS_DIR / "topk-lr0.001-s0" / protocol.MARK_NAME).write_text(json.dumps(m))
    assert protocol.main([*_argv(other), "--cache", str(study / "cache")]) == 0
    assert trained == ["topk-lr0.001-s0"]
    assert "1 finished run(s) restored" in (other / "out" / "log.txt").read_text()
    # a new --out over the cached runs (a report-only pass) gets a record of every run of its tables
    assert protocol.main([*_argv(study)[:2], "--quick", "--out", str(tmp_path / "new"), "--runs", str(study / "runs"),
                          "--cache", str(study / "cache"), "--nproc", "1", "--report-only"]) == 0  # fmt: skip
    assert sorted(p.name for p in (tmp_path / "new" / protocol.RECORDS_DIR).iterdir()) == sorted(
        p.name for p in records.iterdir()
    )
    assert trained == ["topk-lr0.001-s0"]


def test_a_second_invocation_reuses_the_cache_and_an_incomplete_run_is_redone(
    study: Path, monkeypatch
) -> None:
    from experiments import protocol

    trained: list[str] = []
    real = protocol.execute

    def counting(run, folder):
        trained.append(run.name)
        return real(run, folder)

    monkeypatch.setattr(protocol, "execute", counting)
    summary = study / "runs" / "topk-lr0.001-s0" / "summary.json"
    before = summary.stat().st_mtime_ns
    assert protocol.main(_argv(study)) == 0
    assert trained == []  # everything cached: no run, no probe
    assert summary.stat().st_mtime_ns == before
    assert "2 run(s) cached, 0 to do" in (study / "out" / "log.txt").read_text()
    record = study / "out" / protocol.RECORDS_DIR / "topk-lr0.001-s0" / "summary.json"
    summary.unlink()  # as if the run had been killed before igrt train wrote its summary
    record.unlink()  # (a killed run has no record: it is kept only once the run succeeded)
    assert protocol.main(_argv(study)) == 0
    assert trained == ["topk-lr0.001-s0"] and summary.is_file() and record.is_file()
    summary.unlink()
    record.unlink()
    assert protocol.main([*_argv(study), "--report-only"]) == 0  # tables only: the gap is reported, not run
    assert trained == ["topk-lr0.001-s0"] and not summary.exists()
    assert [r["method"] for r in _rows(study / "out" / "runs.csv")] == ["importance"]
    assert "--report-only: 1 run(s) not trained" in (study / "out" / "log.txt").read_text()


def _plan() -> SyncPlan:
    sizes = {
        "0.attn_q": 400,
        "0.attn_k": 300,
        "0.mlp_up": 900,
        "1.attn_q": 200,
        "1.mlp_up": 800,
        "1.attn_k": 100,
    }
    scores = {
        "0.attn_q": 9.0,
        "0.attn_k": 1.0,
        "0.mlp_up": 8.0,
        "1.attn_q": 2.0,
        "1.mlp_up": 3.0,
        "1.attn_k": 0.5,
    }
    important = {"0.attn_q", "0.mlp_up"}
    comps, phase = [], 0
    for key in sorted(sizes):
        low = key not in important
        comps.append(ComponentPlan(key=key, score=scores[key], cls=ComponentClass.LOW if low else ComponentClass.IMPORTANT,
                                   phase=(phase := phase + 1) % 2 if low else None, expected_bytes=sizes[key]))  # fmt: skip
    comps.append(ComponentPlan(key="other", score=0.0, cls=ComponentClass.PINNED, expected_bytes=50))
    return SyncPlan(release_period=2, components=tuple(comps))


def test_split_controls_are_plans_derived_from_the_real_plan() -> None:
    from igpolicy.controls import split_controls

    plan = _plan()
    target = sum(c.expected_bytes for c in plan.components if c.cls == ComponentClass.IMPORTANT)
    biggest = max(c.expected_bytes for c in plan.components)
    controls = split_controls(plan, seed=3)
    for name, p in controls.items():
        assert isinstance(p, SyncPlan) and p.release_period == plan.release_period
        assert [c.key for c in p.components] == [c.key for c in plan.components], name
        assert p.by_key["other"].cls == ComponentClass.PINNED  # pinned stays pinned
        assert p.source["derived_from"] == plan.fingerprint and p.fingerprint != plan.fingerprint
    assert controls["all_low"].important == {"other"}
    from experiments.common import plan_decision_id

    moved = __import__("dataclasses").replace(plan, source={"trace": "/elsewhere"})
    assert plan_decision_id(moved) == plan_decision_id(plan) and moved.fingerprint != plan.fingerprint
    assert len({plan_decision_id(p) for p in (plan, *controls.values())}) == 4
    for name in ("random", "swapped"):
        p = controls[name]
        got = sum(c.expected_bytes for c in p.components if c.cls == ComponentClass.IMPORTANT)
        assert abs(got - target) <= biggest, name  # size-matched
        assert p.important != plan.important, name
    swapped = controls["swapped"].important - {"other"}
    lowest = sorted((c for c in plan.components if c.key != "other"), key=lambda c: c.score)
    assert lowest[0].key in swapped and not (swapped & (plan.important - {"other"}))
    assert controls["all_low"].expected_share == pytest.approx((50 + 2700 / 2) / 2750)
    assert math.isclose(plan.expected_share, (50 + 1300 + 1400 / 2) / 2750)


def test_a_run_lock_keeps_a_second_invocation_off_a_run_in_progress(tmp_path: Path) -> None:
    from experiments.protocol import _claim

    lock = tmp_path / "topk-lr0.001-s0.lock"
    assert _claim(lock) == lock and lock.read_text() == str(__import__("os").getpid())
    assert _claim(lock) is None  # held by a live process (this one)
    lock.write_text("999999999")  # a process that is gone: the lock is stale
    assert _claim(lock) == lock


def test_method_part_variants_switch_one_thing_each(tmp_path: Path) -> None:
    from experiments.protocol import LABELS, POLICIES, VARIANTS, _run, tables

    plan = _plan()
    plans, paths = {"importance": plan}, {"importance": tmp_path / "importance.json"}
    settings = {"workload": "gpt", "tiny": True, "steps": 20, "warmup_steps": 2, "eval_every": 5, "nproc": 2,
                "batch_size": 4, "density": 0.01, "release_period": 2}  # fmt: skip
    base = _run(settings, "importance", lr=1e-3, seed=0, plans=plans, paths=paths)
    for tag in VARIANTS:
        assert tag in POLICIES and tag in LABELS
        run = _run(settings, tag, lr=1e-3, seed=0, plans=plans, paths=paths)
        folder = tmp_path / run.name
        cmd, want = run.command(folder), base.command(folder)
        if run.plan_path is None:  # online profiling: the importance run without its plan
            i = want.index("--plan")
            want = want[:i] + want[i + 2 :]
        want[want.index("--release-period") + 1] = str(run.release_period)
        # the importance run's command, its switches added before --tiny
        assert cmd == [*want[:-1], *run.extra.split(), want[-1]] and run.extra, tag
        assert run.settings() != base.settings()  # its own cache key
    assert _run(settings, "imp_online_r8", lr=1e-3, seed=0, plans=plans, paths=paths).release_period == 8
    warm = _run(settings, "imp_warm", lr=1e-3, seed=0, plans=plans, paths=paths)
    assert warm.extra == "--sync-warmup-steps 2"  # the sync warm-up covers the LR warm-up's steps
    online = _run(settings, "imp_online", lr=1e-3, seed=0, plans=plans, paths=paths)
    assert online.plan_path is None and "--plan" not in online.command(tmp_path)
    # a plan-free run is not charged the profiling run; a variant that follows the plan is
    res = {"quality": 2.0, "quality_after_flush": 2.0, "bytes_per_step": 10.0, "flush_bytes": 0.0, "summary": {},
           "wall_s": 1.0}
    runs = [_run(settings, t, lr=1e-3, seed=0, plans=plans, paths=paths) for t in ("topk", "imp_online", "imp_small")]
    t = tables({**settings, "policies": ("topk", "imp_online", "imp_small"), "seeds": 1, "lrs": (1e-3,)},
               {r.name: res for r in runs}, runs, {}, {"recording_bytes_per_rank": 99.0}, None)  # fmt: skip
    rec = {row["method"]: row["recording_bytes"] for row in t["runs"]}
    assert rec == {"topk": 0.0, "imp_online": 0.0, "imp_small": 99.0}


def test_thinned_top_k_controls_run_top_k_at_their_share_of_the_density(tmp_path: Path) -> None:
    from experiments.protocol import LABELS, POLICIES, THINNED, _run

    plans, paths = {"importance": _plan()}, {"importance": tmp_path / "importance.json"}
    settings = {"workload": "gpt", "tiny": True, "steps": 20, "warmup_steps": 2, "eval_every": 5, "nproc": 2,
                "batch_size": 4, "density": 0.01, "release_period": 2}  # fmt: skip
    topk = _run(settings, "topk", lr=1e-3, seed=0, plans=plans, paths=paths)
    for tag, share in THINNED.items():
        assert tag in POLICIES and tag in LABELS
        run = _run(settings, tag, lr=1e-3, seed=0, plans=plans, paths=paths)
        want_share = plans["importance"].expected_share if share is None else share
        assert run.density == round(0.01 * want_share, 6) < 0.01 and run.plan_path is None
        cmd, want = run.command(tmp_path), topk.command(tmp_path)
        want[want.index("--density") + 1] = f"{run.density:g}"
        assert cmd == want  # Top-k+EF's own command at the thinned density
    assert THINNED["topk_quarter"] == 0.25


def test_every_run_records_the_training_code_version_which_is_not_its_cache_key(study: Path, tmp_path: Path) -> None:
    from experiments.protocol import MARK_NAME, code_version

    here = code_version()
    assert len(here) == 12 and int(here, 16) >= 0
    rows = _rows(study / "out" / "runs.csv")
    assert rows and {r["code"] for r in rows} == {here}
    for r in rows:
        mark = json.loads((study / "runs" / f"{r['method']}-lr{float(r['lr']):g}-s{r['seed']}" / MARK_NAME).read_text())
        assert mark["code"] == here and "code" not in mark["settings"]
    assert f"training code of these runs: {here} ({len(rows)} run(s)); this checkout {here}" in (
        study / "out" / "log.txt"
    ).read_text()
    # a changed training file changes the version; a file outside the training code does not
    for pkg in ("igpolicy", "igrt", "igsim"):
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "a.py").write_text("x = 1\n")
    before = code_version.__wrapped__(tmp_path)
    (tmp_path / "igsim" / "a.py").write_text("x = 2\n")
    assert code_version.__wrapped__(tmp_path) == before
    (tmp_path / "igrt" / "a.py").write_text("x = 2\n")
    assert code_version.__wrapped__(tmp_path) != before


def test_a_wire_encodes_every_method_but_powersgd_and_keeps_its_own_runs(tmp_path: Path) -> None:
    from experiments.protocol import WIRES, _run

    plans, paths = {"importance": _plan()}, {"importance": tmp_path / "importance.json"}
    settings = {"workload": "gpt", "tiny": True, "steps": 20, "warmup_steps": 2, "eval_every": 5, "nproc": 2,
                "batch_size": 4, "density": 0.01, "release_period": 2}  # fmt: skip
    plain = {t: _run(settings, t, lr=1e-3, seed=0, plans=plans, paths=paths) for t in ("topk", "imp_online_r8_thin")}
    assert all("wire" not in r.settings() for r in plain.values())  # fp32 records of earlier sessions match
    assert plain["topk"].name == "topk-lr0.001-s0"
    for wire in ("compact", "int8"):
        for tag, base in plain.items():
            run = _run({**settings, "wire": wire}, tag, lr=1e-3, seed=0, plans=plans, paths=paths)
            assert run.name == f"{base.name}-{wire}" and run.settings()["wire"] == wire
            cmd = run.command(tmp_path)
            i = cmd.index("--value-bytes")
            assert cmd[i : i + 4] == list(WIRES[wire]) and cmd[:i] == base.command(tmp_path)[:i]
    psgd = _run({**settings, "wire": "compact"}, "powersgd1", lr=1e-3, seed=0, plans=plans, paths=paths)
    assert psgd.wire == "fp32" and psgd.name == "powersgd1-lr0.001-s0"  # PyTorch's hook: its own encoding
    assert WIRES["compact"] == ("--value-bytes", "2", "--index-bytes", "2")
