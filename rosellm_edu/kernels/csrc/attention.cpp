// Generated from notebooks/09_attention_kernels.ipynb by `python -m rosellm_edu.book.export`.
// Do not edit: change the notebook's `%%cpp` cells and export again. Each part names its cell.

// notebooks/09_attention_kernels.ipynb, cell 12
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

constexpr int64_t KC = 64;                 // keys per chunk: one chunk's scores fit in a small buffer
constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

// exp(x) as 2^k * p(r) with |r| <= ln2 / 2 (Cephes' polynomial): unlike std::exp, a loop of these vectorises.
// Adding 1.5 * 2^23 rounds x / ln2 to the integer k and leaves k in the low bits of the float: no floor, no cast.
inline float exp_approx(float x) {
  const float xc = std::max(x, -88.f), shifted = xc * 1.44269504f + 12582912.f;
  const float k = shifted - 12582912.f;
  const float r = xc - k * 0.693359375f + k * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f; p = p * r + 8.3334519073e-3f; p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f; p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  int32_t bits;
  std::memcpy(&bits, &shifted, sizeof(float));
  bits = (bits - 0x4B400000 + 127) << 23;  // k + 127 in the exponent bits: 2^k
  float two_k;
  std::memcpy(&two_k, &bits, sizeof(float));
  return x < -87.f ? 0.f : p * two_k;      // exp(-inf) = 0: masked keys weigh nothing
}

// notebooks/09_attention_kernels.ipynb, cell 14
// A row of K or V as float32: a copy into a small buffer for bfloat16/half, the row itself for float32.
template <typename T>
inline const float* as_float(const T* src, float* buf, int64_t d) {
#pragma omp simd
  for (int64_t i = 0; i < d; ++i) buf[i] = float(src[i]);
  return buf;
}
template <>
inline const float* as_float<float>(const float* src, float*, int64_t) { return src; }

// notebooks/09_attention_kernels.ipynb, cell 16
// Where the pieces of one work item live: the cache's layout and one sequence's block table.
template <typename T>
struct Paged {
  const T* k; const T* v; const int32_t* table;
  int64_t bs, row, d;                      // row: distance between two slots
  // The same view with k and v moved to kv head h of every slot.
  Paged head(int64_t h) const { return {k + h * d, v + h * d, table, bs, row, d}; }
  // The offsets of positions c .. c+n-1 in the pool, walking the block table (no division per key).
  void offsets(int64_t c, int64_t n, int64_t* off) const {
    for (int64_t t = 0, b = c / bs, o = c % bs; t < n; ++t) {
      off[t] = (table[b] * bs + o) * row;
      if (++o == bs) { o = 0; ++b; }
    }
  }
};

// Per-thread scratch: a tile of R query rows (nq positions x group heads) and one chunk of keys.
struct Scratch {
  std::vector<float> q, acc, m, l, s, kt, kv;
  int64_t off[KC];
  Scratch(int64_t R, int64_t d)
      : q((R + 3) / 4 * 4 * d), acc(q.size()), m(R), l(R), s((R + 3) / 4 * 4 * KC), kt(d * KC), kv(KC * d) {}
};

// This thread's n Scratches for tiles of R rows, kept from call to call: allocating and zeroing ~36 KB a kv head
// in every call cost more than a short context's whole decode.
inline Scratch* thread_scratch(int64_t n, int64_t R, int64_t d) {
  thread_local std::vector<Scratch> kept;
  if (int64_t(kept.size()) < n || int64_t(kept[0].m.size()) != R || int64_t(kept[0].kt.size()) != d * KC)
    kept.assign(std::max<int64_t>(n, kept.size()), Scratch(R, d));           // m holds R floats, kt d * KC
  return kept.data();
}

