// Generated from notebooks/10_fewer_passes.ipynb by `python -m rosellm_edu.book.export`.
// Do not edit: change the notebook's `%%cpp` cells and export again. Each part names its cell.

// notebooks/10_fewer_passes.ipynb, cell 14
#pragma once

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <vector>

// bfloat16 <-> float by hand, as plain integer ops the compiler can vectorise (round to nearest even, NaN kept).
inline float bf16_bits_to_float(uint16_t b) { return __builtin_bit_cast(float, uint32_t(b) << 16); }
inline uint16_t float_to_bf16_bits(float f) {
  const uint32_t u = __builtin_bit_cast(uint32_t, f);
  return f != f ? uint16_t(0x7fc0) : uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
inline float load(const float* p, int64_t i) { return p[i]; }
inline float load(const at::BFloat16* p, int64_t i) { return bf16_bits_to_float(reinterpret_cast<const uint16_t*>(p)[i]); }
inline void store(float* p, int64_t i, float v) { p[i] = v; }
inline void store(at::BFloat16* p, int64_t i, float v) { reinterpret_cast<uint16_t*>(p)[i] = float_to_bf16_bits(v); }
// Round where PyTorch's unfused bfloat16 ops round (after each op), so results match them bit for bit but for
// the order of one sum; a float32 value is already rounded.
template <typename T> inline float rnd(float x) { return x; }
template <> inline float rnd<at::BFloat16>(float x) { return bf16_bits_to_float(float_to_bf16_bits(x)); }

// exp(x) as 2^n * e^r, |r| <= ln2 / 2, with a degree-6 polynomial (relative error about 1e-7): branch-free
// float arithmetic, so a loop of it vectorises, where std::exp in a loop stays a call per element.
inline float exp_poly(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  const int32_t ni = int32_t(x * 1.44269504f + 128.5f) - 128;   // round(x / ln 2): truncate a positive number
  const float n = float(ni);
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f; p = p * r + 8.3334519073e-3f; p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f; p = p * r + 5.0000001201e-1f;
  return (p * r * r + r + 1.f) * __builtin_bit_cast(float, (ni + 127) << 23);   // times 2^n
}

// notebooks/10_fewer_passes.ipynb, cell 16
// residual <- residual + x (or a copy of x when add is false), x <- rmsnorm(residual) * weight: each row read
// once and written once, where the unfused add and norm make seven passes.
template <typename T>
void add_rms_norm(T* x, T* residual, const T* w, int64_t rows, int64_t n, float eps, bool add) {
  at::parallel_for(0, rows, std::max<int64_t>(1, 16384 / n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      T* xr = x + r * n;
      T* rr = residual + r * n;
      float ss = 0.f;
#pragma omp simd reduction(+ : ss)
      for (int64_t i = 0; i < n; ++i) {
        const float h = add ? rnd<T>(load(xr, i) + load(rr, i)) : load(xr, i);
        store(rr, i, h);
        ss += h * h;
      }
      const float inv = 1.f / std::sqrt(ss / float(n) + eps);
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) store(xr, i, rnd<T>(load(rr, i) * inv) * load(w, i));
    }
  });
}

// notebooks/10_fewer_passes.ipynb, cell 18
// out = silu(gate) * up, reading the (rows, 2 * n) output of the packed gate_up matmul once. Two simple loops per
// row, exp into a float scratch row and then the rest: in one loop GCC splits off the clamped lanes of exp_poly
// and the loop ran several times slower.
template <typename T>
void silu_and_mul(const T* gu, T* out, int64_t rows, int64_t n) {
  at::parallel_for(0, rows, std::max<int64_t>(1, 16384 / n), [&](int64_t begin, int64_t end) {
    std::vector<float> e(n);
    for (int64_t r = begin; r < end; ++r) {
      const T* g = gu + r * 2 * n;
      const T* u = g + n;
      T* o = out + r * n;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) e[i] = exp_poly(-load(g, i));
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) store(o, i, rnd<T>(load(g, i) / (1.f + e[i])) * load(u, i));
    }
  });
}

