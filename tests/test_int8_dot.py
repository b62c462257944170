"""Chapter 11's int8-dot loop: the activations rounded to 8-bit groups once per matmul, integer dot products on
weights in tiles of 16 columns. It must compute exactly what a plain re-computation of that arithmetic computes,
for 1 to 8 rows and blocks of 8 past them, both code widths, in every instruction set it is written for."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import embedded_weights_only, requires_avx2
from rosellm_edu import LLM, SamplingParams, timing
from rosellm_edu.kernels import cpu_quant
from rosellm_edu.kernels.build import build_cpp
from rosellm_edu.kernels.cpu_fused import DECODE_ROWS
from rosellm_edu.layers import quantization
from rosellm_edu.layers.quantization import (TILED_ROWS, Int4Linear, Int8GroupLinear, Int8Linear, dequantize_int4,
                                             dequantize_q8_0, pack_int4, quantize_int4, quantize_int8, quantize_q8_0,
                                             tile_for_rows, unpack_int4)

pytestmark = pytest.mark.skipif(cpu_quant.extension() is None, reason="no C++ compiler for the kernels")
SHAPES = [(16, 32), (48, 96), (32, 160), (576, 576), (96, 1536)]          # (N, K): 1, 3, 5, 18, 48 groups


def rounded_rows(x: torch.Tensor) -> torch.Tensor:
    """x rounded to 8-bit groups of 32 as the loop rounds it (q = round(x * 127 / amax)), in float32."""
    g = x.float().view(x.shape[0], -1, 32)
    amax = g.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, 127 / amax, 0.0)                  # a group of zeros stays zeros
    return (torch.round(g * inv) * (amax / 127)).view(x.shape)


def layers(shape, seed):
    """The same random weight as an Int4Linear, an Int8GroupLinear and an Int8Linear, and each one's float32
    weight (int8 per channel's in tiles: its scale rounded to the tiles' float16)."""
    w = torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 0.05
    q, d, m = quantize_int4(w)
    four = Int4Linear(shape[1], shape[0], pack_int4(q), d, m)
    linear = nn.Linear(shape[1], shape[0], bias=False).requires_grad_(False)
    eight = Int8GroupLinear.from_linear(linear)
    eight.qs, eight.d = quantize_q8_0(w)
    channel = Int8Linear(linear)
    q8, scale = quantize_int8(w)
    channel.qweight, channel.scale = q8, scale.squeeze(1)
    return [(four, dequantize_int4(q, d, m)), (eight, dequantize_q8_0(eight.qs, eight.d)),
            (channel, q8.float() * scale.half().float())]


def bits_of(layer) -> int:
    return 4 if isinstance(layer, Int4Linear) else 8


@pytest.mark.parametrize("shape", SHAPES)
def test_tiles_hold_the_same_weight(shape):
    for layer, w in layers(shape, 0):
        codes, groups = w.numel() // (8 // bits_of(layer)), w.numel() // 32
        layer.tile_()
        assert layer.tiles.numel() == codes and layer.dm.numel() == 2 * groups    # 8 bits gain a float16 minimum
        assert torch.equal(cpu_quant.tiled_dequantize_cpp(layer.tiles, layer.dm, bits_of(layer), torch.float32), w)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("rows", range(1, TILED_ROWS + 1))
def test_int8_dot_loop_equals_its_re_computation(shape, rows):
    x = torch.randn(rows, shape[1], generator=torch.Generator().manual_seed(rows))
    x[0, :32] = 0                                                 # a group of zeros: scale 0, no division by it
    for layer, w in layers(shape, rows):
        layer.tile_()
        expected = rounded_rows(x) @ w.T
        torch.testing.assert_close(layer(x), expected, atol=1e-5, rtol=1e-5)
        y = layer(x.bfloat16())                                   # bfloat16 in and out: one more rounding
        torch.testing.assert_close(y.float(), rounded_rows(x.bfloat16()) @ w.T, atol=2e-2, rtol=1e-2)


@pytest.mark.parametrize("loop", ["expand", "int8-dot"])
def test_more_rows_take_the_loop_measured_faster(loop, monkeypatch):
    """Past TILED_ROWS rows, up to a decode step's, the loop 8 rows at a time or the expanded weight's matmul, as
    many_rows_choice measured; a prefill's rows always expand."""
    monkeypatch.setattr(cpu_quant, "many_rows_choice", lambda bits=4: timing.Choice(loop, {}))
    for layer, w in layers((64, 96), 3):
        layer.tile_()
        for rows in (TILED_ROWS + 3, 17, 29, 64, DECODE_ROWS + 1):   # the last block of 8 rows: 3, 1, 5, 8 rows
            x = torch.randn(rows, 96)
            rounded = loop == "int8-dot" and rows <= DECODE_ROWS and not isinstance(layer, Int8GroupLinear)
            expected = (rounded_rows(x) if rounded else x) @ w.T              # expanded: no rounding of x
            torch.testing.assert_close(layer(x), expected, atol=1e-5, rtol=1e-5)


