"""Speculative decoding changes no output: greedy as without it and as transformers, sampling with the same
distribution (chi-square), masks and logprobs of every emitted token, no lost request or leaked block, and the
prefix cache holding only real tokens."""

from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import hf_greedy
from rosellm_edu import LLM, LLMEngine, SamplingParams, model_loader
from rosellm_edu.engine.block_manager import chain_hash
from rosellm_edu.engine.model_runner import table_rows
from rosellm_edu.spec_decode.config import SpeculativeConfig
from rosellm_edu.spec_decode.ngram_proposer import NgramProposer
from rosellm_edu.spec_decode.rejection_sampler import accepted_count, rejection_sample

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
TEXT = "The quick brown fox jumps over the lazy dog. The dog sleeps in the sun while the fox runs away. "
PROMPTS = ["Repeat this text exactly.\n\n" + TEXT * 2 + "\n\nRepeated:\n", "def fibonacci(n):",
           "Summarise: " + TEXT + "\nSummary:", "Hello, my name is"]
LENGTHS = (40, 24, 30, 17)


@pytest.fixture(scope="module")
def plain():
    return LLM(dtype="float32", block_size=4)


@pytest.fixture(scope="module")
def spec():
    return LLM(dtype="float32", block_size=4, speculative_config=NGRAM)


def greedy(max_tokens: int, **extra) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, **extra)


def assert_no_leak(llm):
    stats = llm.llm_engine.kv_cache_stats()
    assert stats["free_blocks"] == stats["total_blocks"]
    assert not llm.llm_engine.has_unfinished_requests()


def assert_cache_holds_real_tokens(llm, outputs):
    """Every hashed block is a block of some request's real tokens: no rejected draft was ever hashed."""
    bm = llm.llm_engine.scheduler.block_manager
    real = set()
    for out in outputs:
        for c in out.outputs:
            ids, prev = out.prompt_token_ids + c.token_ids, None
            for start in range(0, len(ids) - bm.block_size + 1, bm.block_size):
                prev = chain_hash(prev, tuple(ids[start:start + bm.block_size]))
                real.add(prev)
    stray = [h for h in bm.cached if h not in real]
    assert not stray, f"{len(stray)} cached blocks hold tokens no request produced"


@pytest.mark.parametrize("engine_kwargs", [
    dict(),
    dict(enable_prefix_caching=False, block_size=16),
    dict(max_num_batched_tokens=16, block_size=8),      # the budget cuts drafts short
    dict(max_num_seqs=1),
])
def test_greedy_equals_the_engine_without_speculation_and_transformers(hf_model, plain, engine_kwargs):
    llm = LLM(dtype="float32", **{"block_size": 4, **engine_kwargs}, speculative_config=NGRAM)
    params = [greedy(n) for n in LENGTHS]
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    for out, base, p in zip(outs, plain.generate(PROMPTS, params, use_tqdm=False), params):
        assert out.outputs[0].token_ids == base.outputs[0].token_ids
        assert out.outputs[0].token_ids == hf_greedy(hf_model, out.prompt_token_ids, p.max_tokens)
        assert out.outputs[0].text == base.outputs[0].text
    stats = llm.llm_engine.spec_stats()
    assert stats["num_accepted_tokens"] > 0 and stats["mean_accepted_length"] > 1
    assert_no_leak(llm)
    assert_cache_holds_real_tokens(llm, outs)


def test_preemption_under_a_tiny_kv_budget_loses_nothing(hf_model):
    llm = LLM(dtype="float32", num_kv_blocks=40, block_size=4, speculative_config=NGRAM)
    params = [greedy(n) for n in LENGTHS]
    for out, p in zip(llm.generate(PROMPTS, params, use_tqdm=False), params):
        assert out.outputs[0].token_ids == hf_greedy(hf_model, out.prompt_token_ids, p.max_tokens)
    assert llm.llm_engine.scheduler.num_preemptions > 0
    assert_no_leak(llm)


request = st.tuples(
    st.lists(st.integers(100, 106), min_size=2, max_size=30),   # a small alphabet: suffixes recur, n-grams hit
    st.integers(1, 14),                                          # max_tokens
    st.one_of(st.none(), st.integers(100, 106)),                 # a stop token, if any
)


