# Generated from notebooks/10_fewer_passes.ipynb, notebooks/11_weight_only_quantization.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import functools
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from rosellm_edu.kernels.build import build_cpp
from rosellm_edu.layers.rotary import rotate_half
from rosellm_edu.timing import Choice, choose


# notebooks/10_fewer_passes.ipynb, cell 9
def add_rms_norm_reference(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float):
    """(RMSNorm(residual + x) * weight, residual + x), or with residual None, (RMSNorm(x) * weight, x): chapter
    00's ops, one pass each. x, residual: (tokens, hidden)."""
    h = x if residual is None else x + residual
    h32 = h.float()
    return weight * (h32 * torch.rsqrt(h32.pow(2).mean(-1, keepdim=True) + eps)).to(h.dtype), h


# notebooks/10_fewer_passes.ipynb, cell 9
def silu_and_mul_reference(gate_up: torch.Tensor) -> torch.Tensor:
    """(tokens, 2 * inter) -> (tokens, inter): SiLU of the first half times the second half."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


# notebooks/10_fewer_passes.ipynb, cell 9
def rotary_reference(positions, q, k, cos, sin):
    """Chapter 00's rotary: q (tokens, heads, d), k (tokens, kv_heads, d); cos, sin (max_positions, d)."""
    c = cos[positions].unsqueeze(1).to(q.dtype)                    # (tokens, 1, d)
    s = sin[positions].unsqueeze(1).to(q.dtype)
    return q * c + rotate_half(q) * s, k * c + rotate_half(k) * s


# notebooks/10_fewer_passes.ipynb, cell 42
@functools.cache
def extension():
    """The compiled kernels (`make model` builds them ahead), or None where they cannot be built and the model
    keeps PyTorch's ops. -fno-trapping-math lets the compiler turn the clamps in exp_poly into vector selects."""
    return build_cpp("rosellm_edu_fused_pointwise", "pointwise.h",
                     ["fused_add_rms_norm", "silu_and_mul_out", "rotary_inplace", "linear_few_rows",
                      "few_rows_loop"],
                     "the model uses PyTorch's ops instead", extra_cflags=("-fno-trapping-math",))


# notebooks/10_fewer_passes.ipynb, cell 25
def add_rms_norm_cpp(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float):
    """add_rms_norm_reference's contract, in one pass; x (and residual, if given) are overwritten."""
    x = x.contiguous()
    if residual is None:                                 # the first layer: the residual starts as a copy of x
        residual = torch.empty_like(x)
        extension().fused_add_rms_norm(x, residual, weight, eps, False)
    else:
        extension().fused_add_rms_norm(x, residual, weight, eps, True)
    return x, residual


# notebooks/10_fewer_passes.ipynb, cell 25
def silu_and_mul_cpp(gate_up: torch.Tensor) -> torch.Tensor:
    return extension().silu_and_mul_out(gate_up.contiguous())


# notebooks/10_fewer_passes.ipynb, cell 25
def rotary_cpp(positions, q, k, cos, sin):
    """rotary_reference's contract; q and k are rotated in place and returned."""
    positions = positions.contiguous()
    extension().rotary_inplace(positions, q, cos, sin)
    extension().rotary_inplace(positions, k, cos, sin)
    return q, k


# notebooks/10_fewer_passes.ipynb, cell 27
REGIMES = {"decode": 64, "prefill": 512}   # rows of a step of each kind: a batch of sequences, a prompt


# notebooks/10_fewer_passes.ipynb, cell 27
def kernel_cases(config, rotary: nn.Module, rows: int, dtype: torch.dtype) -> dict[str, tuple[Callable, Callable]]:
    """name -> (PyTorch's ops, the C++ kernel) on the same random (rows, ...) inputs of the model's shapes. The
    kernel works in place on copies of its own, so nothing else is overwritten; its first call is the one to check."""
    g = torch.Generator().manual_seed(rows)                        # the caller's random stream is left alone
    hidden, heads, kv_heads = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
    cos, sin = rotary.cos.to(dtype), rotary.sin.to(dtype)          # (max_positions, head_dim)
    d, eps = cos.shape[1], config.rms_norm_eps
    x, r = torch.randn(rows, hidden, generator=g).to(dtype), torch.randn(rows, hidden, generator=g).to(dtype)
    xs, rs, w = x.clone(), r.clone(), (torch.rand(hidden, generator=g) + 0.5).to(dtype)
    gate_up = torch.randn(rows, 2 * config.intermediate_size, generator=g).to(dtype)
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * d, generator=g).to(dtype)
    qkv_s = qkv.clone()
    q, k, qs, ks = (t[:, lo * d:hi * d].unflatten(1, (hi - lo, d))              # strided, as in the model
                    for t, (lo, hi) in [(qkv, (0, heads)), (qkv, (heads, heads + kv_heads)),
                                        (qkv_s, (0, heads)), (qkv_s, (heads, heads + kv_heads))])
    pos = torch.randint(0, cos.shape[0], (rows,), generator=g)
    return {"add + RMSNorm": (lambda: add_rms_norm_reference(x, r, w, eps), lambda: add_rms_norm_cpp(xs, rs, w, eps)),
            "SiLU x up": (lambda: silu_and_mul_reference(gate_up), lambda: silu_and_mul_cpp(gate_up)),
            "rotary": (lambda: rotary_reference(pos, q, k, cos, sin), lambda: rotary_cpp(pos, qs, ks, cos, sin))}


