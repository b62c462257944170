# Generated from notebooks/00_the_model.ipynb by `python -m rosellm_edu.export`.
# Edit the notebook, not this file.

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q: (n, heads, d) for the last n of m positions; k, v: (m, kv_heads, d). Returns (n, heads, d)."""
    n, m = q.shape[0], k.shape[0]
    q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)   # (heads, tokens, d)
    gqa = q.shape[0] != k.shape[0]
    if n == m:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    else:  # the n queries sit at positions m-n .. m-1, so each sees a longer prefix of the keys
        visible = torch.arange(m, device=q.device) <= torch.arange(m - n, m, device=q.device)[:, None]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=visible, enable_gqa=gqa)
    return out.transpose(0, 1)


class AttentionContext(Protocol):
    """What the model needs from a KV cache or a batch: attention for one layer's new q, k, v."""

    def attend(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor: ...


class Attention(nn.Module):
    def __init__(self, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx

    def forward(self, q, k, v, ctx: AttentionContext | None = None) -> torch.Tensor:
        if ctx is None:  # one sequence, no cache
            return causal_attention(q, k, v)
        return ctx.attend(self.layer_idx, q, k, v)
