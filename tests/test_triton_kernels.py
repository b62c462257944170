"""Chapter 09's Triton kernels (varlen paged prefill, split-k decode) against the gathered reference.
Without a GPU they run in Triton's interpreter (conftest.py sets TRITON_INTERPRET=1): shapes stay small."""

import importlib.util

import pytest
import torch

from conftest import scattered_kv
from rosellm_edu.layers.paged_attention import gathered_attention

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

from rosellm_edu.kernels.triton_paged_attention import paged_decode_attention  # noqa: E402
from rosellm_edu.kernels.triton_paged_prefill import (  # noqa: E402
    PROGRAMS_PER_SM, choose_num_splits, paged_decode_attention_split_k, paged_prefill_attention)

HEAD_DIM = 64
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 2e-2}
# Triton 3.9's interpreter multiplies bfloat16 tl.dot operands as their raw uint16 bits (numpy has no bfloat16), so
# the prefill kernel's half-precision path is checked in float16 on the CPU, and in bfloat16 too on a GPU.
PREFILL_DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE == "cuda" else [])


def paged_batch(computed, new, block_size, heads, kv_heads, dtype, seed):
    """Sequences with computed[i] cached positions and new[i] new tokens, their blocks scattered in a pool.
    Returns the kernels' inputs (q packed (tokens, heads, d); slots no sequence owns hold NaN, so a kernel that
    reads past a context fails) and a clean float32 copy of the pool for the reference."""
    g = torch.Generator().manual_seed(seed)
    lens = [c + n for c, n in zip(computed, new)]
    kv, tables = scattered_kv(lens, block_size, kv_heads, HEAD_DIM, g)
    kv = kv.to(dtype)
    clean = kv.float().nan_to_num(0.0)                  # the pool the kernels read, without the NaN
    k_cache, v_cache = kv
    q = torch.randn(sum(new), heads, HEAD_DIM, generator=g).to(dtype)
    cu = torch.tensor([0, *torch.tensor(new).cumsum(0).tolist()], dtype=torch.int32)
    to = lambda t: t.to(DEVICE)  # noqa: E731
    inputs = [to(t) for t in (q, k_cache, v_cache, tables, torch.tensor(lens, dtype=torch.int32), cu)]
    return inputs, [to(t) for t in clean]


def reference(q, k_clean, v_clean, tables, context_lens, cu):
    """gathered_attention on the clean pool, in float32, with the packed rows padded per sequence and unpacked."""
    query_lens = cu[1:] - cu[:-1]
    rows = [torch.arange(a, b) for a, b in zip(cu[:-1].tolist(), cu[1:].tolist())]
    padded = torch.nn.utils.rnn.pad_sequence([q[r].float() for r in rows], batch_first=True)  # (seqs, max_new, h, d)
    out = gathered_attention(padded, k_clean, v_clean, tables, context_lens, query_lens)
    return torch.cat([out[i, :len(r)] for i, r in enumerate(rows)])


CASES = {   # (computed, new) per sequence: query lengths 1..70 at several context offsets
    "mixed": ([0, 5, 40, 3], [70, 1, 17, 16]),
    "one-each": ([0, 9, 31], [1, 1, 1]),
    "long-context": ([90, 0], [7, 20]),
}


@pytest.mark.parametrize("dtype", PREFILL_DTYPES, ids=str)
@pytest.mark.parametrize("heads, kv_heads", [(9, 3), (4, 4)], ids=["gqa", "mha"])
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("case", CASES)
def test_prefill_matches_gathered_reference(case, block_size, heads, kv_heads, dtype):
    inputs, (k_clean, v_clean) = paged_batch(*CASES[case], block_size, heads, kv_heads, dtype, seed=block_size + heads)
    q, k_cache, v_cache, tables, context_lens, cu = inputs
    expected = reference(q, k_clean, v_clean, tables, context_lens, cu)
    # Key tiles half a block (several query tiles per sequence), or two blocks (a query tile longer than some
    # sequences): the interpreter is slow, so each block size gets one of the two.
    block_m, block_n = (16, 16) if block_size == 32 else (64, 32)
    out = paged_prefill_attention(q, k_cache, v_cache, tables, context_lens, cu, HEAD_DIM ** -0.5,
                                  block_m=block_m, block_n=block_n)
    assert out.shape == q.shape and out.dtype == dtype
    torch.testing.assert_close(out.float(), expected, atol=TOL[dtype], rtol=TOL[dtype])


