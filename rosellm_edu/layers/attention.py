# Generated from notebooks/00_the_model.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn


# notebooks/00_the_model.ipynb, cell 11
def grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor | None) -> torch.Tensor:
    """q: (batch, n, heads, d); k, v: (batch, m, kv_heads, d); visible: (batch, n, m) or None (all visible)."""
    b, n, heads, d = q.shape
    m, kv_heads = k.shape[1], k.shape[2]
    group = heads // kv_heads
    # Fold each K/V head's group of query heads into its rows: (batch, kv_heads, group * n, d).
    q = q.view(b, n, kv_heads, group, d).permute(0, 2, 3, 1, 4).reshape(b, kv_heads, group * n, d)
    if visible is not None:
        visible = visible.repeat(1, group, 1).unsqueeze(1)                     # (batch, 1, group * n, m)
    out = F.scaled_dot_product_attention(q, k.transpose(1, 2), v.transpose(1, 2), attn_mask=visible)
    return out.view(b, kv_heads, group, n, d).permute(0, 3, 1, 2, 4).reshape(b, n, heads, d)


# notebooks/00_the_model.ipynb, cell 11
def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q: (n, heads, d) for the last n of m positions; k, v: (m, kv_heads, d). Returns (n, heads, d)."""
    n, m = q.shape[0], k.shape[0]
    visible = None
    if n > 1:  # query i sits at position m - n + i and sees keys 0 .. m - n + i
        visible = torch.arange(m, device=q.device) <= torch.arange(m - n, m, device=q.device)[:, None]
        visible = visible[None]
    return grouped_attention(q[None], k[None], v[None], visible)[0]


# notebooks/00_the_model.ipynb, cell 11
class AttentionContext(Protocol):
    """What the model needs from a KV cache or a batch: attention for one layer's new q, k, v."""

    def attend(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor: ...


# notebooks/00_the_model.ipynb, cell 12
class Attention(nn.Module):
    def __init__(self, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx

    def forward(self, q, k, v, ctx: AttentionContext | None = None) -> torch.Tensor:
        if ctx is None:  # one sequence, no cache
            return causal_attention(q, k, v)
        return ctx.attend(self.layer_idx, q, k, v)
