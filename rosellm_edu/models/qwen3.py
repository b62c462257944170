# Generated from notebooks/00a_other_families.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

from transformers import PretrainedConfig

from rosellm_edu.layers.norm import RMSNorm
from rosellm_edu.models.llama import LlamaAttention, LlamaForCausalLM
from rosellm_edu.models.mistral import within_sliding_window


# notebooks/00a_other_families.ipynb, cell 11
class Qwen3Attention(LlamaAttention):
    def __init__(self, config: PretrainedConfig, layer_idx: int):
        super().__init__(config, layer_idx)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)       # one norm per head, for q ...
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)       # ... and for k

    def forward(self, x, positions, rotary, ctx, ops=None):
        """ops: chapter 10's pointwise ops (None: chapter 00's modules)."""
        n = x.shape[0]                                                     # x: (tokens, hidden)
        qkv = self.qkv_proj(x) if ops is None else ops.linear(x, self.qkv_proj)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = self.q_norm(q.reshape(n, self.num_heads, self.head_dim))      # before the rotation
        k = self.k_norm(k.reshape(n, self.num_kv_heads, self.head_dim))
        v = v.view(n, self.num_kv_heads, self.head_dim)
        q, k = rotary(positions, q, k) if ops is None else ops.rotary(positions, q, k, rotary.cos, rotary.sin)
        out = self.attn(q, k, v, ctx).reshape(n, self.q_size)              # (tokens, heads * head_dim)
        return self.o_proj(out) if ops is None else ops.linear(out, self.o_proj)


# notebooks/00a_other_families.ipynb, cell 11
class Qwen3ForCausalLM(LlamaForCausalLM):
    def __init__(self, config: PretrainedConfig):
        super().__init__(within_sliding_window(config))
        for i, layer in enumerate(self.model.layers):                      # Qwen3's attention in each layer
            layer.self_attn = Qwen3Attention(self.config, i)
