"""Appendix 11a: the quantization formats measured where the grid is not the model's own. Q4_0 is GGUF's own (the
gguf package's quantizer as the reference), every format keeps its error bound, groups that do not divide a row
end in a shorter group, re-quantizing Q4_1-grid weights on their own grid is exact, and the int4 engine with
float32 activations generates transformers' float32 greedy tokens."""

import math

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize
from hypothesis import given
from hypothesis import strategies as st

from conftest import embedded_weights_only, hf_greedy
from rosellm_edu import LLM, SamplingParams
from rosellm_edu.layers.quantization import dequantize_int4, quantize_int4, quantize_int8, quantize_q8_0
from rosellm_edu.layers.quantization_formats import (FORMATS, decoder_linears, dequantize_q4_0, fake_quantize_model,
                                                     model_bits_per_weight, quantize_q4_0)

shapes = st.tuples(st.sampled_from([4, 16, 48]), st.sampled_from([32, 64, 96]))


def weight(shape, seed, scale=1.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


@given(shapes, st.integers(0, 2**16), st.sampled_from([1e-3, 1.0, 50.0]))
def test_q4_0_round_trip_equals_the_gguf_packages_q4_0(shape, seed, scale):
    w = weight(shape, seed, scale)
    theirs = gguf_dequantize(gguf_quantize(w.numpy(), GGMLQuantizationType.Q4_0), GGMLQuantizationType.Q4_0)
    assert np.array_equal(dequantize_q4_0(*quantize_q4_0(w)).numpy(), theirs)


@given(shapes, st.integers(0, 2**16), st.sampled_from([32, 16]))
def test_q4_0_codes_are_minus_8_to_7_and_within_half_a_step(shape, seed, group):
    w = weight(shape, seed)
    q, d = quantize_q4_0(w, group)
    assert q.dtype == torch.int8 and q.min() >= -8 and q.max() <= 7
    wg = w.view(shape[0], -1, group)
    # a plain re-computation of each group's scale: its weight of largest magnitude, signed, over -8
    d32 = torch.tensor([[g[g.abs().argmax()].item() / -8 for g in row] for row in wg])     # (N, groups)
    assert torch.equal(d, d32.half())
    x = wg / d32.unsqueeze(-1)                                                 # each weight in steps, -8..8
    qg = q.view_as(wg).float()
    inside = x <= 7.5                                                          # above, +7 is the closest level
    assert torch.all((qg - x).abs()[inside] <= 0.5 + 1e-5) and torch.all(qg[~inside] == 7)
    assert torch.all(qg.gather(-1, wg.abs().argmax(-1, keepdim=True)) == -8)    # the largest sits exactly on -8
    # de-quantized with the float16 scale: half a step, plus float16's rounding of the scale for up to 8 steps
    err = (dequantize_q4_0(q, d) - w).view_as(wg)
    bound = d32.abs().unsqueeze(-1) * (0.5 + 8 * 2**-11) + 1e-6
    assert torch.all(err.abs()[inside] <= bound.expand_as(err)[inside])


def test_q4_0_of_a_zero_group_is_zero():
    q, d = quantize_q4_0(torch.zeros(2, 32))
    assert torch.equal(dequantize_q4_0(q, d), torch.zeros(2, 32))


@given(shapes, st.integers(0, 2**16), st.sampled_from([2, 3, 5, 8]), st.sampled_from([16, 32]))
def test_fewer_or_more_bits_fit_their_codes_and_stay_within_half_a_step(shape, seed, bits, group):
    w = weight(shape, seed)
    q, d, m = quantize_int4(w, group, bits)
    assert q.max() <= 2**bits - 1 and d.dtype == m.dtype == torch.float16
    lo, hi = w.view(shape[0], -1, group).amin(-1), w.view(shape[0], -1, group).amax(-1)
    assert torch.equal(d, ((hi - lo) / (2**bits - 1)).half()) and torch.equal(m, lo.half())
    step = d.float().repeat_interleave(group, dim=1)
    # half a step, and the float16 rounding of the minimum (which shifts the whole grid)
    slack = m.float().abs().repeat_interleave(group, dim=1) * 2**-10 + step * 2**-9
    assert torch.all((dequantize_int4(q, d, m) - w).abs() <= step / 2 + slack)


@pytest.mark.parametrize("name", ["Q4_1 / 64", "Q4_1 / 128", "Q4_0", "3-bit / 32", "Q8_0"])
def test_a_row_that_is_not_a_multiple_of_the_group_ends_in_a_shorter_group(name):
    fmt, w = FORMATS[name], weight((8, 576), 1)
    if name == "Q8_0":                          # 576 is a multiple of 32: the plain round trip
        assert torch.equal(fmt.fake_quantize(w), fmt.round_trip(w, 32))
        return
    # each group of the row on its own, the last one as wide as what is left
    starts = range(0, 576, fmt.group)
    expected = torch.cat([fmt.round_trip(w[:, s:s + fmt.group], min(fmt.group, 576 - s)) for s in starts], dim=1)
    assert torch.equal(fmt.fake_quantize(w), expected)


QUANTIZERS = {"Q8_0": lambda w, g: quantize_q8_0(w), "int8 / row": lambda w, g: quantize_int8(w),
              "Q4_1 / 32": quantize_int4, "Q4_1 / 64": quantize_int4, "Q4_1 / 128": quantize_int4,
              "Q4_0": quantize_q4_0, "3-bit / 32": lambda w, g: quantize_int4(w, g, bits=3)}


@pytest.mark.parametrize("name", list(FORMATS))
def test_bits_per_weight_counts_what_the_quantizer_stores(name):
    fmt, (N, K) = FORMATS[name], (4, 576)
    group = fmt.group or K
    padded = torch.nn.functional.pad(weight((N, K), 2), (0, -K % group), mode="replicate")
    codes, *scales = QUANTIZERS[name](padded, group)
    stored = N * K * fmt.bits + sum(8 * t.numel() * t.element_size() for t in scales)     # the scales as stored
    assert fmt.bits_per_weight(K) * N * K == pytest.approx(stored)


def test_weights_on_a_q4_1_grid_come_back_exactly_on_their_own_grid():
    q = torch.randint(0, 16, (16, 64), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    q[:, ::32], q[:, 1::32] = 0, 15                        # every group spans its whole grid, as the file's do
    d, m = torch.rand(16, 2).half() + 0.01, torch.randn(16, 2).half()
    w = dequantize_int4(q, d, m)
    assert torch.equal(FORMATS["Q4_1 / 32"].fake_quantize(w), w)
    assert not torch.equal(FORMATS["Q4_1 / 64"].fake_quantize(w), w)          # one grid for two: it rounds


@embedded_weights_only
def test_the_embedded_models_linears_are_on_their_own_q4_1_grid(our_model):
    for linear in decoder_linears(our_model):
        assert torch.equal(FORMATS["Q4_1 / 32"].fake_quantize(linear.weight.data), linear.weight.data)


def test_fake_quantize_model_rounds_every_decoder_linear_and_nothing_else(our_model):
    fmt = FORMATS["Q4_0"]
    fake = fake_quantize_model(our_model, fmt)
    for ours, original in zip(decoder_linears(fake), decoder_linears(our_model)):
        assert torch.equal(ours.weight, fmt.fake_quantize(original.weight.data))
        assert not torch.equal(ours.weight, original.weight)                  # the original is left alone
    assert torch.equal(fake.model.embed_tokens.weight, our_model.model.embed_tokens.weight)
    sizes = [(lin.weight.numel(), lin.in_features) for lin in decoder_linears(our_model)]
    assert model_bits_per_weight(our_model, fmt) == pytest.approx(4.5)        # Q4_0: 4 + 16 / 32 on every row
    int8 = sum(n * (8 + 32 / k) for n, k in sizes) / sum(n for n, _ in sizes)
    assert model_bits_per_weight(our_model, FORMATS["int8 / row"]) == pytest.approx(int8)


@embedded_weights_only
def test_int4_engine_in_float32_generates_transformers_float32_greedy_tokens(tokenizer, hf_model):
    llm = LLM(quantization="int4", dtype="float32", num_kv_blocks=32)
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
    for prompt, out in zip(prompts, llm.generate(prompts, params, use_tqdm=False)):
        assert out.outputs[0].token_ids == hf_greedy(hf_model, tokenizer(prompt).input_ids, 16), prompt
