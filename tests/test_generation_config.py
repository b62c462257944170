"""Appendix 13b: a checkpoint's generation_config.json as vLLM reads it. Its end tokens stop greedy and sampled runs
(in every mode, not under ignore_eos); its sampling fields are the defaults of LLM.generate without params and of
the server's unset request fields, and generation_config="vllm" drops them. Each is checked against the same
request with the defaults written out, or against a run of the same weights without the file."""

import json
import shutil
import warnings

import httpx
import pytest
import transformers

from rosellm_edu import LLM, SamplingParams
from rosellm_edu.engine.async_llm_engine import AsyncLLMEngine
from rosellm_edu.engine.llm_engine import LLMEngine
from rosellm_edu.entrypoints.openai.api_server import build_app
from rosellm_edu.entrypoints.openai.server_thread import ServerThread
from rosellm_edu.generation_config import diff_sampling_params, read_generation_config
from rosellm_edu.models.tiny import save_tiny_checkpoint

SHAPES = dict(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, bos_token_id=1, eos_token_id=2)
PROMPT = {"prompt_token_ids": list(range(200, 215))}
SAMPLED = SamplingParams(temperature=1.0, seed=11, max_tokens=40)


def llm(path, **kwargs) -> LLM:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return LLM(str(path), dtype="float32", **kwargs)


def tokens(engine: LLM, params=None) -> list[int]:
    return engine.generate(PROMPT, params, use_tqdm=False)[0].outputs[0].token_ids


