"""Structured output: every constrained answer follows its grammar; greedy tokens equal a plain re-computation
(transformers' logits masked by xgrammar's own matcher, step by step); speculation, n > 1 and preemption change
nothing; a slow compilation blocks no other request; bad constraints are refused naming the field; nothing leaks."""

import json
import re
import threading
import time

import jsonschema
import pytest
import torch
import xgrammar as xgr

from rosellm_edu import LLM, LLMEngine, SamplingParams
from rosellm_edu.sampling_params import StructuredOutputsParams
from rosellm_edu.structured_output.backend import XgrammarBackend
from rosellm_edu.structured_output.manager import StructuredOutputManager

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
PROMPT = "<|im_start|>user\nDescribe a person as JSON with a name and an age.<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def llm():
    return LLM(dtype="float32", block_size=4)


def constrained(max_tokens: int = 60, **kind) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, structured_outputs=StructuredOutputsParams(**kind))


def assert_no_leak(engine: LLMEngine) -> None:
    stats = engine.kv_cache_stats()
    assert stats["free_blocks"] == stats["total_blocks"] and not engine.has_unfinished_requests()


def reference_greedy(hf_model, tokenizer, engine: LLMEngine, prompt: str, params: StructuredOutputsParams,
                     max_tokens: int) -> list[int]:
    """transformers' logits, masked by a fresh xgrammar matcher of the same grammar, argmax, until a stop token."""
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=engine.vocab_size,
                                              stop_token_ids=sorted(engine.eos_token_ids))
    backend = XgrammarBackend.__new__(XgrammarBackend)        # only parse(): the rest is xgrammar's own API here
    compiled = xgr.GrammarCompiler(info).compile_grammar(backend.parse(params))
    matcher, bitmask = xgr.GrammarMatcher(compiled), xgr.allocate_token_bitmask(1, engine.vocab_size)
    ids, out = tokenizer(prompt).input_ids, []
    for _ in range(max_tokens):
        with torch.no_grad():
            logits = hf_model(torch.tensor([ids + out])).logits[:, -1].float()      # (1, V)
        matcher.fill_next_token_bitmask(bitmask)
        xgr.apply_token_bitmask_inplace(logits, bitmask)
        token = int(logits.argmax())
        assert matcher.accept_token(token)
        out.append(token)
        if token in engine.eos_token_ids:
            break
    return out


@pytest.mark.parametrize("kind", [{"json": PERSON}, {"regex": r"[A-Z][a-z]+ is \d\d years old\."},
                                  {"choice": ["yes", "no", "maybe"]}, {"json_object": True},
                                  {"grammar": 'root ::= "The answer is " ("red" | "green" | "blue") "."'}])
def test_greedy_tokens_equal_transformers_masked_by_the_same_grammar(llm, hf_model, tokenizer, kind):
    params = constrained(**kind)
    got = llm.generate(PROMPT, params, use_tqdm=False)[0].outputs[0]
    expected = reference_greedy(hf_model, tokenizer, llm.llm_engine, PROMPT, params.structured_outputs, 60)
    assert got.token_ids == expected


def follows(text: str, kind: dict) -> bool:
    if "json" in kind or "json_object" in kind:
        value = json.loads(text)
        jsonschema.validate(value, kind.get("json", {"type": "object"}))
        return True
    if "regex" in kind:
        return re.fullmatch(kind["regex"], text) is not None
    return text in kind["choice"]


@pytest.mark.parametrize("kind", [{"json": PERSON}, {"json": PERSON, "disable_any_whitespace": True},
                                  {"json_object": True}, {"regex": r"\d{3}-\d{4}"}, {"choice": ["left", "right"]}])
