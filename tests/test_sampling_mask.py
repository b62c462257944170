"""The keep-sampling mask: each token's kept vocabulary ids and logZ, against a plain re-computation from
chapter 01's filter, in the sampler and through the engine (mixed requests, preemption, batch order)."""

import pytest
import torch
from conftest import top_p_clear_of_rounding
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from rosellm_edu import LLM, SamplingParams
from rosellm_edu.layers import sampler
from rosellm_edu.layers.sampler import SAMPLING_MASK_CAP, filtered_logits, sample


def reference_mask(logits: torch.Tensor, params: SamplingParams) -> tuple[list[int], float]:
    """Sort the support of chapter 01's filtered distribution; logZ = log of its mass under softmax(logits / T)."""
    kept = filtered_logits(logits[None], params)[0].isfinite().nonzero().squeeze(-1)
    temperature = params.temperature or 1.0
    return kept.tolist(), (logits.float() / temperature).log_softmax(-1)[kept].logsumexp(-1).item()


masked_params = st.builds(SamplingParams, temperature=st.sampled_from([0.0, 0.3, 1.0, 2.0]),
                          top_k=st.integers(-1, 70), top_p=st.floats(0.05, 1.0), return_sampling_mask=st.just(True))


@settings(max_examples=60, deadline=None)
@given(params=st.lists(masked_params, min_size=1, max_size=5), seed=st.integers(0, 2**31 - 1))
def test_mask_and_logz_equal_a_plain_reference_and_contain_the_token(params, seed):
    logits = torch.randn(len(params), 64, generator=torch.Generator().manual_seed(seed)) * 3
    assume(top_p_clear_of_rounding(logits, params))
    out = sample(logits, params, [None] * len(params), torch.Generator().manual_seed(seed))
    for row, p, token, mask, logz in zip(logits, params, out.token_ids, out.sampling_masks, out.sampling_logz):
        if not p.greedy and not 0 < p.top_k < logits.shape[1] and p.top_p == 1:    # nothing truncated
            assert mask is None and logz == 0.0
            continue
        expected_mask, expected_logz = reference_mask(row, p)
        assert token in mask
        assert mask == (expected_mask if not p.greedy else [row.argmax().item()])
        assert logz == pytest.approx(expected_logz if not p.greedy else row.log_softmax(-1).max().item(), abs=1e-5)


def test_top_p_keeps_the_token_that_crosses_p_in_the_mask():
    logits = torch.tensor([[0.1, 0.2, 0.3, 0.4]]).log()
    out = sample(logits, [SamplingParams(top_p=0.6, return_sampling_mask=True)], [None])
    assert out.sampling_masks == [[2, 3]] and out.sampling_logz[0] == pytest.approx(torch.tensor(0.7).log().item())


def test_no_mask_when_not_asked_or_when_nothing_is_truncated():
    logits = torch.randn(4, 100, generator=torch.Generator().manual_seed(0))
    params = [SamplingParams(top_k=5), SamplingParams(return_sampling_mask=True),
              SamplingParams(top_k=100, return_sampling_mask=True),
              SamplingParams(top_k=10**6, return_sampling_mask=True)]
    out = sample(logits, params, [None] * 4, None)
    assert out.sampling_masks == [None] * 4 and out.sampling_logz == [None, 0.0, 0.0, 0.0]


def test_a_kept_set_above_the_cap_lists_the_most_likely_ids_and_the_token_with_the_full_logz():
    vocab = 3 * SAMPLING_MASK_CAP
    logits = torch.randn(3, vocab, generator=torch.Generator().manual_seed(0)) * 0.1     # flat: top-p keeps most
    params = [SamplingParams(top_p=0.99, return_sampling_mask=True, seed=s) for s in range(3)]
    out = sample(logits, params, [torch.Generator().manual_seed(s) for s in range(3)], None)
    for row, p, token, mask, logz in zip(logits, params, out.token_ids, out.sampling_masks, out.sampling_logz):
        expected_mask, expected_logz = reference_mask(row, p)
        assert len(expected_mask) > SAMPLING_MASK_CAP and len(mask) == SAMPLING_MASK_CAP
        assert token in mask and set(mask) <= set(expected_mask) and mask == sorted(mask)
        most_likely = set(row.topk(SAMPLING_MASK_CAP - 1).indices.tolist())
        assert most_likely <= set(mask)
        assert logz == pytest.approx(expected_logz, abs=1e-4)


