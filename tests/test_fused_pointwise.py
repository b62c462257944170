"""Chapter 10's fused C++ kernels (add + RMSNorm, SiLU x up, rotary in place) against the PyTorch ops they replace,
and the model built on them against transformers."""

import pytest
import torch

from conftest import requires_avx2
from rosellm_edu.kernels import cpu_fused
from rosellm_edu import timing
from rosellm_edu.kernels.build import build_cpp
from rosellm_edu.kernels.cpu_fused import (CPP_OPS, DECODE_ROWS, FEW_ROWS, TORCH_OPS, add_rms_norm_cpp,
                                           add_rms_norm_reference, auto_ops, few_rows_linear_cpp, fusion_choices,
                                           linear_cpp, pointwise_ops, rotary_cpp, rotary_reference, silu_and_mul_cpp,
                                           silu_and_mul_reference, torch_linear)

pytestmark = pytest.mark.skipif(cpu_fused.extension() is None, reason="no C++ compiler: the kernels were not built")

DTYPES = [torch.float32, torch.bfloat16]
# float32: the fused sum of squares is added in another order; bfloat16: one rounding step of bfloat16
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=1.6e-2, rtol=1.6e-2)}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, n", [(1, 8), (7, 33), (64, 576), (130, 1000)])
@pytest.mark.parametrize("with_residual", [True, False])
def test_add_rms_norm_matches_the_unfused_ops(dtype, rows, n, with_residual):
    g = torch.Generator().manual_seed(rows * n)
    x = (3 * torch.randn(rows, n, generator=g)).to(dtype)
    residual = torch.randn(rows, n, generator=g).to(dtype) if with_residual else None
    weight = (torch.rand(n, generator=g) + 0.5).to(dtype)
    normed, new_residual = add_rms_norm_reference(x, residual, weight, 1e-5)
    got_normed, got_residual = add_rms_norm_cpp(x.clone(), None if residual is None else residual.clone(), weight, 1e-5)
    torch.testing.assert_close(got_residual, new_residual, atol=0, rtol=0)     # the add rounds as PyTorch's does
    torch.testing.assert_close(got_normed, normed, **TOL[dtype])


def test_add_rms_norm_writes_both_outputs_in_place():
    x, residual, weight = torch.randn(5, 16), torch.randn(5, 16), torch.ones(16)
    expected = add_rms_norm_reference(x, residual, weight, 1e-6)
    got = add_rms_norm_cpp(x, residual, weight, 1e-6)
    assert got[0].data_ptr() == x.data_ptr() and got[1].data_ptr() == residual.data_ptr()
    torch.testing.assert_close(residual, expected[1])
    torch.testing.assert_close(x, expected[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, n", [(1, 8), (7, 33), (64, 1536), (3, 1001)])
def test_silu_and_mul_matches_the_unfused_ops(dtype, rows, n):
    g = torch.Generator().manual_seed(rows + n)
    gate_up = (4 * torch.randn(rows, 2 * n, generator=g)).to(dtype)
    gate_up[0, :4] = torch.tensor([-100.0, 100.0, 0.0, -0.0])     # far tails of exp, and zero
    torch.testing.assert_close(silu_and_mul_cpp(gate_up), silu_and_mul_reference(gate_up), **TOL[dtype])


def rope_tables(max_pos, d, dtype):
    angles = torch.outer(torch.arange(max_pos, dtype=torch.float32), 1.0 / 10000 ** (torch.arange(0, d, 2) / d))
    angles = torch.cat((angles, angles), -1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens, heads, kv_heads, d", [(1, 1, 1, 2), (5, 9, 3, 64), (37, 4, 2, 6), (64, 3, 1, 128)])
def test_rotary_rotates_strided_q_and_k_in_place_and_leaves_v_alone(dtype, tokens, heads, kv_heads, d):
    g = torch.Generator().manual_seed(tokens * d)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * d, generator=g).to(dtype)   # as the model's qkv output
    q = qkv[:, :heads * d].view(tokens, heads, d)
    k = qkv[:, heads * d:(heads + kv_heads) * d].view(tokens, kv_heads, d)
    v_before = qkv[:, (heads + kv_heads) * d:].clone()
    cos, sin = rope_tables(300, d, dtype)
    positions = torch.randint(0, 300, (tokens,), generator=g)
    expected_q, expected_k = rotary_reference(positions, q, k, cos, sin)
    got_q, got_k = rotary_cpp(positions, q, k, cos, sin)
    assert got_q.data_ptr() == q.data_ptr() and got_k.data_ptr() == k.data_ptr()
    torch.testing.assert_close(q, expected_q, **TOL[dtype])
    torch.testing.assert_close(k, expected_k, **TOL[dtype])
    assert torch.equal(qkv[:, (heads + kv_heads) * d:], v_before)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 2, 3, 4])
