"""models/packed.py: oneDNN-blocked linear weights give `F.linear`'s results, and what cannot be blocked is left as it is."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from posttrain.models import packed

BF16 = torch.backends.mkldnn.is_available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(5, 48), (3, 1, 48), (64, 48)])
@pytest.mark.parametrize("biased", [False, True])
def test_blocked_linear_equals_f_linear(dtype, shape, biased):
    """bf16: the same oneDNN kernel as `F.linear`'s, bit for bit; float32: oneDNN against the BLAS, summation order only."""
    torch.manual_seed(0)
    weight, x = torch.randn(40, 48, dtype=dtype), torch.randn(*shape, dtype=dtype)
    bias = torch.randn(40, dtype=dtype) if biased else None
    blocked = packed.pack(weight, 64)
    expected_blocked = packed.packable(weight)
    assert blocked.is_mkldnn == expected_blocked and expected_blocked == (dtype == torch.float32 or BF16)
    got, want = packed.linear(x, blocked, bias), F.linear(x, weight, bias)
    assert got.shape == want.shape and got.dtype == want.dtype
    if dtype == torch.bfloat16:
        assert torch.equal(got, want)
    else:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.filterwarnings("ignore:TF32 acceleration")  # torch.backends.mkldnn.flags on a CPU-only build
def test_what_cannot_be_blocked_is_returned_as_it_is():
    half = torch.randn(8, 4, dtype=torch.float16)
    trained = torch.nn.Parameter(torch.randn(8, 4))
    vector = torch.randn(8)
    assert packed.pack(None, 4) is None
    for weight in (half, trained, vector):
        assert packed.pack(weight, 4) is weight
    with torch.no_grad():
        assert packed.pack(trained, 4).is_mkldnn  # outside autograd a parameter is blocked
    with torch.backends.mkldnn.flags(enabled=False):
        plain = torch.randn(8, 4)
        assert packed.pack(plain, 4) is plain
    x = torch.randn(2, 4)
    assert torch.equal(packed.linear(x, trained.detach()), F.linear(x, trained.detach()))
