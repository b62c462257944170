"""Worked solutions to chapter 12's exercises."""

import torch


def ngram_propose(token_ids: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    for n in range(min(max_n, len(token_ids) - 1), min_n - 1, -1):
        suffix = token_ids[-n:]
        for start in range(len(token_ids) - n - 1, -1, -1):          # latest first, never the suffix itself
            if token_ids[start:start + n] == suffix:
                return token_ids[start + n:start + n + k]
    return []


def accepted_length(alpha: float, k: int) -> float:
    # draft i is kept when it and every draft before it are accepted: probability alpha^i; the target's own token
    # always comes: 1 + alpha + ... + alpha^k
    return sum(alpha ** i for i in range(k + 1))


def leftover_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    left = (p - q).clamp_min(0)
    return left / left.sum()


SOLUTIONS = {"check_ngram_propose": ngram_propose, "check_accepted_length": accepted_length,
             "check_leftover_distribution": leftover_distribution}
