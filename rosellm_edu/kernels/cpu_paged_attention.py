# Generated from notebooks/04_paged_attention.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import functools

import torch

from rosellm_edu.kernels.build import build_cpp


# notebooks/04_paged_attention.ipynb, cell 54
@functools.cache
def extension():
    """The compiled kernel, or None where it cannot be built and the engine gathers the blocks instead."""
    return build_cpp("rosellm_edu_paged_decode", "paged_decode.cpp", ["paged_decode_attention"],
                     "decode attention gathers K/V blocks with PyTorch instead")


# notebooks/04_paged_attention.ipynb, cell 54
def paged_decode_attention_cpu(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                               block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """The same contract as the Triton kernel: q (seqs, heads, d); k_cache, v_cache (blocks, block_size, kv_heads, d);
    block_tables (seqs, max_blocks) int32, rows contiguous (a column slice is fine); context_lens (seqs,) int32,
    each >= 1. Returns (seqs, heads, d)."""
    return extension().paged_decode_attention(q.contiguous(), k_cache, v_cache, block_tables, context_lens, scale)
