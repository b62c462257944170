"""Worked solutions to chapter 01's exercises."""

import torch


def positions_computed(prompt_tokens: int, new_tokens: int) -> int:
    # Step k (k = 0 .. new_tokens - 1) runs the model over the prompt and the k tokens generated before it.
    return sum(prompt_tokens + k for k in range(new_tokens))   # = n * p + n * (n - 1) / 2


def top_p(logits: torch.Tensor, p: float) -> torch.Tensor:    # (vocab,) -> (vocab,)
    if p >= 1.0:                                                # off: a float32 running sum can pass 1.0 early
        return logits
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


SOLUTIONS = {"check_positions_computed": positions_computed, "check_top_p": top_p, "check_cut_at_stop": cut_at_stop}
