"""Worked solutions for chapter 10's exercises."""

import torch
from torch import nn


def add_rms_norm(x, residual, weight, eps):
    h = x if residual is None else x + residual        # the new residual stream
    h32 = h.float()                                    # the mean of squares in float32, as chapter 00
    normed = (h32 * torch.rsqrt(h32.pow(2).mean(-1, keepdim=True) + eps)).to(h.dtype)
    return weight * normed, h


def pack_linears(linears: list[nn.Linear]) -> nn.Linear:
    first = linears[0]
    has_bias = first.bias is not None
    packed = nn.Linear(first.in_features, sum(lin.out_features for lin in linears), bias=has_bias)
    with torch.no_grad():
        packed.weight.copy_(torch.cat([lin.weight for lin in linears], dim=0))   # (out, in): stack the rows
        if has_bias:
            packed.bias.copy_(torch.cat([lin.bias for lin in linears]))
    return packed


def rotate_in_place(positions, x, cos, sin):
    half = x.shape[-1] // 2
    c, s = cos[positions, None, :half], sin[positions, None, :half]     # (tokens, 1, d / 2): both halves share them
    a, b = x[..., :half].clone(), x[..., half:].clone()                # read both halves before writing either
    x[..., :half] = a * c - b * s
    x[..., half:] = b * c + a * s


SOLUTIONS = {"check_add_rms_norm": add_rms_norm, "check_pack_linears": pack_linears,
             "check_rotate_in_place": rotate_in_place}
