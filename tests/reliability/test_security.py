"""What an outsider, another run or a hostile file can reach (issue 17, security).

(a) A single-host launch's rendezvous store listens on 127.0.0.1 only (read from /proc/net/tcp{,6}
    while the group is up): spawned ranks, and a torchrun-style loopback job in this process.
(b) Testbed namespaces carry a per-run id: a run removes its own, never another run's; the
    rendezvous port on the testbed is random, not 29500 + pid % 1000.
(c) Our own checkpoint files load with ``torch.load(weights_only=True)``, and a pickled object in a
    sync-state file is refused without running it (DeepSpeed's own files go through its
    ``weights_only=False`` loader: trusted input only, docs/integrations.md).
(d) DeepSpeed's legacy ``"zero_optimization": true`` (ZeRO stage 1) and a top-level
    ``sparse_gradients`` are refused by ``prepare_config``, naming the key.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

from igrt.testbed import namespaces as testbed
from igrt.testbed import netmeasure

LINUX_PROC = Path("/proc/net/tcp").exists()


def _listening(port: int) -> list[str]:
    """Local addresses of the sockets listening on ``port`` (hex as in /proc/net/tcp{,6})."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not Path(table).exists():
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, hex_port = fields[1].rsplit(":", 1)
            if int(hex_port, 16) == port and fields[3] == "0A":  # TCP_LISTEN
                found.append(address)
    return found


def _store_addresses(ctx) -> list[str]:
    import torch.distributed as dist

    dist.barrier()  # every rank is connected; rank 0's server is up
    addresses = _listening(int(os.environ["MASTER_PORT"])) if ctx.rank == 0 else []
    dist.barrier()
    return addresses


LOOPBACK_HEX = {"0100007F", "0000000000000000FFFF00000100007F"}  # 127.0.0.1 (IPv4, IPv4-mapped)


@pytest.mark.skipif(not LINUX_PROC, reason="reads /proc/net/tcp")
def test_spawned_ranks_rendezvous_on_loopback_only() -> None:
    from igrt.train.launch import launch

    got = launch(_store_addresses, nproc=2, backend="gloo", timeout_s=60)
    assert got[0], "no listening socket found on MASTER_PORT"
    assert set(got[0]) <= LOOPBACK_HEX, f"the store listens on {got[0]} (0.0.0.0 / :: are every interface)"


@pytest.mark.skipif(not LINUX_PROC, reason="reads /proc/net/tcp")
def test_a_torchrun_style_loopback_job_rendezvous_on_loopback_only(monkeypatch) -> None:
    from igrt.train.launch import launch
    from tests.igrt.dist_util import free_port

    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": str(free_port())}.items():  # fmt: skip
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    got = launch(_store_addresses, nproc=1, backend="gloo", timeout_s=60)
    assert got[0] and set(got[0]) <= LOOPBACK_HEX, got


# ----------------------------------------------------------------------------- (b) testbed names
def test_testbed_names_carry_a_run_id_of_their_own() -> None:
    a = testbed.TestbedSpec(num_ranks=2, rate_bytes_per_s=1e6)
    b = testbed.TestbedSpec(num_ranks=2, rate_bytes_per_s=1e6)
    assert a.run_id != b.run_id
    for spec in (a, b):
        assert all(spec.run_id in ns for ns in spec.namespaces())
        assert spec.switch_ns == f"igtb-{spec.run_id}-sw" and spec.rank_ns(1) == f"igtb-{spec.run_id}-r1"
    assert not set(a.namespaces()) & set(b.namespaces())
    with pytest.raises(ValueError, match="run id"):
        testbed.TestbedSpec(num_ranks=2, rate_bytes_per_s=1e6, run_id="")
    with pytest.raises(ValueError, match="run id"):
        testbed.leftovers("*")


def test_the_testbed_rendezvous_port_is_not_predictable(monkeypatch) -> None:
    """run_ranks on a testbed spec: a random port per call (the old one was 29500 + pid % 1000)."""
    ports = []

    class _Done:
        returncode = 0

        def __init__(self, cmd, env, **kwargs) -> None:
            ports.append(int(env["MASTER_PORT"]))

        def wait(self, timeout=None) -> int:
            return 0

        def poll(self) -> int:
            return 0

    monkeypatch.setattr(netmeasure.subprocess, "Popen", _Done)
    spec = testbed.TestbedSpec(num_ranks=2, rate_bytes_per_s=1e6)
    for _ in range(8):
        netmeasure.run_ranks(["igrt.testbed.netbench"], spec=spec)
    per_call = ports[::2]
    assert len(set(per_call)) >= 6 and 29500 + os.getpid() % 1000 not in per_call
    assert ports[0::2] == ports[1::2]  # both ranks of a call agree




