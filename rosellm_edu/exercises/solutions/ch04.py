"""Worked solutions to chapter 04's exercises."""

import torch

from rosellm_edu.engine.block_manager import chain_hash


def predicted_prompt_tokens(prefix_caching: bool, together: bool) -> int:
    prompt, block = 22 + 10, 8
    if not prefix_caching or together:   # sent together, all four begin before any block of theirs is computed
        return 4 * prompt
    shared = 22 // block * block         # the common tokens fill 2 whole blocks: 16 tokens are hits
    repeat = prompt - (prompt - 1) // block * block   # 4 full blocks, but the last token is never a hit: 3 are
    return prompt + 2 * (prompt - shared) + repeat    # 32 + 2 * 16 + 8 = 72


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


SOLUTIONS = {"check_prompt_tokens": predicted_prompt_tokens, "check_block_keys": block_keys, "check_merge": merge}
