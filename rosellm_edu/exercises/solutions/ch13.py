"""Worked solutions to chapter 13's exercises."""

import torch


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    vocab = logits.shape[1]
    bits = (bitmask[:, :, None] >> torch.arange(32, dtype=torch.int32)) & 1       # (B, words, 32)
    allowed = bits.flatten(1)[:, :vocab].bool()                                   # (B, V)
    logits.masked_fill_(~allowed, float("-inf"))


def bitmask_bytes(rows: int, vocab_size: int) -> int:
    return rows * -(-vocab_size // 32) * 4          # one 32-bit word per 32 tokens, rounded up, per row


def choice_allowed(prefix: str, choices: list[str], token_texts: list[str]) -> list[int]:
    return [i for i, t in enumerate(token_texts) if t and any(c.startswith(prefix + t) for c in choices)]


SOLUTIONS = {"check_apply_bitmask": apply_bitmask, "check_bitmask_bytes": bitmask_bytes,
             "check_choice_allowed": choice_allowed}