@pytest.fixture(scope="module")
def tight_pair():
    """A spec and a plain engine with a small cache: preemption and prefix hits happen across examples."""
    kwargs = dict(dtype="float32", block_size=2, num_kv_blocks=48, max_num_seqs=4, max_num_batched_tokens=24)
    return LLM(**kwargs), LLM(**kwargs, speculative_config={**NGRAM, "prompt_lookup_min": 1}), []


@settings(max_examples=6, deadline=None)
@given(requests=st.lists(request, min_size=1, max_size=4))
def test_random_requests_all_finish_as_without_speculation_and_leak_no_block(tight_pair, requests):
    base, llm, produced = tight_pair                      # produced: every output so far, whose blocks may be cached
    prompts = [{"prompt_token_ids": ids} for ids, _, _ in requests]
    params = [greedy(n, stop_token_ids=[] if stop is None else [stop]) for _, n, stop in requests]
    expected = base.generate(prompts, params, use_tqdm=False)
    got = llm.generate(prompts, params, use_tqdm=False)
    assert len(got) == len(requests)
    for a, b in zip(got, expected):
        assert a.finished and a.outputs[0].token_ids == b.outputs[0].token_ids
        assert (a.outputs[0].finish_reason, a.outputs[0].stop_reason) == (b.outputs[0].finish_reason,
                                                                          b.outputs[0].stop_reason)
    assert_no_leak(llm)
    produced += got
    assert_cache_holds_real_tokens(llm, produced)


def test_stops_inside_an_accepted_run_end_the_output_where_plain_decoding_does(plain, spec):
    tok = spec.get_tokenizer()
    fox = tok(" fox").input_ids[0]
    cases = [greedy(40, stop=["lazy"]), greedy(40, stop_token_ids=[fox]),
             SamplingParams(temperature=0, max_tokens=13), SamplingParams(temperature=0, max_tokens=200),
             greedy(40, stop=[" sun"], include_stop_str_in_output=True)]
    prompt = PROMPTS[0]
    for p in cases:
        a, b = spec.generate(prompt, p, use_tqdm=False)[0].outputs[0], plain.generate(prompt, p, use_tqdm=False)[0].outputs[0]
        assert (a.token_ids, a.text, a.finish_reason, a.stop_reason) == (b.token_ids, b.text, b.finish_reason,
                                                                         b.stop_reason), p
    assert spec.llm_engine.spec_stats()["num_accepted_tokens"] > 0
    assert_no_leak(spec)


def test_a_batch_mixing_speculating_plain_sampled_and_forked_requests(plain, spec):
    prompts = PROMPTS + [PROMPTS[0], PROMPTS[2]]
    params = [greedy(n) for n in LENGTHS] + [greedy(1), greedy(12, n=2)]
    sampled = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=20, seed=5, n=3, ignore_eos=True)
    outs = spec.generate(prompts + [PROMPTS[0]], params + [sampled], use_tqdm=False)
    bases = plain.generate(prompts, params, use_tqdm=False)
    for out, base in zip(outs, bases):
        assert [c.token_ids for c in out.outputs] == [c.token_ids for c in base.outputs]
    assert [len(c.token_ids) for c in outs[-1].outputs] == [20, 20, 20]
    assert_no_leak(spec)


def test_a_seeded_request_gives_the_same_sample_alone_and_in_a_batch(spec):
    p = SamplingParams(temperature=0.8, top_k=40, max_tokens=30, seed=7, ignore_eos=True)
    alone = spec.generate(PROMPTS[0], p, use_tqdm=False)[0].outputs[0].token_ids
    crowd = spec.generate(PROMPTS, [p, greedy(20), greedy(9), SamplingParams(temperature=1.0, max_tokens=25)],
                          use_tqdm=False)
    assert crowd[0].outputs[0].token_ids == alone