def test_prefill_of_one_token_each_is_decode():
    inputs, _ = paged_batch([4, 40, 0], [1, 1, 1], 16, 9, 3, torch.float32, seed=1)
    q, k_cache, v_cache, tables, context_lens, cu = inputs
    prefill = paged_prefill_attention(q, k_cache, v_cache, tables, context_lens, cu, HEAD_DIM ** -0.5)
    decode = paged_decode_attention(q, k_cache, v_cache, tables, context_lens, HEAD_DIM ** -0.5)
    torch.testing.assert_close(prefill, decode, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("heads, kv_heads", [(9, 3), (4, 4)], ids=["gqa", "mha"])
@pytest.mark.parametrize("block_size", [16, 32])
def test_split_k_decode_matches_gathered_reference(block_size, heads, kv_heads, dtype):
    # Contexts of 1 token, an exact block multiple, and a partial last block several blocks in.
    inputs, (k_clean, v_clean) = paged_batch([0, 2 * block_size - 1, 70], [1, 1, 1], block_size, heads,
                                             kv_heads, dtype, seed=block_size * heads)
    q, k_cache, v_cache, tables, context_lens, cu = inputs
    expected = reference(q, k_clean, v_clean, tables, context_lens, cu)
    for num_splits in [None, 1, 3, tables.shape[1] + 1]:   # None: the wrapper's choice; the last leaves splits empty
        out = paged_decode_attention_split_k(q, k_cache, v_cache, tables, context_lens, HEAD_DIM ** -0.5,
                                             num_splits=num_splits)
        assert out.shape == q.shape and out.dtype == dtype
        torch.testing.assert_close(out.float(), expected, atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("seqs, kv_heads, max_blocks, sms", [(1, 3, 32, 132), (4, 3, 4, 132), (256, 3, 64, 132),
                                                             (7, 4, 1, 108), (2, 1, 500, 1)])
def test_split_count_fills_the_sms_within_the_blocks(seqs, kv_heads, max_blocks, sms):
    splits = choose_num_splits(seqs, kv_heads, max_blocks, sms)
    assert 1 <= splits <= max_blocks
    wanted = PROGRAMS_PER_SM * sms
    assert splits == max_blocks or seqs * kv_heads * splits >= wanted   # enough programs, unless out of blocks
    assert splits == 1 or seqs * kv_heads * (splits - 1) < wanted       # and no more splits than that needs


def test_bad_inputs_are_named():
    inputs, _ = paged_batch([3, 0], [5, 2], 16, 4, 4, torch.float32, seed=0)
    q, k_cache, v_cache, tables, context_lens, cu = inputs
    scale = HEAD_DIM ** -0.5
    with pytest.raises(ValueError, match="cu_query_lens"):
        paged_prefill_attention(q, k_cache, v_cache, tables, context_lens, cu[:-1], scale)
    with pytest.raises(ValueError, match="int32"):
        paged_prefill_attention(q, k_cache, v_cache, tables.long(), context_lens, cu, scale)
    with pytest.raises(ValueError, match="heads a multiple of kv_heads"):
        paged_prefill_attention(q[:, :3], k_cache, v_cache, tables, context_lens, cu, scale)
    with pytest.raises(ValueError, match="context_lens"):
        paged_decode_attention_split_k(q[:2], k_cache, v_cache, tables, context_lens[:1], scale, num_splits=2)
    with pytest.raises(ValueError, match="num_splits"):
        paged_decode_attention_split_k(q[:2], k_cache, v_cache, tables, context_lens, scale, num_splits=0)


COMPILE_FOR_GPU = """
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from rosellm_edu.kernels import triton_paged_prefill as K

ints, floats = {"block_tables_ptr": "*i32", "context_lens_ptr": "*i32"}, {"scale": "fp32", "table_stride": "i32"}
qkv = {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16"}
kernels = [   # (kernel, argument types, constants, warps) as the wrappers launch them for SmolLM2 in bfloat16
    (K._paged_prefill_kernel, {**qkv, **ints, "cu_query_lens_ptr": "*i32", "tile_seq_ptr": "*i32", "out_ptr": "*bf16",
                               **floats}, dict(NUM_HEADS=9, NUM_KV_HEADS=3, BLOCK_SIZE=16, HEAD_DIM=64, BLOCK_M=64,
                                               BLOCK_N=64, PRECISION="tf32"), 8),
    (K._paged_decode_split_kernel, {**qkv, **ints, "m_ptr": "*fp32", "l_ptr": "*fp32", "acc_ptr": "*fp32", **floats},
     dict(NUM_KV_HEADS=3, GROUP=3, GROUP_PAD=4, BLOCK_SIZE=16, HEAD_DIM=64), 4),
    (K._merge_splits_kernel, {"m_ptr": "*fp32", "l_ptr": "*fp32", "acc_ptr": "*fp32", "out_ptr": "*bf16",
                              "num_splits": "i32"}, dict(SPLITS_PAD=8, HEAD_DIM=64), 4),
]
for capability in map(int, sys.argv[1:]):
    for fn, signature, constants, warps in kernels:
        signature = {**signature, **{name: "constexpr" for name in constants}}
        compiled = triton.compile(ASTSource(fn, signature, constants), target=GPUTarget("cuda", capability, 32),
                                  options={"num_warps": warps})
        assert "cubin" in compiled.asm, fn.__name__
        print(capability, fn.__name__, "wgmma" in compiled.asm["ptx"])
"""


@pytest.mark.skipif(DEVICE == "cuda", reason="on a GPU the tests above run the compiled kernels")
def test_kernels_compile_for_ampere_and_hopper(tmp_path):
    """The interpreter checks the arithmetic but not the typing and lowering a GPU build goes through: compile the
    kernels (bfloat16) to machine code for sm_80 and sm_90 with Triton's bundled ptxas, no GPU needed."""
    import os
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}   # the interpreter skips compilation
    env["TRITON_CACHE_DIR"] = str(tmp_path)                                  # compile afresh, leave no cache behind
    run = subprocess.run([sys.executable, "-c", COMPILE_FOR_GPU, "80", "90"], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "90 _paged_prefill_kernel True" in run.stdout      # Hopper's tensor-core instructions (wgmma) for tl.dot


@pytest.mark.parametrize("num_new", [[1, 25, 18, 1], [12, 25, 18, 3], [1, 1, 1, 1]], ids=["mixed", "prefill", "decode"])
def test_paged_attention_attends_through_the_triton_kernels_as_through_the_gather(monkeypatch, num_new):
    """PagedAttention.attend with the kernels it hands a CUDA batch (in the interpreter where there is no GPU) gives
    what it gives with the gathered fallbacks: the packed rows and cu_query_lens it passes are the right ones."""
    from functools import partial

    from rosellm_edu.layers import paged_attention
    block_size, heads, kv_heads = 16, 9, 3
    g = torch.Generator().manual_seed(7)
    tables, num_computed = [[7, 2], [4, 11], [5, 1, 3], [0, 6, 8, 9]], [20, 0, 30, 40]
    pools = torch.randn(2, 1, 12 * block_size, kv_heads, HEAD_DIM, generator=g).to(DEVICE)   # (k|v, layers, slots, ...)
    tokens = sum(num_new)
    q = torch.randn(tokens, heads, HEAD_DIM, generator=g).to(DEVICE)
    k, v = torch.randn(2, tokens, kv_heads, HEAD_DIM, generator=g).to(DEVICE)
    outs = {}
    for name, decode, prefill in [("gathered", paged_attention.gathered_decode_attention,
                                   paged_attention.gathered_prefill_attention),
                                  ("triton", partial(paged_decode_attention_split_k, num_splits=2),
                                   paged_prefill_attention)]:
        monkeypatch.setattr(paged_attention, "prefill_kernel", lambda device, kernel=prefill: kernel)
        ctx = paged_attention.PagedAttention.build(*pools.clone(), block_size, tables, num_computed, num_new)
        ctx.kernel = decode
        outs[name] = ctx.attend(0, q, k, v)                                          # (tokens, heads, d)
    torch.testing.assert_close(outs["triton"], outs["gathered"], atol=1e-5, rtol=1e-5)
