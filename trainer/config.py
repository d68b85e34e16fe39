"""The model's typed configuration (a section of params.yaml once the train stage lands)."""
from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, model_validator

from tasks.core.config import Strict


class ModelParams(Strict):
    """A GPT decoder as MT-NLG and GPT-3: pre-LayerNorm, learned positions, GeLU (tanh), tied embeddings."""

    n_layer: int = Field(24, ge=1, description="Transformer blocks.")
    n_head: int = Field(16, ge=1, description="Attention heads.")
    d_model: int = Field(1024, ge=1, description="Hidden size.")
    vocab_size: int = Field(50304, ge=2, description="Vocabulary (padded to a multiple of 128, as Megatron).")
    seq_len: int = Field(2048, ge=1, description="Context length (learned position embeddings).")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on embeddings, attention output and MLP output.")
    init_std: float | None = Field(None, gt=0.0, description="Weight init std; None: sqrt(1/(3*d_model)) as MT-NLG.")
    layernorm_eps: float = Field(1e-5, gt=0.0)
    attention: Literal["sdpa", "softmax"] = Field(
        "sdpa", description="sdpa: scaled_dot_product_attention (flash on GPU); softmax: explicit scores "
                            "through the scaled causal softmax (fused kernel when enabled).")
    fused_kernels: bool = Field(True, description="Use kernels/ CuPy kernels when a GPU and CuPy are present.")

    @model_validator(mode="after")
    def _heads_divide(self):
        if self.d_model % self.n_head:
            raise ValueError(f"n_head {self.n_head} does not divide d_model {self.d_model}")
        return self

    @property
    def std(self) -> float:
        return self.init_std if self.init_std is not None else math.sqrt(1.0 / (3 * self.d_model))
