# Generated from notebooks/11a_quantization_error.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import copy
import math
from dataclasses import dataclass, replace
from typing import Callable

import torch
from torch import nn

from rosellm_edu.layers.quantization import (dequantize_int4, dequantize_int8, dequantize_q8_0, quantize_int4,
                                             quantize_int8, quantize_q8_0)


# notebooks/11a_quantization_error.ipynb, cell 6
def quantize_q4_0(w: torch.Tensor, group: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """GGUF's Q4_0: symmetric, in groups, w[n, group*g + j] ~ q * d[n, g] with q in -8..7 and d float16.
    d = the group's weight of largest magnitude, signed, / -8; the codes are computed against the float32 d and
    rounded half up, as llama.cpp and the gguf package do. Returns q (N, K) int8 and d (N, K/group)."""
    N, K = w.shape
    if K % group:
        raise ValueError(f"in_features={K} is not a multiple of the group size {group}")
    wg = w.float().view(N, K // group, group)                                   # (N, groups, group)
    biggest = wg.gather(-1, wg.abs().argmax(dim=-1, keepdim=True))              # (N, groups, 1), signed
    d = biggest / -8
    inverse = torch.where(d == 0, 0.0, 1 / d)
    q = torch.floor(wg * inverse + 8.5).clamp(0, 15) - 8                        # -8..7
    return q.to(torch.int8).view(N, K), d.squeeze(-1).half()


# notebooks/11a_quantization_error.ipynb, cell 6
def dequantize_q4_0(q: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """q (N, K), d (N, groups) -> w (N, K) float32."""
    N, K = q.shape
    return (q.float().view(N, d.shape[1], -1) * d.float().unsqueeze(-1)).view(N, K)


# notebooks/11a_quantization_error.ipynb, cell 9
@dataclass(frozen=True)
class Format:
    """A weight format as appendix 11a measures it: its round trip and what it stores."""
    bits: int                                                  # of each weight's code
    group: int | None                                          # weights sharing a scale; None: the whole row
    scale_bits: int                                            # stored per group: scale, and minimum if any
    round_trip: Callable[[torch.Tensor, int], torch.Tensor]    # (w (N, K), group) -> (N, K) float32

    def fake_quantize(self, w: torch.Tensor) -> torch.Tensor:
        """w (N, K) -> its de-quantized values (N, K) float32; a row that is not a multiple of the group ends in a
        shorter group (padded with copies of its last weight, which change no group's range)."""
        K = w.shape[1]
        group = self.group or K
        padded = torch.cat([w.float(), w[:, -1:].float().expand(-1, -K % group)], dim=1)
        return self.round_trip(padded, group)[:, :K]

    def bits_per_weight(self, in_features: int) -> float:
        group = self.group or in_features
        return self.bits + self.scale_bits * math.ceil(in_features / group) / in_features


# notebooks/11a_quantization_error.ipynb, cell 9
Q4_1 = Format(4, 32, 32, lambda w, g: dequantize_int4(*quantize_int4(w, g)))


# notebooks/11a_quantization_error.ipynb, cell 9
FORMATS = {
    "Q8_0": Format(8, 32, 16, lambda w, g: dequantize_q8_0(*quantize_q8_0(w))),
    "int8 / row": Format(8, None, 32, lambda w, g: dequantize_int8(*quantize_int8(w))),
    "Q4_1 / 32": Q4_1, "Q4_1 / 64": replace(Q4_1, group=64), "Q4_1 / 128": replace(Q4_1, group=128),
    "Q4_0": Format(4, 32, 16, lambda w, g: dequantize_q4_0(*quantize_q4_0(w, g))),
    "3-bit / 32": Format(3, 32, 32, lambda w, g: dequantize_int4(*quantize_int4(w, g, bits=3))),
}


# notebooks/11a_quantization_error.ipynb, cell 11
def decoder_linears(model: nn.Module) -> list[nn.Linear]:
    return [mod for mod in model.model.layers.modules() if isinstance(mod, nn.Linear)]


# notebooks/11a_quantization_error.ipynb, cell 11
def fake_quantize_model(model: nn.Module, fmt: Format) -> nn.Module:
    """A copy of a Llama-shaped model whose decoder Linears hold fmt's round trip of their weights."""
    fake = copy.deepcopy(model)
    for linear in decoder_linears(fake):
        linear.weight.data = fmt.fake_quantize(linear.weight.data).to(linear.weight.dtype)
    return fake


# notebooks/11a_quantization_error.ipynb, cell 11
def model_bits_per_weight(model: nn.Module, fmt: Format) -> float:
    """fmt's bits per weight over the decoder Linears, each weighted by its size."""
    sizes = [(lin.weight.numel(), fmt.bits_per_weight(lin.in_features)) for lin in decoder_linears(model)]
    return sum(n * bits for n, bits in sizes) / sum(n for n, _ in sizes)