def test_sampled_answers_all_follow_their_grammar_with_n_samples(llm, kind):
    params = SamplingParams(temperature=1.0, top_p=0.95, seed=7, n=4, max_tokens=200,
                            structured_outputs=StructuredOutputsParams(**kind))
    out = llm.generate([PROMPT, "Hello"], params, use_tqdm=False)
    texts = [c.text for o in out for c in o.outputs]
    assert len(texts) == 8
    assert all(c.finish_reason == "stop" for o in out for c in o.outputs), [c.finish_reason for o in out for c in o.outputs]
    assert all(follows(t, kind) for t in texts), texts
    assert_no_leak(llm.llm_engine)


def test_unconstrained_rows_of_a_mixed_batch_are_untouched(llm):
    plain = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    alone = llm.generate(["Once upon a time", "def add(a, b):"], plain, use_tqdm=False)
    mixed = llm.generate(["Once upon a time", PROMPT, "def add(a, b):"], [plain, constrained(json=PERSON), plain],
                         use_tqdm=False)
    assert [o.outputs[0].token_ids for o in alone] == [mixed[0].outputs[0].token_ids, mixed[2].outputs[0].token_ids]


def test_logprobs_report_the_models_own_distribution(llm, hf_model, tokenizer):
    params = SamplingParams(temperature=0, max_tokens=6, logprobs=0, structured_outputs=StructuredOutputsParams(
        choice=["Paris", "London"]))
    out = llm.generate("The capital of France is", params, use_tqdm=False)[0].outputs[0]
    ids = tokenizer("The capital of France is").input_ids
    with torch.no_grad():
        logits = hf_model(torch.tensor([ids + out.token_ids])).logits[0, len(ids) - 1:-1].float()
    expected = logits.log_softmax(-1)[torch.arange(len(out.token_ids)), out.token_ids]
    got = torch.tensor([entry[t].logprob for entry, t in zip(out.logprobs, out.token_ids)])
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("engine_kwargs", [
    {"speculative_config": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}},
    {"num_kv_blocks": 30}])           # room for the longest alone: the others are preempted and resumed
def test_speculation_and_preemption_change_no_constrained_token(llm, engine_kwargs):
    prompts = [PROMPT, "Write the JSON of a person: " + json.dumps({"name": "Ada", "age": 36}) * 3, "Hi", "Q: a name?"]
    params = [constrained(json=PERSON), constrained(json=PERSON), constrained(regex=r"(ab|cd){2,6}"),
              SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)]
    prompts, params = prompts * 2, params * 2
    expected = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    other = LLM(dtype="float32", block_size=4, **engine_kwargs)
    assert [o.outputs[0].token_ids for o in other.generate(prompts, params, use_tqdm=False)] == expected
    if "num_kv_blocks" in engine_kwargs:
        assert other.llm_engine.scheduler.num_preemptions > 0
    assert_no_leak(other.llm_engine)


