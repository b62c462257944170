// Generated from notebooks/11_weight_only_quantization.ipynb by `python -m rosellm_edu.book.export`.
// Do not edit: change the notebook's `%%cpp` cells and export again. Each part names its cell.

// notebooks/11_weight_only_quantization.ipynb, cell 23
#pragma once
#include "pointwise.h"

typedef uint8_t u8x16 __attribute__((vector_size(16), aligned(1)));
typedef int32_t i32x16 __attribute__((vector_size(64)));
// 16 nibbles as floats, through int32 (a direct uint8 -> float conversion compiles to one lane at a time).
inline v16 to_float(u8x16 q) { return __builtin_convertvector(__builtin_convertvector(q, i32x16), v16); }

// 16 floats stored as T. bfloat16 rounds as chapter 10's float_to_bf16_bits rounds one float (to nearest even, a
// NaN stays a NaN), here on the whole vector at once: a loop calling that function does not vectorise.
inline void store16(float* p, v16 v) { std::memcpy(p, &v, sizeof v); }
inline void store16(at::BFloat16* p, v16 v) {
  typedef uint32_t u32x16 __attribute__((vector_size(64)));
  typedef uint16_t u16x16 __attribute__((vector_size(32)));
  u32x16 u;
  std::memcpy(&u, &v, sizeof v);
  const u32x16 rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, nan = u - u + 0x7fc0u;
  const u16x16 b = __builtin_convertvector(v != v ? nan : rounded, u16x16);
  std::memcpy(p, &b, sizeof b);
}

// GGUF's Q4_1: group i (column n, group g at i = n * G + g) is 16 bytes of nibbles, element j < 16 in the low
// nibble of byte j and element j + 16 in its high nibble, with a float16 scale d and minimum m: w = q * d + m.
struct Q4_1 {
  const uint8_t* qs;
  const _Float16 *d, *m;
  float scale(int64_t i) const { return d[i]; }
  float min(int64_t i) const { return m[i]; }
  void load(int64_t i, v16& lo, v16& hi) const {      // elements 0..15 and 16..31 of group i, as floats
    const u8x16 q = *reinterpret_cast<const u8x16*>(qs + i * 16);
    lo = to_float(q & 15), hi = to_float(q >> 4);
  }
};

