import pytest

from igpolicy.config import PolicyConfig, check_keys


def test_defaults_round_trip():
    cfg = PolicyConfig()
    assert PolicyConfig.from_dict(cfg.to_dict()) == cfg


def test_unknown_key_is_named():
    with pytest.raises(ValueError, match="unknown key 'densty'"):
        PolicyConfig.from_dict({"densty": 0.1})


def test_removed_key_says_what_replaced_it():
    with pytest.raises(ValueError, match="'sparse_gradients' was removed: use 'sparsifier'"):
        PolicyConfig.from_dict({"sparse_gradients": True})
    with pytest.raises(ValueError, match="use 'release_period'"):
        PolicyConfig.from_dict({"interval": 4})


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("policy", "magic"),
        ("density", 0.0),
        ("density", 1.5),
        ("release_period", 0),
        ("packing", "best"),
        ("num_buckets", 0),
        ("collective", "rdma"),
        ("index_bytes", 3),
        ("density_per_kind", {"attn_z": 0.1}),
        ("density_per_kind", {"attn_q": 2.0}),
    ],
)
def test_bad_values_are_named(key, value):
    with pytest.raises(ValueError, match=key):
        PolicyConfig(**{key: value})


def test_density_for_kind():
    cfg = PolicyConfig(density=0.01, density_per_kind={"embedding": 0.001})
    assert cfg.density_for("embedding") == 0.001
    assert cfg.density_for("attn_q") == 0.01
    assert PolicyConfig(policy="dense").density_for("attn_q") == 1.0


def test_check_keys_reports_missing_and_all_problems():
    with pytest.raises(ValueError) as e:
        check_keys({"a": 1, "zz": 2, "old": 3}, allowed={"a", "b"}, where="f.json", removed={"old": "use b"},
                   required={"b"})
    msg = str(e.value)
    assert msg.startswith("f.json:")
    assert "'zz'" in msg and "'old' was removed: use b" in msg and "missing required key 'b'" in msg
    with pytest.raises(ValueError, match="expected a mapping"):
        check_keys([1], allowed=set(), where="x")
