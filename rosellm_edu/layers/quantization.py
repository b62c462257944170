# Generated from notebooks/11_weight_only_quantization.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import functools

import torch
import torch.nn.functional as F
from torch import nn

from rosellm_edu.kernels import cpu_quant
from rosellm_edu.kernels.cpu_fused import DECODE_ROWS, FEW_ROWS, few_rows_fits, kernels_usable, linear_cpp, torch_linear
from rosellm_edu.timing import Choice, choose


# notebooks/11_weight_only_quantization.ipynb, cell 6
def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric, one scale per output channel: w (N, K) ~ q (N, K) int8 * scale (N, 1) float32."""
    scale = w.float().abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / 127    # (N, 1)
    q = torch.round(w.float() / scale).clamp(-127, 127).to(torch.int8)         # (N, K)
    return q, scale


# notebooks/11_weight_only_quantization.ipynb, cell 6
def dequantize_int8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.float() * scale                                                    # (N, K) float32


# notebooks/11_weight_only_quantization.ipynb, cell 8
def quantize_int4(w: torch.Tensor, group: int = 32, bits: int = 4) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric, in groups of `group` inputs: w[n, group*g + j] ~ q * d[n, g] + m[n, g], q in 0..15.
    The scale d and the minimum m are float16, as GGUF's Q4_1 stores them; q is computed against the rounded
    ones, so the grid q * d + m is the one the model will run with. Returns q (N, K) uint8, d and m (N, K/group).
    `bits` (up to 8) sets the levels, 2**bits: appendix 11a's 3-bit row."""
    N, K = w.shape
    if K % group:
        raise ValueError(f"in_features={K} is not a multiple of the group size {group}")
    wg = w.float().view(N, K // group, group)                                   # (N, groups, group)
    lo, hi = wg.amin(dim=-1), wg.amax(dim=-1)                                   # (N, groups)
    d, m = ((hi - lo) / (2**bits - 1)).half(), lo.half()
    step = d.float().clamp_min(1e-12).unsqueeze(-1)
    q = torch.round((wg - m.float().unsqueeze(-1)) / step).clamp(0, 2**bits - 1).to(torch.uint8)
    return q.view(N, K), d, m


# notebooks/11_weight_only_quantization.ipynb, cell 8
def dequantize_int4(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """q (N, K), d and m (N, groups) -> w (N, K) float32."""
    N, K = q.shape
    qg = q.float().view(N, d.shape[1], -1)                                      # (N, groups, group)
    return (qg * d.float().unsqueeze(-1) + m.float().unsqueeze(-1)).view(N, K)


# notebooks/11_weight_only_quantization.ipynb, cell 20
class Int8Linear(nn.Module):
    """nn.Linear with its weight stored as int8 per output channel."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        q, scale = quantize_int8(linear.weight.detach())
        self.register_buffer("qweight", q)                          # (N, K) int8
        self.register_buffer("scale", scale.squeeze(1))             # (N,) float32
        self.bias = linear.bias

    # notebooks/11_weight_only_quantization.ipynb, cell 67
    def forward(self, x: torch.Tensor) -> torch.Tensor:             # x: (rows, K) -> (rows, N)
        if getattr(self, "tiles", None) is not None:                 # as Int4Linear's tiles, 8-bit codes
            y = tiled_matmul(x, self.tiles, self.dm, 8)
            return y if self.bias is None else y + self.bias
        scale = self.scale.to(x.dtype)
        if x.device.type == "cpu" and x.dim() == 2 and x.shape[0] <= FEW_ROWS:
            y = torch.ops.aten._weight_int8pack_mm(x.contiguous(), self.qweight, scale)
            return y if self.bias is None else y + self.bias
        return F.linear(x, self.qweight.to(x.dtype) * scale[:, None], self.bias)

    # notebooks/11_weight_only_quantization.ipynb, cell 67
    def tile_(self) -> None:
        """Re-lay the weight in place, in Int8GroupLinear's tiles (the same codes, a scale per group)."""
        tiles, dm = channel_tiles(self.qweight, self.scale)
        del self.qweight, self.scale
        self.register_buffer("tiles", tiles)                         # (N/16, K/32, 8, 16, 4) uint8
        self.register_buffer("dm", dm)                               # (N/16, K/32, 2, 16) float16


# notebooks/11_weight_only_quantization.ipynb, cell 22
def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """q (N, K) in 0..15 -> (N, K/32, 16) bytes in GGUF's Q4_1 order: byte j of a group holds element j in its
    low nibble and element j + 16 in its high nibble."""
    N, K = q.shape
    g = q.view(N, K // 32, 32)
    return (g[..., :16] | (g[..., 16:] << 4)).contiguous()


# notebooks/11_weight_only_quantization.ipynb, cell 22
def unpack_int4(qs: torch.Tensor) -> torch.Tensor:
    """The inverse: (N, groups, 16) bytes -> q (N, groups * 32)."""
    return torch.cat([qs & 15, qs >> 4], dim=-1).view(qs.shape[0], -1)


# notebooks/11_weight_only_quantization.ipynb, cell 31
class Int4Linear(nn.Module):
    """nn.Linear with its weight in 4-bit groups of 32, packed as GGUF's Q4_1 packs them."""

    def __init__(self, in_features: int, out_features: int, qs, d, m, bias: torch.Tensor | None = None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("qs", qs)                               # (N, K/32, 16) uint8
        self.register_buffer("d", d)                                 # (N, K/32) float16: the groups' scales
        self.register_buffer("m", m)                                 # (N, K/32) float16: the groups' minimums
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "Int4Linear":
        q, d, m = quantize_int4(linear.weight.detach(), group=32)
        bias = None if linear.bias is None else linear.bias.detach()
        return cls(linear.in_features, linear.out_features, pack_int4(q), d, m, bias)

    # notebooks/11_weight_only_quantization.ipynb, cell 65
    def forward(self, x: torch.Tensor) -> torch.Tensor:             # x: (rows, K) -> (rows, N)
        if getattr(self, "tiles", None) is not None:                 # tiled, so on a CPU with the kernels built
            y = tiled_matmul(x, self.tiles, self.dm, 4)
            return y if self.bias is None else y + self.bias
        if x.device.type == "cpu" and x.dim() == 2 and cpu_quant.extension() is not None:
            if x.shape[0] <= FEW_ROWS:
                y = cpu_quant.int4_linear_cpp(x, self.qs, self.d, self.m)
                return y if self.bias is None else y + self.bias
            return F.linear(x, cpu_quant.int4_dequantize_cpp(self.qs, self.d, self.m, x.dtype), self.bias)
        w = dequantize_int4(unpack_int4(self.qs), self.d, self.m).to(x.dtype)   # a GPU, or no compiler
        return F.linear(x, w, self.bias)

    # notebooks/11_weight_only_quantization.ipynb, cell 65
    def tile_(self) -> None:
        """Re-lay the weight in place, in tiles of 16 columns for the int8-dot loop (the same bytes)."""
        tiles, dm = cpu_quant.tile(self.qs, self.d, self.m)
        del self.qs, self.d, self.m
        self.register_buffer("tiles", tiles)                         # (N/16, K/32, 4, 16, 4) uint8
        self.register_buffer("dm", dm)                               # (N/16, K/32, 2, 16) float16


# notebooks/11_weight_only_quantization.ipynb, cell 41
QUANTIZED_LINEARS = {"int8": Int8Linear, "int4": Int4Linear.from_linear}


# notebooks/11_weight_only_quantization.ipynb, cell 80
def quantize_model(model: nn.Module, method: str) -> nn.Module:
    """Replace every Linear of the decoder layers by its quantized copy, in place, and a Llama's LM head by 8-bit
    groups where head_choice measures them faster; then tiles them where the int8-dot loop won. The
    embedding keeps the model's dtype."""
    if method not in QUANTIZED_LINEARS:
        raise ValueError(f"quantize_model takes one of {sorted(QUANTIZED_LINEARS)}, got {method!r}")
    for layer in model.model.layers if hasattr(model, "model") else model.h:      # Llama, or GPT-2
        for name, child in list(layer.named_modules()):
            if isinstance(child, nn.Linear):
                layer.set_submodule(name, QUANTIZED_LINEARS[method](child))
    head = getattr(model, "lm_head", None)
    if isinstance(head, nn.Linear) and head.bias is None:                # GPT-2's head is its embedding table
        tied = head.weight is model.model.embed_tokens.weight
        q8 = Int8GroupLinear.from_linear(head, dense=head.weight.detach() if tied else None)
        model.lm_head = faster_head(head, q8)
    return tile_for_rows(model, next(p.dtype for p in model.parameters() if p.is_floating_point()))


# notebooks/11_weight_only_quantization.ipynb, cell 46
def quantize_q8_0(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric, in groups of 32 with a float16 scale, as GGUF's Q8_0: w (N, K) ~ q (N, K/32, 32) int8 * d
    (N, K/32); q is computed against the rounded d, as in quantize_int4."""
    N, K = w.shape
    if K % 32:
        raise ValueError(f"in_features={K} is not a multiple of the group size 32")
    wg = w.float().view(N, K // 32, 32)                                         # (N, groups, 32)
    d = (wg.abs().amax(dim=-1) / 127).half()
    q = torch.round(wg / d.float().clamp_min(1e-12).unsqueeze(-1)).clamp(-127, 127).to(torch.int8)
    return q, d


# notebooks/11_weight_only_quantization.ipynb, cell 46
def dequantize_q8_0(q: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """q (N, groups, 32), d (N, groups) -> w (N, groups * 32) float32."""
    return (q.float() * d.float().unsqueeze(-1)).view(q.shape[0], -1)


# notebooks/11_weight_only_quantization.ipynb, cell 47
class Int8GroupLinear(nn.Module):
    """nn.Linear without bias, its weight in 8-bit groups of 32 as GGUF's Q8_0: the LM head's format here. `dense`:
    the same weight unquantized where the model holds it anyway (a head tied to its embedding table); steps of
    more than FEW_ROWS rows, bound by arithmetic, multiply by it instead of expanding the groups each step."""

    def __init__(self, in_features: int, out_features: int, qs: torch.Tensor, d: torch.Tensor,
                 dense: torch.Tensor | None = None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("qs", qs)                               # (N, K/32, 32) int8
        self.register_buffer("d", d)                                 # (N, K/32) float16: the groups' scales
        self.register_buffer("dense", dense, persistent=False)       # (N, K) or None; the embedding's own table

    @classmethod
    def from_linear(cls, linear: nn.Linear, dense: torch.Tensor | None = None) -> "Int8GroupLinear":
        if linear.bias is not None:
            raise ValueError("Int8GroupLinear holds no bias; this Linear has one")
        return cls(linear.in_features, linear.out_features, *quantize_q8_0(linear.weight.detach()), dense)

    # notebooks/11_weight_only_quantization.ipynb, cell 66
    def forward(self, x: torch.Tensor) -> torch.Tensor:             # x: (rows, K) -> (rows, N)
        tiled = getattr(self, "tiles", None) is not None
        if tiled and x.shape[0] <= TILED_ROWS:
            return cpu_quant.tiled_linear_cpp(x, self.tiles, self.dm, 8)
        if self.dense is not None and x.shape[0] > FEW_ROWS:
            return F.linear(x, self.dense.to(x.dtype))
        if tiled:
            return F.linear(x, cpu_quant.tiled_dequantize_cpp(self.tiles, self.dm, 8, x.dtype))
        cpu = x.device.type == "cpu" and x.dim() == 2 and cpu_quant.extension() is not None
        if cpu and x.shape[0] <= FEW_ROWS and self.out_features % 16 == 0:
            return cpu_quant.int8_linear_cpp(x, self.qs, self.d)
        if cpu:
            return F.linear(x, cpu_quant.int8_dequantize_cpp(self.qs, self.d, x.dtype))
        return F.linear(x, dequantize_q8_0(self.qs, self.d).to(x.dtype))                 # a GPU, or no compiler

    # notebooks/11_weight_only_quantization.ipynb, cell 66
    def tile_(self) -> None:
        """Tiles as Int4Linear's, the codes as q + 128 (unsigned, as the loop takes them) with a minimum of -128 d."""
        tiles, dm = cpu_quant.tile(self.qs.view(torch.uint8) ^ 0x80, self.d, self.d * -128)
        del self.qs, self.d
        self.register_buffer("tiles", tiles)                         # (N/16, K/32, 8, 16, 4) uint8
        self.register_buffer("dm", dm)                               # (N/16, K/32, 2, 16) float16


# notebooks/11_weight_only_quantization.ipynb, cell 65
TILED_ROWS = 8                # up to this many rows, a tiled layer runs the int8-dot loop; more, where it measured faster


# notebooks/11_weight_only_quantization.ipynb, cell 65
def tiled_matmul(x: torch.Tensor, tiles: torch.Tensor, dm: torch.Tensor, bits: int) -> torch.Tensor:
    """x (rows, K) @ W^T for W in tiles: the int8-dot loop up to TILED_ROWS rows, and up to DECODE_ROWS where
    many_rows_choice measured it faster; otherwise the tiles expanded for PyTorch's matmul."""
    rows = x.shape[0]
    if rows <= TILED_ROWS or (rows <= DECODE_ROWS and cpu_quant.many_rows_choice(bits).name == "int8-dot"):
        return cpu_quant.tiled_linear_cpp(x, tiles, dm, bits)
    return F.linear(x, cpu_quant.tiled_dequantize_cpp(tiles, dm, bits, x.dtype))


# notebooks/11_weight_only_quantization.ipynb, cell 67
def channel_tiles(q: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 per channel, q (N, K) and scale (N,), as Q8_0 tiles: the channel's scale on each of its groups."""
    N, K = q.shape
    d = scale.half()[:, None].expand(N, K // 32)                                 # (N, K/32) float16
    return cpu_quant.tile(q.view(torch.uint8).view(N, K // 32, 32) ^ 0x80, d, d * -128)


# notebooks/11_weight_only_quantization.ipynb, cell 68
@functools.cache
def channel_row_choice() -> Choice:
    """int8 per channel, one bfloat16 row, measured once per process on cpu_quant.CHOICE_BYTES of codes: PyTorch's
    int8 op (the default), or the int8-dot loop on the same codes in tiles."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randint(-127, 128, (cpu_quant.CHOICE_BYTES // 2048, 2048), dtype=torch.int8, generator=gen)  # (N, K)
    scale = torch.rand(q.shape[0], generator=gen).bfloat16() / 100                  # (N,)
    tiles, dm = channel_tiles(q, scale)
    x = torch.randn(1, 2048, generator=gen).bfloat16()
    return choose("int8 per channel, one bfloat16 row", {
        "PyTorch's int8 op": lambda: torch.ops.aten._weight_int8pack_mm(x, q, scale),
        "int8-dot": lambda: cpu_quant.tiled_linear_cpp(x, tiles, dm, 8)})


# notebooks/11_weight_only_quantization.ipynb, cell 68
def int8_dot_won(layer: nn.Module) -> bool:
    """Whether the int8-dot loop measured fastest for this quantized layer's codes, one bfloat16 row."""
    if isinstance(layer, Int8Linear):
        return channel_row_choice().name == "int8-dot"
    return cpu_quant.bf16_row_choice(4 if isinstance(layer, Int4Linear) else 8).name == "int8-dot"


# notebooks/11_weight_only_quantization.ipynb, cell 68
def tile_for_rows(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Tile each quantized layer of `model` where the int8-dot loop measured fastest for its codes, for bfloat16
    activations on a CPU. float32 keeps the exact loops, so its outputs stay the float32 model's."""
    if dtype != torch.bfloat16 or cpu_quant.extension() is None:
        return model
    for layer in model.modules():
        if (isinstance(layer, (Int4Linear, Int8GroupLinear, Int8Linear)) and getattr(layer, "tiles", None) is None
                and next(layer.buffers()).device.type == "cpu" and layer.out_features % 16 == 0
                and layer.in_features % 32 == 0 and int8_dot_won(layer)):
            layer.tile_()
    return model


# notebooks/11_weight_only_quantization.ipynb, cell 76
@torch.no_grad()
def head_choice(dense: nn.Linear, q8: Int8GroupLinear) -> Choice:
    """The LM head's format at one row, measured once per process, dtype and shape: the model's dtype through
    PyTorch's matmul (the default) or, where it fits, chapter 10's few-rows kernel (either may run a model's one-row
    steps, as fusion_choices measured), or Q8_0 groups through the 8-bit loop."""
    dtype = str(dense.weight.dtype).removeprefix("torch.")
    x = torch.randn(1, dense.in_features).to(dense.weight.dtype)                     # (1, hidden)
    candidates = {dtype: lambda: torch_linear(x, dense)}
    if kernels_usable(x.device) and few_rows_fits(dense):
        candidates["few-rows"] = lambda: linear_cpp(x, dense)
    return choose(f"LM head {dtype} {tuple(dense.weight.shape)}", {**candidates, "Q8_0": lambda: q8(x)})


# notebooks/11_weight_only_quantization.ipynb, cell 76
def faster_head(dense: nn.Linear, q8: Int8GroupLinear) -> nn.Module:
    """The head head_choice measured faster, Q8_0 in tiles where the int8-dot loop won; off the CPU the dense one
    (Q8_0 there would expand every step)."""
    if dense.weight.device.type == "cpu" and head_choice(dense, tile_for_rows(q8, dense.weight.dtype)).name == "Q8_0":
        return q8
    return dense