@pytest.mark.skipif(testbed.support_problem() is not None, reason=f"no testbed here: {testbed.support_problem()}")
def test_a_run_removes_its_own_namespaces_and_no_other_runs() -> None:
    other = testbed.new_run_id()
    others = [f"igtb-{other}-sw", f"igtb-{other}-r0"]  # another run's testbed, up while ours runs
    for ns in others:
        subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        spec = testbed.TestbedSpec(num_ranks=2, rate_bytes_per_s=1e6)
        with testbed.Testbed(spec):
            assert set(testbed.leftovers(spec.run_id)) == set(spec.namespaces())
            assert set(others) <= set(testbed.leftovers())  # set-up removed nothing of the other run
        assert testbed.leftovers(spec.run_id) == []
        assert set(others) <= set(testbed.leftovers())  # nor did tear-down
        assert testbed.teardown(other) == sorted(others)
    finally:
        for ns in others:
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)


# ----------------------------------------------------------------------------- (c) weights_only
class _Payload:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (Path(self.path).write_text, ("code ran",))


def test_a_sync_state_file_with_a_pickled_object_is_refused_without_running_it(tmp_path) -> None:
    from igpolicy.config import PolicyConfig
    from igrt.sync.checkpoint import load_sync_state, save_sync_state, sync_state_path
    from igrt.sync.synchronizer import Synchronizer
    from tests.igrt.tiny_model import TinyLM

    sync = Synchronizer(TinyLM(), config=PolicyConfig(policy="topk", density=0.1), plan=None)
    path = save_sync_state(sync, tmp_path, rank=0)
    assert isinstance(torch.load(path, weights_only=True), dict)  # our own state: tensors and containers
    marker = tmp_path / "pwned"
    torch.save({"residuals": _Payload(str(marker))}, sync_state_path(tmp_path, rank=0))
    with pytest.raises(ValueError, match="cannot read sync state"):
        load_sync_state(sync, tmp_path, rank=0)
    assert not marker.exists()


def test_the_integrations_doc_says_deepspeed_checkpoints_are_trusted_input() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "integrations.md").read_text()
    assert "weights_only=False" in text and "trusted" in text


# ----------------------------------------------------------------------------- (d) DeepSpeed keys
def _ds(**extra):
    return {"train_micro_batch_size_per_gpu": 2, "importance_gradient": {"policy": "topk"}, **extra}


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"zero_optimization": True}, "zero_optimization=true"),
        ({"zero_optimization": "1"}, "zero_optimization='1'"),
        ({"sparse_gradients": True}, "sparse_gradients=True"),
    ],
)
def test_prepare_config_refuses_legacy_zero_and_sparse_gradients(extra, needle) -> None:
    from igrt.integrations.deepspeed import prepare_config

    with pytest.raises(ValueError) as info:
        prepare_config(_ds(**extra))
    assert needle in str(info.value)
    prepare_config(_ds(zero_optimization={"stage": 0}, sparse_gradients=False))  # the explicit forms pass


def test_the_experiments_testbed_port_is_not_predictable(monkeypatch) -> None:
    """experiments/common.py's testbed launcher draws its rendezvous port like run_ranks (it was
    29700 + pid % 200): a different port per launch, the same for every rank of one."""
    import experiments.common as common

    ports = []

    class _Done:
        returncode = 0

        def __init__(self, cmd, env, **kwargs) -> None:
            ports.append(int(env["MASTER_PORT"]))

        def poll(self) -> int:
            return 0

    monkeypatch.setattr(common.subprocess, "Popen", _Done)
    monkeypatch.setattr(testbed, "exec_args", lambda spec, r: ["true"])
    spec = testbed.TestbedSpec(num_ranks=2, rate_bytes_per_s=1e6)
    monkeypatch.setattr(testbed, "leftovers", lambda *a, **k: [spec.rank_ns(r) for r in range(2)])
    for _ in range(8):
        common._launch_on_testbed([], spec, timeout_s=60.0)
    per_call = ports[::2]
    assert len(set(per_call)) >= 6 and 29700 + os.getpid() % 200 not in per_call
    assert ports[0::2] == ports[1::2]


def test_no_fixed_rendezvous_port_in_experiments_or_the_testbed() -> None:
    """No ``port = <number>`` (or ``<number> + ...``) in experiments/ or igrt/testbed/."""
    import ast

    root = Path(__file__).resolve().parents[2]
    fixed = []
    for path in [*(root / "experiments").glob("*.py"), *(root / "igrt" / "testbed").glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign) and not isinstance(node.value, ast.Tuple) and any(
                "port" in ast.unparse(t).lower() for t in node.targets
            ):  # (a range to draw from is a tuple)
                numbers = [n.value for n in ast.walk(node.value) if isinstance(n, ast.Constant)]
                if any(isinstance(v, int) and 1024 <= v < 65536 for v in numbers):
                    fixed.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
    assert not fixed, fixed
