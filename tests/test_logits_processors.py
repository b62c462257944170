"""The parameters users send: penalties, logit_bias, min_tokens and min_p against transformers' logits processors
(or the formula, row by row), in mixed batches; SamplingParams refusing bad values; the chapter 01 engine end to
end against transformers' generate."""

from collections import Counter

import pytest
import torch
from conftest import chapter_class
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import (MinNewTokensLengthLogitsProcessor, MinPLogitsWarper, RepetitionPenaltyLogitsProcessor,
                          SequenceBiasLogitsProcessor)

from rosellm_edu.layers.logits_processors import (ProcessorState, apply_kept_processors, apply_logits_processors,
                                                  token_counts)
from rosellm_edu.layers.sampler import apply_min_p, filtered_logits
from rosellm_edu.sampling_params import SamplingParams
from rosellm_edu.sequence import Sequence

VOCAB = 40
EOS = {0, 3}
CHAPTER_01_ENGINE = "02_kv_cache.ipynb"   # the package as chapter 01 leaves it


@pytest.fixture(scope="module")
def chapter_01_params():   # a fixture, not a module constant: the GPU run imports this file without the book's tools
    return chapter_class(CHAPTER_01_ENGINE, "sampling_params", "SamplingParams")


def logits_rows(n: int, seed: int) -> torch.Tensor:
    """(n, VOCAB) logits with both signs, some exactly 0 (the repetition penalty's edge)."""
    logits = torch.randn(n, VOCAB, generator=torch.Generator().manual_seed(seed)) * 4
    logits[:, ::7] = 0.0
    return logits


ids = st.lists(st.integers(0, VOCAB - 1), max_size=12)
seeds = st.integers(0, 2**31 - 1)


@settings(max_examples=40, deadline=None)
@given(prompt=ids.filter(bool), output=ids, penalty=st.floats(0.05, 5.0), seed=seeds)
def test_repetition_penalty_equals_transformers(prompt, output, penalty, seed):
    logits = logits_rows(1, seed)
    ours = apply_logits_processors(logits, [SamplingParams(repetition_penalty=penalty)], [prompt], [output], EOS)
    theirs = RepetitionPenaltyLogitsProcessor(penalty)(torch.tensor([prompt + output]), logits.clone())
    assert torch.equal(ours, theirs)


@settings(max_examples=40, deadline=None)
@given(output=ids, presence=st.floats(-2, 2), frequency=st.floats(-2, 2), seed=seeds)
def test_presence_and_frequency_penalties_follow_openais_formula_token_by_token(output, presence, frequency, seed):
    logits = logits_rows(1, seed)
    params = SamplingParams(presence_penalty=presence, frequency_penalty=frequency)
    ours = apply_logits_processors(logits, [params], [[1, 2, 5]], [output], EOS)
    expected = logits.clone().double()
    for token, count in Counter(output).items():
        expected[0, token] -= frequency * count + presence
    torch.testing.assert_close(ours.double(), expected, rtol=0, atol=1e-5)
    untouched = [t for t in range(VOCAB) if t not in output]
    assert torch.equal(ours[0, untouched], logits[0, untouched])   # the prompt's tokens (1, 2, 5) included


@settings(max_examples=40, deadline=None)
@given(bias=st.dictionaries(st.integers(0, VOCAB - 1), st.floats(-100, 100), max_size=6), seed=seeds)
def test_logit_bias_equals_transformers_sequence_bias(bias, seed):
    logits = logits_rows(1, seed)
    ours = apply_logits_processors(logits, [SamplingParams(logit_bias=bias)], [[1]], [[]], EOS)
    if not bias:
        assert ours is logits
        return
    theirs = SequenceBiasLogitsProcessor([[[t], b] for t, b in bias.items()])(torch.tensor([[1]]), logits.clone())
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


@pytest.mark.parametrize("generated", [0, 2, 4, 5, 9])
def test_min_tokens_blocks_eos_and_stop_tokens_as_transformers_blocks_eos(generated):
    logits, prompt, output = logits_rows(1, generated), [7, 8, 9], list(range(10, 10 + generated))
    params = SamplingParams(min_tokens=5, stop_token_ids=[30, 31])
    ours = apply_logits_processors(logits, [params], [prompt], [output], EOS)
    stops = sorted(EOS | {30, 31})
    theirs = MinNewTokensLengthLogitsProcessor(len(prompt), 5, stops)(torch.tensor([prompt + output]), logits.clone())
    assert torch.equal(ours, theirs)
    assert ours[0, stops].isinf().all() == (generated < 5)
    ignoring = apply_logits_processors(logits, [SamplingParams(min_tokens=5, ignore_eos=True)], [prompt], [output], EOS)
    assert torch.equal(ignoring, logits)     # ignore_eos: EOS stays possible, as vLLM does


