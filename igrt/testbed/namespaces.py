"""A real network testbed from Linux network namespaces, veth pairs, bridges and ``tc`` shapers.

One namespace per rank (``igtb-r0`` …), each joined by a veth pair to a bridge inside a switch namespace
(``igtb-sw``). Every rank link is shaped in both directions with a token-bucket filter (``tbf``): on the
rank side for rank → switch, on the switch side for switch → rank. The two-level variant puts half the
ranks on a second bridge and joins the two bridges with one veth pair shaped to ``uplink_rate``; the
heterogeneous variant gives one rank a slower NIC.

Addresses are 10.213.0.(i+1)/24 and exist only inside these namespaces: no route leads anywhere else.
``netem`` is not in this kernel, so latency cannot be injected; the stack's own per-message overhead is
what calibration fits. Everything is named with the ``igtb-`` prefix, so :func:`teardown` (also run
before every set-up) removes what a crashed run left behind.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["PREFIX", "Testbed", "TestbedError", "TestbedSpec", "leftovers", "teardown"]

PREFIX = "igtb-"
SWITCH_NS = f"{PREFIX}sw"
SUBNET = "10.213.0"
RANK_IFNAME = "eth0"


class TestbedError(RuntimeError):
    """The testbed cannot be built here (no root, no namespaces, a tool missing)."""

    __test__ = False  # not a pytest test class


@dataclass(frozen=True, kw_only=True)
class TestbedSpec:
    """What to build. Rates are bytes per second (parse "100Mbit" with igpolicy.units at the edge).

    ``two_level``: ranks [0, n/2) on bridge 0, the rest on bridge 1, bridges joined by one link of
    ``uplink_rate_bytes_per_s`` (default: the rank rate, i.e. 2:1 contention for cross traffic).
    ``slow_rank`` / ``slow_rate_bytes_per_s``: one rank with a slower NIC (heterogeneous case).
    """

    __test__ = False

    num_ranks: int
    rate_bytes_per_s: float
    two_level: bool = False
    uplink_rate_bytes_per_s: float | None = None
    slow_rank: int | None = None
    slow_rate_bytes_per_s: float | None = None
    mtu: int = 1500

    def __post_init__(self) -> None:
        if not 2 <= self.num_ranks <= 64:
            raise ValueError(f"testbed: num_ranks must be in [2, 64], got {self.num_ranks}")
        if not self.rate_bytes_per_s > 0:
            raise ValueError(f"testbed: rate must be > 0, got {self.rate_bytes_per_s}")
        if self.slow_rank is not None:
            if not 0 <= self.slow_rank < self.num_ranks:
                raise ValueError(f"testbed: slow_rank {self.slow_rank} is not a rank of {self.num_ranks}")
            if not (self.slow_rate_bytes_per_s and self.slow_rate_bytes_per_s > 0):
                raise ValueError("testbed: slow_rank needs slow_rate_bytes_per_s > 0")
        if self.two_level and self.num_ranks < 4:
            raise ValueError("testbed: the two-level variant needs at least 4 ranks")

    def rank_ns(self, rank: int) -> str:
        return f"{PREFIX}r{rank}"

    def rank_addr(self, rank: int) -> str:
        return f"{SUBNET}.{rank + 1}"

    def rank_rate(self, rank: int) -> float:
        if rank == self.slow_rank:
            assert self.slow_rate_bytes_per_s is not None
            return self.slow_rate_bytes_per_s
        return self.rate_bytes_per_s

    def bridge_of(self, rank: int) -> str:
        if self.two_level and rank >= self.num_ranks // 2:
            return "br1"
        return "br0"

    @property
    def uplink_rate(self) -> float:
        return self.uplink_rate_bytes_per_s or self.rate_bytes_per_s


def _run(cmd: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(cmd), capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise TestbedError(f"`{' '.join(cmd)}` failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def _ns(ns: str, *cmd: str) -> list[str]:
    return ["ip", "netns", "exec", ns, *cmd]


def _tbf(ns: str, dev: str, rate_bytes_per_s: float, mtu: int) -> None:
    """Shape ``dev``'s egress to ``rate``: burst of max(2 MTU, 2 ms of traffic), 100 ms queue."""
    rate_bit = max(int(rate_bytes_per_s * 8), 8000)
    burst = max(2 * (mtu + 14), int(rate_bytes_per_s * 0.002))
    _run(
        _ns(
            ns,
            "tc",
            "qdisc",
            "replace",
            "dev",
            dev,
            "root",
            "tbf",
            "rate",
            f"{rate_bit}bit",
            "burst",
            str(burst),
            "latency",
            "100ms",
        )
    )


def leftovers() -> list[str]:
    """Namespaces with the testbed prefix that exist now (e.g. after a crash)."""
    if shutil.which("ip") is None:
        return []
    out = _run(["ip", "netns", "list"], check=False).stdout
    return sorted(line.split()[0] for line in out.splitlines() if line.startswith(PREFIX))


