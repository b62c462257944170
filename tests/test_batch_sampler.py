"""The batched sampler of chapter 06 against chapter 01's reference sampler: same filtered distribution, same
draws in distribution (chi-square), greedy exactly argmax, per-request seeds independent of the batch."""

import pytest
import torch
from conftest import top_p_clear_of_rounding
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from rosellm_edu.layers import sampler
from rosellm_edu.layers.sampler import draw_truncated, filtered_logits, sample
from rosellm_edu.sampling_params import SamplingParams

row_params = st.builds(SamplingParams, temperature=st.floats(0.05, 3.0), top_k=st.integers(-1, 90),
                       top_p=st.floats(0.01, 1.0))


def reference_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    return torch.stack([filtered_logits(row[None], p).softmax(-1)[0] for row, p in zip(logits, params)])


def chi_square_pvalue(tokens: list[int], expected: torch.Tensor) -> float:
    """How likely draws as uneven as `tokens` are under `expected` (vocab,); no draw may fall outside it."""
    counts = torch.bincount(torch.tensor(tokens), minlength=len(expected)).double()
    support = expected > 0
    assert counts[~support].sum() == 0
    expected = expected[support].double() / expected[support].double().sum()
    return chisquare(counts[support], len(tokens) * expected).pvalue


def candidate_probs(logits: torch.Tensor, params: list[SamplingParams], whole: bool = False) -> torch.Tensor:
    """The distribution draw_truncated draws from, scattered back into vocabulary order."""
    _, cand = draw_truncated(logits, params, [None] * len(params), None, whole)
    return torch.zeros_like(logits).scatter(-1, cand.ids, cand.probs)


@settings(max_examples=60, deadline=None)
@given(params=st.lists(row_params, min_size=1, max_size=6), seed=st.integers(0, 2**31 - 1))
def test_filtered_distribution_equals_the_reference_for_mixed_rows(params, seed):
    logits = torch.randn(len(params), 80, generator=torch.Generator().manual_seed(seed)) * 3
    params = [p for p in params if p.top_k > 0 or p.top_p < 1] or [SamplingParams(top_k=3)]
    logits = logits[:len(params)]
    assume(top_p_clear_of_rounding(logits, params))
    torch.testing.assert_close(candidate_probs(logits, params), reference_probs(logits, params),
                               atol=1e-6, rtol=1e-5)


@settings(max_examples=30, deadline=None)
@given(top_p=st.floats(0.05, 0.999), temperature=st.floats(0.3, 3.0), seed=st.integers(0, 2**31 - 1))
def test_top_p_alone_falls_back_to_the_whole_vocabulary_when_the_candidates_fall_short(top_p, temperature, seed):
    logits = torch.randn(3, 300, generator=torch.Generator().manual_seed(seed))
    params = [SamplingParams(temperature=temperature, top_p=top_p)] * 3
    assume(top_p_clear_of_rounding(logits, params))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sampler, "TOP_P_CANDIDATES", 8)
        tokens, cand = draw_truncated(logits, params, [None] * 3, None)
        reached = cand.probs.new_tensor([float(cand.complete[i]) for i in range(3)]).bool()
        expected = reference_probs(logits, params)
        # rows whose 8 candidates reach top_p are exact already; the others are marked -1 and redone whole
        assert torch.equal(tokens < 0, ~reached)
        torch.testing.assert_close(candidate_probs(logits, params, whole=True), expected, atol=1e-6, rtol=1e-5)
        out = sample(logits, params, [None] * 3, torch.Generator().manual_seed(seed))
        assert all(expected[i, t] > 0 for i, t in enumerate(out.token_ids))


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.8),
    SamplingParams(top_k=5),
    SamplingParams(top_k=6, top_p=0.7, temperature=1.3),
    SamplingParams(top_p=0.8),
    SamplingParams(top_k=1000, top_p=0.95, temperature=0.7),
])
def test_empirical_draws_match_the_reference_distribution(params):
    logits = torch.randn(16, generator=torch.Generator().manual_seed(3)) * 2
    n = 6000
    out = sample(logits.expand(n, -1), [params] * n, [None] * n, torch.Generator().manual_seed(0))
    assert chi_square_pvalue(out.token_ids, filtered_logits(logits[None], params).softmax(-1)[0]) > 1e-3