@settings(max_examples=60, deadline=None)
@given(min_p=st.floats(0, 1), temperature=st.floats(0.1, 3), seed=seeds)
def test_min_p_equals_transformers_min_p_warper(min_p, temperature, seed):
    logits = logits_rows(2, seed) / temperature
    assert torch.equal(apply_min_p(logits, min_p), MinPLogitsWarper(min_p)(None, logits.clone()))


def test_filtered_logits_applies_min_p_after_temperature_and_before_top_k():
    logits = logits_rows(1, 0)[0]
    params = SamplingParams(temperature=0.7, min_p=0.05, top_k=5)
    expected = MinPLogitsWarper(0.05)(None, (logits / 0.7)[None])[0]
    kth = expected.topk(5).values[-1]
    expected = expected.masked_fill(expected < kth, -torch.inf)
    assert torch.equal(filtered_logits(logits, params), expected)


def row_params(draw_flags: list[bool]) -> SamplingParams:
    rep, pres, freq, bias, min_tokens = draw_flags
    return SamplingParams(repetition_penalty=1.7 if rep else 1.0, presence_penalty=0.9 if pres else 0.0,
                          frequency_penalty=-0.6 if freq else 0.0, logit_bias={4: 3.0, 11: -50.0} if bias else None,
                          min_tokens=8 if min_tokens else 0, stop_token_ids=[12], max_tokens=20)


@settings(max_examples=40, deadline=None)
@given(flags=st.lists(st.lists(st.booleans(), min_size=5, max_size=5), min_size=1, max_size=6),
       histories=st.lists(st.tuples(ids.filter(bool), ids), min_size=6, max_size=6), seed=seeds)
def test_each_row_of_a_mixed_batch_gets_its_single_row_result(flags, histories, seed):
    logits = logits_rows(len(flags), seed)
    params = [row_params(f) for f in flags]
    prompts, outputs = [h[0] for h in histories[:len(flags)]], [h[1] for h in histories[:len(flags)]]
    before = logits.clone()
    batch = apply_logits_processors(logits, params, prompts, outputs, EOS)
    assert torch.equal(logits, before)                 # the caller's logits stay raw
    assert batch.shape == logits.shape and batch.dtype == torch.float32
    for i, p in enumerate(params):
        alone = apply_logits_processors(logits[i:i + 1], [p], [prompts[i]], [outputs[i]], EOS)
        assert torch.equal(batch[i], alone[0])
        if not any(flags[i]):
            assert torch.equal(batch[i], logits[i])    # a row at the defaults is untouched


def test_a_batch_that_uses_none_of_them_comes_back_as_the_same_tensor():
    logits = logits_rows(3, 1).to(torch.bfloat16)
    params = [SamplingParams(), SamplingParams(temperature=0.5, top_k=3, min_p=0.2),
              SamplingParams(min_tokens=2, max_tokens=4)]
    assert apply_logits_processors(logits, params, [[1], [2], [3]], [[], [5], [6, 7]], EOS) is logits


def test_token_counts_counts_each_row_with_padding_dropped():
    rows = [[1, 1, 2], [], [VOCAB - 1] * 4]
    expected = torch.zeros(3, VOCAB)
    for i, row in enumerate(rows):
        for t in row:
            expected[i, t] += 1
    assert torch.equal(token_counts(rows, VOCAB, torch.device("cpu")), expected)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_no_device_to_host_sync_on_a_gpu():
    logits = logits_rows(4, 0).cuda()
    params = [row_params([True] * 5), SamplingParams(), row_params([False, True, True, False, True]),
              row_params([True, False, False, True, False])]
    prompts, outputs = [[1, 2]] * 4, [[5, 5, 6]] * 4
    expected = apply_logits_processors(logits.cpu(), params, prompts, outputs, EOS)
    states = [ProcessorState.build(p, prompt, VOCAB, logits.device) for p, prompt in zip(params, prompts)]
    drafted = [[], [7], [7, 8], []]
    expected_kept = apply_logits_processors(logits.cpu(), params, prompts,
                                            [out + d for out, d in zip(outputs, drafted)], EOS)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = apply_logits_processors(logits, params, prompts, outputs, EOS)
        kept = apply_kept_processors(logits, params, states, outputs, EOS, drafted)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.testing.assert_close(got.cpu(), expected)
    torch.testing.assert_close(kept.cpu(), expected_kept)


