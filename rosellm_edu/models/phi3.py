# Generated from notebooks/00a_other_families.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import torch
from transformers import PretrainedConfig

from rosellm_edu.models.llama import LlamaForCausalLM
from rosellm_edu.models.mistral import within_sliding_window


# notebooks/00a_other_families.ipynb, cell 19
def rotary_order(head_dim: int, rotary_dim: int) -> torch.Tensor:
    """A new order of a head's dims: Phi-3's pairs (i, i + rotary_dim/2), i < rotary_dim/2, move to (i,
    i + head_dim/2), where rotate_half pairs them; the dims left unrotated fill the places between."""
    r, rest = rotary_dim // 2, (head_dim - rotary_dim) // 2
    first, second = range(r), range(r, 2 * r)                       # the rotated dims' halves
    kept1, kept2 = range(2 * r, 2 * r + rest), range(2 * r + rest, head_dim)
    return torch.tensor([*first, *kept1, *second, *kept2])


# notebooks/00a_other_families.ipynb, cell 20
class Phi3ForCausalLM(LlamaForCausalLM):
    def __init__(self, config: PretrainedConfig):
        super().__init__(within_sliding_window(config))
        attn = self.model.layers[0].self_attn
        self.rotary_dim = int(attn.head_dim * config.rope_parameters.get("partial_rotary_factor", 1.0))

    def expected_shards(self, params: dict) -> set[tuple[str, int | None]]:
        return {(name, None) for name in params}        # qkv_proj, gate_up_proj ship fused: loaded whole

    def load_weights(self, weights) -> None:
        super().load_weights(weights)
        attn = self.model.layers[0].self_attn
        if self.rotary_dim == attn.head_dim:
            return
        order = rotary_order(attn.head_dim, self.rotary_dim).to(attn.qkv_proj.weight.device)
        for layer in self.model.layers:                  # rows of q and k, each head's in the new order
            w = layer.self_attn.qkv_proj.weight.data     # (q_size + 2 * kv_size, hidden)
            for lo, heads in ((0, attn.num_heads), (attn.q_size, attn.num_kv_heads)):
                rows = w[lo:lo + heads * attn.head_dim]
                rows.copy_(rows.view(heads, attn.head_dim, -1)[:, order].reshape(rows.shape))
