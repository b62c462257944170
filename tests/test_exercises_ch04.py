"""Chapter 04's checkers reject typical wrong answers and say what is wrong."""

import torch

from rosellm_edu.engine.block_manager import chain_hash
from rosellm_edu.exercises import ch04
from rosellm_edu.exercises.solutions.ch04 import block_keys, merge, slots


def test_slots_that_forget_the_block_size_are_rejected(capsys):
    def unscaled(block_table, block_size, start, end):
        return [block_table[p // block_size] + p % block_size for p in range(start, end)]

    assert not ch04.check_slots(unscaled)
    out = capsys.readouterr().out
    assert out.startswith("✗ Slots through a block table") and "multiply the block number by block_size" in out


def test_slots_that_skip_the_block_table_are_rejected(capsys):
    assert not ch04.check_slots(lambda block_table, block_size, start, end: list(range(start, end)))
    assert "look its block up in the block table" in capsys.readouterr().out


def test_slots_that_drop_the_last_position_are_rejected(capsys):
    assert not ch04.check_slots(lambda table, bs, start, end: slots(table, bs, start, end)[:-1])
    assert "positions 3..6: got [31, 8, 9], expected [31, 8, 9, 10]" in capsys.readouterr().out


def test_block_keys_that_are_not_chained_are_rejected(capsys):
    def unchained(token_ids, block_size):
        return [chain_hash(None, tuple(token_ids[s:s + block_size]))
                for s in range(0, len(token_ids) - block_size + 1, block_size)]

    assert not ch04.check_block_keys(unchained)
    out = capsys.readouterr().out
    assert out.startswith("✗ Chained block keys") and "key of block 1 differs" in out and "chain it" in out


def test_block_keys_for_a_partial_block_are_rejected(capsys):
    def with_partial(token_ids, block_size):
        keys, prev = [], None
        for s in range(0, len(token_ids), block_size):
            prev = chain_hash(prev, tuple(token_ids[s:s + block_size]))
            keys.append(prev)
        return keys

    assert not ch04.check_block_keys(with_partial)
    assert "only full blocks get a key" in capsys.readouterr().out


def test_a_merge_that_adds_without_rescaling_is_rejected(capsys):
    def unscaled(m1, l1, acc1, m2, l2, acc2):
        return torch.maximum(m1, m2), l1 + l2, acc1 + acc2

    assert not ch04.check_merge(unscaled)
    out = capsys.readouterr().out
    assert out.startswith("✗ Merging two partial softmax results") and "rescale each part by exp(m_i - m)" in out


def test_a_merge_that_rescales_the_wrong_way_is_rejected(capsys):
    def inverted(m1, l1, acc1, m2, l2, acc2):
        m = torch.maximum(m1, m2)
        a1, a2 = (m - m1).exp(), (m - m2).exp()
        return m, l1 * a1 + l2 * a2, acc1 * a1[:, None] + acc2 * a2[:, None]

    assert not ch04.check_merge(inverted)
    assert "l, the sum of exp(score - m)" in capsys.readouterr().out


def test_the_worked_solutions_pass(capsys):
    assert ch04.check_slots(slots) and ch04.check_block_keys(block_keys) and ch04.check_merge(merge)
