"""Worked solutions to chapter 04's exercises."""

import torch

from rosellm_edu.engine.block_manager import chain_hash


def slots(block_table: list[int], block_size: int, start: int, end: int) -> list[int]:
    # position p sits in logical block p // block_size, at offset p % block_size inside it
    return [block_table[p // block_size] * block_size + p % block_size for p in range(start, end)]


def block_keys(token_ids: list[int], block_size: int) -> list[bytes]:
    keys, prev = [], None
    for start in range(0, len(token_ids) - block_size + 1, block_size):     # full blocks only
        prev = chain_hash(prev, tuple(token_ids[start:start + block_size]))  # the key stands for the whole prefix
        keys.append(prev)
    return keys


def merge(m1, l1, acc1, m2, l2, acc2):   # (heads,), (heads,), (heads, d) twice -> the same three
    m = torch.maximum(m1, m2)
    a1, a2 = (m1 - m).exp(), (m2 - m).exp()   # rescale each part to the common maximum; an empty part gives 0
    return m, l1 * a1 + l2 * a2, acc1 * a1[:, None] + acc2 * a2[:, None]


SOLUTIONS = {"check_slots": slots, "check_block_keys": block_keys, "check_merge": merge}
