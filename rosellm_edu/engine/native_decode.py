# Generated from notebooks/11b_native_decode.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import torch
from torch import nn

from rosellm_edu.kernels import cpu_decode
from rosellm_edu.kernels.cpu_fused import FEW_ROWS, few_rows_fits
from rosellm_edu.layers.quantization import Int4Linear, Int8GroupLinear, Int8Linear, TILED_ROWS
from rosellm_edu.models.llama import LlamaAttention, LlamaDecoderLayer, LlamaMLP, LlamaModel


# notebooks/11b_native_decode.ipynb, cell 32
NO_SCALES = torch.empty(0)


# notebooks/11b_native_decode.ipynb, cell 32
def native_linear(layer: nn.Module) -> tuple[tuple, int] | None:
    """(weight, scales, bits), as the two calls take a Linear, and the most rows its loop takes; None for one
    they do not run (a bias, shapes the loops do not tile, a quantized layer not in tiles)."""
    if few_rows_fits(layer):
        return (layer.weight, NO_SCALES, 0), FEW_ROWS
    if (isinstance(layer, (Int4Linear, Int8GroupLinear, Int8Linear)) and layer.bias is None
            and getattr(layer, "tiles", None) is not None):
        return (layer.tiles, layer.dm, 4 if isinstance(layer, Int4Linear) else 8), TILED_ROWS
    return None


# notebooks/11b_native_decode.ipynb, cell 32
def native_layer(layer: nn.Module) -> tuple[tuple, int] | None:
    """A decoder layer's fixed arguments of attention_in and attention_out, and the most rows they take."""
    if (type(layer), type(layer.self_attn), type(layer.mlp)) != (LlamaDecoderLayer, LlamaAttention, LlamaMLP):
        return None
    attn, mlp = layer.self_attn, layer.mlp
    linears = [native_linear(l) for l in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)]
    if None in linears:
        return None
    (qkv, o, gate_up, down), rows = zip(*linears)
    norm_in, norm_out = layer.input_layernorm, layer.post_attention_layernorm
    return (norm_in.weight, norm_in.eps, qkv, o, norm_out.weight, norm_out.eps, gate_up, down), min(rows)


# notebooks/11b_native_decode.ipynb, cell 33
class NativeDecode:
    """A Llama's decode step on a CPU, issued as one native call after the embedding: up to max_rows sequences,
    one new token each, over one KV cache."""

    def __init__(self, model: nn.Module, k: torch.Tensor, v: torch.Tensor, block_size: int, layers: list, max_rows: int):
        self.model, self.layers, self.max_rows = model.model, layers, max_rows
        self.k_caches = [layer.view(-1, block_size, *k.shape[2:]) for layer in k]   # (blocks, block_size, KV, d)
        self.v_caches = [layer.view(-1, block_size, *v.shape[2:]) for layer in v]
        self.scale = k.shape[-1] ** -0.5
        m = self.model                                     # converted to C++ once: only a step's inputs cross later
        self.plan = cpu_decode.extension().decode_plan(layers, m.rotary.cos, m.rotary.sin, self.k_caches,
                                                       self.v_caches, self.scale, m.norm.weight, m.norm.eps)
        bits = sorted({linear[2] for args in layers for linear in args[2:4] + args[6:8]})
        self.key = f"decode step, {k.dtype}, {len(layers)} layers of {model.config.hidden_size}, Linears of {bits} bits"
        self.one_region = False                            # the runner's choice, at its first decode step

    @classmethod
    def build(cls, model: nn.Module, kv_cache) -> "NativeDecode | None":
        """None where the calls cannot run this model's step: not a Llama's layers, another Linear, a GPU, the
        reader's choice of PyTorch's ops (fusion "torch" or "compile"), or no compiler."""
        inner = getattr(model, "model", None)
        if (type(inner) is not LlamaModel or inner.fusion not in ("auto", "cpp") or kv_cache.k.device.type != "cpu"
                or cpu_decode.extension() is None):
            return None
        layers = [native_layer(layer) for layer in inner.layers]
        if None in layers or inner.rotary.cos.shape[-1] != kv_cache.k.shape[-1]:    # partial rotary: not here
            return None
        args, rows = zip(*layers)
        return cls(model, kv_cache.k, kv_cache.v, kv_cache.block_size, list(args), min(rows))

    # notebooks/11b_native_decode.ipynb, cell 34
    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx,
                 one_region: bool | None = None) -> torch.Tensor:
        """input_ids, positions (rows,), one new token per sequence; ctx the step's PagedAttention, every sequence
        decoding. Returns the hidden states (rows, hidden), as the model's forward does. one_region: decode_region
        rather than decode_step (by default, self.one_region)."""
        d, ext = ctx.decode, cpu_decode.extension()
        x = self.model.embed_tokens(input_ids)                                        # (rows, hidden)
        step = ext.decode_region if (self.one_region if one_region is None else one_region) else ext.decode_step
        return step(self.plan, x, positions, ctx.slot_mapping, d.block_tables, d.context_lens)
