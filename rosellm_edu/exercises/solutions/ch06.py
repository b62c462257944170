"""Worked solutions to chapter 06's exercises."""

import torch


def keep_mask(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> tuple[list[int], float]:
    """The sorted ids a token of this row is drawn from after top-k then top-p, and log Z, the log of the softmax
    mass (after temperature) they keep. logits (V,)."""
    scaled = logits.float() / temperature                          # (V,)
    vocab_size = scaled.shape[0]
    k = top_k if 0 < top_k < vocab_size else vocab_size
    top, ids = scaled.topk(k)                                      # (k,) sorted, most likely first
    probs = top.softmax(dim=-1)                                    # top-k renormalises over the top k
    mass_before = probs.cumsum(dim=-1) - probs
    kept = mass_before < top_p if top_p < 1 else torch.ones(k, dtype=torch.bool)  # the crossing token stays
    log_z = top[kept].logsumexp(dim=-1) - scaled.logsumexp(dim=-1)
    return sorted(ids[kept].tolist()), log_z.item()


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
    "check_sampling_mask": keep_mask,
    "check_batched_top_k_top_p": batched_top_k_top_p,
    "check_exponential_race": exponential_race,
}
