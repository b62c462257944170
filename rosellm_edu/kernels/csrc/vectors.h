// Generated from notebooks/09_attention_kernels.ipynb by `python -m rosellm_edu.book.export`.
// Do not edit: change the notebook's `%%cpp` cells and export again. Each part names its cell.

// notebooks/09_attention_kernels.ipynb, cell 19
#pragma once

#include <c10/util/BFloat16.h>
#include <cstring>

// 16 floats that the compiler keeps in one AVX-512 register (two AVX2 ones); loads need no alignment.
typedef float v16 __attribute__((vector_size(64), aligned(4)));

inline void deinterleave(v16 a, v16 b, v16& even, v16& odd) {      // 32 floats -> the even ones, the odd ones
  even = __builtin_shufflevector(a, b, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  odd = __builtin_shufflevector(a, b, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}
inline void interleave(v16 even, v16 odd, v16& a, v16& b) {        // the inverse
  a = __builtin_shufflevector(even, odd, 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  b = __builtin_shufflevector(even, odd, 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
}

// 32 elements of a row as floats: the even-indexed ones, and the odd ones.
template <typename T>
inline void load32(const T* p, v16& even, v16& odd) {
  for (int j = 0; j < 16; ++j) even[j] = float(p[2 * j]), odd[j] = float(p[2 * j + 1]);
}
template <>
inline void load32<float>(const float* p, v16& even, v16& odd) {
  deinterleave(reinterpret_cast<const v16*>(p)[0], reinterpret_cast<const v16*>(p)[1], even, odd);
}
template <>
inline void load32<c10::BFloat16>(const c10::BFloat16* p, v16& even, v16& odd) {
  typedef uint32_t u32x16 __attribute__((vector_size(64), aligned(2)));
  const u32x16 pairs = *reinterpret_cast<const u32x16*>(p);        // element 2j in the low half of pair j
  const u32x16 e = pairs << 16, o = pairs & 0xFFFF0000u;
  std::memcpy(&even, &e, sizeof even);
  std::memcpy(&odd, &o, sizeof odd);
}

// notebooks/09_attention_kernels.ipynb, cell 20
// x[t] holds 16 partial sums of score t; returns the 16 scores. Each level adds the lane halves of two
// registers into one (16 -> 8 -> 4 -> 2 -> 1), and a last shuffle puts the scores in key order.
inline v16 sum16(v16* x) {
  for (int k = 0; k < 8; ++k)
    x[k] = __builtin_shufflevector(x[2 * k], x[2 * k + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
           __builtin_shufflevector(x[2 * k], x[2 * k + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  for (int k = 0; k < 4; ++k)
    x[k] = __builtin_shufflevector(x[2 * k], x[2 * k + 1], 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27) +
           __builtin_shufflevector(x[2 * k], x[2 * k + 1], 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
  for (int k = 0; k < 2; ++k)
    x[k] = __builtin_shufflevector(x[2 * k], x[2 * k + 1], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29) +
           __builtin_shufflevector(x[2 * k], x[2 * k + 1], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
  const v16 y = __builtin_shufflevector(x[0], x[1], 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30) +
                __builtin_shufflevector(x[0], x[1], 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
  return __builtin_shufflevector(y, y, 0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15);
}

// notebooks/09_attention_kernels.ipynb, cell 23
#if defined(__AVX2__) && !defined(__AVX512F__)
#include <immintrin.h>
#define AVX2_WITHOUT_512 1
// 16 elements of a row in two registers of 8 floats: bfloat16's even and odd ones (a shift, a mask), float32's
// halves.
inline void load16(const float* p, __m256& a, __m256& b) { a = _mm256_loadu_ps(p), b = _mm256_loadu_ps(p + 8); }
inline void load16(const c10::BFloat16* p, __m256& a, __m256& b) {
  const __m256i pairs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  a = _mm256_castsi256_ps(_mm256_slli_epi32(pairs, 16));
  b = _mm256_castsi256_ps(_mm256_and_si256(pairs, _mm256_set1_epi32(int(0xFFFF0000u))));
}
#endif