// notebooks/09_attention_kernels.ipynb, cell 18
// Scores s (R, n) of one chunk of n keys at offsets w.off, for a decode's few rows: a dot product per (row, key),
// four keys at a time so that four sums are in flight while each waits for its additions.
template <typename T>
void dot_scores(const Paged<T>& pg, Scratch& w, int64_t R, int64_t n) {
  const int64_t d = pg.d;
  int64_t t = 0;
  for (; t + 4 <= n; t += 4) {            // four keys at a time: four independent sums in flight
    const float* k0 = as_float(pg.k + w.off[t], w.kv.data(), d);
    const float* k1 = as_float(pg.k + w.off[t + 1], w.kv.data() + d, d);
    const float* k2 = as_float(pg.k + w.off[t + 2], w.kv.data() + 2 * d, d);
    const float* k3 = as_float(pg.k + w.off[t + 3], w.kv.data() + 3 * d, d);
    for (int64_t r = 0; r < R; ++r) {
      const float* qr = w.q.data() + r * d;
      float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
      for (int64_t i = 0; i < d; ++i) {
        s0 += qr[i] * k0[i], s1 += qr[i] * k1[i];
        s2 += qr[i] * k2[i], s3 += qr[i] * k3[i];
      }
      float* sr = w.s.data() + r * KC + t;
      sr[0] = s0, sr[1] = s1, sr[2] = s2, sr[3] = s3;
    }
  }
  for (; t < n; ++t) {
    const float* kt = as_float(pg.k + w.off[t], w.kv.data(), d);
    for (int64_t r = 0; r < R; ++r) {
      const float* qr = w.q.data() + r * d;
      float dot = 0.f;
#pragma omp simd reduction(+ : dot)
      for (int64_t i = 0; i < d; ++i) dot += qr[i] * kt[i];
      w.s[r * KC + t] = dot;
    }
  }
}

// notebooks/09_attention_kernels.ipynb, cell 21
#include "vectors.h"

// Scores s (R, n) of one chunk for a decode's few rows (R < 8), head_dim = 16 * NV: a (row, key) pair leaves 16
// partial sums in part, and sum16 adds them up, 16 keys at a time. Keys past n count as zeros.
template <typename T, int NV>
void decode_scores(const Paged<T>& pg, Scratch& w, int64_t R, int64_t n) {
  v16 q[8][NV];                                          // the rows, each 32 elements split as load32 splits keys
  for (int64_t r = 0; r < R; ++r) {
    const v16* qr = reinterpret_cast<const v16*>(w.q.data() + r * 16 * NV);
    for (int c = 0; c < NV; c += 2) deinterleave(qr[c], qr[c + 1], q[r][c], q[r][c + 1]);
  }
  v16* part = reinterpret_cast<v16*>(w.kt.data());      // (R, 16) registers of partial sums
  for (int64_t t0 = 0; t0 < n; t0 += 16) {
    for (int64_t t = t0; t < t0 + 16; ++t) {
      if (t >= n) { for (int64_t r = 0; r < R; ++r) part[r * 16 + t - t0] = v16{}; continue; }
      for (int64_t b = 0; b < 16 * NV * int64_t(sizeof(T)); b += 64) {   // every 64-byte line of the rows
        if (t + 8 < n) __builtin_prefetch(reinterpret_cast<const char*>(pg.k + w.off[t + 8]) + b);
        __builtin_prefetch(reinterpret_cast<const char*>(pg.v + w.off[t]) + b);
      }
      v16 key[NV];
      for (int c = 0; c < NV; c += 2) load32(pg.k + w.off[t] + 16 * c, key[c], key[c + 1]);
      for (int64_t r = 0; r < R; ++r) {
        v16 a = q[r][0] * key[0];
        for (int c = 1; c < NV; ++c) a += q[r][c] * key[c];
        part[r * 16 + t - t0] = a;
      }
    }
    for (int64_t r = 0; r < R; ++r) *reinterpret_cast<v16*>(w.s.data() + r * KC + t0) = sum16(part + r * 16);
  }
}

