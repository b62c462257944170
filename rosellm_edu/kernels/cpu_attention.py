# Generated from notebooks/09_attention_kernels.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import functools

import torch

from rosellm_edu.kernels.build import build_cpp


# notebooks/09_attention_kernels.ipynb, cell 44
@functools.cache
def extension():
    """The compiled kernel (chapter 04's build_cpp), or None where it cannot be built and attention falls back
    to chapter 04's kernel and the gather."""
    return build_cpp("rosellm_edu_paged_attention_v2", "attention.cpp", ["varlen_attention"],
                     "attention falls back to chapter 04's kernel and the gather, which are slower")


# notebooks/09_attention_kernels.ipynb, cell 45
def paged_prefill_attention_cpu(q, k_cache, v_cache, block_tables, context_lens, cu_query_lens, scale: float, *,
                                tile: int = 32, partition: int = 0) -> torch.Tensor:
    """q (tokens, heads, d) packed: sequence i's new tokens are rows cu_query_lens[i] .. cu_query_lens[i+1]-1,
    the last positions of its context_lens[i] (causal). k_cache, v_cache (blocks, block_size, kv_heads, d);
    block_tables (seqs, width) int32, rows contiguous. tile: queries per work item; partition: keys per split
    (0: split only when the cores would idle). Returns (tokens, heads, d)."""
    return extension().varlen_attention(q.contiguous(), k_cache, v_cache, block_tables, context_lens.contiguous(),
                                        cu_query_lens.contiguous(), scale, tile, partition)


# notebooks/09_attention_kernels.ipynb, cell 45
def paged_decode_attention_cpu(q, k_cache, v_cache, block_tables, context_lens, scale: float, *,
                               partition: int = 0) -> torch.Tensor:
    """Chapter 04's decode contract, q (seqs, heads, d): one query per sequence, keys split when cores idle."""
    cu_query_lens = torch.arange(q.shape[0] + 1, dtype=torch.int32)
    return paged_prefill_attention_cpu(q, k_cache, v_cache, block_tables, context_lens, cu_query_lens, scale,
                                       tile=1, partition=partition)
