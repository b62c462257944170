# Generated from notebooks/11_weight_only_quantization.ipynb by `python -m rosellm_edu.book.export`.
# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell
# (cells counted from 1 in their notebook, markdown cells included).

import functools

import torch

from rosellm_edu.kernels.build import build_cpp
from rosellm_edu.kernels.cpu_fused import SOURCE as POINTWISE_SOURCE


# notebooks/11_weight_only_quantization.ipynb, cell 23
SOURCE = POINTWISE_SOURCE + r"""
typedef uint8_t u8x16 __attribute__((vector_size(16), aligned(1)));
typedef int32_t i32x16 __attribute__((vector_size(64)));
// 16 nibbles as floats, through int32 (a direct uint8 -> float conversion compiles to one lane at a time).
inline v16 to_float(u8x16 q) { return __builtin_convertvector(__builtin_convertvector(q, i32x16), v16); }

// 16 floats stored as T: float32 as they are, bfloat16 rounded to nearest even, both as whole vectors.
inline void store16(float* p, v16 v) { std::memcpy(p, &v, sizeof v); }
inline void store16(at::BFloat16* p, v16 v) {
  typedef uint32_t u32x16 __attribute__((vector_size(64)));
  typedef uint16_t u16x16 __attribute__((vector_size(32)));
  u32x16 u;
  std::memcpy(&u, &v, sizeof v);
  const u16x16 b = __builtin_convertvector((u + 0x7fffu + ((u >> 16) & 1u)) >> 16, u16x16);
  std::memcpy(p, &b, sizeof b);
}
"""


# notebooks/11_weight_only_quantization.ipynb, cell 24
SOURCE += r"""
// y (M, N) = x (M, K) @ W^T, W in 4-bit groups of 32: W[n, 32g + j] = q * d[n, g] + m[n, g], with q the low nibble
// of byte j of group g for j < 16, the high nibble of byte j - 16 after (GGUF's Q4_1 order).
template <typename T, int M>
void int4_few_rows(const T* x, const uint8_t* qs, const at::Half* d, const at::Half* m, T* y, int64_t N, int64_t K) {
  const int64_t G = K / 32;
  std::vector<float> xf(M * K), xsum(M * G, 0.f);              // x as floats, and its sum over each group
  for (int64_t i = 0; i < M * K; ++i) xf[i] = load(x, i), xsum[i / 32] += xf[i];
  const _Float16 *dh = reinterpret_cast<const _Float16*>(d), *mh = reinterpret_cast<const _Float16*>(m);
  at::parallel_for(0, N / 16, 1, [&](int64_t begin, int64_t end) {
    v16 part[M][16]; float low[M][16];                           // (row, column): q * d * x, and m * sum(x)
    for (int64_t b = begin; b < end; ++b) {
      for (int64_t t = 0; t < 16; t += 4) {                      // 4 columns at once: independent sums overlap
        v16 acc[4][M] = {};
        float macc[4][M] = {};
        for (int64_t g = 0; g < G; ++g)
          for (int c = 0; c < 4; ++c) {
            const int64_t i = (b * 16 + t + c) * G + g;
            const u8x16 q = *reinterpret_cast<const u8x16*>(qs + i * 16);
            const v16 lo = to_float(q & 15), hi = to_float(q >> 4);
            const float dg = float(dh[i]), mg = float(mh[i]);
            for (int r = 0; r < M; ++r) {
              const v16* xr = reinterpret_cast<const v16*>(xf.data() + r * K + g * 32);
              acc[c][r] += dg * (xr[0] * lo + xr[1] * hi);
              macc[c][r] += mg * xsum[r * G + g];
            }
          }
        for (int c = 0; c < 4; ++c)
          for (int r = 0; r < M; ++r) part[r][t + c] = acc[c][r], low[r][t + c] = macc[c][r];
      }
      for (int r = 0; r < M; ++r) {
        v16 s = sum16(part[r]);
        for (int j = 0; j < 16; ++j) s[j] += low[r][j];
        store16(y + r * N + b * 16, s);
      }
    }
  });
}
"""


