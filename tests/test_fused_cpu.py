"""The fused CPU kernels of a decode step compute what the torch operators they replace compute."""
import numpy as np
import pytest
import torch

from minibatch.engine.kernels import fused_cpu, torch_ref
from minibatch.engine.kernels.bfloat16 import host_view
from minibatch.engine.ops.reference import ReferenceOps

rms_norm = ReferenceOps(None).rms_norm   # the reference path's norm

H, HKV, D = 6, 2, 16


@pytest.mark.parametrize("width", [96, 100, 13])       # sixteen at a time, then the rest one by one
def test_rms_norm_matches_torch(width):
    gen = torch.Generator().manual_seed(0)
    for rows in (1, 3, 40):
        x, weight = torch.randn(rows, width, generator=gen) * 3, torch.randn(width, generator=gen)
        torch.testing.assert_close(fused_cpu.rms_norm(x, weight, 1e-5), rms_norm(x, weight, 1e-5), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("width", [96, 100, 13])
def test_rms_norm_in_bfloat16_rounds_where_transformers_rounds(width):
    """In bfloat16 the scaled row is rounded before the weight multiplies it, then the product: the torch
    path's two roundings. Only the sum of squares' order differs, which moves a value one bfloat16 step at most."""
    gen = torch.Generator().manual_seed(2)
    x = (torch.randn(40, width, generator=gen) * 3).bfloat16()
    weight = (1 + 0.2 * torch.randn(width, generator=gen)).bfloat16()
    fused, reference = fused_cpu.rms_norm(x, weight, 1e-5), rms_norm(x, weight, 1e-5)
    assert fused.dtype == torch.bfloat16
    assert (fused != reference).float().mean() < 0.01
    torch.testing.assert_close(fused.float(), reference.float(), rtol=2 ** -7, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [D, 20, 64])   # halves of 8, 10 (eight columns, then two one by one), 32
def test_rotary_write_kv_equals_the_torch_path(dtype, head_dim):
    D = head_dim
    gen = torch.Generator().manual_seed(1)
    rows, positions = 5, torch.tensor([0, 7, 3, 30, 12])
    qkv = torch.randn(rows, (H + 2 * HKV) * D, generator=gen).to(dtype)       # (T, (H + 2 Hkv) D)
    cos, sin = (torch.randn(32, D, generator=gen).to(dtype) for _ in range(2))  # (P, D)
    slots = torch.tensor([9, 2, 17, 30, 5])
    caches = [torch.zeros(4, 8, HKV, D, dtype=dtype) for _ in range(4)]       # (N, bs, Hkv, D)
    q = fused_cpu.rotary_write_kv(qkv, positions, cos, sin, caches[0], caches[1], slots, H)
    qk, v = qkv.split([(H + HKV) * D, HKV * D], dim=-1)
    qk = qk.reshape(rows, H + HKV, D)
    qk = qk * cos[positions][:, None] + qk.roll(D // 2, dims=-1) * sin[positions][:, None]
    torch_ref.write_kv(qk[:, H:], v.reshape(rows, HKV, D), caches[2], caches[3], slots)
    assert torch.equal(q, qk[:, :H])
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])


def test_rotary_write_kv_refuses_a_slot_outside_the_cache():
    cache = torch.zeros(2, 4, HKV, D)
    qkv, positions = torch.zeros(1, (H + 2 * HKV) * D), torch.tensor([0])
    with pytest.raises(IndexError, match="outside the KV cache"):
        fused_cpu.rotary_write_kv(qkv, positions, torch.ones(4, D), torch.ones(4, D), cache, cache.clone(),
                                  torch.tensor([8]), H)


def test_kept_views_follow_their_tensor_and_are_forgotten_with_it():
    cache = torch.zeros(3, 4)
    view = fused_cpu._kept_view(cache)
    assert fused_cpu._kept_view(cache) is view
    cache[1, 2] = 5.0
    assert view[1, 2] == 5.0 and view.shape == (3, 4)
    key = id(cache)
    del cache
    assert key not in fused_cpu._views


@pytest.mark.parametrize("inter", [40, 43, 3 * fused_cpu.SILU_CHUNK + 5])    # vectors, a tail, several chunks
def test_silu_times_up_matches_torch(inter):
    gate_up = torch.randn(3, 2 * inter, generator=torch.Generator().manual_seed(0)) * 4     # (T, 2 I)
    gate_up[0, :4] = torch.tensor([-100.0, 100.0, 0.0, -30.0])                            # exp's far ends
    out = np.empty((3, inter), np.float32)
    fused_cpu._silu_mul(gate_up.numpy(), out)
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(torch.from_numpy(out), torch.nn.functional.silu(gate) * up, rtol=1e-6, atol=1e-6)
    halves = torch.empty(3, inter, dtype=torch.bfloat16)                # in bfloat16: SiLU rounded, then times up
    fused_cpu._silu_mul(host_view(gate_up.bfloat16()), host_view(halves))
    gate, up = gate_up.bfloat16().chunk(2, dim=-1)
    expected = torch.nn.functional.silu(gate) * up
    assert (halves != expected).float().mean() < 0.01
    torch.testing.assert_close(halves.float(), expected.float(), rtol=2 ** -7, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul_of_a_gate_up_product_is_torchs_swiglu(dtype):
    gate_up = (torch.randn(5, 2 * 1536, generator=torch.Generator().manual_seed(1)) * 3).to(dtype)  # (T, 2 I)
    gate, up = gate_up.chunk(2, dim=-1)
    out = fused_cpu.silu_mul(gate_up)
    assert out.shape == (5, 1536) and out.dtype == dtype
    torch.testing.assert_close(out.float(), (torch.nn.functional.silu(gate) * up).float(),
                               rtol=1e-6 if dtype == torch.float32 else 2 ** -7, atol=1e-6)

