"""Checkers for chapter 12's exercises: prompt lookup, greedy verification, the leftover distribution of a
rejected draft."""

from __future__ import annotations

import torch

from rosellm_edu.exercises import Mismatch, checker, expect_close, expect_equal


@checker("ngram_propose")
def check_ngram_propose(ngram_propose) -> str:
    from rosellm_edu.spec_decode.ngram_proposer import NgramProposer

    gen = torch.Generator().manual_seed(0)
    cases = [([1, 2, 3, 1, 2], 2, 1, 2), ([7, 8, 9], 3, 1, 3), ([1, 2, 1, 2], 5, 1, 3), ([4, 1, 2, 4, 2], 2, 2, 2),
             ([1, 2, 3, 9, 1, 2, 3, 4, 5, 2, 3], 3, 1, 3)]
    cases += [(torch.randint(0, 4, (n,), generator=gen).tolist(), 3, 1, 3) for n in (12, 30, 50)]
    for ids, k, lo, hi in cases:
        expected = NgramProposer(k, lo, hi).propose_one(ids, k)
        expect_equal(ngram_propose(list(ids), k, lo, hi), expected, f"ngram_propose({ids}, k={k}, {lo}..{hi})")
    return f"{len(cases)} sequences, the longest and latest match each time."


@checker("greedy_verify")
def check_greedy_verify(greedy_verify) -> str:
    from rosellm_edu.spec_decode.rejection_sampler import accepted_count

    cases = [([5, 6, 8], [5, 7]), ([5, 6, 8], [5, 6]), ([3], []), ([1, 2, 3, 4], [9, 2, 3]), ([4, 4, 4], [4, 4])]
    for argmax_ids, drafts in cases:
        a = accepted_count(argmax_ids, drafts)
        expect_equal(greedy_verify(list(argmax_ids), list(drafts)), argmax_ids[:a + 1],
                     f"greedy_verify({argmax_ids}, {drafts})")
    return f"{len(cases)} cases: all accepted, none, a bonus, a rejection at once."


@checker("leftover_distribution")
def check_leftover_distribution(leftover_distribution) -> str:
    gen = torch.Generator().manual_seed(0)
    for trial in range(4):
        p = torch.softmax(torch.randn(8, generator=gen, dtype=torch.float64), 0)
        q = torch.softmax(2 * torch.randn(8, generator=gen, dtype=torch.float64), 0)
        got = leftover_distribution(p.clone(), q.clone())
        expect_close(got, (p - q).clamp_min(0) / (p - q).clamp_min(0).sum(), f"case {trial}: norm(max(0, p - q))")
        accept = torch.minimum(q, p)                     # q(x) * min(1, p(x)/q(x))
        total = accept + (1 - accept.sum()) * got        # what the rule emits
        expect_close(total, p, f"case {trial}: accepting with min(1, p/q), else drawing from yours, gives p")
    return "4 pairs (p, q); the rule with your leftover distribution gives back p exactly."