@pytest.mark.parametrize("field,value", [
    ("min_p", -0.1), ("min_p", 1.5), ("min_p", float("nan")), ("min_tokens", -1), ("min_tokens", 1.5),
    ("presence_penalty", 2.5), ("presence_penalty", -2.1), ("presence_penalty", float("inf")),
    ("frequency_penalty", 3), ("frequency_penalty", "0"), ("repetition_penalty", 0), ("repetition_penalty", -1.0),
    ("repetition_penalty", float("inf")), ("logit_bias", {5: 101.0}), ("logit_bias", {"5": 1.0}),
    ("logit_bias", {-1: 1.0}), ("logit_bias", {5: float("nan")}), ("logit_bias", [(5, 1.0)]),
    ("include_stop_str_in_output", 1), ("skip_special_tokens", None), ("max_tokens", 0),
])
@pytest.mark.parametrize("chapter", ["01", "package"])
def test_sampling_params_refuse_bad_values_naming_the_field(chapter, field, value, chapter_01_params):
    cls = chapter_01_params if chapter == "01" else SamplingParams
    with pytest.raises(ValueError, match=f"SamplingParams.{field} "):
        cls(**{field: value})


@pytest.mark.parametrize("chapter", ["01", "package"])
def test_sampling_params_accept_the_edges(chapter, chapter_01_params):
    cls = chapter_01_params if chapter == "01" else SamplingParams
    cls(min_p=1.0, presence_penalty=-2, frequency_penalty=2, repetition_penalty=0.01,
                   logit_bias={0: -100, 7: 100.0}, max_tokens=None, min_tokens=1000)
    with pytest.raises(ValueError, match="SamplingParams.min_tokens "):
        cls(max_tokens=4, min_tokens=5)


@pytest.fixture(scope="module", params=["01", "package"])
def engine(request):
    """Chapter 01's engine (its own step calls the processors) and the package's (chapter 06's batched sampler)."""
    if request.param == "01":
        return chapter_class(CHAPTER_01_ENGINE, "engine.llm_engine", "LLMEngine")(dtype="float32")
    from rosellm_edu.engine.llm_engine import LLMEngine
    return LLMEngine(dtype="float32")


def run(engine, prompt, params):
    engine.add_request("r", prompt, params)
    outs = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    return outs[-1]


def test_greedy_with_repetition_penalty_equals_transformers_generate(engine, hf_model):
    out = run(engine, "List some fruits:", SamplingParams(temperature=0, max_tokens=24, repetition_penalty=1.3))
    prompt = out.prompt_token_ids
    expected = hf_model.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False, repetition_penalty=1.3,
                                 pad_token_id=engine.tokenizer.eos_token_id)[0, len(prompt):]
    plain = run(engine, "List some fruits:", SamplingParams(temperature=0, max_tokens=24))
    assert out.outputs[0].token_ids == expected.tolist()
    assert out.outputs[0].token_ids != plain.outputs[0].token_ids   # the penalty did change something


def chat(engine, text: str) -> str:
    return engine.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                add_generation_prompt=True)


def test_min_tokens_never_stops_before_min_tokens(engine):
    prompt = chat(engine, "Reply with one word: yes or no?")
    free = run(engine, prompt, SamplingParams(temperature=0, max_tokens=40)).outputs[0]
    assert free.finish_reason == "stop"
    stop_token = free.token_ids[0]
    for min_tokens in [len(free.token_ids) + 3, 12]:
        params = SamplingParams(temperature=0, max_tokens=40, min_tokens=min_tokens, stop_token_ids=[stop_token],
                                stop=[free.text[:2]] if free.text[:2].strip() else None)
        out = run(engine, prompt, params).outputs[0]
        assert len(out.token_ids) >= min_tokens
        assert not set(out.token_ids[:min_tokens]) & (engine.eos_token_ids | {stop_token})