// notebooks/09_attention_kernels.ipynb, cell 24
#ifdef AVX2_WITHOUT_512
#include <type_traits>
template <typename T> constexpr bool avx2_loops = std::is_same_v<T, float> || std::is_same_v<T, c10::BFloat16>;
// 16 floats of q or acc, split as load16 splits a row of T; join16 puts them back.
template <typename T>
inline void split16(const float* p, __m256& a, __m256& b) {
  a = _mm256_loadu_ps(p), b = _mm256_loadu_ps(p + 8);
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    const __m256 even = _mm256_shuffle_ps(a, b, 0x88), odd = _mm256_shuffle_ps(a, b, 0xDD);   // lanes 0,2,1,3
    a = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(even), 0xD8));
    b = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(odd), 0xD8));
  }
}
template <typename T>
inline void join16(float* p, __m256 a, __m256 b) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    const __m256 lo = _mm256_unpacklo_ps(a, b), hi = _mm256_unpackhi_ps(a, b);
    a = _mm256_permute2f128_ps(lo, hi, 0x20), b = _mm256_permute2f128_ps(lo, hi, 0x31);
  }
  _mm256_storeu_ps(p, a), _mm256_storeu_ps(p + 8, b);
}
#endif

// notebooks/09_attention_kernels.ipynb, cell 25
#ifdef AVX2_WITHOUT_512
// x[t] holds 8 partial sums of score t; returns the 8 scores.
inline __m256 sum8(const __m256* x) {
  const __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(x[0], x[1]), _mm256_hadd_ps(x[2], x[3]));
  const __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(x[4], x[5]), _mm256_hadd_ps(x[6], x[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}
// decode_scores in 8-float registers: a (row, key) pair leaves 8 partial sums, sum8 adds them 8 keys at a time.
template <typename T, int NV>
void decode_scores_avx2(const Paged<T>& pg, Scratch& w, int64_t R, int64_t n) {
  __m256 q[8][2 * NV], part[8][8];                      // the rows, split as load16 splits keys; partial sums
  for (int64_t r = 0; r < R; ++r)
    for (int c = 0; c < NV; ++c) split16<T>(w.q.data() + r * 16 * NV + 16 * c, q[r][2 * c], q[r][2 * c + 1]);
  for (int64_t t0 = 0; t0 < n; t0 += 8) {
    for (int64_t t = t0; t < t0 + 8; ++t) {
      if (t >= n) { for (int64_t r = 0; r < R; ++r) part[r][t - t0] = _mm256_setzero_ps(); continue; }
      for (int64_t b = 0; b < 16 * NV * int64_t(sizeof(T)); b += 64) {   // every 64-byte line of the rows
        if (t + 8 < n) __builtin_prefetch(reinterpret_cast<const char*>(pg.k + w.off[t + 8]) + b);
        __builtin_prefetch(reinterpret_cast<const char*>(pg.v + w.off[t]) + b);
      }
      __m256 key[2 * NV];
      for (int c = 0; c < NV; ++c) load16(pg.k + w.off[t] + 16 * c, key[2 * c], key[2 * c + 1]);
      for (int64_t r = 0; r < R; ++r) {
        __m256 a = _mm256_mul_ps(q[r][0], key[0]);
        for (int c = 1; c < 2 * NV; ++c) a = _mm256_fmadd_ps(q[r][c], key[c], a);
        part[r][t - t0] = a;
      }
    }
    for (int64_t r = 0; r < R; ++r) _mm256_storeu_ps(w.s.data() + r * KC + t0, sum8(part[r]));
  }
}
#endif

// notebooks/09_attention_kernels.ipynb, cell 26
// Any other head_dim takes dot_scores. For many rows (a prefill tile): transpose the chunk's keys once, then every row is an axpy over keys.
template <typename T>
void chunk_scores(const Paged<T>& pg, Scratch& w, int64_t R, int64_t n) {
  const int64_t d = pg.d;
#ifdef AVX2_WITHOUT_512
  if constexpr (avx2_loops<T>) {
    if (R < 8 && d == 64) return decode_scores_avx2<T, 4>(pg, w, R, n);
    if (R < 8 && d == 128) return decode_scores_avx2<T, 8>(pg, w, R, n);
  }
#endif
  if (R < 8 && d == 64) return decode_scores<T, 4>(pg, w, R, n);
  if (R < 8 && d == 128) return decode_scores<T, 8>(pg, w, R, n);
  if (R < 8) return dot_scores(pg, w, R, n);
  for (int64_t t = 0; t < n; ++t) {
    const T* kt = pg.k + w.off[t];
    for (int64_t i = 0; i < d; ++i) w.kt[i * KC + t] = float(kt[i]);      // (d, KC)
  }
  for (int64_t r = 0; r < R; r += 4)       // 4 rows x 16 keys of scores stay in registers while i runs over d
    for (int64_t t = 0; t < n; t += 16) {
      v16 a[4] = {};                        // the scratch has rows for a multiple of 4, the extra ones zero
      for (int64_t i = 0; i < d; ++i) {
        const v16 ki = *reinterpret_cast<const v16*>(w.kt.data() + i * KC + t);
        for (int64_t j = 0; j < 4; ++j) a[j] += w.q[(r + j) * d + i] * ki;
      }
      for (int64_t j = 0; j < 4; ++j) *reinterpret_cast<v16*>(w.s.data() + (r + j) * KC + t) = a[j];
    }
}

// notebooks/09_attention_kernels.ipynb, cell 27
// acc (R, d) += p (R, n) @ V (n, d) for a decode's few rows, head_dim = 16 * NV: a row's accumulator stays in
// NV registers, split as load32 splits values, while t runs over the chunk (decode_scores has fetched V's rows).
template <typename T, int NV>
void decode_values(const Paged<T>& pg, Scratch& w, int64_t R, int64_t n) {
  for (int64_t r = 0; r < R; ++r) {
    v16* ar = reinterpret_cast<v16*>(w.acc.data() + r * 16 * NV);
    const float* pr = w.s.data() + r * KC;
    v16 a[NV];
    for (int c = 0; c < NV; c += 2) deinterleave(ar[c], ar[c + 1], a[c], a[c + 1]);
    for (int64_t t = 0; t < n; ++t)
      for (int c = 0; c < NV; c += 2) {
        v16 even, odd;
        load32(pg.v + w.off[t] + 16 * c, even, odd);
        a[c] += pr[t] * even;
        a[c + 1] += pr[t] * odd;
      }
    for (int c = 0; c < NV; c += 2) interleave(a[c], a[c + 1], ar[c], ar[c + 1]);
  }
}

// notebooks/09_attention_kernels.ipynb, cell 28
#ifdef AVX2_WITHOUT_512
// decode_values in 8-float registers: a row's accumulator stays in 2 * NV of them while t runs over the chunk.
template <typename T, int NV>
void decode_values_avx2(const Paged<T>& pg, Scratch& w, int64_t R, int64_t n) {
  for (int64_t r = 0; r < R; ++r) {
    float* ar = w.acc.data() + r * 16 * NV;
    const float* pr = w.s.data() + r * KC;
    __m256 a[2 * NV];
    for (int c = 0; c < NV; ++c) split16<T>(ar + 16 * c, a[2 * c], a[2 * c + 1]);
    for (int64_t t = 0; t < n; ++t) {
      const __m256 p = _mm256_set1_ps(pr[t]);
      for (int c = 0; c < NV; ++c) {
        __m256 x, y;
        load16(pg.v + w.off[t] + 16 * c, x, y);
        a[2 * c] = _mm256_fmadd_ps(p, x, a[2 * c]), a[2 * c + 1] = _mm256_fmadd_ps(p, y, a[2 * c + 1]);
      }
    }
    for (int c = 0; c < NV; ++c) join16<T>(ar + 16 * c, a[2 * c], a[2 * c + 1]);
  }
}
#endif

// notebooks/09_attention_kernels.ipynb, cell 29
// acc (R, d) += p (R, n) @ V (n, d), p in the score buffer: 4 rows x 16 dims of acc stay in registers while t
// runs over the chunk's keys (a head_dim that is no multiple of 16 takes the plain loop).
template <typename T>
void add_values(const Paged<T>& pg, Scratch& w, int64_t R, int64_t n) {
  const int64_t d = pg.d;
#ifdef AVX2_WITHOUT_512
  if constexpr (avx2_loops<T>) {
    if (R < 8 && d == 64) return decode_values_avx2<T, 4>(pg, w, R, n);
    if (R < 8 && d == 128) return decode_values_avx2<T, 8>(pg, w, R, n);
  }
#endif
  if (R < 8 && d == 64) return decode_values<T, 4>(pg, w, R, n);
  if (R < 8 && d == 128) return decode_values<T, 8>(pg, w, R, n);
  const float* vrow[KC];
  for (int64_t t = 0; t < n; ++t) vrow[t] = as_float(pg.v + w.off[t], w.kv.data() + t * d, d);
  if (d % 16) {
    for (int64_t t = 0; t < n; ++t)
      for (int64_t r = 0; r < R; ++r) {
        const float p = w.s[r * KC + t];
        float* ar = w.acc.data() + r * d;
#pragma omp simd
        for (int64_t i = 0; i < d; ++i) ar[i] += p * vrow[t][i];
      }
    return;
  }
  for (int64_t r = 0; r < R; r += 4)
    for (int64_t i = 0; i < d; i += 16) {
      v16 a[4];
      for (int64_t j = 0; j < 4; ++j) a[j] = *reinterpret_cast<const v16*>(w.acc.data() + (r + j) * d + i);
      for (int64_t t = 0; t < n; ++t) {
        const v16 vt = *reinterpret_cast<const v16*>(vrow[t] + i);
        for (int64_t j = 0; j < 4; ++j) a[j] += w.s[(r + j) * KC + t] * vt;
      }
      for (int64_t j = 0; j < 4; ++j) *reinterpret_cast<v16*>(w.acc.data() + (r + j) * d + i) = a[j];
    }
}

// notebooks/09_attention_kernels.ipynb, cell 31
// The online softmax over one chunk: the scores s (R, n) become weights, and (m, l, acc) are rescaled to the new
// maximum. Row r = j * group + g sits at position pos0 + j and sees the keys <= its position (causal).
inline void fold_chunk(Scratch& w, int64_t R, int64_t n, int64_t d, int64_t group, int64_t pos0, int64_t c) {
  for (int64_t r = 0; r < R; ++r) {
    float* sr = w.s.data() + r * KC;
    const int64_t visible = std::min(n, pos0 + r / group - c + 1);     // keys of this chunk the row may see
    float mx = w.m[r];
    for (int64_t t = std::max<int64_t>(visible, 0); t < n; ++t) sr[t] = NEG_INF;
#pragma omp simd reduction(max : mx)
    for (int64_t t = 0; t < n; ++t) mx = std::max(mx, sr[t]);
    if (mx == NEG_INF) { std::fill(sr, sr + n, 0.f); continue; }     // nothing visible yet: weights 0
    const float alpha = exp_approx(w.m[r] - mx);                        // rescales what was summed so far
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int64_t t = 0; t < n; ++t) { sr[t] = exp_approx(sr[t] - mx); sum += sr[t]; }
    float* ar = w.acc.data() + r * d;
#pragma omp simd
    for (int64_t i = 0; i < d; ++i) ar[i] *= alpha;
    w.l[r] = w.l[r] * alpha + sum;
    w.m[r] = mx;
  }
}

