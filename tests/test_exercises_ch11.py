"""Chapter 11's checkers reject typical wrong answers and say what is wrong."""

import numpy as np
import torch

from rosellm_edu.exercises.ch11 import check_int4_step_bytes, check_quantize_int8, check_read_q4_1_block
from rosellm_edu.exercises.solutions.ch11 import int4_step_bytes, quantize_int8, read_q4_1_block


def test_the_solutions_pass():
    assert check_quantize_int8(quantize_int8)
    assert check_int4_step_bytes(int4_step_bytes)
    assert check_read_q4_1_block(read_q4_1_block)


def test_quantize_int8_with_one_scale_for_the_whole_tensor_is_rejected(capsys):
    def per_tensor(w):
        scale = w.abs().max().clamp_min(1e-12) / 127
        return torch.round(w / scale).to(torch.int8), scale.expand(w.shape[0], 1)

    assert not check_quantize_int8(per_tensor)
    assert "one scale per row" in capsys.readouterr().out


def test_quantize_int8_that_uses_minus_128_is_rejected(capsys):
    def asymmetric(w):
        scale = w.abs().amax(1, keepdim=True).clamp_min(1e-12) / 128
        return torch.round(w / scale).clamp(-128, 127).to(torch.int8), scale

    assert not check_quantize_int8(asymmetric)
    assert "quantize_int8" in capsys.readouterr().out


def test_int4_step_bytes_at_half_a_byte_per_weight_is_rejected(capsys):
    assert not check_int4_step_bytes(lambda head: 134_515_008 / 2)      # every weight 4 bits, the head too
    out = capsys.readouterr().out
    assert "int4_step_bytes('bfloat16')" in out and "you predicted" in out


def test_int4_step_bytes_without_the_groups_scales_is_rejected(capsys):
    def nibbles_only(head):
        return int4_step_bytes(head) - 30 * (576 * 960 + 576 * 576 + 3 * 576 * 1536) * 4 / 32     # d and m

    assert not check_int4_step_bytes(nibbles_only)
    assert "✗ int4_step_bytes" in capsys.readouterr().out


def test_read_q4_1_block_that_swaps_scale_and_minimum_is_rejected(capsys):
    def swapped(block):
        raw = np.frombuffer(block, dtype=np.uint8)
        m, d = raw[:4].view(np.float16).astype(np.float32)
        q = np.concatenate([raw[4:] & 15, raw[4:] >> 4]).astype(np.float32)
        return torch.from_numpy(q * d + m)

    assert not check_read_q4_1_block(swapped)
    assert "read_q4_1_block" in capsys.readouterr().out