def test_the_loop_rejects_what_it_does_not_run():
    (four, _), *_ = layers((32, 64), 0)
    four.tile_()
    with pytest.raises(RuntimeError, match="at least one row"):
        cpu_quant.tiled_linear_cpp(torch.randn(0, 64), four.tiles, four.dm, 4)
    with pytest.raises(RuntimeError, match="columns but the weight"):
        cpu_quant.tiled_linear_cpp(torch.randn(1, 96), four.tiles, four.dm, 4)
    with pytest.raises(RuntimeError, match=r"tiles must be a contiguous uint8 \(N / 16, G, 8"):
        cpu_quant.tiled_linear_cpp(torch.randn(1, 64), four.tiles, four.dm, 8)


def test_only_bfloat16_models_are_tiled_and_only_where_the_loop_won(monkeypatch):
    def model():
        m = nn.Sequential(*(layer for layer, _ in layers((32, 64), 1)))
        return m
    monkeypatch.setattr(cpu_quant, "bf16_row_choice", lambda bits=4: timing.Choice("int8-dot", {}))
    monkeypatch.setattr(quantization, "channel_row_choice", lambda: timing.Choice("int8-dot", {}))
    assert all(getattr(l, "tiles", None) is not None for l in tile_for_rows(model(), torch.bfloat16))
    assert all(getattr(l, "tiles", None) is None for l in tile_for_rows(model(), torch.float32))
    monkeypatch.setattr(cpu_quant, "bf16_row_choice", lambda bits=4: timing.Choice("portable", {}))
    monkeypatch.setattr(quantization, "channel_row_choice", lambda: timing.Choice("PyTorch's int8 op", {}))
    assert all(getattr(l, "tiles", None) is None for l in tile_for_rows(model(), torch.bfloat16))


def test_each_width_of_code_is_tiled_by_its_own_race(monkeypatch):
    """A 4-bit race won by another loop leaves the 4-bit layers alone but still tiles the 8-bit ones (an LM head
    in Q8_0) where the int8-dot loop won theirs; int8 per channel follows its own race, against PyTorch's op."""
    monkeypatch.setattr(cpu_quant, "bf16_row_choice",
                        lambda bits=4: timing.Choice("int8-dot" if bits == 8 else "avx512-bf16", {}))
    for op, won in (("PyTorch's int8 op", False), ("int8-dot", True)):
        monkeypatch.setattr(quantization, "channel_row_choice", lambda: timing.Choice(op, {}))
        tiled = {type(l): getattr(l, "tiles", None) is not None
                 for l in tile_for_rows(nn.Sequential(*(l for l, _ in layers((32, 64), 2))), torch.bfloat16)}
        assert tiled == {Int4Linear: False, Int8GroupLinear: True, Int8Linear: won}


def test_the_per_channel_race_is_measured_once_and_names_a_candidate():
    choice = quantization.channel_row_choice()
    assert choice is quantization.channel_row_choice()
    assert set(choice.seconds) == {"PyTorch's int8 op", "int8-dot"} and choice.name in choice.seconds


@embedded_weights_only
def test_engine_with_tiled_layers_decodes_as_it_prefills(monkeypatch):
    """The decode steps (1 to 8 rows: the int8-dot loop) and a prefill of the same tokens (more rows: the tiles
    expanded) pick the same greedy tokens: teacher-forced on the engine's own output."""
    monkeypatch.setattr(cpu_quant, "bf16_row_choice", lambda bits=4: timing.Choice("int8-dot", {}))
    llm = LLM(quantization="gguf", dtype="bfloat16", num_kv_blocks=64)
    model = llm.llm_engine.model
    assert getattr(model.model.layers[0].mlp.down_proj, "tiles", None) is not None
    prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True), use_tqdm=False)
    agree = total = 0
    for out in outs:
        ids = out.prompt_token_ids + out.outputs[0].token_ids
        with torch.no_grad():
            logits = model.compute_logits(model(torch.tensor(ids), torch.arange(len(ids))))
        predicted = logits[len(out.prompt_token_ids) - 1:-1].argmax(-1).tolist()
        agree += sum(p == t for p, t in zip(predicted, out.outputs[0].token_ids))
        total += len(predicted)
    assert agree / total >= 0.9


@requires_avx2
def test_the_avx2_build_computes_the_same_numbers():
    """On an AVX-512 machine the compiler picks vpdpbusd; built without AVX-512 (and AVX-VNNI) the loop takes
    AVX2's maddubs path, 8-bit codes as two nibbles. Both must equal the re-computation."""
    avx2 = build_cpp("rosellm_edu_int4_avx2", "quant.h", ["tiled_linear"], "skipped",
                     extra_cflags=("-fno-trapping-math", "-mno-avx512f", "-mno-avxvnni"))
    for layer, w in layers((48, 160), 7):
        layer.tile_()
        for rows in (1, 3, 8, 18):
            x = torch.randn(rows, 160)
            y = avx2.tiled_linear(x, layer.tiles, layer.dm, bits_of(layer))
            torch.testing.assert_close(y, rounded_rows(x) @ w.T, atol=1e-5, rtol=1e-5)