// notebooks/09_attention_kernels.ipynb, cell 32
// Ask for kv heads h0 .. h1-1 of the K/V rows of keys c .. c+n-1 ahead of use, line by line, into the core's L2
// (locality 1; the in-loop prefetches move them on to L1): a chunk's blocks lie anywhere in the pool, where the
// hardware's prefetcher, which follows addresses in order, does not look.
template <typename T>
void prefetch_chunk(const Paged<T>& pg, int64_t h0, int64_t h1, int64_t c, int64_t n, int64_t* off) {
  pg.offsets(c, n, off);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t b = h0 * pg.d * int64_t(sizeof(T)); b < h1 * pg.d * int64_t(sizeof(T)); b += 64) {
      __builtin_prefetch(reinterpret_cast<const char*>(pg.k + off[t]) + b, 0, 1);
      __builtin_prefetch(reinterpret_cast<const char*>(pg.v + off[t]) + b, 0, 1);
    }
}

// Fold keys [k0, k1) into the running softmax of kv heads h0 .. h1-1 (ws[i] holds head h0 + i). The heads take
// turns on each chunk, so a slot's K/V rows, contiguous across heads, are read from memory together; the next
// chunk's rows are on their way while this one is computed.
template <typename T>
void attend_range(const Paged<T>& pg, Scratch* ws, int64_t h0, int64_t h1, int64_t nq, int64_t group, int64_t pos0,
                  int64_t k0, int64_t k1) {
  int64_t ahead[KC];
  if (k0 < k1) prefetch_chunk(pg, h0, h1, k0, std::min(KC, k1 - k0), ahead);
  for (int64_t c = k0; c < k1; c += KC) {
    const int64_t n = std::min(KC, k1 - c);
    if (c + KC < k1) prefetch_chunk(pg, h0, h1, c + KC, std::min(KC, k1 - c - KC), ahead);
    for (int64_t h = h0; h < h1; ++h) {
      Scratch& w = ws[h - h0];
      const Paged<T> ph = pg.head(h);
      ph.offsets(c, n, w.off);
      chunk_scores(ph, w, nq * group, n);
      fold_chunk(w, nq * group, n, pg.d, group, pos0, c);
      add_values(ph, w, nq * group, n);
    }
  }
}

