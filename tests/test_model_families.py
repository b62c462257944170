"""Appendix 00a's families (Mistral, Qwen2, Qwen3, Phi-3, Qwen3-MoE; Llama 3's and YaRN's RoPE scaling): our logits and our
engine's greedy tokens equal transformers' on tiny random checkpoints saved as the hub ships them (sharded, with
an index), and a checkpoint that does not fit is refused naming the file and the tensor."""

import json
import shutil
import warnings

import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from conftest import hf_greedy
from rosellm_edu import LLM, SamplingParams, model_loader
from rosellm_edu.layers.rotary import RotaryEmbedding, rope_frequencies
from rosellm_edu.models.qwen3_moe import Qwen3MoeSparseBlock, grouped_experts, route
from rosellm_edu.models.tiny import logits_difference, save_tiny_checkpoint

SHAPES = dict(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, bos_token_id=1, eos_token_id=2)
LLAMA3 = dict(rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
              original_max_position_embeddings=32)
YARN = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=32)
MOE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True)
# name -> (model_type, the family's options on)
FAMILIES = {
    "mistral": ("mistral", dict(sliding_window=64, head_dim=32)),
    "qwen2": ("qwen2", {}),
    "qwen2-yarn": ("qwen2", dict(rope_parameters=YARN)),
    "qwen3": ("qwen3", dict(head_dim=32, tie_word_embeddings=True, attention_bias=True)),
    "phi3": ("phi3", dict(partial_rotary_factor=0.5)),
    "llama3": ("llama", dict(rope_parameters=LLAMA3)),
    "qwen3_moe": ("qwen3_moe", dict(MOE, head_dim=32)),
    "qwen3_moe-dense-first": ("qwen3_moe", dict(MOE, norm_topk_prob=False, mlp_only_layers=[0])),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {name: save_tiny_checkpoint(transformers.AutoConfig.for_model(model_type, **{**SHAPES, **options}),
                                           root / name, generation_config=dict(eos_token_id=[2, 7]))
                for name, (model_type, options) in FAMILIES.items()}


@pytest.mark.parametrize("name", FAMILIES)
def test_logits_equal_transformers_on_a_sharded_checkpoint(checkpoints, name):
    assert len(list(checkpoints[name].glob("*.safetensors"))) > 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        worst, agree = logits_difference(checkpoints[name], lengths=(1, 5, 17, 40))
    assert worst < 1e-5 and agree, (name, worst)


@pytest.mark.parametrize("name", FAMILIES)
def test_greedy_through_the_engine_equals_transformers_generate(checkpoints, name):
    """Chunked prefill (16 tokens a step), prefix caching (a shared first block) and preemption (a cache that
    holds the longest request alone) on: the tokens are still transformers' own."""
    path = checkpoints[name]
    g = torch.Generator().manual_seed(1)
    shared = torch.randint(3, 49152, (8,), generator=g).tolist()
    prompts = [shared + torch.randint(3, 49152, (n,), generator=g).tolist() for n in (1, 9, 22, 30)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        llm = LLM(str(path), dtype="float32", max_num_batched_tokens=16, block_size=4, num_kv_blocks=14)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    for out, prompt in zip(outs, prompts):
        assert out.outputs[0].token_ids == hf_greedy(hf, prompt, 12), name
    assert llm.llm_engine.scheduler.num_preemptions > 0
    assert llm.llm_engine.kv_cache_stats()["prefix_hit_rate"] > 0


def test_weights_load_straight_into_the_dtype_asked_for(checkpoints):
    """Qwen2's biases and Qwen3's q/k norms are born in bfloat16 too: no float32 copy of any parameter."""
    for name in ("qwen2", "qwen3"):
        born = []
        hook = torch.nn.modules.module.register_module_parameter_registration_hook(
            lambda module, pname, param: born.append(param.dtype))
        try:
            model = model_loader.load_model(checkpoints[name], torch.bfloat16)
        finally:
            hook.remove()
        assert born and set(born) == {torch.bfloat16}, name
        cast = model_loader.load_model(checkpoints[name], torch.float32).to(torch.bfloat16)
        for (pname, got), (_, want) in zip(model.named_parameters(), cast.named_parameters()):
            assert torch.equal(got, want), (name, pname)


def test_quantized_linears_run_the_families(checkpoints):
    """int8 Linears (chapter 11) replace every Linear of Qwen2's (biased) and Phi-3's (reordered) layers."""
    for name in ("qwen2", "phi3"):
        dense = model_loader.load_model(checkpoints[name])
        q8 = model_loader.load_model(checkpoints[name], quantization="int8")
        assert not any(isinstance(m, torch.nn.Linear) for m in q8.model.layers.modules()), name
        ids = torch.arange(3, 20)
        with torch.no_grad():
            a = dense.compute_logits(dense(ids, torch.arange(len(ids))))
            b = q8.compute_logits(q8(ids, torch.arange(len(ids))))
        assert (a - b).abs().max() < 0.05 * a.abs().max(), name


def test_a_sliding_window_cuts_the_context_with_a_warning(checkpoints):
    with pytest.warns(UserWarning, match="sliding_window=64 is shorter than max_position_embeddings=128"):
        llm = LLM(str(checkpoints["mistral"]), dtype="float32")
    assert llm.llm_engine.max_model_len == 64
    with pytest.warns(UserWarning), pytest.raises(ValueError, match="longer than the model's context"):
        LLM(str(checkpoints["mistral"]), dtype="float32", max_model_len=100)


@pytest.mark.parametrize("rope", [
    dict(LLAMA3, original_max_position_embeddings=8192, rope_theta=500000.0),
    dict(YARN, original_max_position_embeddings=32768, rope_theta=1000000.0),
    dict(YARN, beta_fast=16, beta_slow=2, truncate=False),
    dict(YARN, mscale=1.0, mscale_all_dim=0.5),
    dict(YARN, attention_factor=1.5, partial_rotary_factor=0.5),
    dict(rope_type="linear", rope_theta=10000.0, factor=2.0),
])
def test_rope_scaling_equals_transformers_rotary_embedding(rope):
    config = transformers.LlamaConfig(**{**SHAPES, "max_position_embeddings": 131072}, head_dim=64,
                                      rope_parameters=rope)
    ours, our_scale = rope_frequencies(config, 64)
    theirs, their_scale = ROPE_INIT_FUNCTIONS[rope["rope_type"]](config, None)
    rotated = len(theirs)
    torch.testing.assert_close(ours[:rotated], theirs, rtol=1e-6, atol=0)
    assert (ours[rotated:] == 0).all() and our_scale == pytest.approx(their_scale)
    if "partial_rotary_factor" not in rope:   # transformers' Llama rotates every dim
        config.max_position_embeddings = 256
        table = RotaryEmbedding(config, 64)
        positions = torch.arange(256)
        cos, sin = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(config)(
            torch.zeros(1), positions[None])
        torch.testing.assert_close(table.cos, cos[0], rtol=0, atol=1e-5)
        torch.testing.assert_close(table.sin, sin[0], rtol=0, atol=1e-5)


def broken_copy(checkpoints, tmp_path, name="qwen2", **config_changes):
    path = shutil.copytree(checkpoints[name], tmp_path / name)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, **config_changes}))
    return path