def test_the_top_p_fallback_gives_the_same_mask_as_a_whole_sort():
    logits = torch.randn(2, 400, generator=torch.Generator().manual_seed(2))
    params = [SamplingParams(top_p=0.9, return_sampling_mask=True)] * 2
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sampler, "TOP_P_CANDIDATES", 16)
        out = sample(logits, params, [None] * 2, None)
    for row, p, mask, logz in zip(logits, params, out.sampling_masks, out.sampling_logz):
        expected_mask, expected_logz = reference_mask(row, p)
        assert len(expected_mask) > 16 and mask == expected_mask and logz == pytest.approx(expected_logz, abs=1e-5)


def test_return_sampling_mask_must_be_a_bool():
    with pytest.raises(ValueError, match="SamplingParams.return_sampling_mask"):
        SamplingParams(return_sampling_mask="yes")


PROMPTS = ["The capital of France is", "def quicksort(xs):", "A long prompt about the history of computing. " * 8,
           "Once upon a time", "Hi"]


def test_engine_masks_through_preemption_and_mixed_batches_match_transformers_logits(hf_model):
    params = [SamplingParams(top_k=20, temperature=0.9, max_tokens=10, seed=1, return_sampling_mask=True,
                             ignore_eos=True),
              SamplingParams(temperature=0, max_tokens=8, return_sampling_mask=True, ignore_eos=True),
              SamplingParams(top_k=30, top_p=0.8, max_tokens=12, seed=2, return_sampling_mask=True, ignore_eos=True),
              SamplingParams(max_tokens=9, return_sampling_mask=True, ignore_eos=True),        # nothing truncated
              SamplingParams(top_k=5, max_tokens=7, ignore_eos=True)]                           # not asked
    llm = LLM(dtype="float32", num_kv_blocks=26, block_size=4)                 # room for the longest request alone: preemption
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    assert llm.llm_engine.scheduler.num_preemptions > 0
    for out, p in zip(outs, params):
        completion = out.outputs[0]
        tokens = completion.token_ids
        if not p.return_sampling_mask:
            assert completion.sampling_mask is None and completion.sampling_logz is None
            continue
        assert len(completion.sampling_logz) == len(tokens)
        if p.top_k <= 0 and p.top_p == 1 and not p.greedy:
            assert completion.sampling_mask is None and completion.sampling_logz == [0.0] * len(tokens)
            continue
        assert len(completion.sampling_mask) == len(tokens)
        assert all(t in mask for t, mask in zip(tokens, completion.sampling_mask))
        with torch.no_grad():   # transformers' logits at every generated position give the reference masks
            logits = hf_model(torch.tensor([out.prompt_token_ids + tokens])).logits[0, len(out.prompt_token_ids) - 1:-1]
        for row, mask, logz in zip(logits, completion.sampling_mask, completion.sampling_logz):
            expected_mask, expected_logz = reference_mask(row, p)
            assert mask == expected_mask
            assert logz == pytest.approx(expected_logz, abs=1e-3)

    # the seeded requests draw the same tokens and masks when they run alone, in another order, without preemption
    alone = LLM(dtype="float32").generate([PROMPTS[2], PROMPTS[0]], [params[2], params[0]], use_tqdm=False)
    for solo, crowded in zip(alone, [outs[2], outs[0]]):
        assert solo.outputs[0].token_ids == crowded.outputs[0].token_ids
        assert solo.outputs[0].sampling_mask == crowded.outputs[0].sampling_mask