@pytest.mark.parametrize("in_features, out_features", [(32, 16), (576, 960), (1536, 576), (96, 4096)])
def test_few_rows_linear_matches_a_float32_matmul_of_the_same_numbers(dtype, rows, in_features, out_features):
    g = torch.Generator().manual_seed(rows * in_features + out_features)
    layer = torch.nn.Linear(in_features, out_features, bias=False)
    layer.weight.data = torch.randn(out_features, in_features, generator=g).to(dtype)
    x = torch.randn(rows, in_features, generator=g).to(dtype)
    expected = x.float() @ layer.weight.float().T                    # the exact sums, rounded once below
    got = few_rows_linear_cpp(x, layer)
    assert got.dtype == dtype and got.shape == (rows, out_features)
    torch.testing.assert_close(got.float(), expected.to(dtype).float(), atol=1e-4 * in_features ** 0.5,
                               rtol=TOL[dtype]["rtol"])



@requires_avx2
def test_the_avx2_few_rows_loop_matches_a_float32_matmul():
    """Built without AVX-512, linear_few_rows takes the AVX2 loop (four rows of W at once); an AVX-512 machine
    runs the v16 loop natively, so this is where it tests the other one."""
    avx2 = build_cpp("rosellm_edu_few_rows_avx2", "pointwise.h", ["linear_few_rows", "few_rows_loop"], "skipped",
                     extra_cflags=("-fno-trapping-math", "-mno-avx512f"))
    assert "AVX2" in avx2.few_rows_loop()
    g = torch.Generator().manual_seed(0)
    for dtype in DTYPES:
        for rows, (n, k) in zip([1, 2, 3, 4], [(16, 32), (960, 576), (576, 1536), (4096, 96)]):
            w, x = (torch.randn(*shape, generator=g).to(dtype) for shape in [(n, k), (rows, k)])
            torch.testing.assert_close(avx2.linear_few_rows(x, w).float(), (x.float() @ w.float().T).to(dtype).float(),
                                       atol=1e-4 * k ** 0.5, rtol=TOL[dtype]["rtol"])

def test_linear_cpp_takes_the_kernel_only_where_it_applies():
    g = torch.Generator().manual_seed(0)
    plain = torch.nn.Linear(64, 48, bias=False).to(torch.bfloat16)
    biased = torch.nn.Linear(64, 48).to(torch.bfloat16)
    odd = torch.nn.Linear(40, 48, bias=False).to(torch.bfloat16)      # in_features not a multiple of 32
    with torch.no_grad():
        for layer, rows in [(plain, 4), (plain, 5), (biased, 1), (odd, 1)]:
            x = torch.randn(rows, layer.in_features, generator=g).to(torch.bfloat16)
            applies = layer is plain and rows <= FEW_ROWS
            if applies:      # the kernel: another summation order, so one bfloat16 rounding step apart
                torch.testing.assert_close(linear_cpp(x, layer), torch_linear(x, layer), atol=3e-2, rtol=1.6e-2)
            else:            # PyTorch's own path, bit for bit
                assert torch.equal(linear_cpp(x, layer), torch_linear(x, layer))
        x = torch.randn(2, 64, generator=g)                              # float32 goes to the kernel too
        torch.testing.assert_close(linear_cpp(x, plain.float()), torch_linear(x, plain.float()))


def test_kernels_refuse_bad_input_with_a_message_that_names_it():
    ext = cpu_fused.extension()
    x, w = torch.randn(4, 8), torch.ones(8)
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        ext.silu_and_mul_out(torch.randn(4, 8, dtype=torch.float16))
    with pytest.raises(RuntimeError, match="residual"):
        ext.fused_add_rms_norm(x, torch.randn(4, 9), w, 1e-6, True)
    with pytest.raises(RuntimeError, match="weight"):
        ext.fused_add_rms_norm(x, torch.randn(4, 8), torch.ones(7), 1e-6, True)
    with pytest.raises(RuntimeError, match="even"):
        ext.silu_and_mul_out(torch.randn(4, 7))
    cos, sin = rope_tables(10, 8, torch.float32)
    with pytest.raises(RuntimeError, match="position 10"):
        ext.rotary_inplace(torch.tensor([0, 10]), torch.randn(2, 1, 8), cos, sin)
    with pytest.raises(RuntimeError, match="at most 4 rows"):
        ext.linear_few_rows(torch.randn(5, 32), torch.randn(16, 32))
    with pytest.raises(RuntimeError, match="multiple of 32"):
        ext.linear_few_rows(torch.randn(1, 40), torch.randn(16, 40))
    with pytest.raises(RuntimeError, match="columns"):
        ext.linear_few_rows(torch.randn(1, 32), torch.randn(16, 64))