def teardown() -> list[str]:
    """Delete every testbed namespace (veths and bridges go with them). Returns what was removed."""
    removed = leftovers()
    for ns in removed:
        _run(["ip", "netns", "del", ns], check=False)
    return removed


def check_support() -> None:
    """Raise TestbedError with a clear reason where namespaces cannot be made here."""
    if os.name != "posix" or not os.path.exists("/proc/self/ns/net"):
        raise TestbedError("the testbed needs Linux network namespaces")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise TestbedError(f"the testbed needs `{tool}` (Debian package iproute2)")
    if os.geteuid() != 0:
        raise TestbedError("the testbed needs root (network namespaces and tc); run as root or skip")
    probe = f"{PREFIX}probe"
    proc = _run(["ip", "netns", "add", probe], check=False)
    if proc.returncode != 0:
        raise TestbedError(f"network namespaces are not allowed here: {proc.stderr.strip()}")
    _run(["ip", "netns", "del", probe], check=False)


def setup(spec: TestbedSpec) -> None:
    """Build the testbed described by ``spec`` (after removing any leftovers)."""
    check_support()
    teardown()
    try:
        _run(["ip", "netns", "add", SWITCH_NS])
        _run(_ns(SWITCH_NS, "ip", "link", "set", "lo", "up"))
        bridges = ["br0", "br1"] if spec.two_level else ["br0"]
        for br in bridges:
            _run(_ns(SWITCH_NS, "ip", "link", "add", br, "type", "bridge"))
            _run(_ns(SWITCH_NS, "ip", "link", "set", br, "up"))
        if spec.two_level:
            _run(_ns(SWITCH_NS, "ip", "link", "add", "up0", "type", "veth", "peer", "name", "up1"))
            for dev, br in (("up0", "br0"), ("up1", "br1")):
                _run(_ns(SWITCH_NS, "ip", "link", "set", dev, "master", br))
                _run(_ns(SWITCH_NS, "ip", "link", "set", dev, "up"))
                _tbf(SWITCH_NS, dev, spec.uplink_rate, spec.mtu)
        for r in range(spec.num_ranks):
            ns, port = spec.rank_ns(r), f"p{r}"
            _run(["ip", "netns", "add", ns])
            _run(_ns(ns, "ip", "link", "set", "lo", "up"))
            _run(
                _ns(
                    SWITCH_NS,
                    "ip",
                    "link",
                    "add",
                    port,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    RANK_IFNAME,
                    "netns",
                    ns,
                )
            )
            _run(_ns(SWITCH_NS, "ip", "link", "set", port, "master", spec.bridge_of(r)))
            _run(_ns(SWITCH_NS, "ip", "link", "set", port, "up"))
            _run(_ns(ns, "ip", "addr", "add", f"{spec.rank_addr(r)}/24", "dev", RANK_IFNAME))
            _run(_ns(ns, "ip", "link", "set", RANK_IFNAME, "mtu", str(spec.mtu), "up"))
            rate = spec.rank_rate(r)
            _tbf(ns, RANK_IFNAME, rate, spec.mtu)  # rank -> switch
            _tbf(SWITCH_NS, port, rate, spec.mtu)  # switch -> rank
    except BaseException:
        teardown()
        raise


def exec_args(spec: TestbedSpec, rank: int) -> list[str]:
    """argv prefix that runs a command inside ``rank``'s namespace."""
    return ["ip", "netns", "exec", spec.rank_ns(rank)]


def rank_env(spec: TestbedSpec, rank: int, *, port: int) -> dict[str, str]:
    """Environment for a torch.distributed process of ``rank`` on the testbed (gloo bound to eth0)."""
    return {
        "MASTER_ADDR": spec.rank_addr(0),
        "MASTER_PORT": str(port),
        "RANK": str(rank),
        "WORLD_SIZE": str(spec.num_ranks),
        "LOCAL_RANK": "0",
        "GLOO_SOCKET_IFNAME": RANK_IFNAME,
        "OMP_NUM_THREADS": "1",
    }


class Testbed:
    """Context manager: ``with Testbed(spec) as tb: ...`` builds the testbed and always tears it down."""

    __test__ = False

    def __init__(self, spec: TestbedSpec) -> None:
        self.spec = spec

    def __enter__(self) -> Testbed:
        setup(self.spec)
        return self

    def __exit__(self, *exc: object) -> None:
        teardown()

    def run(self, rank: int, cmd: Sequence[str], **kw) -> subprocess.CompletedProcess[str]:
        """Run ``cmd`` inside ``rank``'s namespace and return the completed process."""
        return subprocess.run([*exec_args(self.spec, rank), *cmd], capture_output=True, text=True, **kw)
