# Generated from notebooks/11_weight_only_quantization.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import functools

import torch
import torch.nn.functional as F

from rosellm_edu.kernels.build import build_cpp
from rosellm_edu.timing import Choice, choose


# notebooks/11_weight_only_quantization.ipynb, cell 61
@functools.cache
def extension():
    """The 4-bit and 8-bit kernels, or None where they cannot be built (the layers then de-quantize with PyTorch
    ops)."""
    return build_cpp("rosellm_edu_int4", "quant.h", ["int4_linear", "int4_dequantize_out", "int8_linear",
                                                  "int8_dequantize_out", "int4_linear_bf16", "has_bf16_dot",
                                                  "tiled_linear", "tiled_dequantize_out"],
                     "quantized layers de-quantize with PyTorch ops instead", extra_cflags=("-fno-trapping-math",))


# notebooks/11_weight_only_quantization.ipynb, cell 62
def int4_linear_cpp(x: torch.Tensor, qs: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """x (rows <= 4, K) @ W^T for W packed as qs (N, K/32, 16), d and m (N, K/32): W is read once, as 4 bits.
    One bfloat16 row takes the bfloat16 dot-product loop where bf16_row_choice measured it fastest."""
    if x.dtype == torch.bfloat16 and x.shape[0] == 1 and bf16_row_choice().name == "avx512-bf16":
        return extension().int4_linear_bf16(x.contiguous(), qs, d, m)
    return extension().int4_linear(x.contiguous(), qs, d, m)


# notebooks/11_weight_only_quantization.ipynb, cell 29
def int4_dequantize_cpp(qs: torch.Tensor, d: torch.Tensor, m: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """W (N, K) in dtype, one pass over the packed weight."""
    return extension().int4_dequantize_out(qs, d, m, dtype)


# notebooks/11_weight_only_quantization.ipynb, cell 60
def tile(codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """codes (N, G, B) uint8, B = 16 (Q4_1's nibbles) or 32 (8-bit codes), d and m (N, G) float16 -> the tiles
    (N/16, G, B/4, 16, 4) and dm (N/16, G, 2, 16): the same bytes, 16 columns side by side."""
    N, G, B = codes.shape
    tiles = codes.view(N // 16, 16, G, B // 4, 4).permute(0, 2, 3, 1, 4).contiguous()
    dm = torch.stack([d, m], -1).view(N // 16, 16, G, 2).permute(0, 2, 3, 1).contiguous()
    return tiles, dm


# notebooks/11_weight_only_quantization.ipynb, cell 61
@functools.cache
def has_bf16_dot() -> bool:
    """Whether the kernels were built for a CPU with AVX512-BF16 (the compiler targets the machine it runs on)."""
    return extension().has_bf16_dot()


# notebooks/11_weight_only_quantization.ipynb, cell 61
def int8_linear_cpp(x: torch.Tensor, qs: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """x (rows <= 4, K) @ W^T for W in Q8_0 groups: qs (N, K/32, 32) int8, d (N, K/32) float16."""
    return extension().int8_linear(x.contiguous(), qs, d)


# notebooks/11_weight_only_quantization.ipynb, cell 61
def int8_dequantize_cpp(qs: torch.Tensor, d: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """W (N, K) in dtype, one pass over the Q8_0 groups."""
    return extension().int8_dequantize_out(qs, d, dtype)


# notebooks/11_weight_only_quantization.ipynb, cell 61
def tiled_linear_cpp(x: torch.Tensor, tiles: torch.Tensor, dm: torch.Tensor, bits: int) -> torch.Tensor:
    """x (rows, K) @ W^T for W in tiles of 4- or 8-bit codes: x rounded to 8-bit groups, integer dots, one pass
    over the tiles, 8 rows at a time on each."""
    return extension().tiled_linear(x.contiguous(), tiles, dm, bits)


# notebooks/11_weight_only_quantization.ipynb, cell 61
def tiled_dequantize_cpp(tiles: torch.Tensor, dm: torch.Tensor, bits: int, dtype: torch.dtype) -> torch.Tensor:
    """W (N, K) in dtype, from its tiles."""
    return extension().tiled_dequantize_out(tiles, dm, bits, dtype)


# notebooks/11_weight_only_quantization.ipynb, cell 62
CHOICE_BYTES = 64 * 2**20    # codes a loop is raced over: more than a last-level cache holds, as a model's weights


# notebooks/11_weight_only_quantization.ipynb, cell 62
@functools.cache
def bf16_row_choice(bits: int = 4) -> Choice:
    """The loop for one bfloat16 row on `bits`-bit codes (4: Q4_1's, 8: Q8_0's), measured once per process on a
    weight of CHOICE_BYTES, read from memory as a model's are: the portable loop (the default), the int8-dot loop
    on the weight in tiles and, for 4 bits where the kernels were built with AVX512-BF16, the bfloat16 dot loop."""
    gen = torch.Generator().manual_seed(0)
    n = CHOICE_BYTES // (2048 * bits // 8)                                           # a (n, 2048) weight
    codes = torch.randint(0, 256, (n, 64, 4 * bits), dtype=torch.uint8, generator=gen)   # (N, K/32, 16 or 32)
    d, m = torch.rand(2, n, 64, generator=gen).half()                                # (N, K/32) each
    x = torch.randn(1, 2048, generator=gen).bfloat16()
    tiles, dm = tile(codes, d, m)
    loops = {"portable": (lambda: extension().int4_linear(x, codes, d, m)) if bits == 4 else
                         (lambda: extension().int8_linear(x, codes.view(torch.int8), d)),
             "int8-dot": lambda: extension().tiled_linear(x, tiles, dm, bits)}
    if bits == 4 and has_bf16_dot():
        loops["avx512-bf16"] = lambda: extension().int4_linear_bf16(x, codes, d, m)
    return choose(f"{bits}-bit loop, one bfloat16 row", loops)


# notebooks/11_weight_only_quantization.ipynb, cell 63
@functools.cache
def many_rows_choice(bits: int = 4) -> Choice:
    """For 9 to DECODE_ROWS bfloat16 rows on a tiled weight of `bits`-bit codes, measured once at 64 rows: expand
    the tiles for PyTorch's matmul (the default), or the int8-dot loop."""
    gen = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 256, (2048, 48, 4 * bits), dtype=torch.uint8, generator=gen)   # (N, K/32, 16 or 32)
    tiles, dm = tile(codes, *torch.rand(2, 2048, 48, generator=gen).half())
    x = torch.randn(64, 1536, generator=gen).bfloat16()
    return choose(f"{bits}-bit tiles, 64 bfloat16 rows", {
        "expand": lambda: F.linear(x, extension().tiled_dequantize_out(tiles, dm, bits, x.dtype)),
        "int8-dot": lambda: extension().tiled_linear(x, tiles, dm, bits)})