def extra_eos_in(run: list[int]) -> int:
    """A token of `run`, first seen at index >= 2 and before any EOS (2): the end token the file will add."""
    head = run[:run.index(2)] if 2 in run else run
    return next(t for i, t in enumerate(head) if i >= 2 and t not in head[:i])


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """The same weights twice: without a generation_config.json of note, and with one naming an extra end token
    (taken from a sampled run, which also passes through greedy's) and sampling defaults."""
    root = tmp_path_factory.mktemp("genconfig")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        base = save_tiny_checkpoint(transformers.LlamaConfig(**SHAPES), root / "base")
    plain = llm(base)
    greedy_run = tokens(plain, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    sampled_run = tokens(plain, SamplingParams(temperature=1.0, seed=11, max_tokens=40, ignore_eos=True))
    extra = [extra_eos_in(greedy_run), extra_eos_in(sampled_run)]
    path = shutil.copytree(base, root / "with-file")
    (path / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": [2, *extra], "temperature": 0.7, "top_k": 5, "max_new_tokens": 12, "do_sample": True}))
    return dict(base=base, path=path, extra=extra, greedy_run=greedy_run, sampled_run=sampled_run)


def until_first(run: list[int], stops: set[int]) -> list[int]:
    end = next(i for i, t in enumerate(run) if t in stops)
    return run[:end + 1]


@pytest.mark.parametrize("mode", ["auto", "vllm"])
def test_greedy_and_sampled_runs_stop_at_the_files_extra_end_token(checkpoints, mode):
    engine, stops = llm(checkpoints["path"], generation_config=mode), {2, *checkpoints["extra"]}
    greedy = engine.generate(PROMPT, SamplingParams(temperature=0, max_tokens=40), use_tqdm=False)[0].outputs[0]
    assert greedy.token_ids == until_first(checkpoints["greedy_run"], stops) and greedy.finish_reason == "stop"
    assert greedy.token_ids[-1] in checkpoints["extra"]
    sampled = engine.generate(PROMPT, SAMPLED, use_tqdm=False)[0].outputs[0]
    assert sampled.token_ids == until_first(checkpoints["sampled_run"], stops) and sampled.finish_reason == "stop"


def test_ignore_eos_ignores_the_files_end_tokens_too(checkpoints):
    engine = llm(checkpoints["path"])
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    assert tokens(engine, params) == checkpoints["greedy_run"]


def test_defaults_are_the_files_sampling_fields_and_none_under_vllm(checkpoints):
    config = read_generation_config(checkpoints["path"])
    assert diff_sampling_params(config) == {"temperature": 0.7, "top_k": 5, "max_tokens": 12}
    assert llm(checkpoints["path"]).get_default_sampling_params() == SamplingParams(temperature=0.7, top_k=5,
                                                                                    max_tokens=12)
    assert llm(checkpoints["path"], generation_config="vllm").get_default_sampling_params() == SamplingParams()
    assert llm(checkpoints["base"]).get_default_sampling_params() == SamplingParams()   # eos and bos only
    with pytest.raises(ValueError, match="generation_config must be 'auto', 'vllm' or a directory"):
        llm(checkpoints["path"], generation_config="nonsense")


def test_a_directory_mode_reads_that_directorys_file(checkpoints):
    engine = llm(checkpoints["base"], generation_config=str(checkpoints["path"]))
    assert engine.get_default_sampling_params() == SamplingParams(temperature=0.7, top_k=5, max_tokens=12)
    assert set(checkpoints["extra"]) <= engine.llm_engine.eos_token_ids


def test_generate_without_params_uses_the_defaults_and_given_params_stay_as_given(checkpoints):
    """Same engine seed, same draws: no params = the defaults written out; given params are not merged."""
    def run(params, mode="auto"):
        return tokens(llm(checkpoints["path"], seed=3, generation_config=mode), params)

    assert run(None) == run(SamplingParams(temperature=0.7, top_k=5, max_tokens=12))
    assert run(None, "vllm") == run(SamplingParams(), "vllm")
    given = SamplingParams(max_tokens=30)    # temperature 1, no top-k: the user's, though left at our default
    assert run(given) == run(given, "vllm")


@pytest.mark.parametrize("mode", ["auto", "vllm"])
def test_the_server_fills_only_the_fields_a_request_leaves_out(checkpoints, mode):
    engine = AsyncLLMEngine(LLMEngine(str(checkpoints["path"]), dtype="float32", generation_config=mode))
    thread = ServerThread(build_app(engine, "tiny"))
    url = thread.start()
    offline = llm(checkpoints["path"], generation_config=mode)
    defaults = {"temperature": 0.7, "top_k": 5} if mode == "auto" else {}
    cap = 12 if mode == "auto" else 30

    def served(**fields) -> dict:
        body = {"model": "tiny", "prompt": PROMPT["prompt_token_ids"], "max_tokens": 30, "seed": 5,
                "ignore_eos": True, **fields}
        response = httpx.post(f"{url}/completions", json=body, timeout=120)
        assert response.status_code == 200, response.text
        return response.json()

    def expected(**fields) -> str:
        params = SamplingParams(max_tokens=cap, seed=5, ignore_eos=True, **fields)
        return offline.generate(PROMPT, params, use_tqdm=False)[0].outputs[0].text

    try:
        unset = served()
        assert unset["choices"][0]["text"] == expected(**defaults)
        assert unset["usage"]["completion_tokens"] == cap                      # max_new_tokens caps max_tokens
        assert served(temperature=1.0)["choices"][0]["text"] == expected(**{**defaults, "temperature": 1.0})
        assert served(top_k=0, temperature=0.7)["choices"][0]["text"] == expected(temperature=0.7)
    finally:
        thread.stop()
        engine.shutdown()


@pytest.mark.parametrize("flag, expected", [([], {"temperature": 0.7, "top_k": 5, "max_tokens": 12}),
                                            (["--generation-config", "vllm"], {})])
def test_the_serve_command_takes_the_generation_config_flag(checkpoints, flag, expected):
    from rosellm_edu.entrypoints.cli import build_engine, serve_args

    engine = build_engine(serve_args(["--model", str(checkpoints["path"]), "--dtype", "float32",
                                      "--num-kv-blocks", "32", *flag]))
    assert engine.get_diff_sampling_param() == expected