def test_a_missing_shard_is_named_with_a_tensor_it_holds(checkpoints, tmp_path):
    path = broken_copy(checkpoints, tmp_path)
    weight_map = json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]
    shard = weight_map["model.layers.1.mlp.down_proj.weight"]
    (path / shard).unlink()
    with pytest.raises(model_loader.CheckpointError, match=rf"lists the shard {shard}, which is missing"):
        model_loader.load_model(path)


def test_a_tensor_of_the_wrong_shape_is_named_with_its_file(checkpoints, tmp_path):
    path = broken_copy(checkpoints, tmp_path, intermediate_size=96)
    with pytest.raises(model_loader.CheckpointError,
                       match=r"model-\d+-of-\d+\.safetensors: tensor 'model\.layers\.0\.mlp\.\w+_proj\.weight': "
                             r"shape \(\d+, \d+\), but the model's config makes it"):
        model_loader.load_model(path)


def test_an_untied_head_missing_from_the_checkpoint_is_named(checkpoints, tmp_path):
    path = broken_copy(checkpoints, tmp_path, "qwen3", tie_word_embeddings=False)
    with pytest.raises(model_loader.CheckpointError, match=r"no weights for \[\('lm_head\.weight', None\)\]"):
        model_loader.load_model(path)


def test_an_unknown_rope_type_is_named_with_its_config(checkpoints, tmp_path):
    longrope = dict(rope_type="longrope", rope_theta=10000.0, short_factor=[1.0] * 8, long_factor=[4.0] * 8,
                    original_max_position_embeddings=32)
    path = broken_copy(checkpoints, tmp_path, rope_scaling=longrope)
    with pytest.raises(ValueError, match=r"config\.json: rope_scaling type 'longrope' is not implemented"):
        model_loader.load_model(path)


