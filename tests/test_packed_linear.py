"""Chapter 10's packed weights: oneDNN's matmul on a weight packed once, against F.linear and a float32 (or
float64) re-computation, and where the model keeps it."""

import copy

import pytest
import torch
from torch import nn

from rosellm_edu import timing
from rosellm_edu.kernels import cpu_fused
from rosellm_edu.kernels.cpu_fused import (BLOCKED, DECODE_ROWS, FEW_ROWS, TORCH_OPS, auto_ops, pack_weights,
                                           packed_linear, torch_linear, unpack_weights)

PACKS = pack_weights([nn.Linear(32, 16, bias=False).bfloat16()])
needs_packing = pytest.mark.skipif(not PACKS, reason="this PyTorch or CPU cannot pack a bfloat16 weight for oneDNN")


def bf16_layer(bias: bool, in_features: int = 576, out_features: int = 1536) -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(in_features, out_features, bias=bias).bfloat16()


@needs_packing
@pytest.mark.parametrize("rows", [1, 5, 64, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_matches_a_float32_matmul_of_the_same_numbers(rows, bias):
    layer, x = bf16_layer(bias), torch.randn(rows, 576).bfloat16()
    assert pack_weights([layer]) and layer in BLOCKED
    got = packed_linear(x, layer).float()
    want = x.float() @ layer.weight.float().T + (layer.bias.float() if bias else 0.0)
    assert (got - want).abs().max() <= 1.6e-2 * want.abs().max()          # one bfloat16 rounding of the result
    torch.testing.assert_close(got, torch_linear(x, layer).float(), atol=1.6e-2 * want.abs().max().item(), rtol=0)


@pytest.mark.skipif(not pack_weights([nn.Linear(32, 16, bias=False)]),
                    reason="this PyTorch or CPU cannot pack a float32 weight for oneDNN")
@pytest.mark.parametrize("rows", [5, 64, 512])
def test_a_packed_float32_weight_sums_as_a_float64_matmul_does(rows):
    torch.manual_seed(0)
    layer, x = nn.Linear(576, 1536, bias=True), torch.randn(rows, 576)
    assert pack_weights([layer]) and layer in BLOCKED
    got = packed_linear(x, layer)
    want = (x.double() @ layer.weight.double().T + layer.bias.double()).float()
    torch.testing.assert_close(got, want, atol=1e-5 * want.abs().max().item(), rtol=0)   # float32 sums, another order


@needs_packing
def test_packed_linear_takes_a_strided_x():
    layer = bf16_layer(bias=True)
    x = torch.randn(8, 2 * 576).bfloat16()[:, ::2]                         # (8, 576), not contiguous
    assert pack_weights([layer])
    torch.testing.assert_close(packed_linear(x, layer), packed_linear(x.contiguous(), layer), atol=0, rtol=0)


def test_a_layer_without_a_packed_weight_is_plain_f_linear():
    layer, x = bf16_layer(bias=True), torch.randn(6, 576).bfloat16()
    unpack_weights([layer])
    assert torch.equal(packed_linear(x, layer), torch_linear(x, layer))


def test_where_packing_fails_nothing_is_kept(monkeypatch):
    def refuse(weight, rows):
        raise RuntimeError("no bfloat16 path on this CPU")

    layers = [bf16_layer(bias=False), bf16_layer(bias=False, out_features=64)]
    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", refuse)
    assert not pack_weights(layers)
    assert not any(layer in BLOCKED for layer in layers)


@needs_packing
def test_a_copy_of_a_packed_layer_multiplies_by_its_own_plain_weight():
    layer, x = bf16_layer(bias=False), torch.randn(8, 576).bfloat16()
    assert pack_weights([layer])
    twin = copy.deepcopy(layer)                                            # the packed copy cannot be deep-copied
    assert layer in BLOCKED and twin not in BLOCKED
    assert torch.equal(packed_linear(x, twin), torch_linear(x, layer))


def test_auto_takes_the_packed_weight_past_the_kernel_where_it_was_chosen():
    packed, plain = timing.Choice("packed", {"torch": 2.0, "packed": 1.0}), timing.Choice("torch", {"torch": 1.0})
    choices = {"linear, decode": packed, "linear, prefill": plain,
               "linear, 1 row(s)": timing.Choice("torch", {"torch": 1.0, "cpp": 2.0})}
    assert auto_ops(choices, FEW_ROWS + 1).linear is packed_linear
    assert auto_ops(choices, DECODE_ROWS).linear is packed_linear
    assert auto_ops(choices, DECODE_ROWS + 1).linear is TORCH_OPS.linear   # a prompt, where torch was chosen
    assert auto_ops(choices, 1).linear is TORCH_OPS.linear
    assert auto_ops(choices | {"linear, prefill": packed}, DECODE_ROWS + 1).linear is packed_linear
    unmeasured = {"linear, decode": timing.Choice("torch", {"torch": 1.0, "packed": 2.0})}
    assert auto_ops(unmeasured, FEW_ROWS + 1).linear is TORCH_OPS.linear
    assert auto_ops(unmeasured, DECODE_ROWS + 1).linear is TORCH_OPS.linear


@pytest.mark.skipif(cpu_fused.extension() is None, reason="fusion='auto' measures only with the kernels built")
@pytest.mark.parametrize("dtype, close", [(torch.bfloat16, 0.05), (torch.float32, 1e-4)])
def test_a_model_keeps_packed_weights_only_where_they_measured_faster(embedded_dir, dtype, close):
    from rosellm_edu import model_loader

    model = model_loader.load_model(embedded_dir, dtype)
    ids = torch.randint(100, model.config.vocab_size, (FEW_ROWS + 4,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        auto = model.compute_logits(model(ids, torch.arange(len(ids)))).float()
        model.model.fusion = "torch"
        plain = model.compute_logits(model(ids, torch.arange(len(ids)))).float()
    decoder = [m for m in model.model.modules() if isinstance(m, nn.Linear)]
    won = "packed" in {model.model.choices[f"linear, {regime}"].name for regime in ("decode", "prefill")}
    assert all((m in BLOCKED) == won for m in decoder)
    # the LM head is packed at its first call where the logits' rows chose the packed weight
    assert (model.lm_head in BLOCKED) == (auto_ops(model.model.choices, len(ids)).linear is packed_linear)
    # the fused norms and the packed matmul sum in another order: close in the model's dtype, not equal
    assert (auto - plain).abs().max() < close * plain.abs().max()
