"""Chapter 11's checkers reject typical wrong answers and say what is wrong."""

import numpy as np
import torch

from rosellm_edu.exercises.ch11 import check_pack_nibbles, check_quantize_int8, check_read_q4_1_block
from rosellm_edu.exercises.solutions.ch11 import pack_nibbles, quantize_int8, read_q4_1_block


def test_the_solutions_pass():
    assert check_quantize_int8(quantize_int8)
    assert check_pack_nibbles(pack_nibbles)
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


def test_pack_nibbles_that_pairs_neighbours_is_rejected(capsys):
    def neighbours(q):      # llama.cpp's order is j with j + 16, not 2j with 2j + 1
        pairs = q.view(q.shape[0], -1, 16, 2)
        return pairs[..., 0] | (pairs[..., 1] << 4)

    assert not check_pack_nibbles(neighbours)
    assert "the bytes" in capsys.readouterr().out


def test_read_q4_1_block_that_swaps_scale_and_minimum_is_rejected(capsys):
    def swapped(block):
        raw = np.frombuffer(block, dtype=np.uint8)
        m, d = raw[:4].view(np.float16).astype(np.float32)
        q = np.concatenate([raw[4:] & 15, raw[4:] >> 4]).astype(np.float32)
        return torch.from_numpy(q * d + m)

    assert not check_read_q4_1_block(swapped)
    assert "read_q4_1_block" in capsys.readouterr().out