// notebooks/09_attention_kernels.ipynb, cell 34
// One work item: a tile of one sequence's queries, kv heads h0 .. h1-1, one split of the keys it sees.
struct Item { int64_t seq, q0, nq, h0, h1, split; };

// A tile's scaled query rows for kv head h (row j * group + g: query head h * group + g of token q0 + j) and
// an empty softmax.
template <typename T>
void start_tile(const T* q, Scratch& w, const Item& x, int64_t h, int64_t heads, int64_t group, int64_t d,
                float scale) {
  for (int64_t j = 0; j < x.nq; ++j)
    for (int64_t g = 0; g < group; ++g)
      for (int64_t i = 0; i < d; ++i)
        w.q[(j * group + g) * d + i] = float(q[((x.q0 + j) * heads + h * group + g) * d + i]) * scale;
  std::fill(w.m.begin(), w.m.end(), NEG_INF);
  std::fill(w.l.begin(), w.l.end(), 0.f);
  std::fill(w.acc.begin(), w.acc.end(), 0.f);
}

// notebooks/09_attention_kernels.ipynb, cell 35
// The work of a batch: sequence i's query rows cu[i] .. cu[i+1]-1 in tiles of `tile`, `per_item` kv heads to an
// item, each tile's keys cut into splits of `part` positions (flash-decoding) when the items alone are too few
// to keep every core busy.
std::vector<Item> plan(const int32_t* lens, const int32_t* cu, int64_t seqs, int64_t kv_heads, int64_t per_item,
                       int64_t tile, int64_t& part, int64_t& splits) {
  int64_t tiles = 0, longest = 1;
  for (int64_t i = 0; i < seqs; ++i) {
    tiles += (cu[i + 1] - cu[i] + tile - 1) / tile;
    longest = std::max<int64_t>(longest, lens[i]);
  }
  const int64_t threads = at::get_num_threads(), want = 4 * threads, units = tiles * (kv_heads / per_item);
  if (part <= 0) {     // auto: split only when there are fewer items than cores to feed, into >= KC keys each
    int64_t pieces = std::min((want + units - 1) / units, std::max<int64_t>(1, longest / KC));
    while (pieces > 1 && units * pieces % threads != 0) --pieces;       // as many items on every core
    part = units >= want ? longest : (longest + pieces - 1) / pieces;
  }
  splits = (longest + part - 1) / part;
  std::vector<Item> items;
  for (int64_t i = 0; i < seqs; ++i)
    for (int64_t q0 = cu[i]; q0 < cu[i + 1]; q0 += tile) {
      const int64_t nq = std::min<int64_t>(tile, cu[i + 1] - q0);
      const int64_t last = lens[i] - (cu[i + 1] - cu[i]) + (q0 - cu[i]) + nq;   // keys seen by the tile's last row
      for (int64_t h = 0; h < kv_heads; h += per_item)
        for (int64_t s = 0; s * part < last; ++s) items.push_back({i, q0, nq, h, h + per_item, s});
    }
  return items;
}

