"""A real network testbed from Linux network namespaces, veth pairs, bridges and ``tc`` shapers.

One namespace per rank (``igtb-<run>-r0`` …), each joined by a veth pair to a bridge inside a switch
namespace (``igtb-<run>-sw``). Every rank link is shaped in both directions with a token-bucket filter (``tbf``): on the
rank side for rank → switch, on the switch side for switch → rank. The two-level variant puts half the
ranks on a second bridge and joins the two bridges with one veth pair shaped to ``uplink_rate``; the
heterogeneous variant gives one rank a slower NIC. The ring variant (3 ranks) has no switch: every
rank is joined to each neighbour by a veth pair of its own (``eth0`` to rank r+1, ``eth1`` to rank
r-1), each shaped both ways, so a ring collective's send and receive of one rank use different links.

Every shaper's queue holds ``queue_s`` of traffic at its rate (``tbf latency``; default 10 ms, as a
switch port would: the earlier 100 ms let a standing queue delay the reverse flow's ACKs on slow
links) and never fewer than ``queue_min_bytes`` (default 125 kB, what 10 ms holds at 100 Mbit/s): a
switch's buffer is bytes, not time, and 10 ms at 25 Mbit/s (31 kB) drops a 4-rank burst that a
125 kB queue absorbs (docs/validation.md, "The shaper's queue in bytes").

A rank's own egress shaper is its NIC, not a switch port: its queue holds ``host_queue_bytes``
(default 4 MiB). A host's TCP stack is backpressured by its own qdisc (TSQ) and never loses a packet
there; a 125 kB tbf in front of a sender with three connections of 64 kB GSO bursts dropped 2.8 % of
all packets of a 1 MiB all-gather, all at the senders' own egress, and every drop cost a loss
recovery (docs/validation.md, "A sender's own queue"). ``host_queue_bytes=0`` builds the earlier
testbed, whose rank egress queued like a switch port.

Addresses are 10.213.0.(i+1) and exist only inside these namespaces: no route leads anywhere else.
``netem`` is not in this kernel, so latency cannot be injected; the stack's own per-message overhead is
what calibration fits.

Every name carries the run's id (``TestbedSpec.run_id``, random per spec), so several testbeds can
exist side by side and a run removes only its own namespaces: :func:`teardown` takes the run id and
never touches another run's. What a crashed run left behind stays until ``igrt testbed down --run-id
RUN`` (or ``--all``, explicitly) removes it; :func:`leftovers` lists it.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["PREFIX", "Testbed", "TestbedError", "TestbedSpec", "bottleneck_bytes_per_s", "burst_s", "describe",
           "leftovers", "link_rates", "new_run_id", "run_ids", "shaper_counters", "support_problem",
           "teardown", "teardown_all"]  # fmt: skip

PREFIX = "igtb-"
DEFAULT_QUEUE_S = 0.010
DEFAULT_QUEUE_MIN_BYTES = 125_000  # 10 ms at 100 Mbit/s
DEFAULT_HOST_QUEUE_BYTES = 4 * 2**20  # a rank's own NIC queue: deep enough that TSQ, not a drop, limits it
SUBNET = "10.213.0"
RANK_IFNAME = "eth0"
_RUN_ID = re.compile(r"[0-9a-z]{4,16}")
_NS_NAME = re.compile(rf"{re.escape(PREFIX)}(?P<run>[0-9a-z]{{4,16}})-(?:sw|r\d+)")


def new_run_id() -> str:
    """A random run id (8 hex digits): namespace names no other run can guess or share."""
    return secrets.token_hex(4)


def _check_run_id(run_id: str) -> str:
    if not isinstance(run_id, str) or not _RUN_ID.fullmatch(run_id):
        raise ValueError(f"testbed: run id {run_id!r} must be 4-16 lowercase letters or digits")
    return run_id


class TestbedError(RuntimeError):
    """The testbed cannot be built here (no root, no namespaces, a tool missing)."""

    __test__ = False  # not a pytest test class


@dataclass(frozen=True, kw_only=True)
class TestbedSpec:
    """What to build. Rates are bytes per second (parse "100Mbit" with igpolicy.units at the edge).

    ``two_level``: ranks [0, n/2) on bridge 0, the rest on bridge 1, bridges joined by one link of
    ``uplink_rate_bytes_per_s`` (default: the rank rate, i.e. 2:1 contention for cross traffic).
    ``slow_rank`` / ``slow_rate_bytes_per_s``: one rank with a slower NIC (heterogeneous case).
    ``ring``: 3 ranks, each pair joined by its own shaped link (no switch).
    ``queue_s``: every shaper's queue limit in seconds of traffic at its rate (tbf ``latency``), raised
    where that holds fewer than ``queue_min_bytes`` (0: time only) to the time those bytes take at the
    shaper's rate (:meth:`queue_s_at`).
    ``host_queue_bytes``: the queue of a rank's own egress shapers (its NIC: rank -> switch, and both of
    a ring rank's links), in bytes; 0: ``queue_s`` / ``queue_min_bytes`` like every other shaper.
    ``slow_start_after_idle``: the rank namespaces' ``net.ipv4.tcp_slow_start_after_idle`` (Linux's
    default True: a connection idle for longer than its retransmission timeout restarts from the
    initial congestion window, as gloo's sockets do between a training step's collectives).
    """

    __test__ = False

    num_ranks: int
    rate_bytes_per_s: float
    two_level: bool = False
    uplink_rate_bytes_per_s: float | None = None
    slow_rank: int | None = None
    slow_rate_bytes_per_s: float | None = None
    ring: bool = False
    queue_s: float = DEFAULT_QUEUE_S
    queue_min_bytes: int = DEFAULT_QUEUE_MIN_BYTES
    host_queue_bytes: int = DEFAULT_HOST_QUEUE_BYTES
    slow_start_after_idle: bool = True
    mtu: int = 1500
    run_id: str = field(default_factory=new_run_id)

    def __post_init__(self) -> None:
        _check_run_id(self.run_id)
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
        if self.ring and (self.num_ranks != 3 or self.two_level):
            raise ValueError(
                f"testbed: the ring variant is 3 ranks (--ranks 3) on a switchless ring, got {self.num_ranks} ranks"
                + (" and two_level" if self.two_level else "")
            )
        if not (0.001 <= self.queue_s <= 1.0):
            raise ValueError(f"testbed: queue_s must be in [0.001, 1] seconds, got {self.queue_s}")
        if not (0 <= self.queue_min_bytes <= 64 * 2**20):
            raise ValueError(f"testbed: queue_min_bytes must be in [0, 64 MiB], got {self.queue_min_bytes}")
        if not (0 <= self.host_queue_bytes <= 64 * 2**20):
            raise ValueError(f"testbed: host_queue_bytes must be in [0, 64 MiB], got {self.host_queue_bytes}")

    def queue_s_at(self, rate_bytes_per_s: float) -> float:
        """The queue limit (tbf ``latency``, seconds) of a shaper at ``rate``: ``queue_s``, or the
        time ``queue_min_bytes`` takes at that rate where that is longer."""
        return max(self.queue_s, self.queue_min_bytes / rate_bytes_per_s)

    @property
    def switch_ns(self) -> str:
        return f"{PREFIX}{self.run_id}-sw"

    def rank_ns(self, rank: int) -> str:
        return f"{PREFIX}{self.run_id}-r{rank}"

    def namespaces(self) -> list[str]:
        """Every namespace of this testbed, the switch first (the ring has none)."""
        ranks = [self.rank_ns(r) for r in range(self.num_ranks)]
        return ranks if self.ring else [self.switch_ns, *ranks]

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


def burst_bytes(rate_bytes_per_s: float, mtu: int) -> int:
    """The token bucket's burst: max(2 frames, 2 ms of traffic at ``rate``)."""
    return max(2 * (mtu + 14), int(rate_bytes_per_s * 0.002))