# notebooks/11_weight_only_quantization.ipynb, cell 39
def torch_linear(x: torch.Tensor, layer: nn.Module) -> torch.Tensor:
    """x (rows, in_features) -> (rows, out_features): F.linear for an nn.Linear; a quantized layer multiplies by
    its packed weight itself."""
    if not isinstance(layer, nn.Linear):
        return layer(x)
    return F.linear(x, layer.weight, layer.bias)


# notebooks/10_fewer_passes.ipynb, cell 42
def few_rows_linear_cpp(x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    """F.linear(x, layer.weight, layer.bias) for x (rows, in_features), by the kernel (no bias, K % 32 == 0,
    N % 16 == 0, at most 4 rows)."""
    return extension().linear_few_rows(x.contiguous(), layer.weight)


# notebooks/10_fewer_passes.ipynb, cell 51
# nn.Linear -> a copy of its weight in oneDNN's layout: made once, so a weight changed in place later needs packing
# again; a deep copy of the model has none, and multiplies by its plain weights
BLOCKED = weakref.WeakKeyDictionary()


# notebooks/10_fewer_passes.ipynb, cell 51
def pack_weights(linears: list[nn.Linear], rows: int = REGIMES["decode"]) -> bool:
    """Keep a second copy of each Linear's weight in oneDNN's layout for `rows` rows. False, and nothing kept,
    where this PyTorch or CPU cannot (no oneDNN, or no path for the dtype)."""
    try:
        BLOCKED.update({m: torch.ops.mkldnn._reorder_linear_weight(m.weight.detach(), rows) for m in linears})
    except (AttributeError, RuntimeError):
        return False
    return True


# notebooks/10_fewer_passes.ipynb, cell 51
def unpack_weights(linears: list[nn.Linear]) -> None:
    for m in linears:
        BLOCKED.pop(m, None)


# notebooks/10_fewer_passes.ipynb, cell 51
def packed_linear(x: torch.Tensor, layer: nn.Module) -> torch.Tensor:
    """x (rows, in_features) -> (rows, out_features) by oneDNN on the packed weight; torch_linear without one."""
    blocked = BLOCKED.get(layer)
    if blocked is None:
        return torch_linear(x, layer)
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), blocked, layer.bias, "none", [], "")


# notebooks/10_fewer_passes.ipynb, cell 55
FEW_ROWS = 4                 # up to this many rows, a matmul can go to the kernel (the lines above)


# notebooks/11_weight_only_quantization.ipynb, cell 39
def few_rows_fits(layer: nn.Module) -> bool:
    """Whether chapter 10's few-rows kernel multiplies by this layer: an nn.Linear, no bias, K % 32 == 0,
    N % 16 == 0."""
    return (isinstance(layer, nn.Linear) and layer.bias is None and layer.in_features % 32 == 0
            and layer.out_features % 16 == 0)


# notebooks/11_weight_only_quantization.ipynb, cell 39
def linear_cpp(x: torch.Tensor, layer: nn.Module) -> torch.Tensor:
    """The few-rows kernel where it fits and x has at most FEW_ROWS rows, else torch_linear. fusion="auto"
    calls it only at the row counts where it measured faster."""
    if few_rows_fits(layer) and x.dim() == 2 and x.shape[0] <= FEW_ROWS:
        return few_rows_linear_cpp(x, layer)
    return torch_linear(x, layer)


# notebooks/10_fewer_passes.ipynb, cell 56
@dataclass(frozen=True)
class PointwiseOps:
    """The steps between a Llama layer's matmuls, and the matmuls themselves, by one implementation."""
    add_rms_norm: Callable   # (x, residual | None, weight, eps) -> (normed, new residual)
    silu_and_mul: Callable   # (gate_up (tokens, 2 * inter)) -> (tokens, inter)
    rotary: Callable         # (positions, q, k, cos, sin) -> (q, k)
    linear: Callable         # (x (tokens, in_features), nn.Linear) -> (tokens, out_features)


# notebooks/11_weight_only_quantization.ipynb, cell 40
TORCH_OPS = PointwiseOps(add_rms_norm_reference, silu_and_mul_reference, rotary_reference, torch_linear)


# notebooks/11_weight_only_quantization.ipynb, cell 40
CPP_OPS = PointwiseOps(add_rms_norm_cpp, silu_and_mul_cpp, rotary_cpp, linear_cpp)


# notebooks/10_fewer_passes.ipynb, cell 56
@functools.cache
def compiled_ops() -> PointwiseOps:
    """PyTorch's ops through torch.compile, one graph for every token count (compiled at the first call)."""
    compile_ = functools.partial(torch.compile, dynamic=True)
    return PointwiseOps(compile_(add_rms_norm_reference), compile_(silu_and_mul_reference), compile_(rotary_reference),
                        torch_linear)