def test_logprobs_and_masks_of_every_emitted_token_are_the_models(plain, spec):
    """Greedy: equal to plain decoding's. Sampled with top-k: each token's logprob is the model's (scored again
    as a prompt) and its mask is the top k ids there."""
    p = greedy(30, logprobs=3, return_sampling_mask=True)
    a = spec.generate(PROMPTS[0], p, use_tqdm=False)[0].outputs[0]
    b = plain.generate(PROMPTS[0], p, use_tqdm=False)[0].outputs[0]
    assert a.sampling_mask == b.sampling_mask and len(a.logprobs) == 30
    for x, y in zip(a.logprobs, b.logprobs):
        assert x.keys() == y.keys()
        assert all(abs(x[t].logprob - y[t].logprob) < 1e-3 and x[t].rank == y[t].rank for t in x)
    out = spec.generate(PROMPTS[0], SamplingParams(temperature=0.7, top_k=20, max_tokens=30, seed=3, logprobs=1,
                                                   return_sampling_mask=True, ignore_eos=True), use_tqdm=False)[0]
    c = out.outputs[0]
    ids = out.prompt_token_ids + c.token_ids
    scored = plain.generate({"prompt_token_ids": ids}, SamplingParams(max_tokens=1, prompt_logprobs=20),
                            use_tqdm=False)[0].prompt_logprobs
    start = len(out.prompt_token_ids)
    for i, token in enumerate(c.token_ids):
        assert abs(c.logprobs[i][token].logprob - scored[start + i][token].logprob) < 1e-3
        top20 = sorted(t for t, lp in scored[start + i].items() if lp.rank <= 20)
        assert c.sampling_mask[i] == top20
    assert spec.llm_engine.spec_stats()["num_accepted_tokens"] > 0


def chi_square_p_value(statistic: float, df: int) -> float:
    """The chi-square distribution's survival function: the regularised upper incomplete gamma Q(df/2, x/2)."""
    return float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64),
                                         torch.tensor(statistic / 2.0, dtype=torch.float64)))


def homogeneity_p_value(a: Counter, b: Counter) -> float:
    """Two equal-sized samples from one distribution? Categories seen fewer than 10 times in all are pooled."""
    big = [c for c in set(a) | set(b) if a[c] + b[c] >= 10]
    rest_a, rest_b = sum(a.values()) - sum(a[c] for c in big), sum(b.values()) - sum(b[c] for c in big)
    pairs = [(a[c], b[c]) for c in big] + ([(rest_a, rest_b)] if rest_a + rest_b else [])
    statistic = sum((x - y) ** 2 / (x + y) for x, y in pairs)
    return chi_square_p_value(statistic, len(pairs) - 1)


def first_tokens(llm, prompt, params, num: int) -> Counter:
    outs = llm.generate([prompt] * len(params), params, use_tqdm=False)
    return Counter(tuple(o.outputs[0].token_ids[:num]) for o in outs)


@pytest.mark.parametrize("sampling", [dict(temperature=0.9, top_k=30), dict(temperature=1.2, top_k=50, top_p=0.8)])
def test_sampled_tokens_follow_the_same_distribution_as_without_speculation(sampling):
    prompt = "one two three four one two three four one two three four one two three four one"
    kwargs = dict(dtype="bfloat16", max_num_seqs=128)
    base, llm = LLM(**kwargs), LLM(**kwargs, speculative_config={**NGRAM, "prompt_lookup_min": 1})
    n = 300
    params = [SamplingParams(**sampling, max_tokens=4, seed=i, ignore_eos=True) for i in range(n)]
    a, b = first_tokens(llm, prompt, params, 3), first_tokens(base, prompt, params, 3)
    assert llm.llm_engine.spec_stats()["num_accepted_tokens"] > n // 4   # drafts were accepted, often
    assert homogeneity_p_value(a, b) > 1e-3
    skewed = Counter({k: v for k, v in b.items()})
    skewed[max(b, key=b.get)] += n // 4                                # the test can tell a different law
    assert homogeneity_p_value(a, skewed) < 1e-3