// notebooks/11_weight_only_quantization.ipynb, cell 24
// y (M, N) = x (M, K) @ W^T, W in groups of 32 read through `w` (a format struct such as Q4_1), once.
template <typename T, int M, typename W>
void groups_few_rows(const T* x, const W& w, T* y, int64_t N, int64_t K) {
  const int64_t G = K / 32;
  std::vector<float> xf(M * K), xsum(M * G, 0.f);              // x as floats, and its sum over each group
  for (int64_t i = 0; i < M * K; ++i) xf[i] = load(x, i), xsum[i / 32] += xf[i];
  at::parallel_for(0, N / 16, 1, [&](int64_t begin, int64_t end) {
    v16 part[M][16]; float low[M][16];                           // (row, column): q * d * x, and m * sum(x)
    for (int64_t b = begin; b < end; ++b) {
      for (int64_t t = 0; t < 16; t += 4) {                      // 4 columns at once: independent sums overlap
        v16 acc[4][M] = {};
        float macc[4][M] = {};
        for (int64_t g = 0; g < G; ++g)
          for (int c = 0; c < 4; ++c) {
            const int64_t i = (b * 16 + t + c) * G + g;
            v16 lo, hi;
            w.load(i, lo, hi);
            const float dg = w.scale(i), mg = w.min(i);
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

// notebooks/11_weight_only_quantization.ipynb, cell 26
template <typename T, typename W>
void dequantize_groups(const W& w, T* out, int64_t N, int64_t K) {
  at::parallel_for(0, N * (K / 32), 256, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {                     // group i = n * G + g, written at out + 32 i
      v16 lo, hi;
      w.load(i, lo, hi);
      const float dg = w.scale(i), mg = w.min(i);
      store16(out + i * 32, lo * dg + mg);
      store16(out + i * 32 + 16, hi * dg + mg);
    }
  });
}

// notebooks/11_weight_only_quantization.ipynb, cell 27
template <typename T, typename W>      // the row count as a template argument, so each row's sums stay in registers
void few_rows(const T* x, const W& w, T* y, int64_t M, int64_t N, int64_t K) {
  auto f = M == 1 ? groups_few_rows<T, 1, W> : M == 2 ? groups_few_rows<T, 2, W> : M == 3 ? groups_few_rows<T, 3, W>
                                                                                            : groups_few_rows<T, 4, W>;
  f(x, w, y, N, K);
}

// The two entry points for any format: x (rows <= 4, G * 32) @ W^T for W (N, G groups), and W expanded to dtype.
void check_linear(const torch::Tensor& x, int64_t N, int64_t G) {
  check_rows(x, "x");
  TORCH_CHECK(x.size(0) >= 1 && x.size(0) <= 4, "x must have 1 to 4 rows, got ", x.size(0));
  TORCH_CHECK(N % 16 == 0, "out_features must be a multiple of 16, got ", N);
  TORCH_CHECK(x.size(1) == G * 32, "x has ", x.size(1), " columns but the weight ", G * 32);
}

template <typename W>
torch::Tensor groups_linear(const torch::Tensor& x, const W& w, int64_t N, int64_t G) {
  check_linear(x, N, G);
  auto y = torch::empty({x.size(0), N}, x.options());
  DISPATCH(x.scalar_type(), "groups_linear", [&] {
    few_rows(x.data_ptr<scalar_t>(), w, y.data_ptr<scalar_t>(), x.size(0), N, x.size(1));
  });
  return y;
}

template <typename W>
torch::Tensor groups_dequantize(const W& w, int64_t N, int64_t G, at::ScalarType dtype) {
  auto out = torch::empty({N, G * 32}, torch::dtype(dtype));
  DISPATCH(dtype, "groups_dequantize", [&] { dequantize_groups(w, out.data_ptr<scalar_t>(), N, G * 32); });
  return out;
}

// notebooks/11_weight_only_quantization.ipynb, cell 28
Q4_1 check_q4_1(const torch::Tensor& qs, const torch::Tensor& d, const torch::Tensor& m) {
  TORCH_CHECK(qs.device().is_cpu() && qs.scalar_type() == at::kByte && qs.dim() == 3 && qs.size(2) == 16 &&
              qs.is_contiguous(), "qs must be a contiguous CPU uint8 (N, K / 32, 16) tensor, got ", qs.sizes());
  for (const auto* t : {&d, &m})
    TORCH_CHECK(t->scalar_type() == at::kHalf && t->is_contiguous() && t->dim() == 2 && t->size(0) == qs.size(0) &&
                t->size(1) == qs.size(1), "d and m must be contiguous float16 (N, K / 32) tensors");
  return {qs.data_ptr<uint8_t>(), reinterpret_cast<const _Float16*>(d.data_ptr<at::Half>()),
          reinterpret_cast<const _Float16*>(m.data_ptr<at::Half>())};
}

torch::Tensor int4_linear(torch::Tensor x, torch::Tensor qs, torch::Tensor d, torch::Tensor m) {
  return groups_linear(x, check_q4_1(qs, d, m), qs.size(0), qs.size(1));
}

torch::Tensor int4_dequantize_out(torch::Tensor qs, torch::Tensor d, torch::Tensor m, at::ScalarType dtype) {
  return groups_dequantize(check_q4_1(qs, d, m), qs.size(0), qs.size(1), dtype);
}

// notebooks/11_weight_only_quantization.ipynb, cell 45
// 16 int8 as floats. GCC widens signed bytes read from memory one lane at a time, so flip each sign bit instead
// (q + 128, unsigned), widen as the nibbles are widened, and take the 128 back off.
inline v16 int8_to_float(u8x16 b) { return to_float(b ^ 0x80) - 128.f; }

// GGUF's Q8_0: group i is 32 int8 and a float16 scale d: w = q * d.
struct Q8_0 {
  const int8_t* qs;
  const _Float16* d;
  float scale(int64_t i) const { return d[i]; }
  float min(int64_t) const { return 0.f; }
  void load(int64_t i, v16& lo, v16& hi) const {
    const u8x16* q = reinterpret_cast<const u8x16*>(qs + i * 32);
    lo = int8_to_float(q[0]), hi = int8_to_float(q[1]);
  }
};

Q8_0 check_q8_0(const torch::Tensor& qs, const torch::Tensor& d) {
  TORCH_CHECK(qs.device().is_cpu() && qs.scalar_type() == at::kChar && qs.dim() == 3 && qs.size(2) == 32 &&
              qs.is_contiguous(), "qs must be a contiguous CPU int8 (N, K / 32, 32) tensor, got ", qs.sizes());
  TORCH_CHECK(d.scalar_type() == at::kHalf && d.is_contiguous() && d.dim() == 2 && d.size(0) == qs.size(0) &&
              d.size(1) == qs.size(1), "d must be a contiguous float16 (N, K / 32) tensor");
  return {qs.data_ptr<int8_t>(), reinterpret_cast<const _Float16*>(d.data_ptr<at::Half>())};
}

torch::Tensor int8_linear(torch::Tensor x, torch::Tensor qs, torch::Tensor d) {
  return groups_linear(x, check_q8_0(qs, d), qs.size(0), qs.size(1));
}

torch::Tensor int8_dequantize_out(torch::Tensor qs, torch::Tensor d, at::ScalarType dtype) {
  return groups_dequantize(check_q8_0(qs, d), qs.size(0), qs.size(1), dtype);
}

// notebooks/11_weight_only_quantization.ipynb, cell 49
#if defined(__AVX512BF16__) && defined(__AVX512VL__)
#include <immintrin.h>
// One bfloat16 row x in the order int4_row_bf16 reads it. Block b (groups 4b..4b+3) is 4 vectors of 32: vector c
// holds elements 8c..8c+7 of each of the 4 groups, group 4b + L in 128-bit lane L. xs holds each group's sum of
// x, a quarter on each of its group's 4 float lanes.
void arrange_row(const uint16_t* x, int64_t G, uint16_t* xr, float* xs) {
  for (int64_t g = 0; g < G; ++g) {
    float sum = 0.f;
    for (int j = 0; j < 32; ++j) {
      xr[(g / 4 * 4 + j / 8) * 32 + g % 4 * 8 + j % 8] = x[g * 32 + j];
      sum += bf16_bits_to_float(x[g * 32 + j]);
    }
    for (int l = 0; l < 4; ++l) xs[g / 4 * 16 + g % 4 * 4 + l] = sum / 4;
  }
}

// The float16 values p[0..n) of n <= 4 groups, each on its group's 4 lanes; zeros past n.
inline __m512 group_lanes(const _Float16* p, int n) {
  const __m512i spread = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  return _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(_mm_cvtph_ps(_mm_maskz_loadu_epi16((1u << n) - 1, p))));
}
#endif

// notebooks/11_weight_only_quantization.ipynb, cell 50
#if defined(__AVX512BF16__) && defined(__AVX512VL__)
// y (1, N) = x (1, K) @ W^T for Q4_1 W and one bfloat16 row x, four groups per step, four columns at once.
void int4_row_bf16(const at::BFloat16* x, const Q4_1& w, at::BFloat16* y, int64_t N, int64_t K) {
  const int64_t G = K / 32, B = (G + 3) / 4;                    // blocks of 4 groups, the last one maybe partial
  std::vector<uint16_t> xr(B * 128, 0);                          // zeros past the last group: they add nothing
  std::vector<float> xs(B * 16, 0.f);
  arrange_row(reinterpret_cast<const uint16_t*>(x), G, xr.data(), xs.data());
  const __m512i low4 = _mm512_set1_epi8(0x0f), high = _mm512_set1_epi8(0x43);
  at::parallel_for(0, N / 16, 1, [&](int64_t begin, int64_t end) {
    v16 part[16];
    for (int64_t nb = begin; nb < end; ++nb) {
      for (int64_t t = 0; t < 16; t += 4) {
        __m512 acc[4] = {};
        for (int64_t b = 0; b < B; ++b) {
          const int n = int(std::min<int64_t>(G - 4 * b, 4));    // groups in this block
          const __mmask64 bytes = n == 4 ? ~__mmask64(0) : (__mmask64(1) << (16 * n)) - 1;
          for (int c = 0; c < 4; ++c) {
            const int64_t i = (nb * 16 + t + c) * G + 4 * b;     // the block's first group in column nb*16 + t + c
            const __m512i q = _mm512_maskz_loadu_epi8(bytes, w.qs + i * 16);
            const __m512i lo = q & low4, hi = _mm512_srli_epi16(q, 4) & low4;   // elements 0..15, 16..31
            const __m512i v[4] = {_mm512_unpacklo_epi8(lo, high), _mm512_unpackhi_epi8(lo, high),
                                  _mm512_unpacklo_epi8(hi, high), _mm512_unpackhi_epi8(hi, high)};
            __m512 s = _mm512_setzero_ps();                       // sum of x * (128 + q) per group, on 4 lanes
            for (int k = 0; k < 4; ++k)
              s = _mm512_dpbf16_ps(s, (__m512bh)v[k], (__m512bh)_mm512_loadu_si512(&xr[b * 128 + 32 * k]));
            const __m512 d = group_lanes(w.d + i, n), m = group_lanes(w.m + i, n);
            const __m512 low = _mm512_fnmadd_ps(d, _mm512_set1_ps(128.f), m);   // m - 128 d
            acc[c] = _mm512_fmadd_ps(s, d, _mm512_fmadd_ps(low, _mm512_loadu_ps(&xs[b * 16]), acc[c]));
          }
        }
        for (int c = 0; c < 4; ++c) part[t + c] = (v16)acc[c];
      }
      store16(y + nb * 16, sum16(part));
    }
  });
}
#endif

// notebooks/11_weight_only_quantization.ipynb, cell 51
bool has_bf16_dot() {
#if defined(__AVX512BF16__) && defined(__AVX512VL__)
  return true;
#else
  return false;
#endif
}

torch::Tensor int4_linear_bf16(torch::Tensor x, torch::Tensor qs, torch::Tensor d, torch::Tensor m) {
  TORCH_CHECK(has_bf16_dot(), "int4_linear_bf16 needs AVX512-BF16, which this build of the kernels lacks");
  const Q4_1 w = check_q4_1(qs, d, m);
  check_linear(x, qs.size(0), qs.size(1));
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.size(0) == 1, "x must be one bfloat16 row, got ", x.sizes(),
              " ", x.scalar_type());
  auto y = torch::empty({1, qs.size(0)}, x.options());
#if defined(__AVX512BF16__) && defined(__AVX512VL__)
  int4_row_bf16(x.data_ptr<at::BFloat16>(), w, y.data_ptr<at::BFloat16>(), qs.size(0), x.size(1));
#endif
  return y;
}

// notebooks/11_weight_only_quantization.ipynb, cell 53
typedef int8_t i8x64 __attribute__((vector_size(64), aligned(1)));
typedef uint8_t u8x64 __attribute__((vector_size(64), aligned(1)));
typedef int32_t i32x16 __attribute__((vector_size(64)));
#if defined(__AVX2__)
#include <immintrin.h>
#endif

// acc + the sums of 4 adjacent products of unsigned bytes u and signed bytes s: 64 products into 16 int32.
template <int BITS>
inline i32x16 dot4(i32x16 acc, u8x64 u, i8x64 s) {
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
  return (i32x16)_mm512_dpbusd_epi32((__m512i)acc, (__m512i)u, (__m512i)s);
#else
  for (int j = 0; j < 16; ++j)
    for (int k = 0; k < 4; ++k) acc[j] += int32_t(u[4 * j + k]) * int32_t(s[4 * j + k]);
  return acc;
#endif
}

inline i8x64 broadcast4(const int8_t* p) {                       // 4 bytes, 16 times
  typedef int32_t i32v __attribute__((vector_size(64)));
  int32_t v;
  std::memcpy(&v, p, 4);
  return (i8x64)(i32v{} + v);
}

inline v16 halves(const _Float16* p) {                           // 16 float16 as floats
  typedef _Float16 h16 __attribute__((vector_size(32), aligned(2)));
  return __builtin_convertvector(*reinterpret_cast<const h16*>(p), v16);
}

// notebooks/11_weight_only_quantization.ipynb, cell 54
// Rows of x as 8-bit groups of 32: x ~ q * d per group, and s = d * sum(q), the sum the minimums multiply.
struct Q8Rows { int64_t G; std::vector<int8_t> q; std::vector<float> d, s; };   // (M, G, 32), (M, G), (M, G)

inline v16 nearest(v16 v) {                                      // ties to even, as torch.round
  for (int j = 0; j < 16; ++j) v[j] = std::nearbyint(v[j]);
  return v;
}

template <typename T>      // once per matmul, its groups split between the threads, 16 elements per instruction
Q8Rows quantize_rows(const T* x, int64_t M, int64_t K, int64_t padded) {       // zero rows from M to padded
  typedef int8_t i8x16 __attribute__((vector_size(16), aligned(1)));
  const int64_t G = K / 32;
  Q8Rows r{G, std::vector<int8_t>(padded * K), std::vector<float>(padded * G), std::vector<float>(padded * G)};
  at::parallel_for(0, M * G, 64, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      v16 even, odd, lo, hi;                                     // the group's 32 elements
      load32(x + i * 32, even, odd);
      const v16 a = even < 0 ? -even : even, b = odd < 0 ? -odd : odd, top = a > b ? a : b;
      float amax = 0.f;
      for (int j = 0; j < 16; ++j) amax = std::max(amax, top[j]);
      const float inv = amax > 0.f ? 127.f / amax : 0.f;
      interleave(nearest(even * inv), nearest(odd * inv), lo, hi);
      const i32x16 q[2] = {__builtin_convertvector(lo, i32x16), __builtin_convertvector(hi, i32x16)};
      const i8x16 bytes[2] = {__builtin_convertvector(q[0], i8x16), __builtin_convertvector(q[1], i8x16)};
      std::memcpy(r.q.data() + i * 32, bytes, 32);
      int32_t sum = 0;
      for (int j = 0; j < 16; ++j) sum += q[0][j] + q[1][j];
      r.d[i] = amax / 127.f, r.s[i] = r.d[i] * float(sum);
    }
  });
  return r;
}

// notebooks/11_weight_only_quantization.ipynb, cell 55
// The weight in tiles of 16 columns. For tile t and group g, `tiles` holds C = 4 (nibbles) or 8 (8-bit codes)
// chunks of 64 bytes, chunk c being bytes 4c..4c+3 of each of the 16 columns' codes: a 32-bit lane is one column.
// dm holds the 16 columns' scales, then their minimums, as float16: w = code * d + m.
struct Tiles { const uint8_t* codes; const _Float16* dm; int64_t G; };

// Rows r0.. of y (M, N) = x (M, K) @ W^T, in one tile's 16 columns: per group and column, sum(code * q) in
// integers, times d * d_x, plus m * s_x.
template <typename T, int M, int BITS>             // M: the rows padded to 1, 2, 4 or 8; the first `rows` are kept
void tile_rows(const Q8Rows& x, int64_t r0, int64_t rows, const Tiles& w, int64_t tile, T* y, int64_t N) {
  constexpr int C = BITS == 4 ? 4 : 8, S = M < 4 ? 2 : 1;      // S sums per row: few rows, too short a chain
  const int64_t G = x.G;
  v16 acc[M] = {};
  for (int64_t g = 0; g < G; ++g) {
    const u8x64* q = reinterpret_cast<const u8x64*>(w.codes + (tile * G + g) * 64 * C);
    i32x16 s[M][S] = {};
    for (int c = 0; c < C; ++c)
      for (int r = 0; r < M; ++r) {
        const int8_t* xr = x.q.data() + ((r0 + r) * G + g) * 32;
        if (BITS == 4) {                                          // element 4c.. low nibbles, 16 + 4c.. high
          s[r][0] = dot4<4>(s[r][0], q[c] & 15, broadcast4(xr + 4 * c));
          s[r][S - 1] = dot4<4>(s[r][S - 1], q[c] >> 4, broadcast4(xr + 16 + 4 * c));
        } else {
          s[r][c % S] = dot4<8>(s[r][c % S], q[c], broadcast4(xr + 4 * c));
        }
      }
    const v16 d = halves(w.dm + (tile * G + g) * 32), m = halves(w.dm + (tile * G + g) * 32 + 16);
    for (int r = 0; r < M; ++r) {
      i32x16 sum = s[r][0];
      if constexpr (S == 2) sum += s[r][1];
      acc[r] += __builtin_convertvector(sum, v16) * (d * x.d[(r0 + r) * G + g]) + m * x.s[(r0 + r) * G + g];
    }
  }
  for (int r = 0; r < rows; ++r) store16(y + (r0 + r) * N + tile * 16, acc[r]);
}

// notebooks/11_weight_only_quantization.ipynb, cell 56
#if defined(__AVX2__) && !(defined(__AVX512VNNI__) && defined(__AVX512BW__))
#define AVX2_LOOP 1
// tiled_rows without 512-bit registers, where the compiler keeps its 64-byte vectors in memory: each tile as two
// halves of 8 columns in 256-bit registers. An 8-bit code goes in as two nibbles, the high one weighing 16, so
// that maddubs' int16 sums of pairs cannot overflow.
inline __m256i madd_avx2(__m256i acc, __m256i u, __m256i s, __m256i weight) {   // acc + weight * u.s by 4
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), weight));
}
inline __m256i bytes4(const int8_t* p) { int32_t v; std::memcpy(&v, p, 4); return _mm256_set1_epi32(v); }   // 8 times
inline __m256 half8(const uint16_t* p) {                         // 8 float16 as floats
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
#endif

// notebooks/11_weight_only_quantization.ipynb, cell 57
#ifdef AVX2_LOOP
template <typename T, int M, int BITS, int C = BITS == 4 ? 4 : 8>
void tile_rows_avx2(const Q8Rows& x, int64_t r0, int64_t rows, const Tiles& w, int64_t tile, T* y, int64_t N) {
  const int64_t G = x.G;
  const __m256i nibble = _mm256_set1_epi8(15), one = _mm256_set1_epi16(1), sixteen = _mm256_set1_epi16(16);
  __m256 acc[M][2] = {};
  for (int64_t g = 0; g < G; ++g) {
    const uint8_t* q = w.codes + (tile * G + g) * 64 * C;
    __m256i s[M][2] = {};
    for (int c = 0; c < C; ++c)
      for (int h = 0; h < 2; ++h) {                               // columns 8h .. 8h+7
        const __m256i qc = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 64 * c + 32 * h));
        const __m256i lo = _mm256_and_si256(qc, nibble), hi = _mm256_and_si256(_mm256_srli_epi16(qc, 4), nibble);
        for (int r = 0; r < M; ++r) {
          const int8_t* xr = x.q.data() + ((r0 + r) * G + g) * 32;
          s[r][h] = madd_avx2(s[r][h], lo, bytes4(xr + 4 * c), one);
          s[r][h] = BITS == 4 ? madd_avx2(s[r][h], hi, bytes4(xr + 16 + 4 * c), one)
                              : madd_avx2(s[r][h], hi, bytes4(xr + 4 * c), sixteen);
        }
      }
    const uint16_t* dm = reinterpret_cast<const uint16_t*>(w.dm + (tile * G + g) * 32);
    const __m256 d[2] = {half8(dm), half8(dm + 8)}, m[2] = {half8(dm + 16), half8(dm + 24)};
    for (int r = 0; r < M; ++r) {
      const __m256 dx = _mm256_set1_ps(x.d[(r0 + r) * G + g]), sx = _mm256_set1_ps(x.s[(r0 + r) * G + g]);
      for (int h = 0; h < 2; ++h)
        acc[r][h] = _mm256_add_ps(acc[r][h], _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(s[r][h]),
                                                                         _mm256_mul_ps(d[h], dx)),
                                                           _mm256_mul_ps(m[h], sx)));
    }
  }
  for (int r = 0; r < rows; ++r) {                                // the two halves as one v16, for store16
    v16 out; std::memcpy(&out, acc[r], sizeof out); store16(y + (r0 + r) * N + tile * 16, out);
  }
}
#endif

