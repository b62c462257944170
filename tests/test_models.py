"""Our forward pass against transformers' LlamaForCausalLM and GPT2LMHeadModel."""

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from conftest import chapter_class, hf_greedy
from rosellm_edu import LLM, SamplingParams
from rosellm_edu.model_loader import load_model
from rosellm_edu.models.gpt2 import GPT2ForCausalLM
from rosellm_edu.models.llama import LlamaForCausalLM as OurLlama

LLAMA_CONFIGS = {
    "gqa-tied": dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True),
    "mha-untied": dict(num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False),
    "mqa-bias": dict(num_attention_heads=4, num_key_value_heads=1, attention_bias=True),
    "llama3-rope": dict(num_attention_heads=4, num_key_value_heads=2, rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 32}),
}
GPT2_CONFIGS = {"gelu_new": dict(activation_function="gelu_new"), "gelu": dict(activation_function="gelu")}


def small_llama(**overrides):
    config = LlamaConfig(vocab_size=120, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                         max_position_embeddings=128, rms_norm_eps=1e-5, bos_token_id=0, eos_token_id=1,
                         pad_token_id=0, **overrides)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def small_gpt2(**overrides):
    config = GPT2Config(vocab_size=120, n_embd=64, n_layer=3, n_head=4, n_positions=128, bos_token_id=0,
                        eos_token_id=1, **overrides)
    torch.manual_seed(0)
    return GPT2LMHeadModel(config).eval()


def ours_from(hf_model):
    cls = GPT2ForCausalLM if hf_model.config.model_type == "gpt2" else OurLlama
    model = cls(hf_model.config).eval()
    model.load_weights(hf_model.state_dict().items())
    return model


def assert_logits_match(ours, hf_model, ids, atol=1e-4):
    with torch.no_grad():
        mine = ours.compute_logits(ours(ids, torch.arange(len(ids))))
        theirs = hf_model(ids[None]).logits[0]
    torch.testing.assert_close(mine, theirs, atol=atol, rtol=1e-4)


@pytest.mark.parametrize("name", LLAMA_CONFIGS)
def test_llama_logits_match_transformers_on_random_configs(name):
    hf = small_llama(**LLAMA_CONFIGS[name])
    assert_logits_match(ours_from(hf), hf, torch.randint(0, 120, (40,)))


@pytest.mark.parametrize("name", GPT2_CONFIGS)
def test_gpt2_logits_match_transformers_on_random_configs(name):
    hf = small_gpt2(**GPT2_CONFIGS[name])
    assert_logits_match(ours_from(hf), hf, torch.randint(0, 120, (40,)))


def test_embedded_model_logits_match_transformers(our_model, hf_model, tokenizer):
    ids = torch.tensor(tokenizer("Paged attention stores the KV cache in fixed-size blocks.").input_ids)
    assert_logits_match(our_model, hf_model, ids, atol=2e-3)


def test_load_weights_rejects_a_checkpoint_with_missing_tensors():
    hf = small_llama(**LLAMA_CONFIGS["gqa-tied"])
    weights = {k: v for k, v in hf.state_dict().items() if "layers.1.mlp.up_proj" not in k}
    with pytest.raises(ValueError, match="no weights for"):
        OurLlama(hf.config).load_weights(weights.items())


@pytest.fixture(scope="module")
def embedded_llms():
    """Chapter 01's engine (the whole sequence every step), chapter 02's (a KV cache) and the package's."""
    return {"chapter 01": chapter_class("02_kv_cache.ipynb", "llm", "LLM")(dtype="float32"),
            "chapter 02": chapter_class("03_continuous_batching.ipynb", "llm", "LLM")(dtype="float32"),
            "package": LLM(dtype="float32")}


PROMPTS = ["The capital of France is", "def quicksort(xs):", "Ingredients for pancakes:",
           "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"]


@pytest.mark.parametrize("engine", ["chapter 01", "chapter 02", "package"])
@pytest.mark.parametrize("n", [1, 7, 24])
def test_greedy_generation_equals_transformers_generate(embedded_llms, hf_model, engine, n):
    llm = embedded_llms[engine]
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True), use_tqdm=False)
    for out in outs:
        assert out.outputs[0].token_ids == hf_greedy(hf_model, out.prompt_token_ids, n)
        assert out.outputs[0].finish_reason == "length"


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_checkpoint_directory_loads_and_generates_like_transformers(tmp_path, tokenizer, family):
    hf = small_llama(**LLAMA_CONFIGS["gqa-tied"]) if family == "llama" else small_gpt2()
    hf.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    assert_logits_match(load_model(tmp_path), hf, torch.randint(0, 120, (30,)))
    llm = LLM(model=str(tmp_path), dtype="float32")
    prompt = [5, 17, 99, 3]
    out = llm.generate({"prompt_token_ids": prompt}, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True),
                       use_tqdm=False)[0]
    assert out.outputs[0].token_ids == hf_greedy(hf, prompt, 20)


@pytest.mark.parametrize("rope_parameters", [
    {"rope_type": "default", "rope_theta": 10000.0},
    {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 64},
    {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
    {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64},
], ids=lambda p: p["rope_type"])
def test_rotary_tables_are_built_on_the_device_the_model_is_built_on(rope_parameters):
    from rosellm_edu.layers.rotary import RotaryEmbedding

    config = LlamaConfig(hidden_size=64, num_attention_heads=4, max_position_embeddings=256,
                         rope_parameters=rope_parameters)
    with torch.device("meta"):                  # as model_loader builds a model under torch.device("cuda")
        rotary = RotaryEmbedding(config, 16)
    assert rotary.cos.device.type == "meta" and rotary.sin.device.type == "meta"