def test_include_stop_str_in_output_keeps_the_stop_string(engine):
    prompt = "Count: 1, 2, 3,"
    free = run(engine, prompt, SamplingParams(temperature=0, max_tokens=20)).outputs[0]
    stop = free.text.strip()[:3]
    cut = run(engine, prompt, SamplingParams(temperature=0, max_tokens=20, stop=[stop])).outputs[0]
    kept = run(engine, prompt, SamplingParams(temperature=0, max_tokens=20, stop=[stop],
                                              include_stop_str_in_output=True)).outputs[0]
    assert kept.finish_reason == cut.finish_reason == "stop" and kept.stop_reason == stop
    assert kept.text == cut.text + stop and free.text.startswith(kept.text)


def test_a_stop_tokens_text_is_left_out_unless_asked_for(engine):
    free = run(engine, "Hello", SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)).outputs[0]
    token = free.token_ids[3]
    for include in [False, True]:
        out = run(engine, "Hello", SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[token],
                                                  include_stop_str_in_output=include)).outputs[0]
        ids = out.token_ids if include else out.token_ids[:-1]
        assert out.token_ids[-1] == token and out.text == engine.tokenizer.decode(ids, skip_special_tokens=True)


def test_skip_special_tokens_false_keeps_them_in_the_text(engine):
    special = engine.tokenizer.convert_tokens_to_ids("<|im_start|>")
    params = dict(temperature=0, max_tokens=6, logit_bias={special: 100.0}, ignore_eos=True)
    shown = run(engine, "Hi", SamplingParams(skip_special_tokens=False, **params)).outputs[0]
    hidden = run(engine, "Hi", SamplingParams(**params)).outputs[0]
    assert shown.token_ids == hidden.token_ids == [special] * 6
    assert shown.text == "<|im_start|>" * 6 and hidden.text == ""


def test_max_tokens_none_runs_to_the_context(tokenizer):
    seq = Sequence("r", None, [1, 2, 3], SamplingParams(max_tokens=None))
    for token in [1000, 1001, 1002, 1003]:
        seq.append_token(token, tokenizer, eos_token_ids=set(), max_model_len=7)
    assert seq.finish_reason == "length" and len(seq) == 7 and seq.text == tokenizer.decode([1000, 1001, 1002, 1003])


def test_min_tokens_holds_stop_strings_back_and_later_searches_only_new_text(tokenizer):
    ids = tokenizer("a stop here, then more words and a stop again", add_special_tokens=False).input_ids
    seq = Sequence("r", None, [1], SamplingParams(stop=["stop"], min_tokens=5, max_tokens=len(ids)))
    for token in ids:
        seq.append_token(token, tokenizer, eos_token_ids=set(), max_model_len=10**6)
        if seq.finished:
            break
    assert seq.stop_reason == "stop" and seq.text == "a stop here, then more words and a "


def test_llm_generate_a_penalized_row_beside_plain_ones_equals_transformers(hf_model):
    from rosellm_edu.llm import LLM

    llm = LLM(dtype="float32")
    prompts = ["List some fruits:", "Count: 1, 2, 3,", "The capital of France is"]
    params = [SamplingParams(temperature=0, max_tokens=12, repetition_penalty=penalty) for penalty in [1.3, 1.0, 0.8]]
    for out, p in zip(llm.generate(prompts, params, use_tqdm=False), params):   # one batch, mixed rows
        prompt = out.prompt_token_ids
        expected = hf_model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                                     repetition_penalty=p.repetition_penalty, pad_token_id=0)[0, len(prompt):]
        assert out.outputs[0].token_ids == expected.tolist()


@settings(max_examples=60, deadline=None)
@given(flags=st.lists(st.lists(st.booleans(), min_size=5, max_size=5), min_size=1, max_size=5),
       prompts=st.lists(ids.filter(bool), min_size=5, max_size=5),
       steps=st.lists(st.lists(st.tuples(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=3),
                                         st.lists(st.integers(0, VOCAB - 1), max_size=3)), min_size=5, max_size=5),
                      max_size=6), seed=seeds)