def test_rejection_sample_emits_tokens_distributed_as_the_target():
    gen = torch.Generator().manual_seed(0)
    V, k, draws = 10, 3, 5000
    p = torch.softmax(torch.randn(k + 1, V, generator=gen), dim=-1)
    q = torch.softmax(2 * torch.randn(k, V, generator=gen), dim=-1)
    first, bonus = Counter(), Counter()
    for _ in range(draws):
        drafts = [int(torch.multinomial(q[i], 1, generator=gen)) for i in range(k)]
        out = rejection_sample(p, drafts, q, gen)
        first[out[0]] += 1
    expected = draws * p[0]
    statistic = sum((first[t] - expected[t]) ** 2 / expected[t] for t in range(V))
    assert chi_square_p_value(float(statistic), V - 1) > 1e-3
    wrong = draws * q[0]
    assert chi_square_p_value(float(sum((first[t] - wrong[t]) ** 2 / wrong[t] for t in range(V))), V - 1) < 1e-3


def test_rejection_sample_with_point_masses_accepts_a_certain_draft_and_never_recovers_it():
    p = torch.tensor([[0.0, 1.0, 0.0], [0.5, 0.0, 0.5], [0.2, 0.3, 0.5]])
    gen = torch.Generator().manual_seed(1)
    for _ in range(50):
        out = rejection_sample(p, [1, 1], None, gen)       # draft 1 certain at 0, impossible at 1
        assert out[0] == 1 and len(out) == 2 and out[1] in (0, 2)
    assert accepted_count([5, 6, 9], [5, 6, 7]) == 2 and accepted_count([1], []) == 0


def test_ngram_proposer_takes_the_longest_latest_match():
    proposer = NgramProposer(3, 1, 3)
    assert proposer.propose_one([1, 2, 3, 9, 1, 2, 3, 4, 5, 2, 3], 3) == [4, 5, 2]   # "2 3": its latest match
    assert proposer.propose_one([7, 8, 9], 3) == []
    assert proposer.propose_one([1, 2, 1, 2], 5) == [1, 2]                           # not past the end
    assert NgramProposer(3, 2, 2).propose_one([4, 1, 2, 4, 2], 2) == []               # min_n 2: "4 2" never seen


@pytest.mark.parametrize("config, words", [
    ({"method": "medusa", "num_speculative_tokens": 2}, "'method'"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "'num_speculative_tokens'"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2, "prompt_lookup_min": 3},
     "'prompt_lookup_min'"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_mx": 3}, "prompt_lookup_mx"),
    ({"method": "ngram", "num_speculative_tokens": 2, "model": "x"}, "'model'"),
    ({"method": "draft_model", "num_speculative_tokens": 2, "quantization": "int3"}, "'quantization'"),
    ({"method": "draft_model", "num_speculative_tokens": 2, "prompt_lookup_max": 3}, "prompt_lookup_max"),
    ({"method": "ngram", "num_speculative_tokens": 2, "dtype": "bfloat16"}, "dtype"),
    ({"method": "ngram", "num_speculative_tokens": 2, "disable_by_batch_size": 0}, "'disable_by_batch_size'"),
    ("ngram", "dict"),
])
def test_bad_speculative_configs_are_refused_naming_the_key(config, words):
    with pytest.raises(ValueError, match=words):
        SpeculativeConfig.from_dict(config)
    with pytest.raises(ValueError, match=words):
        LLMEngine(speculative_config=config)



def test_a_draft_model_changes_no_greedy_output_and_frees_its_cache(plain):
    llm = LLM(dtype="float32", block_size=4, num_kv_blocks=60,
              speculative_config={"method": "draft_model", "model": None, "num_speculative_tokens": 3})
    params = [greedy(n) for n in LENGTHS]
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    for out, base in zip(outs, plain.generate(PROMPTS, params, use_tqdm=False)):
        assert out.outputs[0].token_ids == base.outputs[0].token_ids
    assert llm.llm_engine.spec_stats()["acceptance_rate"] > 0.9   # the target's own weights guess its picks
    assert_no_leak(llm)
    llm.generate(PROMPTS[1], greedy(3), use_tqdm=False)            # its steps forget the finished sequences
    proposer = llm.llm_engine.proposer
    assert set(proposer.blocks.block_tables) <= {"4"} and set(proposer.fed) <= {"4"}


