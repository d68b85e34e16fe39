"""Fused CUDA kernels as CuPy RawKernels, each beside its plain-torch reference.

Every public function takes `fused=`; the fused path runs when a GPU and CuPy are present and the
inputs suit it (contiguous, one float dtype, rows that fit in registers), the reference path otherwise."""
from kernels.bias_gelu import bias_gelu
from kernels.causal_softmax import scaled_causal_softmax
from kernels.cross_entropy import linear_cross_entropy
from kernels.layer_norm import layer_norm
from kernels.runtime import fused_available

__all__ = ["bias_gelu", "layer_norm", "scaled_causal_softmax", "linear_cross_entropy", "fused_available"]
