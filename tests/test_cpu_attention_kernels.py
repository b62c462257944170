"""Chapter 09's C++ attention kernel (varlen paged prefill, split-k decode) against the gathered reference, and the
engine that uses it against transformers."""

import re

import pytest
import torch

from conftest import assert_attention_matches_causal, hf_greedy, requires_avx2, scattered_kv
from rosellm_edu import LLM, SamplingParams
from rosellm_edu.kernels import cpu_attention
from rosellm_edu.kernels.build import build_cpp
from rosellm_edu.layers.paged_attention import (PagedAttention, gathered_attention, gathered_decode_attention,
                                                gathered_prefill_attention)

if cpu_attention.extension() is None:
    pytest.skip("the C++ kernel could not be built here (no compiler?)", allow_module_level=True)

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 5e-3}


def paged_batch(computed, new, block_size, heads, kv_heads, head_dim, dtype, seed):
    """Sequences with computed[i] cached and new[i] new positions, blocks shuffled in a pool whose unowned slots
    hold NaN (a read past a context poisons the output). Returns the kernel's inputs and the float32 reference."""
    g = torch.Generator().manual_seed(seed)
    lens = [c + n for c, n in zip(computed, new)]
    kv, tables = scattered_kv(lens, block_size, kv_heads, head_dim, g)
    kv = kv.to(dtype)
    clean = kv.float().nan_to_num(0.0)                  # the pool the kernel reads, without the NaN
    cu = torch.tensor([0] + new, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    q = torch.randn(int(cu[-1]), heads, head_dim, generator=g).to(dtype)
    context = torch.tensor(lens, dtype=torch.int32)
    padded = torch.zeros(len(new), max(new), heads, head_dim)
    for i, n in enumerate(new):
        padded[i, :n] = q[cu[i]:cu[i + 1]].float()
    ref = gathered_attention(padded, clean[0], clean[1], tables, context, torch.tensor(new))
    ref = torch.cat([ref[i, :n] for i, n in enumerate(new)])
    return (q, kv[0], kv[1], tables, context, cu), ref


def random_lengths(seed, seqs):
    g = torch.Generator().manual_seed(seed)
    new = torch.randint(1, 120, (seqs,), generator=g).tolist()
    computed = torch.randint(0, 200, (seqs,), generator=g).tolist()
    return [0, 0] + computed[2:], [1, 300] + new[2:]                       # a first decode, a long fresh prompt


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (9, 3), (4, 1)], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("block_size", [1, 7, 16])
def test_varlen_prefill_matches_gathered_reference(dtype, heads, kv_heads, block_size):
    computed, new = random_lengths(block_size * 10 + heads, 5)
    args, ref = paged_batch(computed, new, block_size, heads, kv_heads, 64, dtype, seed=block_size + heads)
    out = cpu_attention.paged_prefill_attention_cpu(*args, 64 ** -0.5)
    assert out.shape == args[0].shape and out.dtype == dtype
    torch.testing.assert_close(out.float(), ref, atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("tile, partition", [(1, 0), (1, 10), (5, 64), (3, 100), (32, 128), (64, 64), (16, 10_000)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tiles_and_forced_splits_give_the_same_attention(tile, partition, dtype):
    computed, new = [250, 0, 17, 100], [40, 33, 1, 64]                     # chunks at offsets, a prompt, a decode
    args, ref = paged_batch(computed, new, 16, 9, 3, 64, dtype, seed=tile)
    out = cpu_attention.paged_prefill_attention_cpu(*args, 64 ** -0.5, tile=tile, partition=partition)
    torch.testing.assert_close(out.float(), ref, atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [40, 128])                             # 40: the loops' scalar remainder path
def test_head_dims_that_are_not_64(head_dim, dtype):
    args, ref = paged_batch([30, 0], [1, 70], 16, 6, 2, head_dim, dtype, seed=head_dim)
    out = cpu_attention.paged_prefill_attention_cpu(*args, head_dim ** -0.5, partition=64)
    torch.testing.assert_close(out.float(), ref, atol=TOL[dtype], rtol=TOL[dtype])


@requires_avx2
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_avx2_decode_loops_match_the_gathered_reference(dtype):
    """Built without AVX-512, the decode loops run in 8-float registers; an AVX-512 machine runs the v16 loops
    natively, so this is where it tests the others (head_dim 64 and 128, a few rows per kv head)."""
    avx2 = build_cpp("rosellm_edu_paged_attention_avx2", "attention.cpp", ["varlen_attention"], "skipped",
                     extra_cflags=("-mno-avx512f",))
    for head_dim in (64, 128):
        args, ref = paged_batch([30, 200, 5], [1, 1, 3], 16, 9, 3, head_dim, dtype, seed=head_dim)
        q, k_cache, v_cache, tables, context, cu = args
        out = avx2.varlen_attention(q, k_cache, v_cache, tables, context, cu, head_dim ** -0.5, 1, 64)
        torch.testing.assert_close(out.float(), ref, atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("partition", [0, 64, 256])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_contract_matches_gathered_decode(partition, dtype):
    lens = [1, 16, 17, 300, 1000]
    args, _ = paged_batch([n - 1 for n in lens], [1] * len(lens), 16, 9, 3, 64, dtype, seed=partition)
    q, k_cache, v_cache, tables, context, _ = args
    out = cpu_attention.paged_decode_attention_cpu(q, k_cache, v_cache, tables, context, 64 ** -0.5,
                                                   partition=partition)
    clean_k, clean_v = k_cache.float().nan_to_num(0.0), v_cache.float().nan_to_num(0.0)
    ref = gathered_decode_attention(q.float(), clean_k, clean_v, tables, context, 64 ** -0.5)
    assert out.shape == q.shape and out.dtype == dtype
    torch.testing.assert_close(out.float(), ref, atol=TOL[dtype], rtol=TOL[dtype])


def test_gathered_fallback_has_the_kernels_contract():
    args, ref = paged_batch([0, 40, 9], [12, 5, 1], 4, 6, 2, 16, torch.float32, seed=3)
    q, k_cache, v_cache, tables, context, cu = args
    out = gathered_prefill_attention(q, k_cache.nan_to_num(0.0), v_cache.nan_to_num(0.0), tables, context, cu,
                                     16 ** -0.5)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_bad_inputs_get_errors_that_name_the_mistake():
    args, _ = paged_batch([0, 3], [4, 1], 4, 4, 2, 16, torch.float32, seed=0)
    q, k_cache, v_cache, tables, context, cu = args
    cases = [((q, k_cache, v_cache, tables.long(), context, cu), "int32"),
             ((q, k_cache, v_cache, tables, context, cu[:-1]), "seqs + 1"),
             ((q[:-1], k_cache, v_cache, tables, context, cu), "cu_query_lens[-1]"),
             ((q.double(), k_cache, v_cache, tables, context, cu), "share a dtype"),
             ((q[:, :3], k_cache, v_cache, tables, context, cu), "multiple of kv_heads"),
             ((q, k_cache, v_cache, tables[:, ::2], context, cu), "contiguous")]
    for bad, message in cases:
        with pytest.raises(RuntimeError, match=re.escape(message)):
            cpu_attention.paged_prefill_attention_cpu(*bad, 16 ** -0.5)


@pytest.mark.parametrize("cached, new", [([5, 0, 9, 2], [1, 7, 4, 1]), ([0, 3], [6, 9]), ([4, 8], [1, 1])],
                         ids=["mixed", "prefill only", "decode only"])
def test_paged_attention_attends_with_the_kernels(cached, new):
    tables = [[3, 7, 1, 12], [0, 2, 13], [9, 4, 5, 6], [11, 14]][:len(new)]
    assert_attention_matches_causal(PagedAttention, tables, cached, new)


def test_engine_with_chunked_prefill_still_equals_transformers(hf_model, embedded_dir):
    prompts = ["The history of computing is long. " * 6 + "In short,", "def fibonacci(n):", "Paris is the"]
    llm = LLM(str(embedded_dir), dtype="float32", max_num_batched_tokens=24, block_size=8)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    for out in llm.generate(prompts, params, use_tqdm=False):
        assert out.outputs[0].token_ids == hf_greedy(hf_model, out.prompt_token_ids, 6)


def test_without_the_cpu_kernel_prefill_falls_back_to_the_gather_and_agrees(monkeypatch):
    from rosellm_edu.layers import paged_attention

    monkeypatch.setattr(paged_attention.cpu_attention, "extension", lambda: None)
    assert paged_attention.prefill_kernel(torch.device("cpu")) is paged_attention.gathered_prefill_attention
    assert_attention_matches_causal(PagedAttention, [[3, 7, 1, 12], [0, 2, 13], [9, 4, 5, 6]], [5, 0, 9], [1, 7, 4])
