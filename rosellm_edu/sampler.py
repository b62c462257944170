# Generated from notebooks/01_token_generation.ipynb by `python -m rosellm_edu.export`.
# Edit the notebook, not this file.

import torch

from rosellm_edu.sampling_params import SamplingParams


def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return logits / temperature


def apply_top_k(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Keep the top_k largest logits of the last dimension; top_k <= 0 or >= vocab keeps everything."""
    if top_k <= 0 or top_k >= logits.shape[-1]:
        return logits
    kth_largest = logits.topk(top_k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth_largest, float("-inf"))


def apply_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the most likely tokens until their mass reaches top_p, including the token that crosses it."""
    if top_p >= 1.0:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    remove_sorted = mass_before >= top_p                  # the first token always stays
    remove = remove_sorted.scatter(-1, order, remove_sorted)
    return logits.masked_fill(remove, float("-inf"))


def filtered_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, then top-k, then top-p (on the renormalised top-k distribution). Greedy keeps the argmax."""
    if params.greedy:
        return torch.full_like(logits, float("-inf"), dtype=torch.float32).scatter(-1, logits.argmax(-1, keepdim=True), 0.0)
    logits = apply_temperature(logits.float(), params.temperature)
    return apply_top_p(apply_top_k(logits, params.top_k), params.top_p)


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row of logits (rows, vocab) -> (rows,), all rows with the same params."""
    if params.greedy:
        return logits.argmax(dim=-1)
    probs = filtered_logits(logits, params).softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def sample_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None) -> int:
    """Pick the next token from one row of logits (vocab,)."""
    return int(sample(logits[None], params, generator)[0])
