"""ResidualState: u = g + e in fp32, e = u with S zeroed, conservation Σg == Σsent + e, checkpoints."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from igpolicy.decide import nominal_k
from igrt.sync.residuals import ResidualState, send_param
from igrt.sync.sparsifiers import make_sparsifier

torch.set_num_threads(1)


def test_update_rule_exact():
    r = ResidualState()
    g = torch.tensor([1.0, -3.0, 0.5, 2.0])
    u = r.accumulate("w", g)
    assert u.dtype == torch.float32 and torch.equal(u, g)
    r.after_send("w", u, torch.tensor([1, 3]))
    assert r.get("w").tolist() == [1.0, 0.0, 0.5, 0.0]
    u = r.accumulate("w", torch.tensor([1.0, 1.0, 1.0, 1.0]))
    assert u.tolist() == [2.0, 1.0, 1.5, 1.0]
    r.hold("w", u)
    assert r.get("w").tolist() == [2.0, 1.0, 1.5, 1.0]
    r.after_send("w", r.accumulate("w", None), None)  # a dense send empties it
    assert r.is_zero()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_residual_is_fp32_whatever_the_grad_dtype(dtype):
    r = ResidualState(track_sums=True)
    g = (torch.randn(6, 4) * 1e-3).to(dtype)
    for _ in range(50):
        u = r.accumulate("p", g)
        r.hold("p", u)
    e = r.get("p")
    assert e.dtype == torch.float32
    # 50 small bf16 gradients accumulate without being swallowed (a bf16 residual would stall)
    torch.testing.assert_close(e, 50 * g.float(), rtol=1e-5, atol=1e-7)
    assert max(r.conservation_gap().values()) < 1e-6


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    steps=st.integers(1, 12),
    density=st.floats(0.01, 1.0),
    period=st.integers(1, 4),
    name=st.sampled_from(["topk", "adtopk", "randomk", "threshold"]),
    wire_bf16=st.booleans(),
    grad_dtype=st.sampled_from([torch.float32, torch.bfloat16]),
)
def test_conservation_on_random_schedules(seed, steps, density, period, name, wire_bf16, grad_dtype):
    """Σ_τ g_τ == Σ_τ sent_τ + e_t on every step, with an independent fp64 oracle of what was sent."""
    gen = torch.Generator().manual_seed(seed)
    shapes = {"a": (9, 7), "b": (13,), "emb": (30, 4)}
    r = ResidualState(track_sums=True)
    sp = make_sparsifier(name, seed=seed, threshold=0.5)
    value_dtype = torch.bfloat16 if wire_bf16 else torch.float32
    oracle_g = {n: torch.zeros(s, dtype=torch.float64) for n, s in shapes.items()}
    oracle_sent = {n: torch.zeros(s, dtype=torch.float64) for n, s in shapes.items()}
    for t in range(steps):
        for n, shape in shapes.items():
            g = torch.randn(shape, generator=gen)
            if n == "emb":  # row-sparse: a few rows touched per step
                g[torch.rand(shape[0], generator=gen) < 0.8] = 0.0
            g = g.to(grad_dtype)
            oracle_g[n] += g.double()
            if (t + len(n)) % period == 0:
                k = nominal_k(g.numel(), density)
                idx, vals = send_param(r, sp, name=n, grad=g, like=g, k=k, step=t, value_dtype=value_dtype)
                assert idx is not None
                oracle_sent[n].view(-1).index_add_(0, idx, vals.double())
            else:
                r.hold(n, r.accumulate(n, g))
            e = r.get(n).double()
            scale = float(oracle_g[n].abs().max()) + 1.0
            gap = (oracle_g[n] - oracle_sent[n] - e).abs().max()
            assert float(gap) <= 1e-6 * scale * (t + 1), (n, t, float(gap))
            sg, ss = r.sums(n)
            torch.testing.assert_close(sg, oracle_g[n], rtol=0, atol=0)
            torch.testing.assert_close(ss, oracle_sent[n], rtol=0, atol=0)
    assert max(r.conservation_gap().values()) <= 1e-6 * (steps + 1) * 20


def test_bf16_wire_rounding_stays_in_the_residual():
    r = ResidualState(track_sums=True)
    g = torch.tensor([1.0 + 2**-12, 3.0])  # 1 + 2^-12 is not a bf16 number
    u = r.accumulate("w", g)
    vals = u.to(torch.bfloat16)
    r.after_send("w", u, torch.tensor([0, 1]), sent_values=vals)
    assert r.get("w").tolist() == [2**-12, 0.0]
    assert max(r.conservation_gap().values()) == 0.0


def test_state_dict_roundtrip_and_norms():
    r = ResidualState(track_sums=True)
    for n, s in (("x", (3, 3)), ("y", (5,))):
        u = r.accumulate(n, torch.randn(s))
        r.after_send(n, u, torch.tensor([0, 2]))
    sd = r.state_dict()
    r2 = ResidualState(track_sums=True)
    r2.load_state_dict(sd)
    for n in r.names():
        assert torch.equal(r.get(n), r2.get(n))
        assert all(torch.equal(a, b) for a, b in zip(r.sums(n), r2.sums(n)))
    norms = r.norms()
    assert set(norms) == {"x", "y"}
    assert norms["y"] == pytest.approx(float(r.get("y").norm()))
    assert r.total_norm() == pytest.approx(float(torch.cat([r.get("x").flatten(), r.get("y")]).norm()))
    with pytest.raises(ValueError, match="float32"):
        ResidualState().load_state_dict({"residuals": {"x": torch.zeros(2, dtype=torch.bfloat16)}})
    with pytest.raises(ValueError, match="shape"):
        r.accumulate("x", torch.zeros(4))
    with pytest.raises(ValueError, match="track_sums"):
        ResidualState().conservation_gap()
