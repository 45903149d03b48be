"""No silent acceptance: every loader rejects unknown keys by name, and removed keys with their successor.

The loaders: the policy config (``PolicyConfig.from_dict``, the integrations' section,
``igrt train --config``), the SyncPlan (top level and components), the trace manifest, topology files
(builder and explicit-graph forms, links, overrides) and calibration files. Property: for any key
outside a loader's vocabulary — drawn by hypothesis — the error is a ValueError (TraceError for the
manifest) whose message contains the key's ``repr``; a removed key's message also carries the text of
what replaced it; several bad keys are all named in one message.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from igpolicy.config import REMOVED_POLICY_KEYS, PolicyConfig
from igpolicy.plan import ComponentPlan, SyncPlan
from igpolicy.vocab import ComponentClass, ParamInfo
from igrt.integrations import sync_options
from igsim.net.calibration import Calibration
from igsim.net.topology_files import load_topology
from traces.schema import Manifest, TraceError

POLICY_KEYS = frozenset(f.name for f in dataclasses.fields(PolicyConfig))
key_names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=20)


def _unknown(allowed: frozenset[str] | set[str]):
    return key_names.filter(lambda k: k not in allowed and k not in REMOVED_POLICY_KEYS)


def _plan_json() -> dict:
    plan = SyncPlan(
        release_period=2,
        components=(
            ComponentPlan(key="0.attn_q", score=2.0, cls=ComponentClass.IMPORTANT),
            ComponentPlan(key="0.mlp_up", score=1.0, cls=ComponentClass.LOW, phase=1, expected_bytes=8),
        ),
    )
    return plan.to_json()


def _manifest_json() -> dict:
    params = (ParamInfo(name="w", shape=(2, 3), dtype="float32", component="0.attn_q", order=0),)
    return Manifest(workload="tiny", params=params).to_json()


# ----------------------------------------------------------------------------- policy config
@settings(max_examples=60, deadline=None)
@given(key=_unknown(POLICY_KEYS), value=st.one_of(st.none(), st.integers(), st.text(max_size=5)))
def test_policy_config_names_an_unknown_key(key, value) -> None:
    with pytest.raises(ValueError) as info:
        PolicyConfig.from_dict({"policy": "topk", key: value}, where="run.json")
    assert str(info.value).startswith("run.json: ")
    assert f"unknown key {key!r}" in str(info.value)


@pytest.mark.parametrize("key", sorted(REMOVED_POLICY_KEYS))
def test_a_removed_policy_key_says_what_replaced_it(key) -> None:
    for load in (
        lambda d: PolicyConfig.from_dict(d, where="policy config"),
        lambda d: sync_options(d, where="importance_gradient"),
    ):
        with pytest.raises(ValueError) as info:
            load({"policy": "topk", key: 1})
        message = str(info.value)
        assert f"key {key!r} was removed: {REMOVED_POLICY_KEYS[key]}" in message, message


def test_every_bad_key_is_named_at_once() -> None:
    with pytest.raises(ValueError) as info:
        PolicyConfig.from_dict({"policy": "topk", "sparse_gradients": True, "interval": 4, "bogus": 1})
    message = str(info.value)
    for needle in (
        "'sparse_gradients' was removed",
        "'interval' was removed: use 'release_period'",
        "'bogus'",
    ):
        assert needle in message, message


def test_the_removed_sparse_gradients_flag_explains_the_row_sum_bug() -> None:
    """The seed of the project: the flag that dropped rows like [1, -1] must not come back silently."""
    with pytest.raises(ValueError, match=r"'sparse_gradients' was removed: use 'sparsifier' and 'density'"):
        PolicyConfig.from_dict({"sparse_gradients": True})


def test_igrt_train_config_file_with_a_removed_key_exits_2_naming_it(tmp_path, capsys) -> None:
    from igrt.cli import main

    path = tmp_path / "policy.json"
    path.write_text(json.dumps({"policy": "topk", "bucket_size_mb": 25}))
    code = main(
        ["train", "--workload", "minilm", "--tiny", "--config", str(path), "--out", str(tmp_path / "r")]
    )
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert f"--config {path}" in err and "'bucket_size_mb' was removed: use 'bucket_cap_bytes'" in err, err


# ----------------------------------------------------------------------------- other loaders
@settings(max_examples=40, deadline=None)
@given(key=_unknown(frozenset({"schema_version", "release_period", "components", "settings", "source",
                               "fingerprint"})))  # fmt: skip
def test_syncplan_names_an_unknown_top_level_key(key) -> None:
    data = _plan_json()
    data[key] = 0
    with pytest.raises(ValueError, match="unknown key") as info:
        SyncPlan.from_json(data, where="plan.json")
    assert repr(key) in str(info.value) and str(info.value).startswith("plan.json: ")


@settings(max_examples=40, deadline=None)
@given(key=_unknown(frozenset({"key", "score", "class", "phase", "expected_bytes"})))
def test_syncplan_names_an_unknown_component_key(key) -> None:
    data = _plan_json()
    data["components"][1][key] = 0
    with pytest.raises(ValueError) as info:
        SyncPlan.from_json(data, where="plan.json")
    assert "plan.json: components[1]" in str(info.value) and f"unknown key {key!r}" in str(info.value)


@settings(max_examples=40, deadline=None)
@given(key=_unknown(frozenset(_manifest_json())))
def test_manifest_names_an_unknown_key(key) -> None:
    data = _manifest_json()
    data[key] = 1
    with pytest.raises(TraceError) as info:
        Manifest.from_json(data, where="trace/manifest.json")
    assert str(info.value).startswith("trace/manifest.json") and f"unknown key {key!r}" in str(info.value)


def test_manifest_param_entry_names_an_unknown_key() -> None:
    data = _manifest_json()
    data["params"][0]["grad"] = 1
    with pytest.raises(TraceError, match=r"params\[0\].*unknown key 'grad'"):
        Manifest.from_json(data, where="manifest.json")


TOPOLOGIES = {
    "builder": {"builder": "star", "num_ranks": 2, "bandwidth": "10Gbps", "latency": "1us"},
    "links": {
        "ranks": ["r0", "r1"],
        "switches": ["sw"],
        "links": [
            {"a": "r0", "b": "sw", "bandwidth": "10Gbps", "latency": "1us"},
            {"a": "r1", "b": "sw", "bandwidth": "10Gbps", "latency": "1us"},
        ],
    },
}


@pytest.mark.parametrize(
    ("form", "place"),
    [("builder", "top"), ("builder", "override"), ("links", "top"), ("links", "link"), ("links", "override")],
)
def test_topology_file_names_an_unknown_key(tmp_path, form, place) -> None:
    data = json.loads(json.dumps(TOPOLOGIES[form]))
    if place == "top":
        data["bandwith"] = "1Gbps"  # a typo must not be ignored
    elif place == "link":
        data["links"][0]["bandwith"] = "1Gbps"
    else:
        data["overrides"] = [{"a": "r0", "b": "sw", "bandwith": "1Gbps"}]
    path = tmp_path / "topo.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError) as info:
        load_topology(path)
    assert str(path) in str(info.value) and "unknown key 'bandwith'" in str(info.value), str(info.value)


@pytest.mark.parametrize("form", list(TOPOLOGIES))
def test_the_topology_fixtures_are_valid(tmp_path, form) -> None:
    path = tmp_path / "topo.yaml"
    path.write_text(json.dumps(TOPOLOGIES[form]))  # JSON is YAML
    assert load_topology(path).num_ranks == 2


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"gamma": 1e-9}, "unknown key 'gamma'"),
        ({"default": {"alpha": 1e-6}}, "default: unknown key 'alpha'"),
        (
            {"link_classes": {"nic": {"bandwidth_factor": 0.9}}},
            "link_classes.nic: unknown key 'bandwidth_factor'",
        ),
    ],
)
def test_calibration_names_an_unknown_key(data, needle) -> None:
    with pytest.raises(ValueError, match="calibration") as info:
        Calibration.from_dict(data)
    assert needle in str(info.value), str(info.value)