def test_an_int4_self_draft_changes_no_greedy_output(plain):
    llm = LLM(dtype="float32", num_kv_blocks=60, speculative_config={
        "method": "draft_model", "model": None, "quantization": "int4", "num_speculative_tokens": 3})
    params = [greedy(n) for n in LENGTHS]
    for out, base in zip(llm.generate(PROMPTS, params, use_tqdm=False), plain.generate(PROMPTS, params, use_tqdm=False)):
        assert out.outputs[0].token_ids == base.outputs[0].token_ids
    assert llm.llm_engine.spec_stats()["acceptance_rate"] > 0.5
    assert_no_leak(llm)


def test_disable_by_batch_size_turns_drafts_off_above_that_many_running_sequences(plain):
    llm = LLM(dtype="float32", block_size=4, speculative_config={**NGRAM, "disable_by_batch_size": 2})
    params = [greedy(24)] * len(PROMPTS)                                            # all run to the end together
    outs = llm.generate(PROMPTS, params, use_tqdm=False)                            # more than 2 at once: plain
    assert llm.llm_engine.spec_stats()["num_draft_tokens"] == 0
    for out, base in zip(outs, plain.generate(PROMPTS, params, use_tqdm=False)):
        assert out.outputs[0].token_ids == base.outputs[0].token_ids
    llm.generate(PROMPTS[:2], params[:2], use_tqdm=False)                           # 2 running: it speculates
    assert llm.llm_engine.spec_stats()["num_draft_tokens"] > 0


def test_serve_speculative_config_flag_builds_a_speculating_engine():
    from rosellm_edu.entrypoints.cli import build_engine, serve_args

    args = serve_args(["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2}',
                       "--num-kv-blocks", "16", "--dtype", "float32"])
    engine = build_engine(args)
    assert isinstance(engine.proposer, NgramProposer) and engine.speculative_config.num_speculative_tokens == 2
    with pytest.raises(SystemExit):
        serve_args(["--speculative-config", "{not json"])


@pytest.mark.parametrize("config", [NGRAM, {"method": "draft_model", "model": None, "num_speculative_tokens": 3}])
def test_verifying_and_catch_up_passes_decode_one_row_per_position_with_the_eager_logits(monkeypatch, plain, config):
    """Each runner's decode path, where a row carries several positions, against its eager path on the same batch
    (the K/V both write are the same tokens'), and the greedy output as without speculation. float32 weights: an
    int4 draft rounds its activations to 8 bits, where the two paths' sums in another order can flip a rounding."""
    llm = LLM(dtype="float32", block_size=4, num_kv_blocks=120, speculative_config=config)
    engine = llm.llm_engine
    runners = [engine.runner] + ([engine.proposer.runner] if hasattr(engine.proposer, "runner") else [])
    widened = []
    for runner in runners:
        def checked(batch, block_tables, runner=runner, run=runner.run):
            logits = runner.run_eager(batch, table_rows(block_tables, batch, runner.kv_cache.block_size))
            got = run(batch, block_tables)
            if runner.is_decode(batch) and any(s.num_new > 1 for s in batch):
                torch.testing.assert_close(got, logits, rtol=1e-3, atol=1e-3)
                widened.append(runner)
            return got
        monkeypatch.setattr(runner, "run", checked)
    params = [greedy(n) for n in LENGTHS]
    for out, base in zip(llm.generate(PROMPTS, params, use_tqdm=False), plain.generate(PROMPTS, params, use_tqdm=False)):
        assert out.outputs[0].token_ids == base.outputs[0].token_ids
    assert engine.runner.decode_query_len == 1 + config["num_speculative_tokens"]
    assert set(widened) == set(runners)          # the target verified, and a draft caught up, as decode rows
    assert_no_leak(llm)


def test_a_float32_draft_takes_the_int8_dot_loop_where_it_won():
    from rosellm_edu.layers.quantization import Int4Linear, int8_dot_won
    from rosellm_edu.spec_decode.draft_model_proposer import load_draft_model
    draft = load_draft_model(None, torch.float32, torch.device("cpu"), "int4")
    layers = [m for m in draft.modules() if isinstance(m, Int4Linear)]
    assert layers and all((getattr(m, "tiles", None) is not None) == int8_dot_won(m) for m in layers)
