"""Chapter 10's checkers reject typical wrong answers and say what is wrong."""

import torch

from rosellm_edu.exercises.ch10 import check_add_rms_norm, check_rotate_in_place, check_unfused_bytes
from rosellm_edu.exercises.solutions.ch10 import add_rms_norm, rotate_in_place, unfused_bytes


def test_add_rms_norm_that_normalises_the_input_not_the_sum_is_rejected(capsys):
    def norms_x(x, residual, weight, eps):
        normed, _ = add_rms_norm(x, None, weight, eps)
        return normed, x if residual is None else x + residual

    assert not check_add_rms_norm(norms_x)
    assert "normed output" in capsys.readouterr().out


def test_add_rms_norm_that_fails_on_the_first_layer_is_reported(capsys):
    def needs_residual(x, residual, weight, eps):
        return add_rms_norm(x + residual, torch.zeros_like(x), weight, eps)

    assert not check_add_rms_norm(needs_residual)
    assert "raised TypeError" in capsys.readouterr().out


def test_add_rms_norm_that_returns_only_the_normed_output_is_rejected(capsys):
    assert not check_add_rms_norm(lambda x, residual, weight, eps: add_rms_norm(x, residual, weight, eps)[0])
    assert "expected a pair" in capsys.readouterr().out


def test_unfused_bytes_that_counts_every_pass_in_bfloat16_is_rejected(capsys):
    assert not check_unfused_bytes(lambda rows, hidden: 7 * 2 * 2 * rows * hidden)    # seven reads and writes
    out = capsys.readouterr().out
    assert "unfused_bytes(rows=64, hidden=576)" in out and "you predicted" in out


def test_unfused_bytes_of_the_fused_kernel_is_rejected(capsys):
    assert not check_unfused_bytes(lambda rows, hidden: 4 * 2 * rows * hidden)
    assert "✗ unfused_bytes" in capsys.readouterr().out


def test_the_unfused_bytes_solution_passes():
    assert check_unfused_bytes(unfused_bytes)


def test_rotate_in_place_that_returns_a_new_tensor_is_rejected(capsys):
    def not_in_place(positions, x, cos, sin):
        y = x.clone()
        rotate_in_place(positions, y, cos, sin)
        return y

    assert not check_rotate_in_place(not_in_place)
    assert "read back from its buffer" in capsys.readouterr().out


def test_rotate_in_place_that_overwrites_a_half_before_reading_it_is_rejected(capsys):
    def overwrites(positions, x, cos, sin):
        half = x.shape[-1] // 2
        c, s = cos[positions, None, :half], sin[positions, None, :half]
        x[..., :half] = x[..., :half] * c - x[..., half:] * s
        x[..., half:] = x[..., half:] * c + x[..., :half] * s      # reads the new first half
    assert not check_rotate_in_place(overwrites)
    assert "rotate_in_place" in capsys.readouterr().out
