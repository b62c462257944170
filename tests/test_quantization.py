"""Chapter 11: weight-only quantization. The schemes keep their error bounds, the 4-bit kernels equal a float32
matmul of the de-quantized weight, the GGUF loader reads the file's Q4_1 blocks as the gguf package reads them,
and the quantized engine agrees with transformers where it must."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize as gguf_dequantize
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from conftest import embedded_weights_only, hf_greedy
from rosellm_edu import LLM, SamplingParams, model_loader, timing
from rosellm_edu.entrypoints.cli import build_engine, serve_args
from rosellm_edu.kernels import cpu_fused, cpu_quant
from rosellm_edu.layers.quantization import (Int4Linear, Int8GroupLinear, Int8Linear, dequantize_int4,
                                             dequantize_int8, dequantize_q8_0, faster_head, head_choice,
                                             pack_int4, quantize_q8_0, quantize_int4, quantize_int8, unpack_int4)
from rosellm_edu.models.gguf import load_gguf, q4_1_tensors, q8_0_tensors, unpermute_rows

shapes = st.tuples(st.sampled_from([16, 32, 48]), st.sampled_from([32, 64, 96]))


def weight(shape, seed, scale=1.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


@pytest.fixture
def head_format(monkeypatch):
    """Pin what the LM head's measurement chooses, for the embedded model's head (49152, 576) in any dtype."""
    def pin(name: str, dtype: torch.dtype):
        label = str(dtype).removeprefix("torch.")
        monkeypatch.setitem(timing.CHOICES, f"LM head {label} (49152, 576)",
                            timing.Choice(label if name == "dense" else name, {}))
    return pin


@given(shapes, st.integers(0, 2**16), st.sampled_from([1e-3, 1.0, 50.0]))
def test_int8_is_within_half_a_step_of_every_weight(shape, seed, scale):
    w = weight(shape, seed, scale)
    q, s = quantize_int8(w)
    assert q.dtype == torch.int8 and q.abs().max() <= 127
    assert torch.all((dequantize_int8(q, s) - w).abs() <= s / 2 * (1 + 1e-5))


@given(shapes, st.integers(0, 2**16), st.sampled_from([32, 16]))
def test_int4_is_within_half_a_step_of_every_weight(shape, seed, group):
    w = weight(shape, seed)
    q, d, m = quantize_int4(w, group)
    assert q.max() <= 15 and d.dtype == m.dtype == torch.float16
    step = d.float().repeat_interleave(group, dim=1)
    # half a step, and the float16 rounding of the minimum (which shifts the whole grid)
    slack = m.float().abs().repeat_interleave(group, dim=1) * 2**-10 + step * 2**-9
    assert torch.all((dequantize_int4(q, d, m) - w).abs() <= step / 2 + slack)


def test_a_group_already_on_a_q4_1_grid_is_found_again():
    q = torch.randint(0, 16, (16, 64), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    q[:, ::32], q[:, 1::32] = 0, 15                        # every group spans the whole grid
    d, m = torch.rand(16, 2).half() + 0.01, torch.randn(16, 2).half()
    again = quantize_int4(dequantize_int4(q, d, m))
    assert torch.equal(dequantize_int4(*again), dequantize_int4(q, d, m))


def test_pack_and_unpack_are_inverse_and_use_q4_1_order():
    q = torch.randint(0, 16, (4, 64), dtype=torch.uint8)
    qs = pack_int4(q)
    assert torch.equal(unpack_int4(qs), q)
    assert torch.equal(qs[0, 0] & 15, q[0, :16]) and torch.equal(qs[0, 0] >> 4, q[0, 16:32])


needs_kernels = pytest.mark.skipif(cpu_quant.extension() is None, reason="the 4-bit kernels did not build here")


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 2, 3, 4])
@pytest.mark.parametrize("shape", [(16, 32), (96, 576), (576, 1536)])
def test_int4_kernel_equals_a_float32_matmul_of_the_dequantized_weight(dtype, rows, shape):
    q, d, m = quantize_int4(weight(shape, rows, 0.05))
    x = weight((rows, shape[1]), 7).to(dtype)
    expected = x.float() @ dequantize_int4(q, d, m).T
    got = cpu_quant.int4_linear_cpp(x, pack_int4(q), d, m)
    assert got.dtype == dtype
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=2e-2, rtol=1e-2)
    torch.testing.assert_close(got.float(), expected, **tol)


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int4_dequantize_kernel_equals_the_reference(dtype):
    q, d, m = quantize_int4(weight((48, 96), 3))
    expected = dequantize_int4(q, d, m).to(dtype)
    assert torch.equal(cpu_quant.int4_dequantize_cpp(pack_int4(q), d, m, dtype), expected)


@needs_kernels
def test_int4_kernel_rejects_bad_input_with_a_clear_error():
    q, d, m = quantize_int4(weight((16, 64), 0))
    qs = pack_int4(q)
    with pytest.raises(RuntimeError, match="1 to 4 rows"):
        cpu_quant.int4_linear_cpp(torch.randn(5, 64), qs, d, m)
    with pytest.raises(RuntimeError, match="columns"):
        cpu_quant.int4_linear_cpp(torch.randn(1, 32), qs, d, m)
    with pytest.raises(RuntimeError, match="float16"):
        cpu_quant.int4_linear_cpp(torch.randn(1, 64), qs, d.float(), m)
    q, d, m = quantize_int4(weight((8, 64), 0))
    with pytest.raises(RuntimeError, match="multiple of 16"):
        cpu_quant.int4_linear_cpp(torch.randn(1, 64), pack_int4(q), d, m)


needs_bf16_dot = pytest.mark.skipif(cpu_quant.extension() is None or not cpu_quant.has_bf16_dot(),
                                    reason="this CPU (or build) has no AVX512-BF16")


@needs_bf16_dot
@pytest.mark.parametrize("shape", [(16, 32), (32, 96), (64, 160), (576, 576), (96, 1536)])   # 1, 3, 5, 18, 48 groups
def test_bf16_dot_loop_equals_the_portable_loop_and_a_float32_matmul(shape):
    q, d, m = quantize_int4(weight(shape, shape[1], 0.05))
    x = weight((1, shape[1]), 11).bfloat16()
    expected = x.float() @ dequantize_int4(q, d, m).T
    dot = cpu_quant.extension().int4_linear_bf16(x, pack_int4(q), d, m)
    portable = cpu_quant.extension().int4_linear(x, pack_int4(q), d, m)
    torch.testing.assert_close(dot.float(), expected, atol=2e-2, rtol=1e-2)
    torch.testing.assert_close(dot.float(), portable.float(), atol=2e-2, rtol=1e-2)
    chosen = dot if cpu_quant.bf16_row_choice().name == "avx512-bf16" else portable   # the loop measured faster
    assert torch.equal(cpu_quant.int4_linear_cpp(x, pack_int4(q), d, m), chosen)


@needs_bf16_dot
def test_bf16_dot_loop_rejects_what_it_does_not_run():
    q, d, m = quantize_int4(weight((16, 64), 0))
    with pytest.raises(RuntimeError, match="one bfloat16 row"):
        cpu_quant.extension().int4_linear_bf16(torch.randn(2, 64).bfloat16(), pack_int4(q), d, m)
    with pytest.raises(RuntimeError, match="one bfloat16 row"):
        cpu_quant.extension().int4_linear_bf16(torch.randn(1, 64), pack_int4(q), d, m)


@given(shapes, st.integers(0, 2**16), st.sampled_from([1e-3, 1.0, 50.0]))
def test_q8_0_is_within_half_a_step_of_every_weight(shape, seed, scale):
    w = weight(shape, seed, scale)
    q, d = quantize_q8_0(w)
    step = d.float().repeat_interleave(32, dim=1)
    assert ((dequantize_q8_0(q, d) - w).abs() <= step / 2 + 1e-3 * step + 1e-7).all()


@embedded_weights_only
def test_q8_0_finds_the_grid_a_q8_0_file_stored(gguf_tensors):
    qs, d = q8_0_tensors(gguf_tensors["token_embd.weight"].data)
    q, d2 = quantize_q8_0(dequantize_q8_0(qs[:512], d[:512]))
    assert torch.equal(q, qs[:512]) and torch.equal(d2, d[:512])


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 2, 3, 4])
def test_q8_0_kernel_equals_a_float32_matmul_of_the_dequantized_weight(dtype, rows):
    q, d = quantize_q8_0(weight((96, 576), rows, 0.05))
    x = weight((rows, 576), 5).to(dtype)
    got = cpu_quant.int8_linear_cpp(x, q, d)
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=2e-2, rtol=1e-2)
    torch.testing.assert_close(got.float(), x.float() @ dequantize_q8_0(q, d).T, **tol)
    assert torch.equal(cpu_quant.int8_dequantize_cpp(q, d, dtype), dequantize_q8_0(q, d).to(dtype))
    with pytest.raises(RuntimeError, match="int8"):
        cpu_quant.int8_linear_cpp(x, q.view(torch.uint8), d)


def test_int8_group_linear_runs_every_path_to_the_same_numbers(monkeypatch):
    linear = nn.Linear(64, 40, bias=False)                        # 40 rows: not a multiple of 16, no kernel
    head = Int8GroupLinear.from_linear(linear)
    for rows in (1, 9):
        x = weight((rows, 64), rows)
        expected = F.linear(x, dequantize_q8_0(head.qs, head.d))
        torch.testing.assert_close(head(x), expected, atol=1e-4, rtol=1e-4)
        monkeypatch.setattr(cpu_quant, "extension", lambda: None)
        torch.testing.assert_close(head(x), expected, atol=1e-4, rtol=1e-4)
        monkeypatch.undo()
    with pytest.raises(ValueError, match="bias"):
        Int8GroupLinear.from_linear(nn.Linear(64, 32))
    tied = Int8GroupLinear.from_linear(linear, dense=linear.weight.detach())       # many rows: the dense table
    x = weight((9, 64), 9)
    torch.testing.assert_close(tied(x), F.linear(x, linear.weight.detach()))
    torch.testing.assert_close(tied(x[:1]), head(x[:1]))                           # few rows: the 8-bit groups
    assert "dense" not in tied.state_dict()


def test_quantize_model_takes_a_llama_head_and_leaves_gpt2_tied(head_format, embedded_dir):
    from rosellm_edu.benchmarks.decode import load, weight_bytes

    gpt2 = load("gpt2", torch.float32, torch.device("cpu"), "int4")
    assert isinstance(gpt2.h[0].mlp.c_fc, Int4Linear) and not hasattr(gpt2, "lm_head")
    assert weight_bytes(gpt2) > gpt2.wte.weight.numel() * 4                     # its table is its head: counted
    head_format("dense", torch.float32)
    llama = model_loader.load_model(embedded_dir, torch.float32, quantization="int4")
    assert type(llama.lm_head) is nn.Linear and llama.lm_head.weight is llama.model.embed_tokens.weight
    head_format("Q8_0", torch.float32)
    llama = model_loader.load_model(embedded_dir, torch.float32, quantization="int4")
    assert isinstance(llama.lm_head, Int8GroupLinear)
    assert llama.lm_head.dense.data_ptr() == llama.model.embed_tokens.weight.data_ptr()    # tied: no copy
    head = llama.lm_head.qs.numel() + 2 * llama.lm_head.d.numel()
    assert weight_bytes(llama) == weight_bytes(llama.model.layers) + head + 4 * llama.model.norm.weight.numel()


@pytest.mark.parametrize("rows", [1, 3, 9])
@pytest.mark.parametrize("bias", [False, True])
def test_quantized_linears_equal_f_linear_on_their_dequantized_weights(rows, bias, monkeypatch):
    linear = nn.Linear(64, 32, bias=bias)
    x = weight((rows, 64), rows)
    int8, int4 = Int8Linear(linear), Int4Linear.from_linear(linear)
    b = linear.bias.detach() if bias else None
    torch.testing.assert_close(int8(x), F.linear(x, dequantize_int8(int8.qweight, int8.scale[:, None]), b),
                               atol=1e-4, rtol=1e-4)
    expected = F.linear(x, dequantize_int4(unpack_int4(int4.qs), int4.d, int4.m), b)
    torch.testing.assert_close(int4(x), expected, atol=1e-4, rtol=1e-4)
    monkeypatch.setattr(cpu_quant, "extension", lambda: None)        # no compiler: PyTorch ops, same numbers
    torch.testing.assert_close(int4(x), expected, atol=1e-4, rtol=1e-4)


def llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py, LlamaModel.permute, written out."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def test_unpermute_rows_undoes_llama_cpp_permute():
    w = np.arange(3 * 8 * 5).reshape(24, 5)
    assert np.array_equal(unpermute_rows(torch.from_numpy(llama_cpp_permute(w, 3)), 3).numpy(), w)


@pytest.fixture(scope="module")
def gguf_tensors():
    return {t.name: t for t in GGUFReader(model_loader.embedded_gguf()).tensors}


@embedded_weights_only
def test_q4_1_blocks_read_as_the_gguf_package_dequantizes_them(gguf_tensors):
    t = gguf_tensors["blk.3.ffn_down.weight"]
    assert t.tensor_type == GGMLQuantizationType.Q4_1
    qs, d, m = q4_1_tensors(t.data)
    ours = dequantize_int4(unpack_int4(qs), d, m).numpy()
    assert np.array_equal(ours, gguf_dequantize(t.data, GGMLQuantizationType.Q4_1).astype(np.float32))


@embedded_weights_only
@pytest.mark.parametrize("head", ["Q8_0", "dense"])
def test_the_gguf_model_computes_what_the_converted_float32_model_computes(embedded_dir, our_model, gguf_tensors,
                                                                           head, head_format):
    head_format(head, torch.float32)
    gguf_model = load_gguf(model_loader.embedded_gguf(), our_model.config, torch.float32)
    assert all(isinstance(layer.mlp.down_proj, Int4Linear) for layer in gguf_model.model.layers)
    if head == "Q8_0":
        qs, d = q8_0_tensors(gguf_tensors["token_embd.weight"].data)          # the tied head, as the file stores it
        assert torch.equal(gguf_model.lm_head.qs, qs) and torch.equal(gguf_model.lm_head.d, d)
    else:
        assert gguf_model.lm_head.weight is gguf_model.model.embed_tokens.weight   # tied: the expanded table
    for rows in (1, 64):                                                      # the few-rows loops, and the GEMM
        ids = torch.arange(100, 100 + rows)
        with torch.no_grad():
            ours = gguf_model.compute_logits(gguf_model(ids, torch.arange(rows)))
            reference = our_model.compute_logits(our_model(ids, torch.arange(rows)))
        torch.testing.assert_close(ours, reference, atol=2e-4, rtol=1e-4)


def test_head_choice_is_measured_once_per_dtype_and_names_a_candidate():
    head = nn.Linear(64, 32, bias=False)
    q8 = Int8GroupLinear.from_linear(head)
    choice = head_choice(head, q8)
    kernel = {"few-rows"} if cpu_fused.extension() is not None else set()     # chapter 10's, where it was built
    assert choice.name in choice.seconds and set(choice.seconds) == {"float32", "Q8_0"} | kernel
    assert head_choice(head, q8) is choice and faster_head(head, q8) in (head, q8)
    odd = nn.Linear(64, 56, bias=False)                           # 56 outputs: no multiple of 16, no few-rows kernel
    assert set(head_choice(odd, Int8GroupLinear.from_linear(odd)).seconds) == {"float32", "Q8_0"}
    loop = cpu_quant.bf16_row_choice(4)
    assert loop.name in loop.seconds and {"portable", "int8-dot"} <= set(loop.seconds) <= {"portable", "int8-dot",
                                                                                        "avx512-bf16"}
    assert set(cpu_quant.bf16_row_choice(8).seconds) == {"portable", "int8-dot"}   # no bfloat16 loop for 8 bits


@embedded_weights_only
@pytest.mark.parametrize("loop", ["portable", "int8-dot"])
@pytest.mark.parametrize("method", ["int8", "int4", "gguf"])
def test_bfloat16_activations_stay_close_to_float32(method, loop, our_model, tokenizer, monkeypatch):
    """Chapter 11 prints its quality table with float32 activations (the same digits on every CPU); with
    bfloat16 activations the digits depend on the CPU (AMX, AVX512-BF16, the order of sums), so they are bounded
    here instead. The int8-dot loop rounds the activations to 8 bits as well, and stays within the same bounds."""
    from rosellm_edu.benchmarks.quality import TEXT, compare, logits
    from rosellm_edu.layers import quantization

    monkeypatch.setattr(cpu_quant, "bf16_row_choice", lambda bits=4: timing.Choice(loop, {}))
    other = "PyTorch's int8 op" if loop == "portable" else loop                 # int8 per channel's race
    monkeypatch.setattr(quantization, "channel_row_choice", lambda: timing.Choice(other, {}))
    ids = tokenizer(TEXT).input_ids
    model = model_loader.load_model(model_loader.resolve_model(), torch.bfloat16, quantization=method)
    scores = compare(logits(our_model, ids), logits(model, ids), ids)
    assert scores["kl"] < 1e-2 and scores["top1"] >= 0.9
    assert abs(scores["ppl"] - scores["ppl_reference"]) < 0.05 * scores["ppl_reference"]


@embedded_weights_only
def test_llm_with_the_gguf_as_it_ships_generates_what_transformers_generates(tokenizer, hf_model):
    llm = LLM(quantization="gguf", dtype="float32", num_kv_blocks=32)
    prompt = "The capital of France is"
    out = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True), use_tqdm=False)[0]
    assert out.outputs[0].token_ids == hf_greedy(hf_model, tokenizer(prompt).input_ids, 16)


@embedded_weights_only
@pytest.mark.parametrize("method", ["int8", "int4"])
def test_quantized_engine_stays_close_to_float32_on_greedy_text(method, our_model, tokenizer):
    """Top-1 agreement with the float32 model, teacher-forced on its own greedy continuation."""
    from rosellm_edu.benchmarks.quality import greedy_agreement

    reference = LLM(dtype="float32", num_kv_blocks=64)
    quantized = model_loader.load_model(model_loader.resolve_model(), torch.float32, quantization=method)
    assert greedy_agreement(reference, quantized, max_tokens=16) >= 0.95


def test_bad_quantization_is_refused_by_name(tmp_path, embedded_dir):
    with pytest.raises(ValueError, match="'int3'"):
        LLM(str(embedded_dir), quantization="int3", num_kv_blocks=8)
    with pytest.raises(ValueError, match=r"\*\.gguf"):
        model_loader.gguf_file(tmp_path)


def test_serve_quantization_flag_builds_a_quantized_engine(embedded_dir):
    engine = build_engine(serve_args(["--model", str(embedded_dir), "--quantization", "int4", "--num-kv-blocks", "16",
                                      "--dtype", "float32"]))
    assert isinstance(engine.model.model.layers[0].self_attn.qkv_proj, Int4Linear)
    with pytest.raises(SystemExit):
        serve_args(["--quantization", "fp4"])
