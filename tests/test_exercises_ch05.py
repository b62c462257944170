"""Chapter 05's checkers reject typical wrong answers and say what is wrong."""

import torch

from rosellm_edu.exercises import ch05
from rosellm_edu.exercises.solutions import ch05 as solutions


def test_a_prediction_with_powers_of_two_for_buckets_is_rejected(capsys):
    def powers_of_two(output_lens, max_num_seqs):
        live = [sum(n > step for n in output_lens) for step in range(1, max(output_lens))]
        return sum(min(1 << (n - 1).bit_length(), max_num_seqs) - n for n in live)

    assert not ch05.check_padded_rows(powers_of_two)
    out = capsys.readouterr().out
    assert "✗ Predict the padded rows" in out and "20 requests, max_num_seqs=32: you predicted 77 rows, the engine measured 53 rows" in out


def test_a_prediction_that_pads_the_prefill_step_too_is_rejected(capsys):
    def prefill_padded(output_lens, max_num_seqs):
        live = len(output_lens)
        return solutions.predict_padded_rows(output_lens, max_num_seqs) + solutions.padded_size(live, max_num_seqs) - live

    assert not ch05.check_padded_rows(prefill_padded)
    assert "5 requests, max_num_seqs=8: you predicted 12 rows, the engine measured 9 rows" in capsys.readouterr().out


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
