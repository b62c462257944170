"""The LLM entry point and the step-wise engine, as the package has it and as chapters 01 and 02 built it:
outputs, stop conditions, seeds and bad input."""

import pytest
import torch
from conftest import chapter_class

from rosellm_edu import LLM, SamplingParams
from rosellm_edu.engine.llm_engine import LLMEngine, as_dtype, bfloat16_is_faster_here

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
CHAPTER_01 = "02_kv_cache.ipynb"          # the package as chapter 01 left it: no KV cache
CHAPTER_02 = "03_continuous_batching.ipynb"


@pytest.fixture(scope="module")
def llm():
    return LLM(dtype="float32")


def test_llm_runs_the_package_engine(llm):
    assert type(llm.llm_engine) is LLMEngine


def test_auto_dtype_follows_the_device_and_the_measured_matmul():
    assert as_dtype("auto", torch.device("cuda")) == torch.bfloat16
    expected = torch.bfloat16 if bfloat16_is_faster_here() else torch.float32
    assert as_dtype("auto", torch.device("cpu")) == expected
    assert as_dtype("float32", torch.device("cuda")) == torch.float32


def test_outputs_come_back_in_prompt_order_with_vllm_fields(llm, tokenizer):
    prompts = ["One", {"prompt_token_ids": tokenizer("Two plus two").input_ids}, "Three little pigs"]
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.prompt for o in outs] == ["One", None, "Three little pigs"]
    assert outs[1].prompt_token_ids == tokenizer("Two plus two").input_ids
    for out in outs:
        completion = out.outputs[0]
        assert out.finished and completion.finish_reason == "length" and len(completion.token_ids) == 12
        assert completion.text == tokenizer.decode(completion.token_ids, skip_special_tokens=True)
    assert len({o.request_id for o in outs}) == 3


def test_a_single_prompt_and_per_prompt_params(llm):
    outs = llm.generate(["a", "b"], [SamplingParams(max_tokens=2, temperature=0), SamplingParams(max_tokens=5, temperature=0)],
                        use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outs] == [2, 5]
    assert len(llm.generate("a", GREEDY, use_tqdm=False)) == 1


def test_eos_ends_a_request_unless_ignored(llm, tokenizer):
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "Say hi."}], tokenize=False,
                                         add_generation_prompt=True)
    out = llm.generate(chat, SamplingParams(temperature=0, max_tokens=200), use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason is None
    assert out.token_ids[-1] == tokenizer.eos_token_id and tokenizer.eos_token_id not in out.token_ids[:-1]
    ignored = llm.generate(chat, SamplingParams(temperature=0, max_tokens=len(out.token_ids) + 5, ignore_eos=True),
                           use_tqdm=False)[0].outputs[0]
    assert ignored.finish_reason == "length" and ignored.token_ids[:len(out.token_ids)] == out.token_ids


def test_stop_string_is_cut_from_the_text(llm):
    free = llm.generate("Count: 1, 2, 3,", SamplingParams(temperature=0, max_tokens=20), use_tqdm=False)[0].outputs[0]
    stop = free.text.strip()[:3]
    out = llm.generate("Count: 1, 2, 3,", SamplingParams(temperature=0, max_tokens=20, stop=[stop]),
                       use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert stop not in out.text and free.text.startswith(out.text)


def test_stop_token_ids_end_the_request(llm):
    free = llm.generate("Hello", GREEDY, use_tqdm=False)[0].outputs[0]
    token = free.token_ids[3]
    out = llm.generate("Hello", SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[token]),
                       use_tqdm=False)[0].outputs[0]
    assert out.token_ids == free.token_ids[:free.token_ids.index(token) + 1]
    assert out.finish_reason == "stop" and out.stop_reason == token


def test_seeded_sampling_is_reproducible_whatever_runs_beside_it(llm):
    params = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=16, seed=123)
    alone = llm.generate("Once upon a time", params, use_tqdm=False)[0].outputs[0].token_ids
    crowd = llm.generate(["Hi", "Once upon a time", "Bye"],
                         [SamplingParams(temperature=1.0, max_tokens=8), params, SamplingParams(temperature=1.0, max_tokens=8)],
                         use_tqdm=False)[1].outputs[0].token_ids
    assert alone == crowd