// notebooks/11_weight_only_quantization.ipynb, cell 58
// The tiles read back group by group (group i = n * G + g of column n), for the loops written per group:
// de-quantizing, for steps of more than 8 rows.
template <int BITS>
struct TiledGroups : Tiles {
  int64_t at(int64_t i) const { return i / G / 16 * G + i % G; }    // the group's tile and group: tile * G + g
  float scale(int64_t i) const { return dm[at(i) * 32 + i / G % 16]; }
  float min(int64_t i) const { return dm[at(i) * 32 + 16 + i / G % 16]; }
  void load(int64_t i, v16& lo, v16& hi) const {
    uint8_t b[32] = {};                                           // the column's codes, in the file's order
    for (int c = 0; c < BITS; ++c) std::memcpy(b + 4 * c, codes + at(i) * 64 * BITS + 64 * c + i / G % 16 * 4, 4);
    u8x16 q[2];
    std::memcpy(q, b, 32);
    lo = to_float(BITS == 4 ? q[0] & 15 : q[0]), hi = to_float(BITS == 4 ? q[0] >> 4 : q[1]);
  }
};

Tiles check_tiles(const torch::Tensor& tiles, const torch::Tensor& dm, int64_t bits) {
  TORCH_CHECK(bits == 4 || bits == 8, "bits must be 4 or 8, got ", bits);
  TORCH_CHECK(tiles.device().is_cpu() && tiles.scalar_type() == at::kByte && tiles.is_contiguous() &&
              tiles.dim() == 5 && tiles.size(2) == bits && tiles.size(3) == 16 && tiles.size(4) == 4,
              "tiles must be a contiguous uint8 (N / 16, G, ", bits, ", 16, 4) tensor, got ", tiles.sizes());
  TORCH_CHECK(dm.scalar_type() == at::kHalf && dm.is_contiguous() && dm.dim() == 4 && dm.size(0) == tiles.size(0) &&
              dm.size(1) == tiles.size(1) && dm.size(2) == 2 && dm.size(3) == 16,
              "dm must be a contiguous float16 (N / 16, G, 2, 16) tensor, got ", dm.sizes());
  return {tiles.data_ptr<uint8_t>(), reinterpret_cast<const _Float16*>(dm.data_ptr<at::Half>()), tiles.size(1)};
}

