"""A spawned rank that succeeded ends without interpreter finalization (igrt.train.launch).

Finalization is where a gloo group still referenced by a collected DDP reducer or a future's callback
can abort the process (SIGABRT, "terminate called without an active exception"), after the rank's
result was delivered; so a rank that delivered its result exits at once with code 0. An atexit
handler stands in for finalization here: it must not run on a rank that succeeded, and it must on
the launcher's side of a failing rank's path (the usual exit).
"""

from __future__ import annotations

import atexit
from pathlib import Path

import pytest

from igrt.train.launch import launch


def _register_marker_then(ctx, folder: str, fail: bool) -> int:
    marker = Path(folder) / f"finalized-{ctx.rank}"
    atexit.register(marker.write_text, "finalized")
    if fail:
        raise ValueError("this rank fails on purpose")
    return ctx.rank * 10


def test_a_rank_that_succeeded_returns_its_result_and_skips_finalization(tmp_path: Path) -> None:
    got = launch(_register_marker_then, nproc=2, backend="gloo", args=(str(tmp_path), False), timeout_s=60)
    assert got == {0: 0, 1: 10}
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no atexit handler ran


def test_a_failing_rank_still_reports_its_error_and_exits_the_usual_way(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="fails on purpose"):
        launch(_register_marker_then, nproc=1, backend="gloo", args=(str(tmp_path), True), timeout_s=60)
    assert (tmp_path / "finalized-0").read_text() == "finalized"