// notebooks/10_fewer_passes.ipynb, cell 20
// Rotary in place on one (tokens, heads, d) view whose rows may be strided (q and k are slices of the qkv output):
// element i pairs with i + d/2, both read before either is written. cos, sin: (max_positions, d) in x's dtype.
template <typename T>
void rotary(T* x, int64_t row_stride, const int64_t* pos, const T* cos, const T* sin, int64_t tokens,
            int64_t heads, int64_t d) {
  const int64_t half = d / 2;
  at::parallel_for(0, tokens, std::max<int64_t>(1, 4096 / (heads * d)), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const T* c = cos + pos[t] * d;
      const T* s = sin + pos[t] * d;
      for (int64_t h = 0; h < heads; ++h) {
        T* xh = x + t * row_stride + h * d;
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          const float ci = load(c, i), si = load(s, i), a = load(xh, i), b = load(xh, i + half);
          store(xh, i, rnd<T>(a * ci) + rnd<T>(-b * si));
          store(xh, i + half, rnd<T>(b * ci) + rnd<T>(a * si));
        }
      }
    }
  });
}

// notebooks/10_fewer_passes.ipynb, cell 22
// float32 and bfloat16 only: float16 would need its own conversions.
#define DISPATCH(t, name, ...) [&] {                                                            \
    TORCH_CHECK(t == at::kFloat || t == at::kBFloat16, name, ": float32 or bfloat16 expected, got ", t); \
    if (t == at::kFloat) { using scalar_t = float; __VA_ARGS__(); }                             \
    else { using scalar_t = at::BFloat16; __VA_ARGS__(); }                                      \
  }()

void check_rows(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be on the CPU");
  TORCH_CHECK(t.dim() == 2 && t.is_contiguous(), name, " must be a contiguous (rows, n) tensor, got ",
              t.sizes(), t.is_contiguous() ? "" : " (not contiguous)");
}

// In place: residual += x (unless add is false), then x = rmsnorm(residual) * weight.
void fused_add_rms_norm(torch::Tensor x, torch::Tensor residual, torch::Tensor weight, double eps, bool add) {
  check_rows(x, "x");
  check_rows(residual, "residual");
  TORCH_CHECK(x.sizes() == residual.sizes(), "x ", x.sizes(), " and residual ", residual.sizes(), " differ");
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(1) && weight.is_contiguous(),
              "weight must be a contiguous (", x.size(1), ",) tensor, got ", weight.sizes());
  TORCH_CHECK(x.scalar_type() == residual.scalar_type() && x.scalar_type() == weight.scalar_type(),
              "x, residual and weight must share a dtype");
  DISPATCH(x.scalar_type(), "fused_add_rms_norm", [&] {
    add_rms_norm<scalar_t>(x.data_ptr<scalar_t>(), residual.data_ptr<scalar_t>(), weight.data_ptr<scalar_t>(),
                           x.size(0), x.size(1), float(eps), add);
  });
}

// notebooks/10_fewer_passes.ipynb, cell 23
torch::Tensor silu_and_mul_out(torch::Tensor gate_up) {
  check_rows(gate_up, "gate_up");
  TORCH_CHECK(gate_up.size(1) % 2 == 0, "gate_up's last dimension must be even, got ", gate_up.size(1));
  auto out = torch::empty({gate_up.size(0), gate_up.size(1) / 2}, gate_up.options());
  DISPATCH(gate_up.scalar_type(), "silu_and_mul", [&] {
    silu_and_mul<scalar_t>(gate_up.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), out.size(0), out.size(1));
  });
  return out;
}