# notebooks/11_weight_only_quantization.ipynb, cell 26
SOURCE += r"""
template <typename T>
void int4_dequantize(const uint8_t* qs, const at::Half* d, const at::Half* m, T* w, int64_t N, int64_t K) {
  const int64_t G = K / 32;
  const _Float16 *dh = reinterpret_cast<const _Float16*>(d), *mh = reinterpret_cast<const _Float16*>(m);
  at::parallel_for(0, N * G, 256, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {                     // group i = n * G + g, written at w + 32 i
      const u8x16 q = *reinterpret_cast<const u8x16*>(qs + i * 16);
      const float dg = float(dh[i]), mg = float(mh[i]);
      store16(w + i * 32, to_float(q & 15) * dg + mg);
      store16(w + i * 32 + 16, to_float(q >> 4) * dg + mg);
    }
  });
}
"""


# notebooks/11_weight_only_quantization.ipynb, cell 27
SOURCE += r"""
void check_int4(const torch::Tensor& qs, const torch::Tensor& d, const torch::Tensor& m) {
  TORCH_CHECK(qs.device().is_cpu() && qs.scalar_type() == at::kByte && qs.dim() == 3 && qs.size(2) == 16 &&
              qs.is_contiguous(), "qs must be a contiguous CPU uint8 (N, K / 32, 16) tensor, got ", qs.sizes());
  TORCH_CHECK(qs.size(0) % 16 == 0, "out_features must be a multiple of 16, got ", qs.size(0));
  for (const auto* t : {&d, &m})
    TORCH_CHECK(t->scalar_type() == at::kHalf && t->is_contiguous() && t->dim() == 2 && t->size(0) == qs.size(0) &&
                t->size(1) == qs.size(1), "d and m must be contiguous float16 (N, K / 32) tensors");
}

torch::Tensor int4_linear(torch::Tensor x, torch::Tensor qs, torch::Tensor d, torch::Tensor m) {
  check_rows(x, "x");
  check_int4(qs, d, m);
  TORCH_CHECK(x.size(0) >= 1 && x.size(0) <= 4, "x must have 1 to 4 rows, got ", x.size(0));
  TORCH_CHECK(x.size(1) == qs.size(1) * 32, "x has ", x.size(1), " columns but the weight ", qs.size(1) * 32);
  auto y = torch::empty({x.size(0), qs.size(0)}, x.options());
  DISPATCH(x.scalar_type(), "int4_linear", [&] {
    auto f = x.size(0) == 1 ? int4_few_rows<scalar_t, 1> : x.size(0) == 2 ? int4_few_rows<scalar_t, 2>
           : x.size(0) == 3 ? int4_few_rows<scalar_t, 3> : int4_few_rows<scalar_t, 4>;
    f(x.data_ptr<scalar_t>(), qs.data_ptr<uint8_t>(), d.data_ptr<at::Half>(), m.data_ptr<at::Half>(),
      y.data_ptr<scalar_t>(), qs.size(0), x.size(1));
  });
  return y;
}

torch::Tensor int4_dequantize_out(torch::Tensor qs, torch::Tensor d, torch::Tensor m, at::ScalarType dtype) {
  check_int4(qs, d, m);
  auto w = torch::empty({qs.size(0), qs.size(1) * 32}, qs.options().dtype(dtype));
  DISPATCH(dtype, "int4_dequantize", [&] {
    int4_dequantize<scalar_t>(qs.data_ptr<uint8_t>(), d.data_ptr<at::Half>(), m.data_ptr<at::Half>(),
                              w.data_ptr<scalar_t>(), qs.size(0), qs.size(1) * 32);
  });
  return w;
}
"""


# notebooks/11_weight_only_quantization.ipynb, cell 28
@functools.cache
def extension():
    """The 4-bit kernels, or None where they cannot be built (the layers then de-quantize with PyTorch ops)."""
    return build_cpp("rosellm_edu_int4", SOURCE, ["int4_linear", "int4_dequantize_out"],
                     "4-bit layers de-quantize with PyTorch ops instead", extra_cflags=("-fno-trapping-math",))


# notebooks/11_weight_only_quantization.ipynb, cell 28
def int4_linear_cpp(x: torch.Tensor, qs: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """x (rows <= 4, K) @ W^T for W packed as qs (N, K/32, 16), d and m (N, K/32): W is read once, as 4 bits."""
    return extension().int4_linear(x.contiguous(), qs, d, m)


# notebooks/11_weight_only_quantization.ipynb, cell 28
def int4_dequantize_cpp(qs: torch.Tensor, d: torch.Tensor, m: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """W (N, K) in dtype, one pass over the packed weight."""
    return extension().int4_dequantize_out(qs, d, m, dtype)