def test_forced_modes_and_where_the_kernels_cannot_run():
    cpu = torch.device("cpu")
    with torch.no_grad():
        assert pointwise_ops(cpu, "cpp") is CPP_OPS
        assert pointwise_ops(cpu, "torch") is TORCH_OPS
        assert pointwise_ops(cpu, "auto") == TORCH_OPS      # nothing measured: PyTorch's ops
    assert pointwise_ops(cpu, "auto", {"rotary, decode": timing.Choice("cpp", {})}) is TORCH_OPS   # autograd on
    with pytest.raises(RuntimeError, match="autograd"):
        pointwise_ops(cpu, "cpp")
    with pytest.raises(ValueError, match="fusion"):
        pointwise_ops(cpu, "fast")


def test_auto_takes_the_kernel_only_where_it_was_measured_faster():
    won, lost = timing.Choice("cpp", {"torch": 2.0, "cpp": 1.0}), timing.Choice("torch", {"torch": 1.0, "cpp": 2.0})
    choices = {"add + RMSNorm, decode": won, "add + RMSNorm, prefill": lost, "rotary, decode": lost,
               "rotary, prefill": won, "linear, 2 row(s)": won}
    with torch.no_grad():
        decode = pointwise_ops(torch.device("cpu"), "auto", choices, rows=2)
        prefill = auto_ops(choices, DECODE_ROWS + 1)
    assert decode == type(CPP_OPS)(CPP_OPS.add_rms_norm, TORCH_OPS.silu_and_mul, TORCH_OPS.rotary, CPP_OPS.linear)
    assert prefill == type(CPP_OPS)(TORCH_OPS.add_rms_norm, TORCH_OPS.silu_and_mul, CPP_OPS.rotary, TORCH_OPS.linear)
    assert auto_ops(choices, 1).linear is TORCH_OPS.linear                              # 1 row: not measured


def test_fusion_choices_are_measured_once_per_process_and_leave_the_model_alone(our_model):
    ids = torch.arange(100, 109)
    with torch.no_grad():
        before = our_model.compute_logits(our_model(ids, torch.arange(9)))
        first = fusion_choices(our_model.model)
        keys = set(timing.CHOICES)
        second = fusion_choices(our_model.model)
        after = our_model.compute_logits(our_model(ids, torch.arange(9)))
    past_the_kernel = {"linear, decode", "linear, prefill"}                         # F.linear or the packed weight
    pieces = {f"{piece}, {regime}" for piece in ("add + RMSNorm", "SiLU x up", "rotary")
              for regime in ("decode", "prefill")}
    assert set(first) == pieces | {f"linear, {r} row(s)" for r in range(1, 5)} | past_the_kernel
    assert all(second[key] is first[key] for key in first) and set(timing.CHOICES) == keys
    assert all(choice.name in ("torch", "cpp") and set(choice.seconds) == {"torch", "cpp"}
               for key, choice in first.items() if key not in past_the_kernel)
    assert all(first[key].name in first[key].seconds and set(first[key].seconds) <= {"torch", "packed"}
               for key in past_the_kernel)
    assert torch.equal(before, after)                   # the kernels ran on copies of their own


@pytest.mark.parametrize("fusion", ["auto", "cpp", "torch"])
def test_embedded_model_logits_match_transformers_with_and_without_fusion(our_model, hf_model, tokenizer, fusion):
    ids = torch.tensor(tokenizer("Fused kernels read each activation once.").input_ids)
    our_model.model.fusion = fusion
    try:
        with torch.no_grad():
            mine = our_model.compute_logits(our_model(ids, torch.arange(len(ids))))
            theirs = hf_model(ids[None]).logits[0]
    finally:
        our_model.model.fusion = "auto"
    torch.testing.assert_close(mine, theirs, atol=2e-3, rtol=1e-4)
    assert torch.equal(mine.argmax(-1), theirs.argmax(-1))


@pytest.mark.parametrize("fusion", ["auto", "cpp"])
def test_bfloat16_model_fused_and_unfused_agree(embedded_dir, fusion):
    from rosellm_edu import model_loader

    model = model_loader.load_model(embedded_dir, torch.bfloat16)
    ids = torch.randint(100, model.config.vocab_size, (24,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model.model.fusion = fusion
        fused = model.compute_logits(model(ids, torch.arange(24))).float()
        model.model.fusion = "torch"
        unfused = model.compute_logits(model(ids, torch.arange(24))).float()
    # the same numbers but for the order of each norm's sum of squares: bfloat16-close, not equal
    assert (fused - unfused).abs().max() < 0.05 * unfused.abs().max()