def _tbf(ns: str, dev: str, rate_bytes_per_s: float, mtu: int, queue_s: float, *, limit_bytes: int = 0) -> None:
    """Shape ``dev``'s egress to ``rate``: burst of :func:`burst_bytes`, a queue of ``queue_s`` (or,
    with ``limit_bytes``, of that many bytes: a host's own NIC queue)."""
    rate_bit = max(int(rate_bytes_per_s * 8), 8000)
    burst = burst_bytes(rate_bytes_per_s, mtu)
    queue = ["limit", str(limit_bytes)] if limit_bytes else ["latency", f"{round(queue_s * 1e3, 3):g}ms"]
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
            *queue,
        )
    )


def leftovers(run_id: str | None = None) -> list[str]:
    """Testbed namespaces that exist now: run ``run_id``'s, or (None) every run's, e.g. after a crash."""
    if shutil.which("ip") is None:
        return []
    out = _run(["ip", "netns", "list"], check=False).stdout
    names = sorted(line.split()[0] for line in out.splitlines() if line.startswith(PREFIX))
    if run_id is None:
        return names
    _check_run_id(run_id)
    return [n for n in names if (m := _NS_NAME.fullmatch(n)) is not None and m["run"] == run_id]


def run_ids() -> list[str]:
    """The ids of the runs whose testbed namespaces exist now."""
    return sorted({m["run"] for n in leftovers() if (m := _NS_NAME.fullmatch(n)) is not None})


