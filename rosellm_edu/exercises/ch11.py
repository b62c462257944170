"""Checkers for chapter 11's exercises: int8 per-channel quantization, a prediction of the bytes a batch-1 step of
the 4-bit model reads, checked against the packed tensors, and reading one Q4_1 block's 20 bytes back into 32
weights."""

from __future__ import annotations

import numpy as np
import torch

from rosellm_edu.exercises import Mismatch, checker, compare_prediction, expect_close


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


def _measured_int4_bytes(head: str) -> int:
    """The bytes of the embedded SmolLM2's weights with every decoder Linear packed as Int4Linear and the LM head
    in bfloat16 or as Int8GroupLinear (Q8_0), summed from the packed tensors themselves, built on the meta device
    (shapes and dtypes, no memory). A batch-1 step reads each once; the embedding table only where it is the head
    (beside a Q8_0 head, a lookup reads one row of it)."""
    from torch import nn

    from rosellm_edu.layers.quantization import Int4Linear, Int8GroupLinear
    from rosellm_edu.model_loader import load_config, resolve_model
    from rosellm_edu.models import model_class

    config = load_config(resolve_model())
    with torch.device("meta"):
        model = model_class(config)(config).to(torch.bfloat16)
        for layer in model.model.layers:
            for name, child in list(layer.named_modules()):
                if isinstance(child, nn.Linear):
                    layer.set_submodule(name, Int4Linear.from_linear(child))
        if head == "Q8_0":
            model.lm_head = Int8GroupLinear.from_linear(model.lm_head)     # the table stays, for the lookup
    packed = [b for m in model.modules() if isinstance(m, (Int4Linear, Int8GroupLinear)) for b in m.buffers()]
    dense = [p for p in model.parameters() if head == "bfloat16" or p is not model.model.embed_tokens.weight]
    return sum(t.nbytes for t in packed + dense)          # not the rotary tables: a step reads a row of them


@checker("int4_step_bytes", predicts=True)
def check_int4_step_bytes(int4_step_bytes) -> str:
    for head in ("bfloat16", "Q8_0"):
        said = compare_prediction(int4_step_bytes(head), _measured_int4_bytes(head), f"int4_step_bytes({head!r})",
                                  within=(0.95, 1.05), unit=" B")
    bfloat16 = 134_515_008 * 2                         # the bfloat16 model: every parameter once
    return f"{said}; {bfloat16 / _measured_int4_bytes('Q8_0'):.2f}x fewer bytes than the bfloat16 model's."


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
