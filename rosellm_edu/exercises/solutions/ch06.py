"""Worked solutions to chapter 06's exercises."""

import math

import torch


def predict_kept(temperature: float) -> int:
    """How many tokens top-p 0.9 keeps of the logits -0.1 * i (i < 1000). After temperature, p_i is proportional
    to r**i with r = exp(-0.1 / temperature); the first j tokens hold 1 - r**j of the mass (r**1000 is
    negligible). Token j stays while the mass before it is below 0.9: r**j > 0.1, j < log(0.1) / log(r)."""
    r = math.exp(-0.1 / temperature)
    return math.floor(math.log(0.1) / math.log(r)) + 1


def batched_top_k_top_p(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                        top_p: torch.Tensor) -> torch.Tensor:
    """Each row's filtered distribution (B, V): temperature, its own top-k (<= 0 or >= V: off), renormalise,
    its own top-p (keeping the token that crosses p)."""
    batch, vocab_size = logits.shape
    k = torch.where((top_k > 0) & (top_k < vocab_size), top_k, vocab_size)[:, None]       # (B, 1)
    scaled = logits.float() / temperature[:, None]                                         # (B, V)
    sorted_logits, order = scaled.sort(dim=-1, descending=True)                            # (B, V)
    in_top_k = torch.arange(vocab_size) < k                                                # (B, V)
    probs = sorted_logits.masked_fill(~in_top_k, -torch.inf).softmax(dim=-1)               # renormalised top-k
    mass_before = probs.cumsum(dim=-1) - probs
    keep = in_top_k & ((mass_before < top_p[:, None]) | (top_p[:, None] >= 1))
    probs = probs * keep
    probs = probs / probs.sum(dim=-1, keepdim=True)
    return torch.zeros_like(probs).scatter(-1, order, probs)                               # back to vocab order


def exponential_race(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One index per row of probs (B, K), drawn with probability probs / probs.sum(): argmax(probs / Exp(1))."""
    noise = torch.empty_like(probs).exponential_(generator=generator)   # (B, K) Exp(1) numbers
    return (probs / noise).argmax(dim=-1)


SOLUTIONS = {
    "check_top_p_prediction": predict_kept,
    "check_batched_top_k_top_p": batched_top_k_top_p,
    "check_exponential_race": exponential_race,
}