// notebooks/09_attention_kernels.ipynb, cell 37
// Merge each (token, head)'s partial softmax results, split by split: the exercise of chapter 04, in C++.
// A split that saw no key has m = -inf, l = 0, acc = 0 and weighs nothing.
template <typename T>
void merge_splits(const std::vector<float>& pm, const std::vector<float>& pl, const std::vector<float>& pacc, T* out,
                  int64_t rows, int64_t splits, int64_t d) {
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> acc(d);
    for (int64_t row = begin; row < end; ++row) {
      const float* m = pm.data() + row * splits;
      const float mx = *std::max_element(m, m + splits);
      float l = 0.f;
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t s = 0; s < splits; ++s) {
        const float w = m[s] == NEG_INF ? 0.f : std::exp(m[s] - mx);
        const float* a = pacc.data() + (row * splits + s) * d;
        l += w * pl[row * splits + s];
#pragma omp simd
        for (int64_t i = 0; i < d; ++i) acc[i] += w * a[i];
      }
      for (int64_t i = 0; i < d; ++i) out[row * d + i] = T(acc[i] / l);
    }
  });
}

// notebooks/09_attention_kernels.ipynb, cell 39
// One call: its inputs (q and out are (tokens, heads, d)), its items and, where the keys are split, the items'
// partial results (m, l, acc) for a merge.
template <typename T>
struct Work {
  const T *q, *k, *v;
  const int32_t *tables, *lens, *cu;
  T* out;
  int64_t seqs, heads, kv_heads, d, bs, stride;
  float scale;
  int64_t tile, part, splits = 1, per_item = 1;
  std::vector<Item> items;
  std::vector<float> pm, pl, pacc;           // (tokens, heads, splits [, d])

