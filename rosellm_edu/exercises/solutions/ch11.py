"""Worked solutions for chapter 11's exercises."""

import numpy as np
import torch


def quantize_int8(w):
    scale = w.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / 127     # (N, 1): the largest |w| maps to 127
    return torch.round(w / scale).clamp(-127, 127).to(torch.int8), scale


def pack_nibbles(q):
    groups = q.view(q.shape[0], -1, 32)                                  # (N, K / 32, 32)
    return groups[..., :16] | (groups[..., 16:] << 4)                    # element j low, element j + 16 high


def read_q4_1_block(block: bytes):
    raw = np.frombuffer(block, dtype=np.uint8)
    d, m = raw[:4].view(np.float16).astype(np.float32)                   # the scale, then the minimum
    q = np.concatenate([raw[4:] & 15, raw[4:] >> 4]).astype(np.float32)  # elements 0..15, then 16..31
    return torch.from_numpy(q * d + m)


SOLUTIONS = {"check_quantize_int8": quantize_int8, "check_pack_nibbles": pack_nibbles,
             "check_read_q4_1_block": read_q4_1_block}
