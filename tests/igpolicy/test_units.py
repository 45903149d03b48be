import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from igpolicy.units import format_bandwidth, parse_bandwidth, parse_size, parse_time


@pytest.mark.parametrize(
    ("text", "bytes_per_s"),
    [
        ("100Gbps", 12.5e9),
        ("100 Gbit/s", 12.5e9),
        ("100Mbit", 12.5e6),
        ("400gbps", 50e9),
        ("1 GB/s", 1e9),
        ("1GiB/s", 2.0**30),
        ("8", 8.0),
    ],
)
def test_parse_bandwidth(text, bytes_per_s):
    assert parse_bandwidth(text) == pytest.approx(bytes_per_s, rel=1e-12)


@pytest.mark.parametrize("text", ["100 Gbs", "fast", "-1Gbps", "0Gbps", "1e400Gbps", "10 gb/s"])
def test_parse_bandwidth_rejects(text):
    with pytest.raises(ValueError, match="bandwidth"):
        parse_bandwidth(text)


def test_parse_size_and_time():
    assert parse_size("100MB") == 100_000_000
    assert parse_size("1MiB") == 2**20
    assert parse_size("0") == 0
    assert parse_time("5us") == pytest.approx(5e-6)
    assert parse_time("2 ms") == pytest.approx(2e-3)
    with pytest.raises(ValueError, match="unknown unit"):
        parse_size("3 MBs")
    with pytest.raises(ValueError, match="unknown unit"):
        parse_time("3 min")


@given(st.floats(min_value=1e3, max_value=1e14, allow_nan=False))
def test_bandwidth_round_trip(bps):
    text = format_bandwidth(bps)
    value, unit = text.split()
    assert math.isclose(parse_bandwidth(value + unit), bps, rel_tol=1e-3)
