"""Unit conversions: the only place where Gbit/s, MiB and microseconds exist.

Inside the project everything is bytes, seconds and bytes per second. Strings with units appear only
at the edges (CLI flags, config and topology files) and are parsed here, strictly: "100 Gbs" is an
error, not a guess.

A command-line flag passes its name as ``flag``: then a bare number is refused ("--latency 5" could
mean seconds or microseconds), the error names the flag and the units it takes, and only zero may
go without a unit. Files keep the documented bare-number meaning (bytes, seconds, bytes per second).
"""

from __future__ import annotations

import math
import re

__all__ = [
    "format_bandwidth",
    "format_bytes",
    "format_time",
    "parse_bandwidth",
    "parse_size",
    "parse_time",
]

_NUM = r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*"

# bits per second -> multiply by factor / 8 to get bytes per second
_BANDWIDTH_UNITS: dict[str, float] = {
    "bps": 1.0,
    "bit/s": 1.0,
    "kbps": 1e3,
    "kbit/s": 1e3,
    "kbit": 1e3,
    "mbps": 1e6,
    "mbit/s": 1e6,
    "mbit": 1e6,
    "gbps": 1e9,
    "gbit/s": 1e9,
    "gbit": 1e9,
    "tbps": 1e12,
    "tbit/s": 1e12,
    "tbit": 1e12,
}
# bytes per second (capital B)
_BYTERATE_UNITS: dict[str, float] = {
    "B/s": 1.0,
    "KB/s": 1e3,
    "MB/s": 1e6,
    "GB/s": 1e9,
    "TB/s": 1e12,
    "KiB/s": 2.0**10,
    "MiB/s": 2.0**20,
    "GiB/s": 2.0**30,
}
_SIZE_UNITS: dict[str, float] = {
    "B": 1,
    "KB": 1e3,
    "MB": 1e6,
    "GB": 1e9,
    "TB": 1e12,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
    "TiB": 2**40,
}
_TIME_UNITS: dict[str, float] = {
    "s": 1.0,
    "ms": 1e-3,
    "us": 1e-6,
    "µs": 1e-6,
    "ns": 1e-9,
}


_EXAMPLES = {"bandwidth": "10Gbit/s, 100Gbps or 12.5GB/s", "size": "25MiB or 100MB", "time": "5us or 2ms"}


def _split(text: str, what: str) -> tuple[float, str]:
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return float(text), ""
    if not isinstance(text, str):
        raise ValueError(f"{what}: expected a string such as '100Gbps', got {text!r}")
    m = re.fullmatch(_NUM + r"([A-Za-zµ/]*)\s*", text)
    if not m:
        raise ValueError(f"{what}: cannot parse {text!r}")
    return float(m.group(1)), m.group(2)


def _split_flag(text: str | float, flag: str | None, kind: str) -> tuple[float, str]:
    """``_split`` for a file value (``flag`` None) or a command-line flag: there a bare number other
    than zero is refused with the units the flag takes."""
    value, unit = _split(text, flag or kind)
    if flag is not None and unit == "" and value != 0:
        raise ValueError(f"{flag}: give a unit, e.g. {_EXAMPLES[kind]} (got {text!r})")
    return value, unit


def _positive(value: float, text: object, what: str, *, allow_zero: bool = False) -> float:
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{what}: {text!r} must be {'>= 0' if allow_zero else '> 0'} and finite")
    return value


def parse_bandwidth(text: str | float, *, flag: str | None = None) -> float:
    """Parse a link rate to bytes per second.

    Bit rates: ``bps, kbps, Mbps, Gbps, Tbps`` (also ``Gbit/s``, ``Gbit``; case-insensitive).
    Byte rates: ``B/s, MB/s, GB/s, MiB/s, GiB/s`` (case-sensitive B). A bare number is bytes/s,
    except for a command-line ``flag``, where it is refused.

    >>> parse_bandwidth("100Gbps")
    12500000000.0
    >>> parse_bandwidth("100", flag="--bandwidth")
    Traceback (most recent call last):
    ...
    ValueError: --bandwidth: give a unit, e.g. 10Gbit/s, 100Gbps or 12.5GB/s (got '100')

    Raises ValueError on an unknown unit ("100 Gbs") or a value that is not positive and finite.
    """
    what = flag or "bandwidth"
    value, unit = _split_flag(text, flag, "bandwidth")
    if unit == "":
        return _positive(value, text, what)
    if unit in _BYTERATE_UNITS:
        return _positive(value * _BYTERATE_UNITS[unit], text, what)
    factor = _BANDWIDTH_UNITS.get(unit.lower())
    if factor is None:
        known = "bps, Kbps, Mbps, Gbps, Tbps, Gbit/s, MB/s, GB/s, MiB/s, GiB/s"
        raise ValueError(f"{what}: unknown unit {unit!r} in {text!r} (known: {known})")
    return _positive(value * factor / 8.0, text, what)


def parse_size(text: str | float, *, flag: str | None = None) -> int:
    """Parse a size to bytes: ``B, KB, MB, GB, TB`` (powers of 10) or ``KiB, MiB, GiB, TiB``.

    >>> parse_size("1MiB")
    1048576

    A bare number is bytes, except for a command-line ``flag`` (refused unless zero). Raises
    ValueError on an unknown unit or a negative size.
    """
    what = flag or "size"
    value, unit = _split_flag(text, flag, "size")
    if unit and unit not in _SIZE_UNITS:
        raise ValueError(f"{what}: unknown unit {unit!r} in {text!r} (known: {', '.join(_SIZE_UNITS)})")
    return round(_positive(value * _SIZE_UNITS.get(unit, 1), text, what, allow_zero=True))


def parse_time(text: str | float, *, flag: str | None = None) -> float:
    """Parse a duration to seconds: ``s, ms, us (µs), ns``; a bare number is seconds, except for a
    command-line ``flag`` (refused unless zero).

    >>> parse_time("2ms")
    0.002
    >>> parse_time("5", flag="--latency")
    Traceback (most recent call last):
    ...
    ValueError: --latency: give a unit, e.g. 5us or 2ms (got '5')
    """
    what = flag or "time"
    value, unit = _split_flag(text, flag, "time")
    if unit and unit not in _TIME_UNITS:
        raise ValueError(f"{what}: unknown unit {unit!r} in {text!r} (known: s, ms, us, ns)")
    return _positive(value * _TIME_UNITS.get(unit, 1.0), text, what, allow_zero=True)


def format_bandwidth(bytes_per_s: float) -> str:
    """Bytes per second as a bit rate string (``12.5e9`` -> ``'100 Gbit/s'``)."""
    bits = bytes_per_s * 8.0
    for unit, factor in (("Tbit/s", 1e12), ("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bits >= factor:
            return f"{bits / factor:.4g} {unit}"
    return f"{bits:.4g} bit/s"


def format_bytes(size_bytes: float) -> str:
    """Bytes in binary units (``1048576`` -> ``'1 MiB'``)."""
    for unit, factor in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(size_bytes) >= factor:
            return f"{size_bytes / factor:.4g} {unit}"
    return f"{size_bytes:.0f} B"


def format_time(seconds: float) -> str:
    """Seconds in the most readable unit (``5e-6`` -> ``'5 us'``)."""
    for unit, factor in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(seconds) >= factor:
            return f"{seconds / factor:.4g} {unit}"
    return f"{seconds / 1e-9:.4g} ns"