void rotary_inplace(torch::Tensor positions, torch::Tensor x, torch::Tensor cos, torch::Tensor sin) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 3, "x must be a (tokens, heads, head_dim) CPU tensor");
  TORCH_CHECK(x.stride(2) == 1 && x.stride(1) == x.size(2), "each token's heads must be contiguous in x");
  TORCH_CHECK(x.size(2) % 2 == 0, "head_dim must be even, got ", x.size(2));
  TORCH_CHECK(positions.scalar_type() == at::kLong && positions.is_contiguous() && positions.numel() == x.size(0),
              "positions must be a contiguous int64 (tokens,) tensor");
  TORCH_CHECK(cos.scalar_type() == x.scalar_type() && sin.scalar_type() == x.scalar_type() && cos.is_contiguous() &&
              sin.is_contiguous() && cos.size(1) == x.size(2), "cos, sin must be contiguous (positions, head_dim) in x's dtype");
  const int64_t* pos = positions.data_ptr<int64_t>();
  for (int64_t t = 0; t < x.size(0); ++t)   // a wrong position would read outside the tables
    TORCH_CHECK(pos[t] >= 0 && pos[t] < cos.size(0), "position ", pos[t], " is outside [0, ", cos.size(0), ")");
  DISPATCH(x.scalar_type(), "rotary_inplace", [&] {
    rotary<scalar_t>(x.data_ptr<scalar_t>(), x.stride(0), pos, cos.data_ptr<scalar_t>(),
                     sin.data_ptr<scalar_t>(), x.size(0), x.size(1), x.size(2));
  });
}

// notebooks/10_fewer_passes.ipynb, cell 37
#include "vectors.h"
#ifndef FEW_ROWS_PREFETCH
#define FEW_ROWS_PREFETCH 1   // __builtin_prefetch's locality: 1 brings a line into L2, 3 into L1 as well
#endif
// x's n values (n % 32 == 0) as floats xs, split as load32 splits W's rows: split once, then reused for every row of W.
template <typename T>
void split_v16(const T* x, int64_t n, float* xs) {
  for (int64_t i = 0; i < n; i += 32) {
    v16 even, odd;
    load32(x + i, even, odd);
    std::memcpy(xs + i, &even, sizeof even), std::memcpy(xs + i + 16, &odd, sizeof odd);
  }
}

// Blocks [begin, end) of 16 columns of y (M, N) = x (M, K) @ W (N, K)^T, M <= 4, x split: W read once, in order.
template <typename T>
void few_rows_v16(const float* xs, const T* w, T* y, int64_t M, int64_t N, int64_t K, int64_t begin, int64_t end) {
  v16 part[4][16];                                               // (row of x, output column) partial sums
  for (int64_t b = begin; b < end; ++b) {
    for (int64_t t = 0; t < 16; ++t) {
      const T* row = w + (b * 16 + t) * K;
      v16 acc[4] = {};
      for (int64_t c = 0; c < K; c += 32) {
        __builtin_prefetch(reinterpret_cast<const char*>(row + 16 * K + c), 0, FEW_ROWS_PREFETCH);   // 16 rows ahead
        v16 even, odd;
        load32(row + c, even, odd);
        for (int64_t m = 0; m < M; ++m) {
          const v16* xm = reinterpret_cast<const v16*>(xs + m * K + c);
          acc[m] += xm[0] * even + xm[1] * odd;
        }
      }
      for (int64_t m = 0; m < M; ++m) part[m][t] = acc[m];
    }
    for (int64_t m = 0; m < M; ++m) {
      const v16 s = sum16(part[m]);
      for (int j = 0; j < 16; ++j) store(y, m * N + b * 16 + j, s[j]);
    }
  }
}

// notebooks/10_fewer_passes.ipynb, cell 39
#ifdef AVX2_WITHOUT_512
template <typename T>
void split_avx2(const T* x, int64_t n, float* xs) {            // as load16 splits W's rows
  for (int64_t i = 0; i < n; i += 16) {
    __m256 a, b;
    load16(x + i, a, b);
    _mm256_storeu_ps(xs + i, a), _mm256_storeu_ps(xs + i + 8, b);
  }
}

