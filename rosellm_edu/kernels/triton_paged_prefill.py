# Generated from notebooks/09_attention_kernels.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import functools

import torch
import triton
import triton.language as tl

from rosellm_edu.kernels.triton_paged_attention import _online_softmax_step, paged_decode_attention


# notebooks/09_attention_kernels.ipynb, cell 71
@triton.jit
def _load_kv_tile(k_ptr, v_ptr, table_row, keys, key_ok, kv_head, NUM_KV_HEADS: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                  HEAD_DIM: tl.constexpr):
    """K and V of positions keys (BLOCK_N,) of one sequence (its table row at table_row), each (BLOCK_N, HEAD_DIM);
    zeros where key_ok is False. Each key finds its block through the table: a tile may span several blocks."""
    block = tl.load(table_row + keys // BLOCK_SIZE, mask=key_ok, other=0)
    slot = block.to(tl.int64) * BLOCK_SIZE + keys % BLOCK_SIZE        # int64: a large pool overflows int32 offsets
    offs = (slot * NUM_KV_HEADS + kv_head)[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
    k = tl.load(k_ptr + offs, mask=key_ok[:, None], other=0.0)
    v = tl.load(v_ptr + offs, mask=key_ok[:, None], other=0.0)
    return k, v


# notebooks/09_attention_kernels.ipynb, cell 71
@triton.jit
def _online_softmax_tile(m, l, acc, s, v, PRECISION: tl.constexpr):
    """Chapter 04's online-softmax step for a tile of rows: m, l (BLOCK_M,), acc (BLOCK_M, HEAD_DIM) in float32,
    s (BLOCK_M, BLOCK_N) scores (-inf where hidden), v (BLOCK_N, HEAD_DIM). p @ v is a matrix product (tl.dot)."""
    m_new = tl.maximum(m, tl.max(s, axis=1))    # finite: every real row sees key 0 in the first tile
    alpha = tl.exp(m - m_new)
    p = tl.exp(s - m_new[:, None])
    l = l * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, l, acc


# notebooks/09_attention_kernels.ipynb, cell 72
@triton.jit
def _paged_prefill_kernel(q_ptr, k_ptr, v_ptr, block_tables_ptr, context_lens_ptr, cu_query_lens_ptr, tile_seq_ptr,
                          out_ptr, scale, table_stride, NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr,
                          BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                          BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    # One program per (query tile, query head): BLOCK_M new tokens of one sequence against its keys, BLOCK_N at a time.
    tile, head = tl.program_id(0), tl.program_id(1)
    seq = tl.load(tile_seq_ptr + tile)
    q_start = tl.load(cu_query_lens_ptr + seq)
    query_len = tl.load(cu_query_lens_ptr + seq + 1) - q_start
    first_row = (tile - (q_start // BLOCK_M + seq)) * BLOCK_M   # the tile's first query row in its sequence
    if first_row >= query_len:                                   # a spare tile of the upper bound: nothing to do
        return
    context_len = tl.load(context_lens_ptr + seq)
    rows = first_row + tl.arange(0, BLOCK_M)
    pos = context_len - query_len + rows                         # (BLOCK_M,) each query's position
    q_offs = ((q_start + rows).to(tl.int64) * NUM_HEADS + head)[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
    q = tl.load(q_ptr + q_offs, mask=(rows < query_len)[:, None], other=0.0)   # (BLOCK_M, HEAD_DIM)

    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    kv_end = context_len - query_len + tl.minimum(first_row + BLOCK_M, query_len)  # causal: the tile's last row
    for start in range(0, kv_end, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        k, v = _load_kv_tile(k_ptr, v_ptr, block_tables_ptr + seq * table_stride, keys, keys < kv_end,
                             head // (NUM_HEADS // NUM_KV_HEADS), NUM_KV_HEADS, BLOCK_SIZE, HEAD_DIM)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale   # (BLOCK_M, BLOCK_N) in float32
        s = tl.where(keys[None, :] <= pos[:, None], s, float("-inf"))   # causal (also hides keys >= kv_end)
        m, l, acc = _online_softmax_tile(m, l, acc, s, v, PRECISION)
    out = acc / l[:, None]
    tl.store(out_ptr + q_offs, out.to(out_ptr.dtype.element_ty), mask=(rows < query_len)[:, None])


# notebooks/09_attention_kernels.ipynb, cell 74
def _check_paged(q, k_cache, v_cache, block_tables, context_lens):
    """The checks both kernels share; raises ValueError naming what is wrong."""
    if k_cache.shape != v_cache.shape or k_cache.dim() != 4:
        raise ValueError(f"k_cache and v_cache must both be (blocks, block_size, kv_heads, head_dim), got "
                         f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("k_cache and v_cache must be contiguous: the kernels compute offsets for a contiguous pool")
    _, block_size, num_kv_heads, head_dim = k_cache.shape
    if q.dim() != 3 or q.shape[2] != head_dim or q.shape[1] % num_kv_heads:
        raise ValueError(f"q must be (rows, heads, {head_dim}) with heads a multiple of kv_heads={num_kv_heads}, "
                         f"got {tuple(q.shape)}")
    if head_dim & (head_dim - 1) or block_size & (block_size - 1):
        raise ValueError(f"head_dim ({head_dim}) and block_size ({block_size}) must be powers of two")
    if block_tables.dtype != torch.int32 or context_lens.dtype != torch.int32:
        raise ValueError(f"block_tables and context_lens must be int32, got {block_tables.dtype}, {context_lens.dtype}")
    if block_tables.dim() != 2 or block_tables.stride(1) != 1:
        raise ValueError("block_tables must be (seqs, width) with contiguous rows (a column slice is fine)")
    if context_lens.shape != (block_tables.shape[0],):
        raise ValueError(f"context_lens must be ({block_tables.shape[0]},), one per block table row, "
                         f"got {tuple(context_lens.shape)}")


# notebooks/09_attention_kernels.ipynb, cell 75
def paged_prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                            context_lens: torch.Tensor, cu_query_lens: torch.Tensor, scale: float,
                            block_m: int = 64, block_n: int = 64) -> torch.Tensor:
    """Causal attention for packed new tokens, K/V read in place. q: (tokens, heads, d), sequence i's rows
    cu_query_lens[i] .. cu_query_lens[i+1] - 1, its query j at position context_lens[i] - query_len_i + j;
    k_cache, v_cache: (blocks, block_size, kv_heads, d), the new tokens' K/V already written; block_tables:
    (seqs, width) int32; context_lens: (seqs,) int32; cu_query_lens: (seqs + 1,) int32. Returns (tokens, heads, d)."""
    _check_paged(q, k_cache, v_cache, block_tables, context_lens)
    num_seqs = block_tables.shape[0]
    if cu_query_lens.dtype != torch.int32 or cu_query_lens.shape != (num_seqs + 1,):
        raise ValueError(f"cu_query_lens must be int32 of shape ({num_seqs + 1},), got "
                         f"{cu_query_lens.dtype} {tuple(cu_query_lens.shape)}")
    if min(block_m, block_n, q.shape[-1]) < 16:
        raise ValueError("block_m, block_n and head_dim must be at least 16 (tl.dot's smallest tile)")
    num_tokens, num_heads, head_dim = q.shape
    q = q.contiguous()
    out = torch.empty_like(q)
    # Sequence i owns tiles cu[i] // block_m + i .. cu[i+1] // block_m + i: enough for its rows, and the total,
    # tokens // block_m + seqs, is known without reading cu_query_lens back from the device.
    num_tiles = num_tokens // block_m + num_seqs
    tiles_per_seq = cu_query_lens[1:] // block_m - cu_query_lens[:-1] // block_m + 1
    seq_ids = torch.arange(num_seqs, device=q.device, dtype=torch.int32)
    tile_seq = torch.repeat_interleave(seq_ids, tiles_per_seq, output_size=num_tiles)   # (num_tiles,)
    _paged_prefill_kernel[(num_tiles, num_heads)](
        q, k_cache, v_cache, block_tables, context_lens, cu_query_lens, tile_seq, out, scale,
        block_tables.stride(0), NUM_HEADS=num_heads, NUM_KV_HEADS=k_cache.shape[2], BLOCK_SIZE=k_cache.shape[1],
        HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",   # float32 stays exact; tf32 only affects float32
        num_warps=8 if block_m * block_n * head_dim > 64 * 32 * 64 else 4)   # 4 warps spill registers on 64x64x64
    return out


# notebooks/09_attention_kernels.ipynb, cell 77
@triton.jit
def _paged_decode_split_kernel(q_ptr, k_ptr, v_ptr, block_tables_ptr, context_lens_ptr, m_ptr, l_ptr, acc_ptr, scale,
                               table_stride, NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr,
                               GROUP_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr):
    # One program per (sequence, kv head, split): chapter 04's loop over one slice of the sequence's blocks.
    seq, kv_head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    num_splits = tl.num_programs(2)
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, HEAD_DIM)
    head = seq * NUM_KV_HEADS * GROUP + kv_head * GROUP + g      # (GROUP_PAD,) rows of q viewed as (seqs * heads, d)
    q = tl.load(q_ptr + head[:, None] * HEAD_DIM + d[None, :], mask=(g < GROUP)[:, None], other=0.0)
    q = q.to(tl.float32) * scale                                           # (GROUP_PAD, HEAD_DIM)

    context_len = tl.load(context_lens_ptr + seq)
    num_blocks = tl.cdiv(context_len, BLOCK_SIZE)
    per_split = tl.cdiv(num_blocks, num_splits)                            # this sequence's blocks per split
    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    for i in range(split * per_split, tl.minimum((split + 1) * per_split, num_blocks)):   # may be empty
        keys = i * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        valid = keys < context_len                                         # the last block may be partly filled
        k, v = _load_kv_tile(k_ptr, v_ptr, block_tables_ptr + seq * table_stride, keys, valid, kv_head,
                             NUM_KV_HEADS, BLOCK_SIZE, HEAD_DIM)           # (BLOCK_SIZE, HEAD_DIM) each
        s = tl.sum(q[:, None, :] * k.to(tl.float32)[None, :, :], axis=2)   # (GROUP_PAD, BLOCK_SIZE)
        s = tl.where(valid[None, :], s, float("-inf"))
        m, l, acc = _online_softmax_step(m, l, acc, s, v.to(tl.float32))
    # Unnormalised partials: an empty split leaves m = -inf, l = 0, acc = 0, which the merge weighs by 0.
    part = head * num_splits + split                                       # (GROUP_PAD,) rows of (seqs*heads, splits)
    tl.store(m_ptr + part, m, mask=g < GROUP)
    tl.store(l_ptr + part, l, mask=g < GROUP)
    tl.store(acc_ptr + part[:, None] * HEAD_DIM + d[None, :], acc, mask=(g < GROUP)[:, None])


# notebooks/09_attention_kernels.ipynb, cell 78
@triton.jit
def _merge_splits_kernel(m_ptr, l_ptr, acc_ptr, out_ptr, num_splits, SPLITS_PAD: tl.constexpr,
                         HEAD_DIM: tl.constexpr):
    # One program per (sequence, head): rescale every split's sums to the common max, add, divide once.
    # num_splits is an argument, not a constant: a new split count compiles nothing, only a new power of two does.
    row = tl.program_id(0)
    s = tl.arange(0, SPLITS_PAD)
    d = tl.arange(0, HEAD_DIM)
    ok = s < num_splits
    m = tl.load(m_ptr + row * num_splits + s, mask=ok, other=float("-inf"))   # (SPLITS_PAD,)
    l = tl.load(l_ptr + row * num_splits + s, mask=ok, other=0.0)
    acc = tl.load(acc_ptr + (row * num_splits + s)[:, None] * HEAD_DIM + d[None, :], mask=ok[:, None], other=0.0)
    w = tl.exp(m - tl.max(m, axis=0))          # split 0 is never empty, so the max is finite; empty splits weigh 0
    out = tl.sum(w[:, None] * acc, axis=0) / tl.sum(w * l, axis=0)             # (HEAD_DIM,)
    tl.store(out_ptr + row * HEAD_DIM + d, out.to(out_ptr.dtype.element_ty))


# notebooks/09_attention_kernels.ipynb, cell 79
PROGRAMS_PER_SM = 4   # enough programs in flight per SM to keep its loads overlapping


# notebooks/09_attention_kernels.ipynb, cell 79
@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


# notebooks/09_attention_kernels.ipynb, cell 79
def choose_num_splits(num_seqs: int, num_kv_heads: int, max_blocks: int, num_sms: int) -> int:
    """Splits per sequence so that seqs * kv_heads * splits programs fill num_sms SMs, with every split
    owning at least one block of the widest table. 1 when the batch fills the GPU by itself."""
    wanted = triton.cdiv(PROGRAMS_PER_SM * num_sms, num_seqs * num_kv_heads)
    return max(1, min(wanted, max_blocks))


# notebooks/09_attention_kernels.ipynb, cell 80
def paged_decode_attention_split_k(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                   block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float,
                                   num_splits: int | None = None, max_context_len: int | None = None) -> torch.Tensor:
    """Chapter 04's decode contract, each sequence's blocks split among num_splits programs (flash-decoding).
    q: (seqs, heads, d); k_cache, v_cache: (blocks, block_size, kv_heads, d); block_tables: (seqs, width) int32;
    context_lens: (seqs,) int32, each >= 1. num_splits: None picks it from the batch and the GPU's SMs, at most one
    per block of max_context_len (the longest context, if the caller knows it; else the table's width)."""
    _check_paged(q, k_cache, v_cache, block_tables, context_lens)
    num_seqs, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    if num_seqs != block_tables.shape[0]:
        raise ValueError(f"q must hold one query per sequence: {num_seqs} rows for {block_tables.shape[0]} tables")
    if num_splits is None and not q.is_cuda:   # off a GPU the kernels only run in Triton's interpreter, for checks
        num_splits = 1
    if num_splits is None:
        blocks = block_tables.shape[1] if max_context_len is None else triton.cdiv(max_context_len, k_cache.shape[1])
        num_splits = choose_num_splits(num_seqs, num_kv_heads, blocks, _sm_count(q.device.index or 0))
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    if num_splits == 1:   # the batch fills the GPU: chapter 04's kernel, no partials to merge
        return paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale)
    q = q.contiguous()
    group = num_heads // num_kv_heads
    m = torch.empty(num_seqs, num_heads, num_splits, device=q.device, dtype=torch.float32)
    l = torch.empty_like(m)
    acc = torch.empty(num_seqs, num_heads, num_splits, head_dim, device=q.device, dtype=torch.float32)
    _paged_decode_split_kernel[(num_seqs, num_kv_heads, num_splits)](
        q, k_cache, v_cache, block_tables, context_lens, m, l, acc, scale, block_tables.stride(0),
        NUM_KV_HEADS=num_kv_heads, GROUP=group, GROUP_PAD=triton.next_power_of_2(group), BLOCK_SIZE=k_cache.shape[1],
        HEAD_DIM=head_dim)
    out = torch.empty_like(q)
    _merge_splits_kernel[(num_seqs * num_heads,)](m, l, acc, out, num_splits,
                                                  SPLITS_PAD=triton.next_power_of_2(num_splits), HEAD_DIM=head_dim)
    return out
