"""Linear-layer weights blocked once for oneDNN on the CPU, for the gradient-free decode loop.

`F.linear` on the CPU hands the weight to the BLAS in its row-major layout, and the GEMM re-blocks it into its own
panel layout on every call (in bf16, the K-pairs of the AVX512-BF16 dot product too). oneDNN can take the weight
blocked once, ahead of time (`torch.ops.mkldnn._reorder_linear_weight`, the op inductor's CPU weight freezing uses),
and then reads it as it is. A decode step reads every weight of the model once for 64-odd rows, so the per-call
re-blocking is a large share of its matmul time: at SmolLM2-135M's shape (30 layers, 64 rows, 2 threads of an
AVX512-BF16 EPYC) one step's layer matmuls took 49.7 ms plain against 39.7 ms blocked in bf16, and 114 against 76 ms
in float32; the 49,152 x 576 head 12.0 against 10.1 ms (bf16) and 34.8 against 18.7 ms (float32).

bf16 results equal `F.linear`'s bit for bit; float32 ones differ by summation order (oneDNN against MKL's sgemm,
about 1e-6 relative). A blocked weight is an opaque `torch._mkldnn` tensor: no autograd, no views, no pickling; it
lives as long as the decoder that made it (one rollout). Where oneDNN cannot run the weight's dtype (float16 without
AVX512-FP16, bf16 without AVX512-BF16 or AMX), on other devices, or with `torch.backends.mkldnn` disabled, `pack`
returns the weight as it is and `linear` is `F.linear`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

_DTYPES = (torch.float32, torch.bfloat16)


def packable(weight: Tensor) -> bool:
    """Whether `weight` [out, in] can be blocked for oneDNN here: a plain CPU float32 or bf16 matrix (not a tensor
    subclass such as a sharded DTensor), outside autograd, oneDNN enabled."""
    if type(weight.detach()) is not Tensor or weight.device.type != "cpu" or weight.dtype not in _DTYPES or weight.dim() != 2:
        return False
    if weight.requires_grad and torch.is_grad_enabled():
        return False
    if not (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        return False
    return weight.dtype != torch.bfloat16 or bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def pack(weight: Tensor | None, rows: int) -> Tensor | None:
    """`weight` blocked for oneDNN matmuls of about `rows` input rows (a layout hint; any row count works), or the
    weight itself where it cannot be (see `packable`)."""
    if weight is None or not packable(weight):
        return weight
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), rows)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """`F.linear(x, weight, bias)` for a plain or a `pack`ed weight."""
    if weight.is_mkldnn:
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)