torch::Tensor tiled_dequantize_out(torch::Tensor tiles, torch::Tensor dm, int64_t bits, at::ScalarType dtype) {
  const Tiles w = check_tiles(tiles, dm, bits);
  return bits == 4 ? groups_dequantize(TiledGroups<4>{w}, tiles.size(0) * 16, w.G, dtype)
                   : groups_dequantize(TiledGroups<8>{w}, tiles.size(0) * 16, w.G, dtype);
}

// notebooks/11_weight_only_quantization.ipynb, cell 59
#ifdef AVX2_LOOP
#define TILE_ROWS tile_rows_avx2
#else
#define TILE_ROWS tile_rows
#endif
inline int64_t padded_rows(int64_t rows) { return rows <= 2 ? rows : rows <= 4 ? 4 : 8; }   // a block of <= 8

// Tiles begin .. end-1 of y (M, N), every block of 8 rows on a tile before the next: a tile comes from memory
// once, and the blocks after the first find it in the core's cache.
template <typename T, int BITS>
void tile_range(const Q8Rows& x, const Tiles& w, T* y, int64_t M, int64_t N, int64_t begin, int64_t end) {
  for (int64_t tile = begin; tile < end; ++tile)
    for (int64_t r0 = 0; r0 < M; r0 += 8) {
      const int64_t rows = std::min<int64_t>(M - r0, 8), padded = padded_rows(rows);
      auto f = padded == 1 ? TILE_ROWS<T, 1, BITS> : padded == 2 ? TILE_ROWS<T, 2, BITS>
             : padded == 4 ? TILE_ROWS<T, 4, BITS> : TILE_ROWS<T, 8, BITS>;
      f(x, r0, rows, w, tile, y, N);
    }
}

