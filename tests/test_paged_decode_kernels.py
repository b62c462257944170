"""The paged-decode kernels (Triton for GPUs, C++ for CPUs) against PyTorch attention over gathered blocks.
Without a GPU the Triton kernel runs in Triton's interpreter (conftest.py)."""

import importlib.util

import pytest
import torch

from conftest import scattered_kv
from rosellm_edu.kernels import cpu_paged_attention
from rosellm_edu.layers.attention import grouped_attention

BLOCK_SIZE, HEAD_DIM = 16, 64


def random_paged_batch(num_seqs, num_heads, num_kv_heads, dtype, device, g):
    # One token, an exact block multiple and a partly filled last block, then random lengths.
    lens = [1, 3 * BLOCK_SIZE, 2 * BLOCK_SIZE + 5] + torch.randint(1, 100, (num_seqs,), generator=g).tolist()
    lens = lens[:num_seqs]
    kv, block_tables = scattered_kv(lens, BLOCK_SIZE, num_kv_heads, HEAD_DIM, g, spare_blocks=3, spare_columns=0)
    q = torch.randn(num_seqs, num_heads, HEAD_DIM, generator=g)
    k_cache, v_cache = kv
    context_lens = torch.tensor(lens, dtype=torch.int32)
    return [t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype)
            for t in (q, k_cache, v_cache, block_tables, context_lens)]


def decode_kernel(name: str):
    """The kernel and the device it runs on; skips where it cannot run."""
    if name == "triton":
        if importlib.util.find_spec("triton") is None:
            pytest.skip("triton is not installed")
        from rosellm_edu.kernels.triton_paged_attention import paged_decode_attention
        return paged_decode_attention, "cuda" if torch.cuda.is_available() else "cpu"
    if cpu_paged_attention.extension() is None:
        pytest.skip("the C++ kernel could not be built here (no compiler?)")
    return cpu_paged_attention.paged_decode_attention_cpu, "cpu"


def reference(q, k_cache, v_cache, block_tables, context_lens):
    """Gather each sequence's K/V through its block table and attend in float32."""
    outs = []
    for i, n in enumerate(context_lens.tolist()):
        blocks = block_tables[i, :-(-n // BLOCK_SIZE)].long()
        k = k_cache[blocks].flatten(0, 1)[:n].float()      # (n, kv_heads, head_dim)
        v = v_cache[blocks].flatten(0, 1)[:n].float()
        outs.append(grouped_attention(q[i, None, None].float(), k[None], v[None], None)[0, 0])
    return torch.stack(outs)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("num_seqs, num_heads, num_kv_heads", [(3, 4, 4), (4, 9, 3), (4, 4, 1)],
                         ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("kernel", ["triton", "cpu"])
def test_paged_decode_attention_matches_gathered_reference(kernel, num_seqs, num_heads, num_kv_heads, dtype, tol):
    paged_decode_attention, device = decode_kernel(kernel)
    g = torch.Generator().manual_seed(num_seqs * 100 + num_heads * 10 + num_kv_heads)
    q, k_cache, v_cache, block_tables, context_lens = random_paged_batch(
        num_seqs, num_heads, num_kv_heads, dtype, device, g)
    out = paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, HEAD_DIM ** -0.5)
    assert out.shape == q.shape and out.dtype == dtype
    torch.testing.assert_close(out.float(), reference(q, k_cache, v_cache, block_tables, context_lens),
                               atol=tol, rtol=tol)
