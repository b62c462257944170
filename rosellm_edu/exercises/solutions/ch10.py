"""Worked solutions for chapter 10's exercises."""

import torch


def add_rms_norm(x, residual, weight, eps):
    h = x if residual is None else x + residual        # the new residual stream
    h32 = h.float()                                    # the mean of squares in float32, as chapter 00
    normed = (h32 * torch.rsqrt(h32.pow(2).mean(-1, keepdim=True) + eps)).to(h.dtype)
    return weight * normed, h


def unfused_bytes(rows: int, hidden: int) -> int:
    n = rows * hidden
    per_element = (2 + 2 + 2     # x + residual: read two bfloat16 tensors, write one
                   + 2 + 4       # .float(): read bfloat16, write float32
                   + 4 + 4       # pow(2)
                   + 4           # mean over the row: read float32, write one number per row
                   + 4 + 4       # times rsqrt(...)
                   + 4 + 2       # .to(bfloat16)
                   + 2 + 2)      # weight * ...
    return per_element * n + 2 * hidden          # the weight itself, read once


def rotate_in_place(positions, x, cos, sin):
    half = x.shape[-1] // 2
    c, s = cos[positions, None, :half], sin[positions, None, :half]     # (tokens, 1, d / 2): both halves share them
    a, b = x[..., :half].clone(), x[..., half:].clone()                # read both halves before writing either
    x[..., :half] = a * c - b * s
    x[..., half:] = b * c + a * s


SOLUTIONS = {"check_add_rms_norm": add_rms_norm, "check_unfused_bytes": unfused_bytes,
             "check_rotate_in_place": rotate_in_place}
