"""Checkers for chapter 10's exercises: add + RMSNorm as one (normed, residual) pair, two Linears packed into one,
rotary applied in place to a strided view."""

from __future__ import annotations

import torch
from torch import nn

from rosellm_edu.exercises import Mismatch, checker, expect_close


@checker("add_rms_norm")
def check_add_rms_norm(add_rms_norm) -> str:
    from rosellm_edu.kernels.cpu_fused import add_rms_norm_reference   # chapter 00's ops, written out

    gen = torch.Generator().manual_seed(0)
    cases = [(5, 16, torch.float32, True), (1, 7, torch.float32, False), (37, 64, torch.float32, True),
             (9, 33, torch.bfloat16, True)]
    for rows, n, dtype, with_residual in cases:
        x = torch.randn(rows, n, generator=gen).to(dtype)
        residual = torch.randn(rows, n, generator=gen).to(dtype) if with_residual else None
        weight = (torch.rand(n, generator=gen) + 0.5).to(dtype)
        expected = add_rms_norm_reference(x, residual, weight, 1e-6)
        what = f"add_rms_norm on ({rows}, {n}) {dtype}, residual {'given' if with_residual else 'None'}"
        got = add_rms_norm(x.clone(), None if residual is None else residual.clone(), weight, 1e-6)
        if not (isinstance(got, tuple) and len(got) == 2):
            raise Mismatch(f"{what}: expected a pair (normed, residual), got {type(got).__name__}")
        tol = dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else {}
        expect_close(got[1], expected[1], f"{what}: the new residual", **tol)
        expect_close(got[0], expected[0], f"{what}: the normed output", **tol)
    return f"{len(cases)} cases, the first layer's (residual None) and bfloat16 included."


@checker("pack_linears")
def check_pack_linears(pack_linears) -> str:
    torch.manual_seed(0)
    cases = [([nn.Linear(8, 6, bias=False), nn.Linear(8, 6, bias=False)], "gate and up"),
             ([nn.Linear(12, 12), nn.Linear(12, 4), nn.Linear(12, 4)], "q, k and v, with biases")]
    for linears, name in cases:
        packed = pack_linears(linears)
        if not isinstance(packed, nn.Linear):
            raise Mismatch(f"{name}: expected an nn.Linear, got {type(packed).__name__}")
        x = torch.randn(5, linears[0].in_features)
        with torch.no_grad():
            expected = torch.cat([lin(x) for lin in linears], dim=-1)
            expect_close(packed(x), expected, f"{name}: the packed Linear's output")
    return f"{len(cases)} packings: one matmul gives what {len(cases[1][0])} gave."


@checker("rotate_in_place")
def check_rotate_in_place(rotate_in_place) -> str:
    from rosellm_edu.layers.rotary import rotate_half

    gen = torch.Generator().manual_seed(0)
    for tokens, heads, d in [(3, 2, 8), (11, 3, 16)]:
        angles = torch.outer(torch.arange(64.0), 1.0 / 10000 ** (torch.arange(0, d, 2) / d))
        cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
        qkv = torch.randn(tokens, 2 * heads * d, generator=gen)     # q is the first half of each row
        q = qkv[:, :heads * d].view(tokens, heads, d)
        positions = torch.randint(0, 64, (tokens,), generator=gen)
        expected_q = q * cos[positions, None] + rotate_half(q) * sin[positions, None]
        other = qkv[:, heads * d:].clone()
        rotate_in_place(positions, q, cos, sin)
        what = f"rotate_in_place on a ({tokens}, {heads}, {d}) view"
        expect_close(qkv[:, :heads * d].view(tokens, heads, d), expected_q, f"{what}: q, read back from its buffer")
        if not torch.equal(qkv[:, heads * d:], other):
            raise Mismatch(f"{what}: the columns after q changed; write only q's own elements")
    return "2 strided views rotated where they lie, their neighbours untouched."