# notebooks/10_fewer_passes.ipynb, cell 56
def kernels_usable(device: torch.device) -> bool:
    """The kernels write in place: a CPU, no autograd, and a compiler that built them."""
    return device.type == "cpu" and not torch.is_grad_enabled() and extension() is not None


# notebooks/10_fewer_passes.ipynb, cell 57
DECODE_ROWS = 128            # a step of up to this many rows takes the decode choices, a longer one the prefill's


# notebooks/10_fewer_passes.ipynb, cell 57
def timed_linears(linear: Callable, linears: list[nn.Module], rows: int, dtype: torch.dtype) -> Callable:
    """A call of `linear` on every layer in `linears`, x (rows, in_features): the matmuls of one step."""
    g = torch.Generator().manual_seed(rows)
    xs = {n: torch.randn(rows, n, generator=g).to(dtype) for n in {m.in_features for m in linears}}
    return lambda: [linear(xs[m.in_features], m) for m in linears]


# notebooks/10_fewer_passes.ipynb, cell 57
def fusion_choices(model: nn.Module) -> dict[str, Choice]:
    """For a LlamaModel on this CPU: per piece and kind of step, "cpp" (the kernel), "torch" (PyTorch's op) or, for
    the Linears of a step past the kernel's rows, "packed", measured at the model's shapes in its dtype by timing.choose
    (once per process per shape)."""
    cfg, dtype = model.config, model.embed_tokens.weight.dtype
    shape = f"{dtype}, {cfg.hidden_size}/{cfg.intermediate_size}/{cfg.num_attention_heads}/{cfg.num_key_value_heads}"
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    choices = {}
    with torch.no_grad():
        for regime, rows in REGIMES.items():
            for name, (unfused, fused) in kernel_cases(cfg, model.rotary, rows, dtype).items():
                choices[f"{name}, {regime}"] = choose(f"fusion {name}, {rows} rows, {shape}",
                                                      {"torch": unfused, "cpp": fused})
        for rows in range(1, FEW_ROWS + 1) if linears else ():
            calls = {name: timed_linears(ops.linear, linears, rows, dtype) for name, ops in
                     (("torch", TORCH_OPS), ("cpp", CPP_OPS))}
            choices[f"linear, {rows} row(s)"] = choose(f"fusion linear, {rows} rows, {len(linears)} Linears, {shape}",
                                                       calls, repeat=3, warmup=1)
        if linears:                                                # decode batches past the kernel's rows, prompts
            ways = {"torch": torch_linear} | ({"packed": packed_linear} if pack_weights(linears) else {})
            for regime, rows in REGIMES.items():
                calls = {name: timed_linears(f, linears, rows, dtype) for name, f in ways.items()}
                choices[f"linear, {regime}"] = choose(f"fusion linear, {regime}, {len(linears)} Linears, {shape}",
                                                      calls, repeat=3, warmup=1)
            if "packed" not in {choices[f"linear, {regime}"].name for regime in REGIMES}:
                unpack_weights(linears)                            # the second copy only where it wins
    return choices


# notebooks/10_fewer_passes.ipynb, cell 58
def auto_ops(choices: dict[str, Choice], rows: int) -> PointwiseOps:
    """For a step of `rows` rows, each piece by what `choices` measured faster there (PyTorch's op if unmeasured)."""
    regime = "decode" if rows <= DECODE_ROWS else "prefill"

    def pick(field: str, key: str) -> Callable:
        name = getattr(choices.get(key), "name", "torch")
        return packed_linear if name == "packed" else getattr(CPP_OPS if name == "cpp" else TORCH_OPS, field)

    linear = f"linear, {rows} row(s)" if rows <= FEW_ROWS else f"linear, {regime}"
    return PointwiseOps(pick("add_rms_norm", f"add + RMSNorm, {regime}"), pick("silu_and_mul", f"SiLU x up, {regime}"),
                        pick("rotary", f"rotary, {regime}"), pick("linear", linear))


# notebooks/10_fewer_passes.ipynb, cell 59
def pointwise_ops(device: torch.device, fusion: str = "auto", choices: dict[str, Choice] | None = None,
                  rows: int = 1) -> PointwiseOps:
    """fusion: "auto" (per piece, what `choices` measured faster for a step of `rows` rows; PyTorch's ops where the
    kernels cannot run), "cpp" (every kernel), "torch", "compile"."""
    if fusion == "torch":
        return TORCH_OPS
    if fusion == "compile":
        return compiled_ops()
    if fusion not in ("auto", "cpp"):
        raise ValueError(f"fusion must be 'auto', 'cpp', 'torch' or 'compile', got {fusion!r}")
    if not kernels_usable(device):
        if fusion == "cpp":
            raise RuntimeError("fusion='cpp' needs the C++ kernels on a CPU, without autograd, and a C++ compiler")
        return TORCH_OPS
    return CPP_OPS if fusion == "cpp" else auto_ops(choices or {}, rows)
