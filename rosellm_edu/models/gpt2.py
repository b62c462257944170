# Generated from notebooks/00_the_model.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig

from rosellm_edu.layers.attention import Attention, AttentionContext


# notebooks/00_the_model.ipynb, cell 24
TRANSPOSED = ("c_attn.weight", "c_proj.weight", "c_fc.weight")  # stored as Conv1D (in, out)


# notebooks/00_the_model.ipynb, cell 24
class GPT2Attention(nn.Module):
    def __init__(self, config: PretrainedConfig, layer_idx: int):
        super().__init__()
        self.num_heads = config.n_head
        self.head_dim = config.n_embd // config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        self.attn = Attention(layer_idx)

    def forward(self, x, ctx):
        n = x.shape[0]
        q, k, v = self.c_attn(x).view(n, 3, self.num_heads, self.head_dim).unbind(1)
        return self.c_proj(self.attn(q, k, v, ctx).reshape(n, -1))


# notebooks/00_the_model.ipynb, cell 24
class GPT2MLP(nn.Module):
    def __init__(self, config: PretrainedConfig):
        super().__init__()
        inner = config.n_inner or 4 * config.n_embd
        self.c_fc = nn.Linear(config.n_embd, inner)
        self.c_proj = nn.Linear(inner, config.n_embd)
        self.approximate = "none" if config.activation_function == "gelu" else "tanh"

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate=self.approximate))


# notebooks/00_the_model.ipynb, cell 25
class GPT2Block(nn.Module):
    def __init__(self, config: PretrainedConfig, layer_idx: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.attn = GPT2Attention(config, layer_idx)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.mlp = GPT2MLP(config)

    def forward(self, x, ctx):
        x = x + self.attn(self.ln_1(x), ctx)
        return x + self.mlp(self.ln_2(x))


# notebooks/00_the_model.ipynb, cell 26
class GPT2ForCausalLM(nn.Module):
    def __init__(self, config: PretrainedConfig):
        super().__init__()
        if config.scale_attn_by_inverse_layer_idx or config.reorder_and_upcast_attn:
            raise ValueError("GPT-2 variants with scale_attn_by_inverse_layer_idx or reorder_and_upcast_attn "
                             "are not supported")
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.n_positions, config.n_embd)
        self.h = nn.ModuleList(GPT2Block(config, i) for i in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: AttentionContext | None = None):
        x = self.wte(input_ids) + self.wpe(positions)                      # (tokens, hidden)
        for block in self.h:
            x = block(x, ctx)
        return self.ln_f(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden @ self.wte.weight.T                                  # tied LM head

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        params = dict(self.named_parameters())
        loaded = set()
        for name, tensor in weights:
            name = name.removeprefix("transformer.")
            if name.endswith((".attn.bias", ".attn.masked_bias")) or name == "lm_head.weight":
                continue  # causal-mask buffers and the tied head
            params[name].data.copy_(tensor.T if name.endswith(TRANSPOSED) else tensor)
            loaded.add(name)
        missing = set(params) - loaded
        if missing:
            raise ValueError(f"checkpoint has no weights for {sorted(missing)[:5]}")