def teardown(run_id: str) -> list[str]:
    """Delete run ``run_id``'s namespaces (veths and bridges go with them), no other run's.
    Returns what was removed."""
    removed = leftovers(run_id)
    for ns in removed:
        _run(["ip", "netns", "del", ns], check=False)
    return removed


def teardown_all() -> list[str]:
    """Delete every testbed namespace of every run (``igrt testbed down --all``). Returns them."""
    removed = leftovers()
    for ns in removed:
        _run(["ip", "netns", "del", ns], check=False)
    return removed


def support_problem() -> str | None:
    """Why no testbed can be built here (:func:`check_support`'s message), or None when one can."""
    try:
        check_support()
    except TestbedError as e:
        return str(e)
    return None


def check_support() -> None:
    """Raise TestbedError with a clear reason where namespaces cannot be made here."""
    if os.name != "posix" or not os.path.exists("/proc/self/ns/net"):
        raise TestbedError("the testbed needs Linux network namespaces")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise TestbedError(f"the testbed needs `{tool}` (Debian package iproute2)")
    if os.geteuid() != 0:
        raise TestbedError("the testbed needs root (network namespaces and tc); run as root or skip")
    probe = f"{PREFIX}probe-{secrets.token_hex(4)}"  # never another run's name
    proc = _run(["ip", "netns", "add", probe], check=False)
    if proc.returncode != 0:
        raise TestbedError(f"network namespaces are not allowed here: {proc.stderr.strip()}")
    _run(["ip", "netns", "del", probe], check=False)