  void plan_items() {
    per_item = tile == 1 ? kv_heads : 1;     // a decode item takes every kv head of its sequence
    items = plan(lens, cu, seqs, kv_heads, per_item, tile, part, splits);
    if (splits > 1) { pm.assign(cu[seqs] * heads * splits, NEG_INF); pl.resize(pm.size()); pacc.resize(pm.size() * d); }
  }
  void run(int64_t begin, int64_t end);      // items begin .. end-1, on this thread
  void merge() { if (splits > 1) merge_splits(pm, pl, pacc, out, cu[seqs] * heads, splits, d); }
};

// notebooks/09_attention_kernels.ipynb, cell 40
// With one split, items write their rows of out directly; with several, each writes its (m, l, acc) and merge()
// combines them, as two halves of a softmax merge.
template <typename T>
void Work<T>::run(int64_t begin, int64_t end) {
  const int64_t group = heads / kv_heads;
  Scratch* ws = thread_scratch(per_item, tile * group, d);
  for (int64_t it = begin; it < end; ++it) {
    const Item& x = items[it];
    const int64_t R = x.nq * group, pos0 = lens[x.seq] - (cu[x.seq + 1] - cu[x.seq]) + (x.q0 - cu[x.seq]);
    const Paged<T> pg{k, v, tables + x.seq * stride, bs, kv_heads * d, d};
    for (int64_t h = x.h0; h < x.h1; ++h) start_tile(q, ws[h - x.h0], x, h, heads, group, d, scale);
    const int64_t k0 = x.split * part, k1 = std::min(k0 + part, pos0 + x.nq);
    attend_range(pg, ws, x.h0, x.h1, x.nq, group, pos0, k0, k1);
    for (int64_t h = x.h0; h < x.h1; ++h)
    for (int64_t r = 0; r < R; ++r) {
      const Scratch& w = ws[h - x.h0];
      const int64_t row = (x.q0 + r / group) * heads + h * group + r % group;   // (token, head)
      if (splits == 1) {
        for (int64_t i = 0; i < d; ++i) out[row * d + i] = T(w.acc[r * d + i] / w.l[r]);
      } else {
        pm[row * splits + x.split] = w.m[r];
        pl[row * splits + x.split] = w.l[r];
        std::copy_n(w.acc.data() + r * d, d, pacc.data() + (row * splits + x.split) * d);
      }
    }
  }
}

