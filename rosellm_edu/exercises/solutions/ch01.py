"""Worked solutions to chapter 01's exercises."""

import torch


def top_k(logits: torch.Tensor, k: int) -> torch.Tensor:      # (vocab,) -> (vocab,)
    if k <= 0 or k >= logits.shape[-1]:
        return logits                                          # off: keep every token
    kth_largest = logits.topk(k).values[-1]
    return logits.masked_fill(logits < kth_largest, float("-inf"))


def top_p(logits: torch.Tensor, p: float) -> torch.Tensor:    # (vocab,) -> (vocab,)
    sorted_logits, order = logits.sort(descending=True)
    probs = sorted_logits.softmax(-1)
    mass_before = probs.cumsum(-1) - probs                      # the mass of the tokens more likely than this one
    keep_sorted = mass_before < p                               # so the token that crosses p is kept
    keep = torch.zeros_like(keep_sorted)
    keep[order] = keep_sorted                                   # back to vocabulary order
    return logits.masked_fill(~keep, float("-inf"))


def cut_at_stop(text: str, stops: list[str]) -> tuple[str, str | None]:
    found = [(text.find(s), s) for s in stops if s in text]
    if not found:
        return text, None
    index, stop = min(found)                                    # the earliest in the text
    return text[:index], stop


SOLUTIONS = {"check_top_k": top_k, "check_top_p": top_p, "check_cut_at_stop": cut_at_stop}
