"""SamplingParams validation, chapter 01's filters and per-row sampler against transformers' logits warpers."""

import pytest
import torch
from conftest import chapter_class, top_p_clear_of_rounding
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare
from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from rosellm_edu.layers.sampler import apply_top_k, apply_top_p, filtered_logits
from rosellm_edu.sampling_params import SamplingParams

chapter_01_sample = chapter_class("06_fast_sampling.ipynb", "layers.sampler", "sample")   # before the batched one


def sample(logits: torch.Tensor, params: SamplingParams, generator=None) -> torch.Tensor:
    """Chapter 01's sampler on every row of logits with the same params."""
    rows = len(logits)
    return torch.tensor(chapter_01_sample(logits, [params] * rows, [None] * rows, generator).token_ids)


def hf_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    warpers = LogitsProcessorList([TemperatureLogitsWarper(params.temperature)])
    if params.top_k > 0:
        warpers.append(TopKLogitsWarper(params.top_k))
    if params.top_p < 1:
        warpers.append(TopPLogitsWarper(params.top_p))
    return warpers(None, logits.clone()).softmax(-1)


@pytest.mark.parametrize("field,value", [
    ("temperature", -0.1), ("temperature", float("nan")), ("temperature", float("inf")), ("temperature", "1"),
    ("top_k", 2.5), ("top_k", True), ("top_p", 0.0), ("top_p", 1.01), ("top_p", -1),
    ("max_tokens", 0), ("max_tokens", -3), ("max_tokens", 1.5), ("seed", 1.5), ("stop", [""]), ("stop", [3]),
    ("stop_token_ids", ["a"]),
])
def test_invalid_sampling_params_raise_value_error_naming_the_field(field, value):
    with pytest.raises(ValueError, match=f"SamplingParams.{field}"):
        SamplingParams(**{field: value})


def test_sampling_params_accept_the_documented_edge_values():
    assert SamplingParams(temperature=0).greedy
    assert SamplingParams(top_k=0).top_k == 0 and SamplingParams(top_k=-1).top_k == -1
    assert SamplingParams(top_p=1.0).top_p == 1.0
    assert SamplingParams(stop="###").stop == ["###"]


def test_top_p_keeps_the_token_that_crosses_p():
    logits = torch.tensor([0.1, 0.2, 0.3, 0.4]).log()
    kept = apply_top_p(logits, 0.6).isfinite()
    assert kept.tolist() == [False, False, True, True]


@pytest.mark.parametrize("top_k", [0, -1, 49152, 10**9])
def test_top_k_off_or_at_least_vocab_is_a_no_op(top_k):
    logits = torch.randn(3, 49152)
    assert torch.equal(apply_top_k(logits, top_k), logits)


@settings(max_examples=60, deadline=None)
@given(temperature=st.floats(0.05, 3.0), top_k=st.integers(-1, 80), top_p=st.floats(0.01, 1.0),
       seed=st.integers(0, 2**31 - 1))
def test_filtered_distribution_equals_transformers_warpers(temperature, top_k, top_p, seed):
    logits = torch.randn(4, 64, generator=torch.Generator().manual_seed(seed)) * 3
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    assume(top_p_clear_of_rounding(logits, [params] * len(logits)))
    ours = filtered_logits(logits, params).softmax(-1)
    theirs = hf_probs(logits, params)
    assert torch.equal(ours > 0, theirs > 0)
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-5)


def test_greedy_is_exactly_argmax():
    logits = torch.randn(32, 1000)
    assert torch.equal(sample(logits, SamplingParams(temperature=0)), logits.argmax(-1))
    probs = filtered_logits(logits, SamplingParams(temperature=0)).softmax(-1)
    assert torch.equal(probs.argmax(-1), logits.argmax(-1)) and torch.all(probs.max(-1).values == 1)


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_k=10),
    SamplingParams(temperature=1.3, top_p=0.8),
    SamplingParams(temperature=1.0, top_k=25, top_p=0.9),
])
def test_empirical_frequencies_match_transformers_distribution(params):
    logits = torch.randn(200, generator=torch.Generator().manual_seed(1)) * 2
    expected = hf_probs(logits[None], params)[0].double()
    draws = sample(logits.expand(40_000, -1), params, torch.Generator().manual_seed(2))
    observed = torch.bincount(draws, minlength=200).double()
    assert observed[expected == 0].sum() == 0
    support = expected > 0
    result = chisquare(observed[support].numpy(), (expected[support] / expected[support].sum() * len(draws)).numpy())
    assert result.pvalue > 1e-4


def test_same_generator_seed_gives_the_same_samples():
    logits = torch.randn(500)
    params = SamplingParams(temperature=1.0, top_p=0.95)
    a = sample(logits.expand(20, -1), params, torch.Generator().manual_seed(7)).tolist()
    b = sample(logits.expand(20, -1), params, torch.Generator().manual_seed(7)).tolist()
    assert a == b