template <typename T, int BITS>                     // each thread takes whole tiles
void tiled_blocks(const Q8Rows& x, const Tiles& w, T* y, int64_t M, int64_t N) {
  at::parallel_for(0, N / 16, 1, [&](int64_t begin, int64_t end) { tile_range<T, BITS>(x, w, y, M, N, begin, end); });
}

torch::Tensor tiled_linear(torch::Tensor x, torch::Tensor tiles, torch::Tensor dm, int64_t bits) {
  const Tiles w = check_tiles(tiles, dm, bits);
  const int64_t N = tiles.size(0) * 16, M = x.size(0), K = x.size(1);
  check_rows(x, "x");
  TORCH_CHECK(M >= 1, "x must have at least one row");
  TORCH_CHECK(K == w.G * 32, "x has ", K, " columns but the weight ", w.G * 32);
  auto y = torch::empty({M, N}, x.options());
  const int64_t padded = M - M % 8 + padded_rows(M % 8);      // rows quantized: the last block's padding too
  DISPATCH(x.scalar_type(), "tiled_linear", [&] {
    const Q8Rows xq = quantize_rows(x.data_ptr<scalar_t>(), M, K, padded);
    (bits == 4 ? tiled_blocks<scalar_t, 4> : tiled_blocks<scalar_t, 8>)(xq, w, y.data_ptr<scalar_t>(), M, N);
  });
  return y;
}
