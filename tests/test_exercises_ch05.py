"""Chapter 05's checkers reject typical wrong answers and say what is wrong."""

import torch

from rosellm_edu.exercises import ch05
from rosellm_edu.exercises.solutions import ch05 as solutions


def test_padded_size_rejects_the_next_power_of_two(capsys):
    def next_power_of_two(num_seqs, max_num_seqs):
        return min(1 << (num_seqs - 1).bit_length(), max_num_seqs)

    assert not ch05.check_padded_size(next_power_of_two)
    out = capsys.readouterr().out
    assert "✗ padded_size" in out and "padded_size(17, 64)" in out and "got 32, expected 24" in out


def test_padded_size_rejects_a_bucket_past_max_num_seqs(capsys):
    def uncapped(num_seqs, max_num_seqs):
        return num_seqs if num_seqs <= 2 else 4 if num_seqs <= 4 else -(-num_seqs // 8) * 8

    assert not ch05.check_padded_size(uncapped)
    out = capsys.readouterr().out
    assert "padded_size(3, 3)" in out and "got 4, expected 3" in out


def with_padded_rows(name, value):
    """The worked solution, except that the padded rows' `name` is `value`."""
    def wrong(tokens, positions, tables, rows, block_size, scratch_block):
        inputs = solutions.decode_inputs(tokens, positions, tables, rows, block_size, scratch_block)
        inputs[name][len(tokens):] = value
        return inputs

    return wrong


def test_decode_inputs_rejects_padded_rows_that_write_into_block_0(capsys):
    # slot 0 belongs to whoever owns block 0
    assert not ch05.check_decode_inputs(with_padded_rows("slot_mapping", 0))
    out = capsys.readouterr().out
    assert "['slot_mapping']" in out and "got [145, 0], expected [145, 384]" in out


def test_decode_inputs_rejects_a_padded_context_of_zero_tokens(capsys):
    assert not ch05.check_decode_inputs(with_padded_rows("context_lens", 0))
    assert "['context_lens']: got [18, 0], expected [18, 1]" in capsys.readouterr().out


def test_decode_inputs_rejects_a_position_taken_as_the_block_index(capsys):
    def slot_from_position(tokens, positions, tables, rows, block_size, scratch_block):
        inputs = solutions.decode_inputs(tokens, positions, tables, rows, block_size, scratch_block)
        inputs["slot_mapping"][:len(tokens)] = torch.tensor(
            [t[0] * block_size + p for t, p in zip(tables, positions)])
        return inputs

    assert not ch05.check_decode_inputs(slot_from_position)
    assert "['slot_mapping']: got [65, " in capsys.readouterr().out


def test_count_launches_rejects_counting_every_op_as_a_kernel(capsys):
    assert not ch05.check_count_launches(lambda ops: (len(ops), 0))
    out = capsys.readouterr().out
    assert "count_launches for x.view(16)" in out and "got (1, 0), expected (0, 1)" in out


def test_count_launches_rejects_taking_an_in_place_op_for_a_view(capsys):
    def any_alias_is_a_view(ops):
        views = [any(r.alias_info is not None for r in op._schema.returns) for op in ops]
        return sum(not v and op not in solutions.ALLOCATIONS for v, op in zip(views, ops)), sum(views)

    assert not ch05.check_count_launches(any_alias_is_a_view)
    out = capsys.readouterr().out
    assert "count_launches for x.add_(1)" in out and "got (0, 1), expected (1, 0)" in out


def test_count_launches_rejects_an_allocation_counted_as_a_kernel(capsys):
    def allocations_compute(ops):
        views = sum(solutions.is_view(op) for op in ops)
        return len(ops) - views, views

    assert not ch05.check_count_launches(allocations_compute)
    assert "count_launches for torch.empty_like(x)" in capsys.readouterr().out
