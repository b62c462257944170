# Generated from notebooks/00_the_model.ipynb, notebooks/00a_other_families.ipynb, notebooks/10_fewer_passes.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

from collections.abc import Iterable

import torch
from torch import nn
from transformers import PretrainedConfig

from rosellm_edu.kernels.cpu_fused import (BLOCKED, PointwiseOps, fusion_choices, kernels_usable, pack_weights,
                                           packed_linear, pointwise_ops)
from rosellm_edu.layers.attention import Attention, AttentionContext
from rosellm_edu.layers.norm import RMSNorm
from rosellm_edu.layers.rotary import RotaryEmbedding


# notebooks/00_the_model.ipynb, cell 19
class LlamaAttention(nn.Module):
    def __init__(self, config: PretrainedConfig, layer_idx: int):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        bias = getattr(config, "attention_bias", False)
        self.qkv_proj = nn.Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=bias)
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, bias=bias)
        self.attn = Attention(layer_idx)

    # notebooks/10_fewer_passes.ipynb, cell 61
    def forward(self, x, positions, rotary: RotaryEmbedding, ctx: AttentionContext | None, ops: PointwiseOps):
        n = x.shape[0]                                                     # x: (tokens, hidden)
        q, k, v = ops.linear(x, self.qkv_proj).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(n, self.num_heads, self.head_dim)
        k = k.view(n, self.num_kv_heads, self.head_dim)
        v = v.view(n, self.num_kv_heads, self.head_dim)
        q, k = ops.rotary(positions, q, k, rotary.cos, rotary.sin)         # in place, with the kernels
        out = self.attn(q, k, v, ctx)                                      # (tokens, heads, head_dim)
        return ops.linear(out.reshape(n, self.q_size), self.o_proj)        # ops.linear, every matmul


# notebooks/00_the_model.ipynb, cell 20
class LlamaMLP(nn.Module):
    def __init__(self, config: PretrainedConfig):
        super().__init__()
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    # notebooks/10_fewer_passes.ipynb, cell 61
    def forward(self, x, ops: PointwiseOps):
        return ops.linear(ops.silu_and_mul(ops.linear(x, self.gate_up_proj)), self.down_proj)   # one call for SiLU x up


# notebooks/00_the_model.ipynb, cell 20
class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: PretrainedConfig, layer_idx: int):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config, layer_idx)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = LlamaMLP(config)

    # notebooks/10_fewer_passes.ipynb, cell 61
    def forward(self, x, residual, positions, rotary, ctx, ops: PointwiseOps):
        """x: the previous layer's output, not yet added to residual (the embeddings, with residual None, for the
        first layer). Returns this layer's output and the residual, for the next layer to add."""
        x, residual = ops.add_rms_norm(x, residual, self.input_layernorm.weight, self.input_layernorm.eps)
        x = self.self_attn(x, positions, rotary, ctx, ops)
        x, residual = ops.add_rms_norm(x, residual, self.post_attention_layernorm.weight,
                                       self.post_attention_layernorm.eps)
        return self.mlp(x, ops), residual


# notebooks/10_fewer_passes.ipynb, cell 62
class LlamaModel(nn.Module):
    def __init__(self, config: PretrainedConfig):
        super().__init__()
        self.config = config     # the shapes fusion_choices measures at
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config, self.layers[0].self_attn.head_dim)
        self.fusion = "auto"     # how the steps between the matmuls run (see pointwise_ops)
        self.choices = None      # fusion="auto"'s measured choices, made at the first step

    def ops(self, device: torch.device, rows: int) -> PointwiseOps:
        if self.fusion == "auto" and self.choices is None and kernels_usable(device):
            self.choices = fusion_choices(self)
        return pointwise_ops(device, self.fusion, self.choices, rows)

    def forward(self, input_ids, positions, ctx=None):
        ops = self.ops(input_ids.device, input_ids.shape[0])
        x, residual = self.embed_tokens(input_ids), None                   # (tokens, hidden)
        for layer in self.layers:
            x, residual = layer(x, residual, positions, self.rotary, ctx, ops)
        return ops.add_rms_norm(x, residual, self.norm.weight, self.norm.eps)[0]


# notebooks/00_the_model.ipynb, cell 21
# checkpoint name -> (our packed parameter, which shard of it)
PACKED_SHARDS = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
                 "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}


# notebooks/00_the_model.ipynb, cell 21
class LlamaForCausalLM(nn.Module):
    def __init__(self, config: PretrainedConfig):
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: AttentionContext | None = None):
        """input_ids, positions: (tokens,) -> hidden states (tokens, hidden)."""
        return self.model(input_ids, positions, ctx)

    # notebooks/10_fewer_passes.ipynb, cell 62
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        linear = self.model.ops(hidden.device, hidden.shape[0]).linear
        if linear is packed_linear and isinstance(self.lm_head, nn.Linear) and self.lm_head not in BLOCKED:
            pack_weights([self.lm_head])                                    # as the layers' Linears, once
        return linear(hidden, self.lm_head)                                 # (rows, vocab)

    # notebooks/00_the_model.ipynb, cell 22
    def shard_offsets(self, packed: str) -> list[int]:
        attn = self.model.layers[0].self_attn
        sizes = [attn.q_size, attn.kv_size, attn.kv_size] if packed == "qkv_proj" else \
                [self.config.intermediate_size] * 2
        return [sum(sizes[:i]) for i in range(len(sizes) + 1)]

    # notebooks/00_the_model.ipynb, cell 22
    def expected_shards(self, params: dict) -> set[tuple[str, int | None]]:
        """Every (parameter, shard) the checkpoint must fill; shard None means the whole parameter."""
        packed = {p for p, _ in PACKED_SHARDS.values()}
        return {(name, shard) for name in params
                for shard in (range(len(self.shard_offsets(name.split(".")[-2])) - 1)
                              if name.split(".")[-2] in packed else [None])}

    # notebooks/00a_other_families.ipynb, cell 4
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        params = dict(self.named_parameters())
        loaded = set()
        for name, tensor in weights:
            if "rotary_emb" in name or (name == "lm_head.weight" and self.config.tie_word_embeddings):
                continue
            part, shard = name.split(".")[-2], None
            if part in PACKED_SHARDS:
                packed, shard = PACKED_SHARDS[part]
                name = name.replace(part, packed)
            if name not in params:
                raise ValueError(f"{type(self).__name__} has no parameter for {name!r}")
            target = params[name].data
            if shard is not None:
                lo, hi = self.shard_offsets(packed)[shard:shard + 2]
                target = target[lo:hi]
            if target.shape != tensor.shape:                                          # copy_ would broadcast
                raise ValueError(f"shape {tuple(tensor.shape)}, but the model's config makes it {tuple(target.shape)}")
            target.copy_(tensor)                                                      # into the model's dtype
            loaded.add((name, shard))
        missing = self.expected_shards(params) - loaded
        if missing:
            raise ValueError(f"checkpoint has no weights for {sorted(missing, key=str)[:5]}")
