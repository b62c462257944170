"""Checkers for chapter 10's exercises: add + RMSNorm as one (normed, residual) pair, a prediction of the bytes the
unfused add + RMSNorm moves, counted op by op, and rotary applied in place to a strided view."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from rosellm_edu.exercises import Mismatch, checker, compare_prediction, expect_close


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


class _ByteCounter(TorchDispatchMode):
    """Counts the bytes each ATen op reads (its tensor inputs) and writes (its tensor outputs), as if nothing
    stayed in a cache between two ops: the passes over memory an unfused sequence of ops makes."""

    def __init__(self):
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        flat = tree_leaves((args, kwargs, out))
        self.bytes += sum(t.nbytes for t in flat if isinstance(t, torch.Tensor))
        return out


def _unfused_bytes(rows: int, hidden: int) -> int:
    """The bytes chapter 00's add + RMSNorm (kernels.cpu_fused.add_rms_norm_reference) moves in bfloat16."""
    from rosellm_edu.kernels.cpu_fused import add_rms_norm_reference

    x, residual = torch.zeros(rows, hidden, dtype=torch.bfloat16), torch.zeros(rows, hidden, dtype=torch.bfloat16)
    weight = torch.ones(hidden, dtype=torch.bfloat16)
    with _ByteCounter() as counter:
        add_rms_norm_reference(x, residual, weight, 1e-6)
    return counter.bytes


@checker("unfused_bytes", predicts=True)
def check_unfused_bytes(unfused_bytes) -> str:
    cases = [(64, 576), (512, 576), (1, 4096)]
    for rows, hidden in cases:
        measured = _unfused_bytes(rows, hidden)
        said = compare_prediction(unfused_bytes(rows, hidden), measured,
                                  f"unfused_bytes(rows={rows}, hidden={hidden})", within=(0.85, 1.15), unit=" B")
    fused = 4 * 2 * rows * hidden                    # the kernel reads x and residual, writes both: bfloat16
    return f"{len(cases)} shapes; the last, {said}: {measured / fused:.1f}x the fused kernel's bytes."


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
