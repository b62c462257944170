"""Checkers for chapter 11's exercises: int8 per-channel quantization, packing 4-bit values in GGUF's Q4_1 order,
and reading one Q4_1 block's 20 bytes back into 32 weights."""

from __future__ import annotations

import numpy as np
import torch

from rosellm_edu.exercises import Mismatch, checker, expect_close, expect_equal


@checker("quantize_int8")
def check_quantize_int8(quantize_int8) -> str:
    gen = torch.Generator().manual_seed(0)
    cases = [torch.randn(4, 64, generator=gen), torch.randn(16, 32, generator=gen) * 0.02,
             torch.tensor([[0.0, 0.0, 0.0, 0.0], [1.0, -2.0, 0.5, 0.25]])]
    for w in cases:
        what = f"quantize_int8 on a {tuple(w.shape)} weight"
        got = quantize_int8(w.clone())
        if not (isinstance(got, tuple) and len(got) == 2):
            raise Mismatch(f"{what}: expected a pair (q, scale), got {type(got).__name__}")
        q, scale = got
        if q.dtype != torch.int8 or tuple(q.shape) != tuple(w.shape):
            raise Mismatch(f"{what}: q must be int8 of w's shape, got {q.dtype} {tuple(q.shape)}")
        if int(q.abs().max()) > 127:
            raise Mismatch(f"{what}: q holds -128; a symmetric grid uses -127..127")
        expect_close(scale.reshape(-1), w.abs().amax(1).clamp_min(1e-12) / 127, f"{what}: one scale per row, max|w| / 127")
        expect_close(q.float() * scale.reshape(-1, 1), w, f"{what}: q * scale", atol=float(scale.max()) / 2 + 1e-6, rtol=0)
    return f"{len(cases)} weights, an all-zero row included."


@checker("pack_nibbles")
def check_pack_nibbles(pack_nibbles) -> str:
    from rosellm_edu.layers.quantization import pack_int4

    gen = torch.Generator().manual_seed(1)
    cases = [torch.arange(32, dtype=torch.uint8).remainder(16).view(1, 32),
             torch.randint(0, 16, (3, 64), generator=gen, dtype=torch.uint8)]
    for q in cases:
        got = pack_nibbles(q.clone())
        expect_equal(tuple(got.shape), (q.shape[0], q.shape[1] // 32, 16), f"pack_nibbles of {tuple(q.shape)}: the shape")
        expect_equal(got.to(torch.uint8).tolist(), pack_int4(q).tolist(), f"pack_nibbles of {tuple(q.shape)}: the bytes")
    return f"{len(cases)} tensors of 4-bit values, byte for byte."


@checker("read_q4_1_block")
def check_read_q4_1_block(read_q4_1_block) -> str:
    gen = np.random.default_rng(2)
    for d, m in [(0.5, -1.0), (0.013, -0.1), (2.0, 3.0)]:
        nibbles = gen.integers(0, 256, 16, dtype=np.uint8)
        block = np.concatenate([np.array([d, m], dtype=np.float16).view(np.uint8), nibbles])
        q = np.concatenate([nibbles & 15, nibbles >> 4]).astype(np.float32)
        expected = torch.tensor(q * np.float32(np.float16(d)) + np.float32(np.float16(m)))
        got = read_q4_1_block(bytes(block))
        expect_close(torch.as_tensor(got, dtype=torch.float32), expected, f"read_q4_1_block with d={d}, m={m}")
    return "3 blocks, each checked against its 32 weights."
