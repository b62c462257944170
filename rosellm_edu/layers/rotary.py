# Generated from notebooks/00_the_model.ipynb, notebooks/00a_other_families.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import math

import torch
from torch import nn
from transformers import PretrainedConfig


# notebooks/00a_other_families.ipynb, cell 14
def llama3_frequencies(inv_freq: torch.Tensor, p: dict, config: PretrainedConfig) -> tuple[torch.Tensor, float]:
    old, low, high = p["original_max_position_embeddings"], p["low_freq_factor"], p["high_freq_factor"]
    wavelength = 2 * math.pi / inv_freq
    smooth = (old / wavelength - low) / (high - low)                   # 0 at old / low, 1 at old / high
    blended = (1 - smooth) * inv_freq / p["factor"] + smooth * inv_freq
    out = torch.where(wavelength > old / low, inv_freq / p["factor"], inv_freq)
    return torch.where((wavelength <= old / low) & (wavelength >= old / high), blended, out), 1.0


# notebooks/00a_other_families.ipynb, cell 14
def yarn_frequencies(inv_freq: torch.Tensor, p: dict, config: PretrainedConfig) -> tuple[torch.Tensor, float]:
    old, dim, base = p["original_max_position_embeddings"], 2 * len(inv_freq), p["rope_theta"]
    factor = p.get("factor") or config.max_position_embeddings / old

    def dim_turning(turns: float) -> float:     # the dim whose wave turns `turns` times over the original context
        return dim * math.log(old / (turns * 2 * math.pi)) / (2 * math.log(base))

    low, high = dim_turning(p.get("beta_fast") or 32), dim_turning(p.get("beta_slow") or 1)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    ramp = ((torch.arange(dim // 2, device=inv_freq.device) - low) / max(high - low, 0.001)).clamp(0, 1)
    mscale = lambda m=1: 0.1 * m * math.log(factor) + 1.0 if factor > 1 else 1.0
    attention = p.get("attention_factor") or (mscale(p["mscale"]) / mscale(p["mscale_all_dim"])
                                              if p.get("mscale") and p.get("mscale_all_dim") else mscale())
    return inv_freq / factor * ramp + inv_freq * (1 - ramp), attention


# notebooks/00a_other_families.ipynb, cell 14
ROPE_SCALINGS = {"default": lambda inv_freq, p, config: (inv_freq, 1.0),
                 "linear": lambda inv_freq, p, config: (inv_freq / p["factor"], 1.0),
                 "llama3": llama3_frequencies, "yarn": yarn_frequencies}


# notebooks/00a_other_families.ipynb, cell 15
def rope_frequencies(config: PretrainedConfig, head_dim: int) -> tuple[torch.Tensor, float]:
    """Inverse frequencies θ_i (head_dim / 2,) and the attention scaling some RoPE variants apply. A partial
    rotation (partial_rotary_factor < 1) gives the dims it leaves alone the frequency 0: cos 1, sin 0."""
    params = config.rope_parameters
    rope_type = params.get("rope_type", "default")
    if rope_type not in ROPE_SCALINGS:
        raise ValueError(f"rope_scaling type {rope_type!r} is not implemented; rosellm_edu implements "
                         f"{sorted(ROPE_SCALINGS)}")
    dim = int(head_dim * params.get("partial_rotary_factor", 1.0))
    device = torch.get_default_device()  # where the model is being built, e.g. inside `with torch.device("cuda")`
    exponents = torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim
    inv_freq, scaling = ROPE_SCALINGS[rope_type](1.0 / params["rope_theta"] ** exponents, params, config)
    unrotated = torch.zeros(head_dim // 2 - dim // 2, device=device)
    return torch.cat((inv_freq, unrotated)), scaling


# notebooks/00_the_model.ipynb, cell 9
def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


# notebooks/00_the_model.ipynb, cell 9
class RotaryEmbedding(nn.Module):
    def __init__(self, config: PretrainedConfig, head_dim: int):
        super().__init__()
        inv_freq, scaling = rope_frequencies(config, head_dim)
        positions = torch.arange(config.max_position_embeddings, dtype=torch.float32)
        angles = torch.outer(positions, inv_freq)             # (max_positions, head_dim / 2)
        angles = torch.cat((angles, angles), dim=-1)          # (max_positions, head_dim)
        self.register_buffer("cos", angles.cos() * scaling, persistent=False)
        self.register_buffer("sin", angles.sin() * scaling, persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        # q: (tokens, heads, head_dim), k: (tokens, kv_heads, head_dim), positions: (tokens,)
        cos = self.cos[positions].unsqueeze(1).to(q.dtype)   # (tokens, 1, head_dim)
        sin = self.sin[positions].unsqueeze(1).to(q.dtype)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