def test_kept_state_equals_a_plain_recomputation_from_the_token_lists(flags, prompts, steps, seed):
    """Each sequence's ProcessorState, built once and used step after step while its output grows (by one token,
    or a few accepted drafts), gives the logits that apply_logits_processors computes from the whole lists,
    drafts included: row j of a sequence sees its first j drafts as output."""
    params = [row_params(f) for f in flags]
    states = [ProcessorState.build(p, prompts[i], VOCAB, torch.device("cpu")) for i, p in enumerate(params)]
    outputs = [[] for _ in params]
    for n, step in enumerate(steps):
        drafts = [d for _, d in step[:len(params)]]
        rows = [i for i, d in enumerate(drafts) for _ in range(1 + len(d))]
        drafted = [d[:j] for d in drafts for j in range(1 + len(d))]
        logits = logits_rows(len(rows), seed + n)
        kept = apply_kept_processors(logits, [params[i] for i in rows], [states[i] for i in rows],
                                     [outputs[i] for i in rows], EOS, drafted)
        rebuilt = apply_logits_processors(logits, [params[i] for i in rows], [prompts[i] for i in rows],
                                          [outputs[i] + d for i, d in zip(rows, drafted)], EOS)
        assert torch.equal(kept, rebuilt)
        assert (kept is logits) == (rebuilt is logits)
        for out, (appended, _) in zip(outputs, step):
            out += appended
    for state, p in zip(states, params):
        assert (state is None) == (p.repetition_penalty == 1 and p.presence_penalty == 0
                                   and p.frequency_penalty == 0 and not p.logit_bias)


def test_a_state_is_built_once_and_counts_only_the_new_tokens():
    state = ProcessorState.build(SamplingParams(frequency_penalty=0.5, logit_bias={3: 1.0}), [1, 2], VOCAB,
                                 torch.device("cpu"))
    output = [5, 5]
    state.count(output)
    output += [7]
    state.count(output)
    state.count(output)                        # twice in one step (rows of one sequence): counted once
    expected = torch.zeros(VOCAB)
    expected[5], expected[7] = 2, 1
    assert torch.equal(state.output_counts, expected) and state.counted == 3
    assert state.prompt_mask is None           # only the repetition penalty reads the prompt


def test_the_engines_kept_states_equal_a_recomputation_with_drafts_forks_and_preemption(monkeypatch):
    """Every step of a speculating engine short of KV blocks: the logits its kept states give equal those
    apply_logits_processors computes from each row's prompt and whole output (drafts included), for samples
    forked from a parent (n > 1) and for sequences preempted and resumed."""
    from rosellm_edu.engine import llm_engine
    from rosellm_edu.engine.llm_engine import LLMEngine

    engine = LLMEngine(dtype="float32", block_size=4, num_kv_blocks=20, max_num_seqs=5,
                       speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
                                           "prompt_lookup_max": 3})
    seen = {"steps": 0, "drafted": 0}

    def checked(logits, params, states, output_ids, eos_token_ids, drafted=None):
        prompts = {id(s.output_token_ids): s.prompt_token_ids for s in engine.scheduler.running}
        rebuilt = apply_logits_processors(logits, params, [prompts[id(out)] for out in output_ids],
                                          [out + d for out, d in zip(output_ids, drafted or [[]] * len(params))],
                                          eos_token_ids)
        kept = kept_processors(logits, params, states, output_ids, eos_token_ids, drafted)
        assert torch.equal(kept, rebuilt)
        seen["steps"] += 1
        seen["drafted"] += sum(map(len, drafted or []))
        return kept

    kept_processors = llm_engine.apply_kept_processors
    monkeypatch.setattr(llm_engine, "apply_kept_processors", checked)
    prompt = "one two three one two three one two three one two"
    requests = [SamplingParams(temperature=0, max_tokens=12, repetition_penalty=1.2, ignore_eos=True),
                SamplingParams(n=2, seed=1, max_tokens=12, frequency_penalty=0.7, presence_penalty=-0.3,
                               ignore_eos=True),
                SamplingParams(temperature=0, max_tokens=10, logit_bias={t: -30.0 for t in range(200, 900)},
                               min_tokens=8),
                SamplingParams(temperature=0, max_tokens=10)]
    for i, params in enumerate(requests):
        engine.add_request(str(i), prompt, params)
    while engine.has_unfinished_requests():
        engine.step()
    assert seen["steps"] and seen["drafted"], seen
    assert engine.scheduler.num_preemptions
