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


def test_slow_start_flag_takes_only_0_or_1():
    with pytest.raises(SystemExit):
        _spec("--tcp-slow-start-after-idle", "2")
