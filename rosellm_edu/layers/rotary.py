# Generated from notebooks/00_the_model.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import torch
from torch import nn
from transformers import PretrainedConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS


# notebooks/00_the_model.ipynb, cell 9
def rope_frequencies(config: PretrainedConfig, head_dim: int) -> tuple[torch.Tensor, float]:
    """Inverse frequencies θ_i (head_dim / 2,) and the attention scaling some RoPE variants apply."""
    params = config.rope_parameters
    device = torch.get_default_device()  # where the model is being built, e.g. inside `with torch.device("cuda")`
    if params.get("rope_type", "default") == "default":
        exponents = torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim
        return 1.0 / params["rope_theta"] ** exponents, 1.0
    return ROPE_INIT_FUNCTIONS[params["rope_type"]](config, device)


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
