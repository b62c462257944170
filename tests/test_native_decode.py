"""NativeDecode (appendix 11b): a decode step issued as one C++ call computes exactly what the model's
modules compute (logits and the K/V it writes), refuses the models it cannot run, and the engine gives the same
greedy tokens whichever way its runner chose."""

import gc
import weakref

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, Qwen3Config

from rosellm_edu import LLM, SamplingParams, timing
from rosellm_edu.engine import model_runner
from rosellm_edu.engine.kv_cache import KVCache
from rosellm_edu.engine.model_runner import ModelRunner
from rosellm_edu.engine.native_decode import NativeDecode, native_linear
from rosellm_edu.kernels import cpu_decode
from rosellm_edu.kernels.build import build_cpp
from rosellm_edu.layers.quantization import Int4Linear, Int8GroupLinear, Int8Linear, quantize_model
from rosellm_edu.models import model_class

from conftest import embedded_weights_only, requires_avx2

pytestmark = pytest.mark.skipif(cpu_decode.extension() is None, reason="no C++ compiler for the kernels")

ROWS = {torch.float32: 4, torch.bfloat16: 4, "int4": 8, "int8": 8}


def tiny_model(kind, bias: bool = False) -> nn.Module:
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         attention_bias=bias, tie_word_embeddings=False)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if kind in ("int4", "int8") else kind
    model = model_class(config)(config).to(dtype).eval()
    for p in model.parameters():
        p.data.normal_(0, 0.1)
    if kind in ("int4", "int8"):
        quantize_model(model, kind)
        for layer in model.modules():
            if isinstance(layer, (Int4Linear, Int8GroupLinear, Int8Linear)) and getattr(layer, "tiles", None) is None:
                layer.tile_()
    model.model.fusion = "cpp"                     # the modules run the same kernels as the two calls
    return model


