# Generated from notebooks/04_paged_attention.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import torch
import triton
import triton.language as tl


# notebooks/04_paged_attention.ipynb, cell 43
@triton.jit
def _online_softmax_step(m, l, acc, s, v):
    """Fold one block into the running max m (GROUP_PAD,), sum l (GROUP_PAD,) and weighted sum acc
    (GROUP_PAD, HEAD_DIM): s (GROUP_PAD, BLOCK_SIZE) are its scores (-inf for unused slots), v (BLOCK_SIZE, HEAD_DIM)
    its values."""
    m_new = tl.maximum(m, tl.max(s, axis=1))           # finite: every visited block has a valid token
    alpha = tl.exp(m - m_new)                          # rescales what was summed under the old max
    p = tl.exp(s - m_new[:, None])
    l = l * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
    return m_new, l, acc


# notebooks/04_paged_attention.ipynb, cell 45
@triton.jit
def _paged_decode_kernel(q_ptr, k_ptr, v_ptr, block_tables_ptr, context_lens_ptr, out_ptr, scale,
                         table_stride, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
                         BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr):
    # One program per (sequence, kv head): its whole query group shares each K/V block it loads.
    seq, kv_head = tl.program_id(0), tl.program_id(1)
    num_kv_heads = tl.num_programs(1)
    g = tl.arange(0, GROUP_PAD)                      # tl.arange needs a power of two; mask the padding rows
    d = tl.arange(0, HEAD_DIM)
    t = tl.arange(0, BLOCK_SIZE)
    g_mask = g < GROUP

    q_offs = (seq * num_kv_heads * GROUP + kv_head * GROUP + g)[:, None] * HEAD_DIM + d[None, :]
    q = tl.load(q_ptr + q_offs, mask=g_mask[:, None], other=0.0).to(tl.float32) * scale  # (GROUP_PAD, HEAD_DIM)

    context_len = tl.load(context_lens_ptr + seq)
    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)   # running max of the scores
    l = tl.zeros([GROUP_PAD], tl.float32)                  # running sum of exp(score - m)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)      # running sum of exp(score - m) * v
    for i in range(0, (context_len + BLOCK_SIZE - 1) // BLOCK_SIZE):
        # int64: block * block_size * kv_heads * head_dim overflows int32 in a large pool.
        block = tl.load(block_tables_ptr + seq * table_stride + i).to(tl.int64)
        valid = i * BLOCK_SIZE + t < context_len           # the last block may be partly filled
        kv_offs = ((block * BLOCK_SIZE + t) * num_kv_heads + kv_head)[:, None] * HEAD_DIM + d[None, :]
        k = tl.load(k_ptr + kv_offs).to(tl.float32)        # (BLOCK_SIZE, HEAD_DIM); stale rows' scores are masked below
        # Stale slots may hold NaN, and p = 0 would not cancel it: 0 * NaN is NaN.
        v = tl.load(v_ptr + kv_offs, mask=valid[:, None], other=0.0).to(tl.float32)
        # Broadcast-and-sum, not tl.dot: tl.dot wants at least 16 rows and a group is often 1 to 8.
        s = tl.sum(q[:, None, :] * k[None, :, :], axis=2)  # (GROUP_PAD, BLOCK_SIZE)
        s = tl.where(valid[None, :], s, float("-inf"))
        m, l, acc = _online_softmax_step(m, l, acc, s, v)

    out = acc / l[:, None]
    tl.store(out_ptr + q_offs, out.to(out_ptr.dtype.element_ty), mask=g_mask[:, None])


# notebooks/04_paged_attention.ipynb, cell 46
def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                           context_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """q: (seqs, heads, d); k_cache, v_cache: (blocks, block_size, kv_heads, d); block_tables: (seqs, max_blocks)
    int32; context_lens: (seqs,) int32, each >= 1. Returns (seqs, heads, d) in q's dtype."""
    num_seqs, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    assert k_cache.is_contiguous() and v_cache.is_contiguous(), "the kernel computes offsets for a contiguous pool"
    assert block_tables.stride(1) == 1, "block table rows must be contiguous (a column slice is fine)"
    q = q.contiguous()
    group = num_heads // num_kv_heads
    out = torch.empty_like(q)
    _paged_decode_kernel[(num_seqs, num_kv_heads)](
        q, k_cache, v_cache, block_tables, context_lens, out, scale, block_tables.stride(0),
        GROUP=group, GROUP_PAD=triton.next_power_of_2(group), BLOCK_SIZE=block_size, HEAD_DIM=head_dim)
    return out