def test_an_unknown_model_type_is_named_with_its_config(checkpoints, tmp_path):
    path = broken_copy(checkpoints, tmp_path, model_type="gemma3")
    with pytest.raises(ValueError, match=r"config\.json: model_type 'gemma3' is not supported"):
        model_loader.load_model(path)


def test_every_expert_equals_transformers_expert_and_the_block_its_block(checkpoints):
    """Enough random tokens that the router sends some to every expert; each expert alone (all tokens, weight 1)
    against transformers' Qwen3MoeExperts, the router against its router, the block against its block."""
    path = checkpoints["qwen3_moe"]
    ours = model_loader.load_model(path)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    x = torch.randn(256, 64, generator=torch.Generator().manual_seed(0))
    for layer, their_layer in zip(ours.model.layers, theirs.model.layers):
        block, their_block = layer.mlp, their_layer.mlp
        assert isinstance(block, Qwen3MoeSparseBlock)
        with torch.no_grad():
            weights, experts = route(block.gate(x), block.top_k, block.norm_topk_prob)
            _, their_weights, their_experts = their_block.gate(x)
            assert torch.equal(experts, their_experts)
            torch.testing.assert_close(weights, their_weights, rtol=0, atol=1e-6)
            assert set(experts.unique().tolist()) == set(range(MOE["num_experts"]))   # every expert routed to
            for e in range(MOE["num_experts"]):
                chosen = experts == e                                              # (tokens, top_k)
                rows = chosen.any(-1)
                only = torch.full((int(rows.sum()), 1), e)
                got = grouped_experts(x[rows], block.gate_up, block.down, torch.ones(len(only), 1), only)
                want = their_block.experts(x[rows], only, torch.ones(len(only), 1))
                torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
            torch.testing.assert_close(block(x), their_block(x[None])[0], rtol=0, atol=1e-5)


def test_a_dense_layer_of_a_moe_model_stays_an_mlp(checkpoints):
    model = model_loader.load_model(checkpoints["qwen3_moe-dense-first"])
    assert not isinstance(model.model.layers[0].mlp, Qwen3MoeSparseBlock)
    assert isinstance(model.model.layers[1].mlp, Qwen3MoeSparseBlock)


@pytest.mark.parametrize("method", ["int8", "int4"])
def test_quantizing_a_moe_is_refused_by_name(checkpoints, method):
    with pytest.raises(ValueError, match=rf"quantization='{method}' is not implemented for qwen3_moe"):
        model_loader.load_model(checkpoints["qwen3_moe"], quantization=method)


def test_a_moe_checkpoint_missing_an_expert_is_named(checkpoints, tmp_path):
    """An expert's tensor dropped from its shard (the index rewritten without it): the load names the expert."""
    from safetensors.torch import load_file, save_file

    path = shutil.copytree(checkpoints["qwen3_moe"], tmp_path / "moe")
    index_file = path / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    name = "model.layers.1.mlp.experts.5.up_proj.weight"
    shard = path / index["weight_map"].pop(name)
    tensors = load_file(shard)
    del tensors[name]
    save_file(tensors, shard, metadata={"format": "pt"})
    index_file.write_text(json.dumps(index))
    with pytest.raises(model_loader.CheckpointError, match=r"no weights for experts \[\('model\.layers\.1\.mlp', 5, "
                                                           r"'up_proj'\)\]"):
        model_loader.load_model(path)
