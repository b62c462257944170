"""Checkers for chapter 12's exercises: prompt lookup, a prediction of the mean accepted length from the acceptance
rate, checked on the package's rejection sampler, and the leftover distribution of a rejected draft."""

from __future__ import annotations

import torch

from rosellm_edu.exercises import checker, compare_prediction, expect_close, expect_equal


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


def _measured_accepted_length(alpha: float, k: int, steps: int = 2000) -> float:
    """Mean accepted length (SpecDecodingStats') of `steps` verifications of k point-mass drafts by the package's
    rejection sampler, where the target gives each draft probability alpha: each draft is accepted with
    probability alpha, independently of the others."""
    from rosellm_edu.spec_decode.metrics import SpecDecodingStats
    from rosellm_edu.spec_decode.rejection_sampler import rejection_sample

    gen = torch.Generator().manual_seed(0)
    target = torch.full((k + 1, 4), (1 - alpha) / 3, dtype=torch.float64)      # (k + 1, vocab 4)
    target[:, 0] = alpha                                                       # the draft is token 0
    stats = SpecDecodingStats()
    for _ in range(steps):
        emitted = rejection_sample(target, [0] * k, None, generator=gen)
        stats.observe(k, len(emitted) - 1)
    return stats.as_dict()["mean_accepted_length"]


@checker("accepted_length", predicts=True)
def check_accepted_length(accepted_length) -> str:
    cases = [(0.6, 4), (0.9, 2), (0.8, 8)]
    for alpha, k in cases:
        said = compare_prediction(accepted_length(alpha, k), _measured_accepted_length(alpha, k),
                                  f"accepted_length(alpha={alpha}, k={k})", within=(0.93, 1.07), unit=" tokens")
    return f"{len(cases)} acceptance rates; the last, {said}."


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