def setup(spec: TestbedSpec) -> None:
    """Build the testbed described by ``spec`` in namespaces of its own run id (other runs' testbeds
    are left alone); on a failure, remove what was built."""
    check_support()
    taken = leftovers(spec.run_id)
    if taken:
        raise TestbedError(f"testbed run id {spec.run_id} is in use already ({' '.join(taken)})")
    if spec.ring:
        try:
            _setup_ring(spec)
        except BaseException:
            teardown(spec.run_id)
            raise
        return
    sw = spec.switch_ns
    try:
        _run(["ip", "netns", "add", sw])
        _run(_ns(sw, "ip", "link", "set", "lo", "up"))
        bridges = ["br0", "br1"] if spec.two_level else ["br0"]
        for br in bridges:
            _run(_ns(sw, "ip", "link", "add", br, "type", "bridge"))
            _run(_ns(sw, "ip", "link", "set", br, "up"))
        if spec.two_level:
            _run(_ns(sw, "ip", "link", "add", "up0", "type", "veth", "peer", "name", "up1"))
            for dev, br in (("up0", "br0"), ("up1", "br1")):
                _run(_ns(sw, "ip", "link", "set", dev, "master", br))
                _run(_ns(sw, "ip", "link", "set", dev, "up"))
                _tbf(sw, dev, spec.uplink_rate, spec.mtu, spec.queue_s_at(spec.uplink_rate))
        for r in range(spec.num_ranks):
            ns, port = spec.rank_ns(r), f"p{r}"
            _run(["ip", "netns", "add", ns])
            _run(_ns(ns, "ip", "link", "set", "lo", "up"))
            _tcp_settings(spec, ns)
            _run(
                _ns(
                    sw,
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
            _run(_ns(sw, "ip", "link", "set", port, "master", spec.bridge_of(r)))
            _run(_ns(sw, "ip", "link", "set", port, "up"))
            _run(_ns(ns, "ip", "addr", "add", f"{spec.rank_addr(r)}/24", "dev", RANK_IFNAME))
            _run(_ns(ns, "ip", "link", "set", RANK_IFNAME, "mtu", str(spec.mtu), "up"))
            rate = spec.rank_rate(r)
            _tbf(ns, RANK_IFNAME, rate, spec.mtu, spec.queue_s_at(rate), limit_bytes=spec.host_queue_bytes)  # rank -> switch
            _tbf(sw, port, rate, spec.mtu, spec.queue_s_at(rate))  # switch -> rank
    except BaseException:
        teardown(spec.run_id)
        raise


def _tcp_settings(spec: TestbedSpec, ns: str) -> None:
    """The rank namespace's own TCP settings (per network namespace since Linux 4.15). A new
    namespace starts with Linux's defaults, so only a change from them is written (a kernel
    without the per-namespace sysctl then fails only when asked for one)."""
    if not spec.slow_start_after_idle:
        _run(_ns(ns, "sysctl", "-q", "-w", "net.ipv4.tcp_slow_start_after_idle=0"))


def _setup_ring(spec: TestbedSpec) -> None:
    """Rank r's ``eth0`` is joined to rank r+1's ``eth1`` by a veth pair shaped both ways. Both of a
    rank's links carry its address (/32) and a host route to the neighbour behind it, so gloo (bound
    to ``eth0``'s address) reaches each neighbour over the direct link."""
    p = spec.num_ranks
    for r in range(p):
        ns = spec.rank_ns(r)
        _run(["ip", "netns", "add", ns])
        _run(_ns(ns, "ip", "link", "set", "lo", "up"))
        _tcp_settings(spec, ns)
    for r in range(p):
        nxt = (r + 1) % p
        a, b = spec.rank_ns(r), spec.rank_ns(nxt)
        _run(_ns(a, "ip", "link", "add", RANK_IFNAME, "type", "veth", "peer", "name", "eth1", "netns", b))
    for r in range(p):
        ns = spec.rank_ns(r)
        for dev, peer in ((RANK_IFNAME, (r + 1) % p), ("eth1", (r - 1) % p)):
            _run(_ns(ns, "ip", "addr", "add", f"{spec.rank_addr(r)}/32", "dev", dev))
            _run(_ns(ns, "ip", "link", "set", dev, "mtu", str(spec.mtu), "up"))
            _run(_ns(ns, "ip", "route", "add", f"{spec.rank_addr(peer)}/32", "dev", dev, "src",
                     spec.rank_addr(r)))  # fmt: skip
            link = min(spec.rank_rate(r), spec.rank_rate(peer))
            _tbf(ns, dev, link, spec.mtu, spec.queue_s_at(link), limit_bytes=spec.host_queue_bytes)  # a NIC


def shaper_counters(run_id: str) -> dict[str, dict[str, int]]:
    """Every tbf shaper of testbed ``run_id``: ``{"NAMESPACE/DEV": {"packets", "bytes", "drops",
    "overlimits"}}``, cumulative since it was built (``tc -s -j qdisc show`` in each namespace). A
    drop is a packet the shaper's queue had no room for, which TCP sends again; on the star every
    drop measured was at a sender's own egress, none at a switch port (docs/validation.md)."""
    out: dict[str, dict[str, int]] = {}
    for ns in leftovers(run_id):
        proc = _run(["ip", "netns", "exec", ns, "tc", "-s", "-j", "qdisc", "show"])
        for q in json.loads(proc.stdout or "[]"):
            if q.get("kind") == "tbf":
                out[f"{ns}/{q['dev']}"] = {k: int(q.get(k, 0)) for k in ("packets", "bytes", "drops", "overlimits")}
    return out


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
        teardown(self.spec.run_id)

    def run(self, rank: int, cmd: Sequence[str], **kw) -> subprocess.CompletedProcess[str]:
        """Run ``cmd`` inside ``rank``'s namespace and return the completed process."""
        return subprocess.run([*exec_args(self.spec, rank), *cmd], capture_output=True, text=True, **kw)


def bottleneck_bytes_per_s(spec: TestbedSpec) -> float:
    """The slowest link's rate (bytes per second): a rank's NIC or the uplink."""
    return link_rates(spec)[-1]


def link_rates(spec: TestbedSpec) -> list[float]:
    """Every distinct shaped rate of the testbed (bytes per second), fastest first."""
    rates = {spec.rank_rate(r) for r in range(spec.num_ranks)}
    if spec.two_level:
        rates.add(spec.uplink_rate)
    return sorted(rates, reverse=True)


def burst_s(spec: TestbedSpec) -> float:
    """The shapers' token-bucket burst in seconds of line rate on the slowest link
    (:func:`igrt.testbed.namespaces.burst_bytes`)."""
    rate = bottleneck_bytes_per_s(spec)
    return burst_bytes(rate, spec.mtu) / rate


def describe(spec: TestbedSpec) -> dict[str, Any]:
    """The testbed as a measurement file's ``testbed`` entry (igsim.studies.validation reads it)."""
    return {
        "num_ranks": spec.num_ranks,
        "rate_bytes_per_s": spec.rate_bytes_per_s,
        "two_level": spec.two_level,
        "uplink_rate_bytes_per_s": spec.uplink_rate if spec.two_level else None,
        "slow_rank": spec.slow_rank,
        "slow_rate_bytes_per_s": spec.slow_rate_bytes_per_s,
        "ring": spec.ring,
        "queue_s": spec.queue_s,
        "queue_min_bytes": spec.queue_min_bytes,
        "host_queue_bytes": spec.host_queue_bytes,
        "queues_s": {f"{rate:g}": spec.queue_s_at(rate) for rate in link_rates(spec)},  # by link rate, B/s
        "mtu": spec.mtu,
        "burst_s": burst_s(spec),
        "slow_start_after_idle": spec.slow_start_after_idle,
    }
