# Generated from notebooks/00a_other_families.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import re

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig

from rosellm_edu.models.qwen3 import Qwen3ForCausalLM


# notebooks/00a_other_families.ipynb, cell 23
def route(router_logits: torch.Tensor, top_k: int, norm_topk_prob: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, experts) router logits -> each token's top_k expert weights and ids, both (tokens, top_k):
    softmax first (in float32), then top-k, renormalised to sum to 1 if norm_topk_prob."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, experts = probs.topk(top_k, dim=-1)
    if norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(router_logits.dtype), experts


# notebooks/00a_other_families.ipynb, cell 23
def grouped_experts(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, weights: torch.Tensor,
                    experts: torch.Tensor, silu_and_mul=None) -> torch.Tensor:
    """x (tokens, hidden); gate_up (E, 2 * inter, hidden), down (E, hidden, inter) stacked; weights, experts
    (tokens, top_k). Each expert runs once, on the tokens routed to it; the weighted outputs add back."""
    top_k = experts.shape[1]
    flat = experts.reshape(-1)                                  # (tokens * top_k,): the expert of each pair
    order = flat.argsort(stable=True)                           # pairs grouped by expert
    counts = torch.bincount(flat, minlength=gate_up.shape[0]).tolist()   # tokens per expert (one sync)
    pair_weight = weights.reshape(-1, 1)                        # (tokens * top_k, 1)
    out = torch.zeros_like(x)
    start = 0
    for expert, count in enumerate(counts):                     # over experts, never over tokens
        if count == 0:
            continue
        pairs = order[start:start + count]
        rows = pairs // top_k                                   # (count,): the tokens this expert serves
        h = F.linear(x[rows], gate_up[expert])                  # (count, 2 * inter)
        h = silu_and_mul(h) if silu_and_mul is not None else F.silu(h[:, :h.shape[1] // 2]) * h[:, h.shape[1] // 2:]
        out.index_add_(0, rows, F.linear(h, down[expert]) * pair_weight[pairs])
        start += count
    return out


# notebooks/00a_other_families.ipynb, cell 24
class Qwen3MoeSparseBlock(nn.Module):
    """The router and the stacked experts, in place of a layer's MLP."""

    def __init__(self, config: PretrainedConfig):
        super().__init__()
        experts, inter = config.num_experts, config.moe_intermediate_size
        self.top_k, self.norm_topk_prob = config.num_experts_per_tok, config.norm_topk_prob
        self.gate = nn.Linear(config.hidden_size, experts, bias=False)                       # the router
        self.gate_up = nn.Parameter(torch.empty(experts, 2 * inter, config.hidden_size))     # gate rows, then up
        self.down = nn.Parameter(torch.empty(experts, config.hidden_size, inter))

    def forward(self, x: torch.Tensor, ops=None) -> torch.Tensor:
        """x (tokens, hidden); ops: chapter 10's (its SiLU x up kernel), or None here."""
        weights, experts = route(F.linear(x, self.gate.weight), self.top_k, self.norm_topk_prob)
        return grouped_experts(x, self.gate_up, self.down, weights, experts, ops and ops.silu_and_mul)


# notebooks/00a_other_families.ipynb, cell 24
def is_sparse(config: PretrainedConfig, layer_idx: int) -> bool:
    """Whether layer layer_idx has experts (transformers' rule): not listed in mlp_only_layers, and on the
    decoder_sparse_step grid."""
    return (layer_idx not in config.mlp_only_layers and config.num_experts > 0
            and (layer_idx + 1) % config.decoder_sparse_step == 0)


# notebooks/00a_other_families.ipynb, cell 26
EXPERT_WEIGHT = re.compile(r"(.+\.mlp)\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight")


# notebooks/00a_other_families.ipynb, cell 26
def copy_expert(params: dict, name: str, tensor: torch.Tensor) -> tuple[str, int, str] | None:
    """One expert's projection into its slice of the stacked tensor: (block, expert, projection) loaded, or
    None for a tensor that is not an expert's."""
    match = EXPERT_WEIGHT.fullmatch(name)
    if match is None:
        return None
    block, expert, proj = match[1], int(match[2]), match[3]
    stacked = params.get(f"{block}.{'down' if proj == 'down_proj' else 'gate_up'}")
    if stacked is None or expert >= stacked.shape[0]:
        raise ValueError(f"the model has no parameter for {name!r}")
    target = stacked.data[expert]
    if proj != "down_proj":                                     # gate rows first, then up
        half = target.shape[0] // 2
        target = target[:half] if proj == "gate_proj" else target[half:]
    if target.shape != tensor.shape:
        raise ValueError(f"shape {tuple(tensor.shape)}, but the model's config makes it {tuple(target.shape)}")
    target.copy_(tensor)                                        # into the model's dtype
    return block, expert, proj


# notebooks/00a_other_families.ipynb, cell 27
class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    quantizable = False    # chapter 11 quantizes nn.Linear; the stacked experts are not: refused, not half done

    def __init__(self, config: PretrainedConfig):
        super().__init__(config)
        for i, layer in enumerate(self.model.layers):
            if is_sparse(config, i):
                layer.mlp = Qwen3MoeSparseBlock(config)

    def expected_shards(self, params: dict) -> set[tuple[str, int | None]]:
        return {p for p in super().expected_shards(params) if not p[0].endswith((".gate_up", ".down"))}

    def load_weights(self, weights) -> None:
        params, loaded = dict(self.named_parameters()), set()

        def not_experts(weights):                               # the experts into their slices, the rest on
            for name, tensor in weights:
                key = copy_expert(params, name, tensor)
                if key is None:
                    yield name, tensor
                else:
                    loaded.add(key)

        super().load_weights(not_experts(weights))
        blocks = [f"model.layers.{i}.mlp" for i, layer in enumerate(self.model.layers) if hasattr(layer.mlp, "gate_up")]
        missing = {(b, e, p) for b in blocks for e in range(self.config.num_experts)
                   for p in ("gate_proj", "up_proj", "down_proj")} - loaded
        if missing:
            raise ValueError(f"checkpoint has no weights for experts {sorted(missing)[:5]}")