def test_seeded_rows_draw_from_the_reference_distribution():
    logits = torch.randn(12, generator=torch.Generator().manual_seed(5)) * 2
    params = SamplingParams(top_k=8, top_p=0.9, seed=1)
    tokens = [sample(logits[None], [params], [torch.Generator().manual_seed(s)]).token_ids[0] for s in range(3000)]
    assert chi_square_pvalue(tokens, filtered_logits(logits[None], params).softmax(-1)[0]) > 1e-3


def test_greedy_rows_are_exactly_argmax_beside_sampled_rows():
    logits = torch.randn(8, 500, generator=torch.Generator().manual_seed(0))
    params = [SamplingParams(temperature=0), SamplingParams(top_k=3)] * 4
    out = sample(logits, params, [None] * 8, torch.Generator().manual_seed(0))
    assert out.token_ids[::2] == logits[::2].argmax(-1).tolist()


def test_greedy_on_bfloat16_logits_with_ties_picks_bfloat16s_argmax():
    # the sampler's argmax runs in float32; ties must still go to bfloat16's argmax (the first)
    logits = torch.randint(0, 40, (64, 2000), generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    assert (logits == logits.max(-1, keepdim=True).values).sum(-1).min() > 1       # every row has a tie
    out = sample(logits, [SamplingParams(temperature=0)] * 64, [None] * 64)
    assert out.token_ids == logits.argmax(-1).tolist()


def test_top_k_above_the_vocabulary_is_top_k_off():
    logits = torch.randn(2, 50, generator=torch.Generator().manual_seed(0))
    for top_p in (1.0, 0.9):
        big, off = SamplingParams(top_k=10**9, top_p=top_p, seed=4), SamplingParams(top_k=0, top_p=top_p, seed=4)
        assert sample(logits, [big] * 2, [torch.Generator().manual_seed(4)] * 2).token_ids == \
            sample(logits, [off] * 2, [torch.Generator().manual_seed(4)] * 2).token_ids


def test_an_empty_batch_gives_nothing():
    out = sample(torch.empty(0, 100), [], [], None)
    assert out.token_ids == [] and out.sampling_masks == [] and out.sampling_logz == []


@pytest.mark.parametrize("params", [SamplingParams(seed=7), SamplingParams(top_k=9, seed=7),
                                    SamplingParams(top_p=0.6, temperature=1.5, seed=7),
                                    SamplingParams(top_k=40, top_p=0.9, seed=7)])
def test_a_seeded_request_draws_the_same_tokens_whatever_its_neighbours(params):
    steps = torch.randn(6, 2000, generator=torch.Generator().manual_seed(1)) * 2    # one logits row per step
    alone_gen = torch.Generator().manual_seed(7)
    alone = [sample(row[None], [params], [alone_gen]).token_ids[0] for row in steps]
    neighbours = [SamplingParams(), SamplingParams(top_k=1500), SamplingParams(top_p=0.99, temperature=3.0),
                  SamplingParams(temperature=0), SamplingParams(top_k=2, seed=3)]
    batch_gen, shared = torch.Generator().manual_seed(7), torch.Generator().manual_seed(99)
    in_batch = []
    for step, row in enumerate(steps):
        noise = torch.randn(len(neighbours), 2000, generator=torch.Generator().manual_seed(step))
        where = step % (len(neighbours) + 1)                                           # a different slot each step
        rows = torch.cat([noise[:where], row[None], noise[where:]])
        ps = neighbours[:where] + [params] + neighbours[where:]
        gens = [torch.Generator().manual_seed(3) if p.seed == 3 else None for p in ps]
        gens[where] = batch_gen
        in_batch.append(sample(rows, ps, gens, shared).token_ids[where])
    assert in_batch == alone
