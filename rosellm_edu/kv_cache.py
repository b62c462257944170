# Generated from notebooks/02_kv_cache.ipynb by `python -m rosellm_edu.export`.
# Edit the notebook, not this file.

import torch

from rosellm_edu.layers.attention import causal_attention


def kv_cache_shape(config) -> tuple[int, int, int]:
    """(layers, kv_heads, head_dim) for a Llama-family or GPT-2 config."""
    if config.model_type == "gpt2":
        return config.n_layer, config.n_head, config.n_embd // config.n_head
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return config.num_hidden_layers, config.num_key_value_heads, head_dim


class ContiguousKVCache:
    def __init__(self, config, max_len: int, dtype: torch.dtype = torch.float32, device="cpu"):
        layers, kv_heads, head_dim = kv_cache_shape(config)
        self.k = torch.zeros(layers, max_len, kv_heads, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.length = 0

    @property
    def max_len(self) -> int:
        return self.k.shape[1]

    def extend(self, model, token_ids: torch.Tensor) -> torch.Tensor:
        """Run `model` on new tokens (n,) that follow the cached ones; returns their hidden states."""
        n = token_ids.shape[0]
        if self.length + n > self.max_len:
            raise ValueError(f"the cache holds {self.max_len} positions; cannot add {n} to {self.length}")
        positions = torch.arange(self.length, self.length + n, device=token_ids.device)
        hidden = model(token_ids, positions, ctx=self)
        self.length += n
        return hidden

    def attend(self, layer_idx: int, q, k, v):
        start, end = self.length, self.length + q.shape[0]
        self.k[layer_idx, start:end] = k
        self.v[layer_idx, start:end] = v
        return causal_attention(q, self.k[layer_idx, :end], self.v[layer_idx, :end])