def test_a_finished_grammar_ends_the_request_even_when_eos_is_ignored(llm):
    params = SamplingParams(temperature=0, max_tokens=50, ignore_eos=True,
                            structured_outputs=StructuredOutputsParams(choice=["yes", "no"]))
    out = llm.generate("Is the sky blue? Answer:", params, use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop" and len(out.token_ids) < 50
    assert out.text.removesuffix(llm.llm_engine.tokenizer.eos_token) in ("yes", "no")


class SlowBackend(XgrammarBackend):
    """xgrammar with a compile that waits for a signal: a grammar that takes as long as a test wants."""
    release = threading.Event()

    def compile(self, grammar):
        self.release.wait(timeout=60)
        return super().compile(grammar)


def test_a_slow_grammar_blocks_no_other_request_and_an_abort_leaks_nothing(llm):
    engine = llm.llm_engine
    engine.structured = StructuredOutputManager(
        lambda: SlowBackend(engine.tokenizer, engine.vocab_size, sorted(engine.eos_token_ids)))
    try:
        engine.add_request("slow", PROMPT, constrained(json=PERSON))
        engine.add_request("aborted", PROMPT, constrained(regex=r"\d+"))
        engine.add_request("plain", "Hello", SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
        finished = {}
        while "plain" not in finished:
            for out in engine.step():
                if out.finished:
                    finished[out.request_id] = out
        assert "slow" not in finished and engine.scheduler.find("slow").grammar.ready is False
        engine.abort_request("aborted")
        SlowBackend.release.set()
        while engine.has_unfinished_requests():
            for out in engine.step():
                finished[out.request_id] = out
        assert sorted(finished) == ["plain", "slow"]
        jsonschema.validate(json.loads(finished["slow"].outputs[0].text), PERSON)
        assert_no_leak(engine)
    finally:
        SlowBackend.release.set()
        engine.structured = StructuredOutputManager(
            lambda: XgrammarBackend(engine.tokenizer, engine.vocab_size, sorted(engine.eos_token_ids)))


@pytest.mark.parametrize("kind, field, reason", [
    ({"json": {"type": "object", "properties": {"a": {"type": "strin"}}}}, "structured_outputs.json", "strin"),
    ({"json": "{not json"}, "structured_outputs.json", "JSON"),
    ({"regex": "(ab"}, "structured_outputs.regex", "parenthesis"),
    ({"grammar": "root ::= missing_rule"}, "structured_outputs.grammar", "missing_rule"),
    ({"choice": ["x" * 70000]}, "structured_outputs.choice", "max_grammar_bytes"),
    ({"json": {"type": "object", "properties": {"a": {"not": {"type": "string"}}}}}, "structured_outputs.json",
     "'not' at #/properties/a"),
    ({"json": {"type": "array", "uniqueItems": True}}, "structured_outputs.json", "'uniqueItems' at #"),
    ({"json": {"allOf": [{"type": "integer"}, {"minimum": 3}]}}, "structured_outputs.json", "'allOf'"),
    ({"json": json.dumps({"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}})},
     "structured_outputs.json", "'if' at #")])
def test_a_bad_constraint_is_refused_naming_the_field_and_harms_no_other_request(llm, kind, field, reason):
    engine = llm.llm_engine
    engine.add_request("good", "Hi", SamplingParams(temperature=0, max_tokens=4))
    with pytest.raises(ValueError, match=re.escape(field) + ".*" + re.escape(reason)):
        engine.add_request("bad", "Hi", constrained(**kind))
    assert engine.scheduler.find("bad") is None
    while engine.has_unfinished_requests():
        engine.step()
    assert_no_leak(engine)


@pytest.mark.parametrize("kwargs, message", [({}, "exactly one"), ({"regex": "a", "choice": ["a"]}, "exactly one"),
                                             ({"choice": []}, "choice"), ({"choice": "ab"}, "choice"),
                                             ({"regex": 3}, "regex"), ({"json": 3}, "json")])
def test_structured_outputs_params_name_what_is_wrong(kwargs, message):
    with pytest.raises(ValueError, match=message):
        StructuredOutputsParams(**kwargs)


def test_each_constraint_compiles_once_and_the_cache_is_bounded():
    calls = []

    class Counting(XgrammarBackend):
        def compile(self, grammar):
            calls.append(grammar)
            return super().compile(grammar)

    from rosellm_edu.model_loader import load_tokenizer, resolve_model
    tok = load_tokenizer(resolve_model())
    manager = StructuredOutputManager(lambda: Counting(tok, 49152, [2]), max_cached=2)
    first = [manager.request(StructuredOutputsParams(json=dict(PERSON))) for _ in range(3)]
    assert all(r.compiled is first[0].compiled for r in first)
    for pattern in ("a+", "b+", "c+"):
        manager.request(StructuredOutputsParams(regex=pattern)).compiled.result()
    assert len(manager.compiled) == 2 and len(calls) == 4


def test_keywords_are_refused_only_where_they_are_keywords(llm):
    """A property may be named "not" or "if"; an enum may hold the word; neither is the keyword."""
    schema = {"type": "object", "properties": {"not": {"enum": ["if", "uniqueItems"]}}, "required": ["not"]}
    out = llm.generate("Answer:", constrained(json=schema), use_tqdm=False)[0].outputs[0]
    assert json.loads(out.text)["not"] in ("if", "uniqueItems")