def test_unseeded_runs_are_reproducible_from_the_engine_seed():
    params = SamplingParams(temperature=1.0, max_tokens=10)
    a = LLM(seed=5, dtype="float32").generate(["x", "y"], params, use_tqdm=False)
    b = LLM(seed=5, dtype="float32").generate(["x", "y"], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in a] == [o.outputs[0].token_ids for o in b]


@pytest.mark.parametrize("prompt,match", [
    ("", "prompt is empty"),
    ({"prompt_token_ids": []}, "prompt is empty"),
    ({"prompt_token_ids": [1, 10**6]}, "token ids must be integers"),
    ({"prompt_token_ids": [1] * 8192}, "leaving no room"),
    (42, "a prompt is a string"),
])
def test_bad_prompts_fail_clearly_and_leave_the_engine_clean(llm, prompt, match):
    with pytest.raises(ValueError, match=match):
        llm.generate(["fine", prompt], GREEDY, use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()
    assert llm.generate("fine", GREEDY, use_tqdm=False)[0].finished


def test_mismatched_params_list_is_an_error(llm):
    with pytest.raises(ValueError, match="2 prompts but 1 sampling_params"):
        llm.generate(["a", "b"], [GREEDY], use_tqdm=False)


@pytest.mark.parametrize("chapter", [CHAPTER_01, CHAPTER_02])
def test_early_engines_step_abort_and_refuse_duplicate_ids(chapter):
    engine = chapter_class(chapter, "engine.llm_engine", "LLMEngine")(dtype="float32")
    engine.add_request("a", "Hello", GREEDY)
    engine.add_request("b", "World", GREEDY)
    with pytest.raises(ValueError, match="already running"):
        engine.add_request("a", "again", GREEDY)
    first = engine.step()
    assert [o.request_id for o in first] == ["a"] and len(first[0].outputs[0].token_ids) == 1
    engine.abort_request("a")
    with pytest.raises(KeyError, match="no unfinished request 'a'"):
        engine.abort_request("a")
    outs = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    assert {o.request_id for o in outs} == {"b"} and outs[-1].finished
    assert getattr(engine, "caches", {}) == {}


def test_unknown_dtype_is_rejected():
    with pytest.raises(ValueError, match="dtype must be"):
        LLM(dtype="int8")


def test_bfloat16_engine_generates(tokenizer):
    out = LLM(dtype="bfloat16").generate("The capital of France is", SamplingParams(temperature=0, max_tokens=4),
                                         use_tqdm=False)[0]
    assert out.outputs[0].text.strip().startswith("Paris")


def test_chapter_01_and_02_engines_give_identical_tokens():
    prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
    params = [SamplingParams(temperature=0, max_tokens=20), SamplingParams(temperature=0.9, top_k=50, max_tokens=20, seed=1),
              SamplingParams(temperature=1.2, top_p=0.8, max_tokens=20)]
    naive = chapter_class(CHAPTER_01, "llm", "LLM")(seed=3, dtype="float32").generate(prompts, params, use_tqdm=False)
    cached = chapter_class(CHAPTER_02, "llm", "LLM")(seed=3, dtype="float32").generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in naive] == [o.outputs[0].token_ids for o in cached]


def test_the_engine_makes_its_own_gpu_current_and_leaves_a_cpu_alone():
    from types import SimpleNamespace

    context = LLMEngine.device_context(SimpleNamespace(device=torch.device("cuda:1")))
    assert isinstance(context, torch.cuda.device) and context.idx == 1
    assert not isinstance(LLMEngine.device_context(SimpleNamespace(device=torch.device("cpu"))), torch.cuda.device)


@pytest.mark.parametrize("sizes", [dict(num_kv_blocks=0), dict(block_size=-4), dict(max_num_seqs=2.0)])
def test_engine_sizes_must_be_positive_integers(sizes):
    name = next(iter(sizes))
    with pytest.raises(ValueError, match=f"LLMEngine {name} must be a positive integer"):
        LLMEngine(dtype="float32", **sizes)