template <typename T, int M>
void few_rows_avx2(const float* xs, const T* w, T* y, int64_t N, int64_t K, int64_t begin, int64_t end) {
  for (int64_t n = 16 * begin; n < 16 * end; n += 4) {          // blocks of 16 columns, four rows of W at once
    __m256 acc[M][4];                                           // (row of x, row of W) partial sums
    for (auto& row : acc) for (auto& a : row) a = _mm256_setzero_ps();
    for (int64_t c = 0; c < K; c += 16) {
      __m256 wa[4], wb[4];
      for (int r = 0; r < 4; ++r) {
        __builtin_prefetch(reinterpret_cast<const char*>(w + (n + 4 + r) * K + c), 0, FEW_ROWS_PREFETCH);   // next 4
        load16(w + (n + r) * K + c, wa[r], wb[r]);
      }
      for (int m = 0; m < M; ++m) {
        const __m256 xa = _mm256_loadu_ps(xs + m * K + c), xb = _mm256_loadu_ps(xs + m * K + c + 8);
        for (int r = 0; r < 4; ++r) acc[m][r] = _mm256_fmadd_ps(xb, wb[r], _mm256_fmadd_ps(xa, wa[r], acc[m][r]));
      }
    }
    for (int m = 0; m < M; ++m) {                               // four registers -> their four sums
      const __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(acc[m][0], acc[m][1]), _mm256_hadd_ps(acc[m][2], acc[m][3]));
      const __m128 sums = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
      for (int r = 0; r < 4; ++r) store(y, m * N + n + r, sums[r]);
    }
  }
}
#endif

// notebooks/10_fewer_passes.ipynb, cell 40
// This CPU's loop, AVX2's (M a constant) or the v16 loop: x split for it, then blocks [begin, end) of 16 columns.
template <typename T>
void split_rows(const T* x, int64_t n, float* xs) {
#ifdef AVX2_WITHOUT_512
  split_avx2(x, n, xs);
#else
  split_v16(x, n, xs);
#endif
}

template <typename T>
void few_rows_range(const float* xs, const T* w, T* y, int64_t M, int64_t N, int64_t K, int64_t begin, int64_t end) {
#ifdef AVX2_WITHOUT_512
  using Loop = void (*)(const float*, const T*, T*, int64_t, int64_t, int64_t, int64_t);
  const Loop loops[] = {few_rows_avx2<T, 1>, few_rows_avx2<T, 2>, few_rows_avx2<T, 3>, few_rows_avx2<T, 4>};
  if (M > 0) loops[M - 1](xs, w, y, N, K, begin, end);
#else
  few_rows_v16(xs, w, y, M, N, K, begin, end);
#endif
}

// notebooks/10_fewer_passes.ipynb, cell 41
// A weight this loop can take, for `rows` rows of x in `dtype`.
void check_few_rows(const torch::Tensor& weight, int64_t rows, at::ScalarType dtype) {
  check_rows(weight, "weight");
  TORCH_CHECK(rows <= 4, "x may have at most 4 rows, got ", rows);
  TORCH_CHECK(weight.size(1) % 32 == 0 && weight.size(0) % 16 == 0,
              "in_features must be a multiple of 32 and out_features of 16, got ", weight.sizes());
  TORCH_CHECK(weight.scalar_type() == dtype, "x and weight must share a dtype");
}

torch::Tensor linear_few_rows(torch::Tensor x, torch::Tensor weight) {
  check_rows(x, "x");
  check_few_rows(weight, x.size(0), x.scalar_type());
  TORCH_CHECK(weight.size(1) == x.size(1), "x has ", x.size(1), " columns but weight ", weight.size(1));
  auto y = torch::empty({x.size(0), weight.size(0)}, x.options());
  DISPATCH(x.scalar_type(), "linear_few_rows", [&] {
    const scalar_t *xp = x.data_ptr<scalar_t>(), *wp = weight.data_ptr<scalar_t>();
    scalar_t* yp = y.data_ptr<scalar_t>();
    std::vector<float> xs(x.numel());
    split_rows(xp, x.numel(), xs.data());
    at::parallel_for(0, weight.size(0) / 16, 1, [&](int64_t begin, int64_t end) {
      few_rows_range(xs.data(), wp, yp, x.size(0), weight.size(0), x.size(1), begin, end);
    });
  });
  return y;
}

std::string few_rows_loop() {        // which loop linear_few_rows runs on this CPU
#ifdef AVX2_WITHOUT_512
  return "AVX2's, four rows of W at once in 8-float registers";
#else
  return "the v16 loop";
#endif
}
