"""Worked solutions to chapter 05's exercises."""

import torch

from rosellm_edu.benchmarks.launches import ALLOCATIONS


def padded_size(num_seqs: int, max_num_seqs: int) -> int:
    """The smallest bucket (1, 2, 4, then multiples of 8 below max_num_seqs, then max_num_seqs) >= num_seqs."""
    for bucket in (1, 2, 4):
        if num_seqs <= bucket < max_num_seqs:
            return bucket
    multiple_of_8 = -(-num_seqs // 8) * 8          # round up to a multiple of 8
    return min(multiple_of_8, max_num_seqs)


def predict_padded_rows(output_lens, max_num_seqs):
    # All arrive together and fit in the seats: step 0 prefills every prompt (eager, no graph); in step t >= 1
    # the requests that want more than t tokens decode, one row each.
    padded = 0
    for step in range(1, max(output_lens)):
        live = sum(n > step for n in output_lens)
        padded += padded_size(live, max_num_seqs) - live
    return padded


def decode_inputs(tokens, positions, tables, rows, block_size, scratch_block) -> dict[str, torch.Tensor]:
    """The static inputs of one decode step, padded to `rows` rows."""
    pad = rows - len(tokens)
    width = max(len(t) for t in tables)
    slots = [table[p // block_size] * block_size + p % block_size for table, p in zip(tables, positions)]
    return {
        "input_ids": torch.tensor(tokens + [0] * pad),
        "positions": torch.tensor(positions + [0] * pad),
        "slot_mapping": torch.tensor(slots + [scratch_block * block_size] * pad),
        "context_lens": torch.tensor([p + 1 for p in positions] + [1] * pad, dtype=torch.int32),
        "block_tables": torch.tensor([t + [scratch_block] * (width - len(t)) for t in tables]
                                     + [[scratch_block] * width] * pad, dtype=torch.int32),
    }


def is_view(op) -> bool:
    """A return that aliases an input without writing it: a new shape over the same memory."""
    return any(r.alias_info is not None and not r.alias_info.is_write for r in op._schema.returns)


def count_launches(ops) -> tuple[int, int]:
    """(kernels, views): an in-place op writes its input, so it computes; allocations launch nothing."""
    views = sum(is_view(op) for op in ops)
    kernels = sum(not is_view(op) and op not in ALLOCATIONS for op in ops)
    return kernels, views


SOLUTIONS = {"check_padded_rows": predict_padded_rows, "check_decode_inputs": decode_inputs,
             "check_count_launches": count_launches}
