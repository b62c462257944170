# Generated from notebooks/11_weight_only_quantization.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader
from torch import nn

from rosellm_edu.layers.quantization import Int4Linear, Int8GroupLinear, dequantize_q8_0, faster_head, tile_for_rows
from rosellm_edu.layers.rotary import RotaryEmbedding
from rosellm_edu.models.llama import LlamaForCausalLM


# notebooks/11_weight_only_quantization.ipynb, cell 85
Q4_1_BLOCK = 20   # bytes per 32 weights: float16 d, float16 m, 16 bytes of nibbles


# notebooks/11_weight_only_quantization.ipynb, cell 85
Q8_0_BLOCK = 34   # bytes per 32 weights: float16 d, 32 int8


# notebooks/11_weight_only_quantization.ipynb, cell 85
def q4_1_tensors(raw: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A Q4_1 tensor's bytes (N, K/32 * 20) -> qs (N, K/32, 16) uint8, d and m (N, K/32) float16: the same bytes,
    split into three arrays, no arithmetic."""
    blocks = torch.from_numpy(np.array(raw)).view(raw.shape[0], -1, Q4_1_BLOCK)      # (N, groups, 20)
    d = blocks[..., 0:2].contiguous().view(torch.float16).squeeze(-1)
    m = blocks[..., 2:4].contiguous().view(torch.float16).squeeze(-1)
    return blocks[..., 4:].contiguous(), d, m


# notebooks/11_weight_only_quantization.ipynb, cell 85
def q8_0_tensors(raw: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """A Q8_0 tensor's bytes (N, K/32 * 34) -> qs (N, K/32, 32) int8 and d (N, K/32) float16, split the same way."""
    blocks = torch.from_numpy(np.array(raw)).view(raw.shape[0], -1, Q8_0_BLOCK)      # (N, groups, 34)
    d = blocks[..., 0:2].contiguous().view(torch.float16).squeeze(-1)
    return blocks[..., 2:].contiguous().view(torch.int8), d


# notebooks/11_weight_only_quantization.ipynb, cell 87
def unpermute_rows(t: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's converter reorders the rows of q and k, per head, from (half, pair) to (pair, half), for its
    rotary; put them back in the checkpoint's order. t: (heads * head_dim, ...) with any trailing shape."""
    return t.reshape(heads, t.shape[0] // heads // 2, 2, *t.shape[1:]).transpose(1, 2).reshape(t.shape)


# notebooks/11_weight_only_quantization.ipynb, cell 88
# GGUF's tensor name in block i -> (our layer in model.model.layers[i], the shards it packs, in order)
GGUF_LINEARS = {"self_attn.qkv_proj": ["attn_q", "attn_k", "attn_v"], "self_attn.o_proj": ["attn_output"],
                "mlp.gate_up_proj": ["ffn_gate", "ffn_up"], "mlp.down_proj": ["ffn_down"]}


# notebooks/11_weight_only_quantization.ipynb, cell 88
GGUF_NORMS = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}


# notebooks/11_weight_only_quantization.ipynb, cell 88
def int4_linear(tensors: dict, names: list[str], config) -> Int4Linear:
    """One Int4Linear from Q4_1 shards stacked along the output rows (q, k, v into qkv_proj, as chapter 00)."""
    parts = []
    for name in names:
        t = tensors[name]
        if t.tensor_type != GGMLQuantizationType.Q4_1:
            raise ValueError(f"GGUF tensor {name} is {t.tensor_type.name}; only Q4_1 linears load as they ship")
        qs, d, m = q4_1_tensors(t.data)
        heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}.get(name.split(".")[-2])
        parts.append([unpermute_rows(x, heads) for x in (qs, d, m)] if heads else [qs, d, m])
    qs, d, m = (torch.cat(x).contiguous() for x in zip(*parts))
    return Int4Linear(qs.shape[1] * 32, qs.shape[0], qs, d, m)


# notebooks/11_weight_only_quantization.ipynb, cell 89
def dense(t, dtype: torch.dtype) -> torch.Tensor:
    """A GGUF tensor that stays in the model's dtype: the norms (F32) and the embedding (Q8_0 in this file)."""
    if t.tensor_type == GGMLQuantizationType.Q8_0:
        return dequantize_q8_0(*q8_0_tensors(t.data)).to(dtype)
    if t.tensor_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
        return torch.from_numpy(np.array(t.data)).to(dtype)
    raise ValueError(f"GGUF tensor {t.name} is {t.tensor_type.name}, which this loader does not read")


# notebooks/11_weight_only_quantization.ipynb, cell 89
def gguf_head(tensors: dict, embedding: nn.Parameter, dtype: torch.dtype) -> nn.Module:
    """The LM head from its Q8_0 table (the embedding's when tied), as it ships or expanded to dtype: faster_head's
    choice."""
    head = tensors.get("output.weight", tensors["token_embd.weight"])
    if head.tensor_type != GGMLQuantizationType.Q8_0:
        raise ValueError(f"GGUF tensor {head.name} is {head.tensor_type.name}; the LM head loads from Q8_0 only")
    tied = head.name == "token_embd.weight"
    qs, d = q8_0_tensors(head.data)                                  # (vocab, K/32, 32) int8, (vocab, K/32)
    linear = nn.Linear(qs.shape[1] * 32, qs.shape[0], bias=False, device="meta")
    linear.weight = embedding if tied else nn.Parameter(dense(head, dtype), False)
    q8 = Int8GroupLinear(linear.in_features, linear.out_features, qs, d, embedding.detach() if tied else None)
    return faster_head(linear, q8)


# notebooks/11_weight_only_quantization.ipynb, cell 90
def load_gguf(path, config, dtype: torch.dtype) -> LlamaForCausalLM:
    """A Llama model whose decoder Linears are the file's Q4_1 weights, packed as they ship, and whose LM head is
    its Q8_0 table as it ships or expanded to dtype, whichever faster_head measures faster; tiled where the int8-dot loop won."""
    tensors = {t.name: t for t in GGUFReader(path).tensors}
    with torch.device("meta"):                                   # no memory, no random init: every tensor is set
        model = LlamaForCausalLM(config).to(dtype)
    for i, layer in enumerate(model.model.layers):
        for ours, theirs in GGUF_LINEARS.items():
            layer.set_submodule(ours, int4_linear(tensors, [f"blk.{i}.{name}.weight" for name in theirs], config))
        for ours, theirs in GGUF_NORMS.items():
            getattr(layer, ours).weight = nn.Parameter(dense(tensors[f"blk.{i}.{theirs}.weight"], dtype), False)
    model.model.norm.weight = nn.Parameter(dense(tensors["output_norm.weight"], dtype), False)
    model.model.embed_tokens.weight = nn.Parameter(dense(tensors["token_embd.weight"], dtype), False)
    model.lm_head = gguf_head(tensors, model.model.embed_tokens.weight, dtype)
    model.model.rotary = RotaryEmbedding(config, model.model.layers[0].self_attn.head_dim).to(dtype)  # off meta
    return tile_for_rows(model.eval(), dtype)
