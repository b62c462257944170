"""Worked solutions for chapter 11's exercises."""

import numpy as np
import torch


def quantize_int8(w):
    scale = w.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / 127     # (N, 1): the largest |w| maps to 127
    return torch.round(w / scale).clamp(-127, 127).to(torch.int8), scale


def int4_step_bytes(head: str) -> float:
    layers, hidden, inter, vocab = 30, 576, 1536, 49152
    q, kv, o = hidden * 9 * 64, 2 * hidden * 3 * 64, 9 * 64 * hidden           # 9 query heads, 3 KV heads of 64
    linears = layers * (q + kv + o + 3 * hidden * inter)                       # + gate, up, down
    int4 = linears * 20 / 32                  # Q4_1: 16 bytes of nibbles + a float16 scale and minimum per 32
    head_bytes = vocab * hidden * (2 if head == "bfloat16" else 34 / 32)       # Q8_0: 32 int8 + a float16 scale
    norms = (2 * layers + 1) * hidden * 2
    return int4 + head_bytes + norms


def read_q4_1_block(block: bytes):
    raw = np.frombuffer(block, dtype=np.uint8)
    d, m = raw[:4].view(np.float16).astype(np.float32)                   # the scale, then the minimum
    q = np.concatenate([raw[4:] & 15, raw[4:] >> 4]).astype(np.float32)  # elements 0..15, then 16..31
    return torch.from_numpy(q * d + m)


SOLUTIONS = {"check_quantize_int8": quantize_int8, "check_int4_step_bytes": int4_step_bytes,
             "check_read_q4_1_block": read_q4_1_block}
