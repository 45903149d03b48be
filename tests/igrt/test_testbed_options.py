"""The testbed flags ``igrt testbed`` and ``igrt validate`` share, parsed into a TestbedSpec."""

from __future__ import annotations

import argparse

import pytest

from igrt.cli.options import add_testbed_arguments, spec_from_args


def _spec(*argv: str):
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=4)
    add_testbed_arguments(p)
    return spec_from_args(p.parse_args(list(argv)))


def test_link_flags_reach_the_spec():
    spec = _spec("--bandwidth", "25Mbit", "--queue-ms", "20", "--tcp-slow-start-after-idle", "0")
    assert spec.rate_bytes_per_s == pytest.approx(25e6 / 8)
    assert spec.queue_s == pytest.approx(0.02)
    assert spec.slow_start_after_idle is False
    assert _spec().slow_start_after_idle is True  # Linux's own default


def test_a_queue_holds_at_least_its_minimum_bytes_on_slow_links():
    spec = _spec("--bandwidth", "25Mbit")  # defaults: 10 ms, at least 125 kB
    assert spec.queue_s_at(spec.rate_bytes_per_s) == pytest.approx(0.040)  # 125 kB at 25 Mbit/s
    assert spec.queue_s_at(100e6 / 8) == pytest.approx(0.010)  # 10 ms holds 125 kB at 100 Mbit/s
    assert spec.queue_s_at(1e9 / 8) == pytest.approx(0.010)  # never shorter than --queue-ms
    flat = _spec("--bandwidth", "25Mbit", "--queue-min-bytes", "0")
    assert flat.queue_s_at(flat.rate_bytes_per_s) == pytest.approx(0.010)
    with pytest.raises(ValueError, match="queue_min_bytes"):
        _spec("--queue-min-bytes", "-1")


def test_the_host_queue_flag_reaches_the_spec():
    assert _spec().host_queue_bytes == 4 * 2**20  # a rank's own NIC: TCP's backpressure, not a drop
    assert _spec("--host-queue-bytes", "0").host_queue_bytes == 0  # the testbed before 2026-12-07
    with pytest.raises(ValueError, match="host_queue_bytes"):
        _spec("--host-queue-bytes", "-5")


def test_slow_start_flag_takes_only_0_or_1():
    with pytest.raises(SystemExit):
        _spec("--tcp-slow-start-after-idle", "2")