def runner_at(model, rows: int, gen) -> ModelRunner:
    """A runner over random K/V whose first `rows` rows decode sequences of random lengths on shuffled blocks."""
    cache = KVCache(model.config, 4 * ROWS["int4"], 4, next(model.parameters()).dtype)
    cache.k.normal_(generator=gen), cache.v.normal_(generator=gen)
    runner = ModelRunner(model, cache, ROWS["int4"], 256)
    blocks = torch.randperm(cache.num_blocks, generator=gen).view(ROWS["int4"], -1).int()    # (rows, 4)
    lengths = torch.randint(1, 15, (ROWS["int4"],), generator=gen)
    runner.block_tables[:, :4] = blocks
    runner.positions[:] = lengths
    runner.input_ids[:] = torch.randint(256, (ROWS["int4"],), generator=gen)
    runner.slot_mapping[:] = blocks[torch.arange(ROWS["int4"]), lengths // 4].long() * 4 + lengths % 4
    runner.context_lens[:] = (lengths + 1).int()
    return runner


@pytest.mark.parametrize("kind", [torch.float32, torch.bfloat16, "int4", "int8"])
def test_the_native_step_computes_what_the_modules_compute(kind):
    model, gen = tiny_model(kind), torch.Generator().manual_seed(1)
    for rows in range(1, ROWS[kind] + 1):
        runner = runner_at(model, rows, gen)
        native = NativeDecode.build(model, runner.kv_cache)
        assert native is not None and native.max_rows == ROWS[kind]
        ids, positions = runner.input_ids[:rows], runner.positions[:rows]
        ctx = runner.decode_attention(rows, 4)
        with torch.no_grad():
            expected = model(ids, positions, ctx)
            k, v = runner.kv_cache.k.clone(), runner.kv_cache.v.clone()
        for one_region in (False, True):
            slots = runner.slot_mapping[:rows]
            runner.kv_cache.k[:, slots], runner.kv_cache.v[:, slots] = 0, 0     # written again, or the test fails
            with torch.no_grad():
                got = native(ids, positions, ctx, one_region=one_region)
            assert torch.equal(got, expected), f"{rows} rows, one region: {one_region}"
            assert torch.equal(runner.kv_cache.k, k) and torch.equal(runner.kv_cache.v, v)


@pytest.mark.parametrize("kind", ["int4", torch.bfloat16])
@pytest.mark.parametrize("threads", [1, 3])
def test_one_region_computes_what_the_modules_compute_on_any_team_with_keys_split(kind, threads):
    """Sequences of 120-200 keys, so that attention splits them (flash-decoding) where there are threads to feed;
    three threads take unequal shares of the columns, and one runs the region alone."""
    model, gen = tiny_model(kind), torch.Generator().manual_seed(4)
    cache = KVCache(model.config, 3 * 50, 4, torch.bfloat16)
    cache.k.normal_(generator=gen), cache.v.normal_(generator=gen)
    runner = ModelRunner(model, cache, 3, 256)
    lengths = torch.tensor([199, 120, 150])
    runner.block_tables[:, :50] = torch.randperm(150, generator=gen).view(3, 50).int()
    runner.positions[:3] = lengths
    runner.input_ids[:3] = torch.randint(256, (3,), generator=gen)
    runner.slot_mapping[:3] = runner.block_tables[torch.arange(3), lengths // 4].long() * 4 + lengths % 4
    runner.context_lens[:3] = (lengths + 1).int()
    native, before = NativeDecode.build(model, cache), torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for rows in (1, 3):
            ids, positions, ctx = runner.input_ids[:rows], runner.positions[:rows], runner.decode_attention(rows, 50)
            with torch.no_grad():
                expected = model(ids, positions, ctx)
                assert torch.equal(native(ids, positions, ctx, one_region=True), expected)
    finally:
        torch.set_num_threads(before)


@requires_avx2
def test_the_avx2_build_runs_one_region_as_it_runs_a_region_per_kernel():
    """Built without AVX-512, the region's shares run AVX2's few-rows loop (M a constant) and tile loop: an
    AVX-512 machine runs the v16 loops natively, so this is where it tests the others."""
    avx2 = build_cpp("rosellm_edu_decode_layer_avx2", "decode_layer.cpp", ["decode_plan", "decode_step",
                     "decode_region"], "skipped", extra_cflags=("-fno-trapping-math", "-mno-avx512f"))
    for kind in (torch.bfloat16, "int4"):
        model, gen = tiny_model(kind), torch.Generator().manual_seed(6)
        runner = runner_at(model, 4, gen)
        native, m = NativeDecode.build(model, runner.kv_cache), model.model
        plan = avx2.decode_plan(native.layers, m.rotary.cos, m.rotary.sin, native.k_caches, native.v_caches,
                                native.scale, m.norm.weight, m.norm.eps)
        for rows in (1, 3, 4):
            ctx = runner.decode_attention(rows, 4)
            with torch.no_grad():
                x = m.embed_tokens(runner.input_ids[:rows])
                args = (runner.positions[:rows], ctx.slot_mapping, ctx.decode.block_tables, ctx.decode.context_lens)
                per_kernel, one = avx2.decode_step(plan, x.clone(), *args), avx2.decode_region(plan, x.clone(), *args)
                assert torch.equal(one, per_kernel), f"{kind}, {rows} rows"
                modules = m(runner.input_ids[:rows], runner.positions[:rows], ctx)      # the v16 loops' order
                torch.testing.assert_close(one.float(), modules.float(), atol=0.05, rtol=0.05)


def test_one_region_refuses_more_rows_than_the_few_rows_loop_takes_and_writes_nothing():
    model, gen = tiny_model(torch.bfloat16), torch.Generator().manual_seed(5)
    runner = runner_at(model, 5, gen)
    native = NativeDecode.build(model, runner.kv_cache)
    k, v = runner.kv_cache.k.clone(), runner.kv_cache.v.clone()
    with torch.no_grad(), pytest.raises(RuntimeError, match="at most 4 rows"):
        native(runner.input_ids[:5], runner.positions[:5], runner.decode_attention(5, 4), one_region=True)
    assert torch.equal(runner.kv_cache.k, k) and torch.equal(runner.kv_cache.v, v)


def test_the_plan_holds_the_step_arguments_until_its_native_decode_goes():
    model, gen = tiny_model(torch.float32), torch.Generator().manual_seed(2)
    runner = runner_at(model, 1, gen)
    native = NativeDecode.build(model, runner.kv_cache)
    cache_view = weakref.ref(native.k_caches[0])                # held by the plan as well as by native
    native.k_caches = None
    gc.collect()
    assert cache_view() is not None
    del native
    gc.collect()
    assert cache_view() is None                                 # the capsule freed the plan and its tensors


def test_a_step_refuses_what_is_not_a_plan():
    model, gen = tiny_model(torch.float32), torch.Generator().manual_seed(2)
    runner = runner_at(model, 1, gen)
    ctx = runner.decode_attention(1, 4)
    x = model.model.embed_tokens(runner.input_ids[:1])
    with pytest.raises(TypeError, match="decode_step"):
        cpu_decode.extension().decode_step(native_linear, x, runner.positions[:1], ctx.slot_mapping,
                                           ctx.decode.block_tables, ctx.decode.context_lens)


@pytest.mark.parametrize("kind, one_region", [(torch.float32, False), (torch.bfloat16, True), ("int4", False),
                                              ("int4", True)])
def test_a_slot_outside_the_cache_is_refused_and_nothing_is_written(kind, one_region):
    model, gen = tiny_model(kind), torch.Generator().manual_seed(3)
    runner = runner_at(model, 2, gen)
    native = NativeDecode.build(model, runner.kv_cache)
    ctx = runner.decode_attention(2, 4)
    k, v = runner.kv_cache.k.clone(), runner.kv_cache.v.clone()
    runner.slot_mapping[1] = runner.kv_cache.k.shape[1]                   # one past the last slot
    with torch.no_grad(), pytest.raises(RuntimeError, match="outside the cache"):
        native(runner.input_ids[:2], runner.positions[:2], ctx, one_region=one_region)
    assert torch.equal(runner.kv_cache.k, k) and torch.equal(runner.kv_cache.v, v)


def test_models_the_calls_cannot_run_are_refused():
    cache = lambda m: KVCache(m.config, 4, 4, next(m.parameters()).dtype)
    assert NativeDecode.build(tiny_model(torch.float32, bias=True), cache(tiny_model(torch.float32))) is None
    untiled = tiny_model(torch.float32)
    quantize_model(untiled, "int4")                                       # float32: never tiled
    assert NativeDecode.build(untiled, cache(untiled)) is None
    assert native_linear(nn.Linear(64, 24, bias=False)) is None           # 24 outputs: not whole tiles of 16
    for fusion in ("torch", "compile"):                                   # the reader asked for PyTorch's ops
        model = tiny_model(torch.float32)
        model.model.fusion = fusion
        assert NativeDecode.build(model, cache(model)) is None
    qwen3 = Qwen3Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    other = model_class(qwen3)(qwen3)                                     # its attention has q/k norms
    assert NativeDecode.build(other, cache(other)) is None


def test_a_step_of_more_rows_than_the_calls_take_runs_the_modules(monkeypatch):
    model = tiny_model(torch.float32)
    monkeypatch.setattr(model_runner, "choose", lambda key, calls: timing.Choice("native", {}))
    runner = runner_at(model, 8, torch.Generator().manual_seed(2))
    ctx = lambda rows: runner.decode_attention(rows, 4)
    assert runner.native_decode(runner.input_ids[:4], runner.positions[:4], ctx(4)) is runner.native_plan
    assert runner.native_decode(runner.input_ids[:5], runner.positions[:5], ctx(5)) is None


@pytest.mark.parametrize("quantization", [None, pytest.param("gguf", marks=embedded_weights_only)])
def test_the_engine_gives_the_same_greedy_tokens_either_way(quantization, monkeypatch, embedded_dir):
    prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    outputs = {}
    for way in ("modules", "native", "native, one region"):
        monkeypatch.setattr(model_runner, "choose", lambda key, calls, way=way: timing.Choice(way, {}))
        llm = LLM(str(embedded_dir), quantization=quantization, dtype="bfloat16", num_kv_blocks=64)
        llm.llm_engine.model.model.fusion = "cpp"
        outputs[way] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        tiled = all(getattr(l, "tiles", None) is not None for l in llm.llm_engine.model.modules()
                    if isinstance(l, Int4Linear))                         # chapter 11's race, on this CPU
        assert (llm.llm_engine.runner.native_plan is not None) == tiled   # bfloat16's dense Linears: always
    assert all(tokens == outputs["modules"] for tokens in outputs.values())