template <typename T>
void paged_attention(Work<T>& w) {
  w.plan_items();
  at::parallel_for(0, int64_t(w.items.size()), 1, [&](int64_t begin, int64_t end) { w.run(begin, end); });
  w.merge();
}

// notebooks/09_attention_kernels.ipynb, cell 42
// The entry points PyTorch calls: checks, then one template per dtype (float32, bfloat16, float16).
torch::Tensor varlen_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor block_tables,
                               torch::Tensor context_lens, torch::Tensor cu_query_lens, double scale, int64_t tile,
                               int64_t part) {
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(),
              "q must be (tokens, heads, d) and k_cache, v_cache (blocks, block_size, kv_heads, d)");
  TORCH_CHECK(q.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous(), "contiguous tensors expected");
  TORCH_CHECK(k_cache.scalar_type() == q.scalar_type() && v_cache.scalar_type() == q.scalar_type(),
              "q, k_cache and v_cache must share a dtype");
  TORCH_CHECK(q.size(2) == k_cache.size(3) && q.size(1) % k_cache.size(2) == 0,
              "head_dim must match and heads must be a multiple of kv_heads");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && context_lens.scalar_type() == at::kInt &&
              cu_query_lens.scalar_type() == at::kInt, "block_tables, context_lens, cu_query_lens must be int32");
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.stride(1) == 1, "block table rows must be contiguous");
  const int64_t seqs = context_lens.size(0);
  TORCH_CHECK(context_lens.is_contiguous() && cu_query_lens.is_contiguous() && cu_query_lens.size(0) == seqs + 1 &&
              block_tables.size(0) == seqs, "cu_query_lens must have seqs + 1 entries, block_tables seqs rows");
  TORCH_CHECK(cu_query_lens.data_ptr<int32_t>()[seqs] == q.size(0), "cu_query_lens[-1] must equal q's token count");
  TORCH_CHECK(tile >= 1, "tile must be >= 1");
  auto out = torch::empty_like(q);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "varlen_attention", [&] {
    Work<scalar_t> w{q.data_ptr<scalar_t>(), k_cache.data_ptr<scalar_t>(), v_cache.data_ptr<scalar_t>(),
                     block_tables.data_ptr<int32_t>(), context_lens.data_ptr<int32_t>(),
                     cu_query_lens.data_ptr<int32_t>(), out.data_ptr<scalar_t>(), seqs, q.size(1), k_cache.size(2),
                     q.size(2), k_cache.size(1), block_tables.stride(0), float(scale), tile, part};
    paged_attention(w);
  });
  return out;
}
