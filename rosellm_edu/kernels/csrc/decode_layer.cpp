// Generated from notebooks/11b_native_decode.ipynb by `python -m rosellm_edu.book.export`.
// Do not edit: change the notebook's `%%cpp` cells and export again. Each part names its cell.

// notebooks/11b_native_decode.ipynb, cell 12
#include "quant.h"

// A Linear of a decode step: (weight, scales, bits). bits 0: a weight (N, K) in x's dtype, chapter 10's few-rows
// loop (up to 4 rows); 4 or 8: tiles and their scales, chapter 11's int8-dot loop.
using Linear = std::tuple<torch::Tensor, torch::Tensor, int64_t>;

torch::Tensor step_linear(const torch::Tensor& x, const Linear& l) {
  const auto& [w, dm, bits] = l;
  return bits == 0 ? linear_few_rows(x, w) : tiled_linear(x, w, dm, bits);
}

// src (rows, KV, d) into slots[r] of cache (..., KV, d), whose (KV, d) rows are its slots: a copy a row, where
// index_copy_'s checks and iterator cost more than the few hundred bytes a decode step writes.
void write_slots(const torch::Tensor& src, torch::Tensor& cache, const torch::Tensor& slots) {
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.is_contiguous() && slots.numel() == src.size(0) &&
              cache.is_contiguous() && src.stride(2) == 1 && src.stride(1) == src.size(2) &&
              src.size(1) == cache.size(-2) && src.size(2) == cache.size(-1) &&
              cache.scalar_type() == src.scalar_type(), "write_slots: int64 slots, one a row, rows as the cache's");
  const int64_t row = src.size(1) * src.size(2), bytes = row * src.element_size(), n_slots = cache.numel() / row;
  const int64_t* slot = slots.data_ptr<int64_t>();
  for (int64_t r = 0; r < src.size(0); ++r)                                // all checked before any is written
    TORCH_CHECK(slot[r] >= 0 && slot[r] < n_slots, "slot ", slot[r], " is outside the cache's ", n_slots);
  for (int64_t r = 0; r < src.size(0); ++r)
    std::memcpy(static_cast<char*>(cache.data_ptr()) + slot[r] * bytes,
                static_cast<const char*>(src.data_ptr()) + r * src.stride(0) * src.element_size(), bytes);
}

// notebooks/11b_native_decode.ipynb, cell 13
// A decoder layer up to attention. x (rows, hidden), the previous layer's output, is added into residual (copied,
// for the first layer: add false) and normalised, both in place. k and v go into their slots of this layer's
// cache (blocks, block_size, KV, d). Returns q (rows, H, d), rotated.
torch::Tensor attention_in(torch::Tensor x, torch::Tensor residual, bool add, torch::Tensor norm, double eps,
                           const Linear& qkv_proj, torch::Tensor positions, torch::Tensor cos, torch::Tensor sin,
                           torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor slots) {
  fused_add_rms_norm(x, residual, norm, eps, add);
  const auto qkv = step_linear(x, qkv_proj);                                 // (rows, (H + 2 KV) d)
  const int64_t d = cos.size(1), kv = k_cache.size(2), heads = qkv.size(1) / d - 2 * kv;
  const auto split = qkv.view({x.size(0), heads + 2 * kv, d});              // (rows, H + 2 KV, d)
  rotary_inplace(positions, split.narrow(1, 0, heads + kv), cos, sin);      // q and k in one pass
  write_slots(split.narrow(1, heads, kv), k_cache, slots);
  write_slots(split.narrow(1, heads + kv, kv), v_cache, slots);
  return split.narrow(1, 0, heads).contiguous();
}

// notebooks/11b_native_decode.ipynb, cell 15
// The rest: attn (rows, H, d) through o_proj, added into residual (in place) and normalised, then the MLP.
// Returns the layer's output (rows, hidden), for the next layer to add.
torch::Tensor attention_out(torch::Tensor attn, torch::Tensor residual, const Linear& o_proj, torch::Tensor norm,
                            double eps, const Linear& gate_up_proj, const Linear& down_proj) {
  auto x = step_linear(attn.view({attn.size(0), -1}), o_proj);              // (rows, hidden)
  fused_add_rms_norm(x, residual, norm, eps, true);
  return step_linear(silu_and_mul_out(step_linear(x, gate_up_proj)), down_proj);
}

// notebooks/11b_native_decode.ipynb, cell 16
#include "attention.cpp"   // chapter 09's varlen_attention, compiled into this module: the loop calls it directly

using Layer = std::tuple<torch::Tensor, double, Linear, Linear, torch::Tensor, double, Linear, Linear>;

// A decode step after the embedding: x (rows, hidden) through every layer, then the final norm. k_caches[i] and
// v_caches[i] (blocks, block_size, KV, d) are layer i's; one query a sequence. Returns (rows, hidden).
torch::Tensor decode_layers(torch::Tensor x, const std::vector<Layer>& layers, torch::Tensor positions,
                            torch::Tensor cos, torch::Tensor sin, const std::vector<torch::Tensor>& k_caches,
                            const std::vector<torch::Tensor>& v_caches, torch::Tensor slots, torch::Tensor block_tables,
                            torch::Tensor context_lens, double scale, torch::Tensor norm, double eps) {
  TORCH_CHECK(k_caches.size() == layers.size() && v_caches.size() == layers.size(), "a k and a v cache a layer");
  auto residual = torch::empty_like(x);
  const auto cu_query_lens = torch::arange(x.size(0) + 1, torch::kInt32);
  for (size_t i = 0; i < layers.size(); ++i) {
    const auto& [norm_in, eps_in, qkv, o, norm_out, eps_out, gate_up, down] = layers[i];
    const auto q = attention_in(x, residual, i > 0, norm_in, eps_in, qkv, positions, cos, sin, k_caches[i],
                                v_caches[i], slots);                                           // (rows, H, d)
    const auto attn = varlen_attention(q, k_caches[i], v_caches[i], block_tables, context_lens, cu_query_lens,
                                       scale, 1, 0);                                           // (rows, H, d)
    x = attention_out(attn, residual, o, norm_out, eps_out, gate_up, down);
  }
  fused_add_rms_norm(x, residual, norm, eps, true);
  return x;
}

// notebooks/11b_native_decode.ipynb, cell 18
// What every decode step of a model shares, converted from Python once.
struct DecodePlan {
  std::vector<Layer> layers;
  torch::Tensor cos, sin;
  std::vector<torch::Tensor> k_caches, v_caches;
  double scale;
  torch::Tensor norm;
  double eps;
};

pybind11::capsule decode_plan(std::vector<Layer> layers, torch::Tensor cos, torch::Tensor sin,
                              std::vector<torch::Tensor> k_caches, std::vector<torch::Tensor> v_caches, double scale,
                              torch::Tensor norm, double eps) {
  TORCH_CHECK(k_caches.size() == layers.size() && v_caches.size() == layers.size(), "a k and a v cache a layer");
  return pybind11::capsule(new DecodePlan{std::move(layers), cos, sin, std::move(k_caches), std::move(v_caches),
                                          scale, norm, eps},
                           "DecodePlan", [](void* p) { delete static_cast<DecodePlan*>(p); });
}

// decode_layers over a plan: x (rows, hidden) and the step's positions, slots and attention metadata.
torch::Tensor decode_step(const pybind11::capsule& plan, torch::Tensor x, torch::Tensor positions, torch::Tensor slots,
                          torch::Tensor block_tables, torch::Tensor context_lens) {
  TORCH_CHECK(plan.name() && std::string(plan.name()) == "DecodePlan", "decode_step takes decode_plan's capsule");
  const DecodePlan& p = *plan.get_pointer<DecodePlan>();
  return decode_layers(x, p.layers, positions, p.cos, p.sin, p.k_caches, p.v_caches, slots, block_tables,
                       context_lens, p.scale, p.norm, p.eps);
}

// notebooks/11b_native_decode.ipynb, cell 20
#include <atomic>
#include <chrono>
#ifdef _OPENMP
#include <omp.h>
#endif

inline void spin_pause() {             // tells the core it is waiting: the other hyperthread gets its cycles
#if defined(__x86_64__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Threads that wait for each other by watching a counter, never sleeping: the last to arrive opens the next phase.
struct SpinBarrier {
  alignas(64) std::atomic<int> arrived{0};
  alignas(64) std::atomic<int> phase{0};
  int threads = 1;
  void wait() {
    if (threads == 1) return;
    const int p = phase.load(std::memory_order_relaxed);
    if (arrived.fetch_add(1, std::memory_order_acq_rel) == threads - 1) {
      arrived.store(0, std::memory_order_relaxed);
      phase.store(p + 1, std::memory_order_release);
    } else {
      while (phase.load(std::memory_order_acquire) == p) spin_pause();
    }
  }
};

// notebooks/11b_native_decode.ipynb, cell 21
// f(thread, threads) on every thread of one parallel region, bar sized to its team.
template <typename F>
void in_region(SpinBarrier& bar, const F& f) {
#ifdef _OPENMP
#pragma omp parallel num_threads(at::get_num_threads())
  {
#pragma omp single
    bar.threads = omp_get_num_threads();
    f(omp_get_thread_num(), omp_get_num_threads());
  }
#else
  f(0, 1);
#endif
}

// Microseconds each: an empty at::parallel_for over every thread, opened and closed `calls` times; a barrier,
// passed `calls` times inside one region.
std::vector<double> region_costs(int64_t calls) {
  using clock = std::chrono::steady_clock;
  const auto us = [&](clock::time_point start) {
    return std::chrono::duration<double, std::micro>(clock::now() - start).count() / calls;
  };
  auto start = clock::now();
  for (int64_t i = 0; i < calls; ++i) at::parallel_for(0, at::get_num_threads(), 1, [](int64_t, int64_t) {});
  const double fork_join = us(start);
  SpinBarrier bar;
  start = clock::now();
  in_region(bar, [&](int, int) { for (int64_t i = 0; i < calls; ++i) bar.wait(); });
  return {fork_join, us(start)};
}

// notebooks/11b_native_decode.ipynb, cell 23
// A Linear as the region runs it, either kind: tiles, or a weight (N, K) in x's dtype for chapter 10's loop.
struct RegionLinear { Tiles tiles; const void* weight; int64_t bits, N, K; };

RegionLinear region_linear(const Linear& l, const torch::Tensor& x) {
  const auto& [w, dm, bits] = l;
  if (bits != 0) return {check_tiles(w, dm, bits), nullptr, bits, w.size(0) * 16, w.size(1) * 32};
  check_few_rows(w, x.size(0), x.scalar_type());                    // chapter 10's checks; each K in region_linears
  return {Tiles{}, w.data_ptr(), 0, w.size(0), w.size(1)};
}

std::pair<int64_t, int64_t> share(int64_t count, int t, int n) {    // thread t's run of count items
  const int64_t per = (count + n - 1) / n;
  return {std::min(count, t * per), std::min(count, (t + 1) * per)};
}

// This thread's share of y (M, N) = x (M, K) @ W^T: its run of blocks of 16 output columns. Each thread splits or
// quantizes x itself, a few KB: cheaper than waiting for one thread to do it.
template <typename T>
void linear_share(const T* x, int64_t M, const RegionLinear& l, T* y, int t, int n) {
  const auto [begin, end] = share(l.N / 16, t, n);
  if (l.bits == 0) {
    std::vector<float> xs(M * l.K);
    split_rows(x, M * l.K, xs.data());
    return few_rows_range(xs.data(), static_cast<const T*>(l.weight), y, M, l.N, l.K, begin, end);
  }
  const Q8Rows xq = quantize_rows(x, M, l.K, M - M % 8 + padded_rows(M % 8));
  (l.bits == 4 ? tile_range<T, 4> : tile_range<T, 8>)(xq, l.tiles, y, M, l.N, begin, end);
}

// What the threads of a step's region share: its buffers (rows first), shapes, inputs and each layer's Linears.
template <typename T>
struct Region {
  T *x, *residual, *qkv, *q, *attn, *gate_up, *act;
  int64_t M, hidden, heads, kv, d, inter;
  const int64_t *positions, *slots;
  std::vector<std::array<RegionLinear, 4>> linears;                  // a layer's qkv, o, gate_up, down
};

// notebooks/11b_native_decode.ipynb, cell 24
// Layer i on thread t of n. Between phases, a barrier; thread 0 alone runs the steps of a few microseconds.
template <typename T>
void layer_share(const DecodePlan& p, size_t i, Region<T>& s, Work<T>& work, SpinBarrier& bar, int t, int n) {
  const auto& [norm_in, eps_in, _qkv, _o, norm_out, eps_out, _gate_up, _down] = p.layers[i];   // the norms here
  const auto& [qkv_l, o_l, gate_up_l, down_l] = s.linears[i];
  const int64_t M = s.M, width = (s.heads + 2 * s.kv) * s.d, row = s.kv * s.d;     // qkv's row, a slot's
  if (t == 0) add_rms_norm<T>(s.x, s.residual, norm_in.data_ptr<T>(), M, s.hidden, float(eps_in), i > 0);
  bar.wait();
  linear_share(s.x, M, qkv_l, s.qkv, t, n);
  bar.wait();
  if (t == 0) {                                  // rotary on q and k; k and v into their slots; q packed for attention
    rotary<T>(s.qkv, width, s.positions, p.cos.data_ptr<T>(), p.sin.data_ptr<T>(), M, s.heads + s.kv, s.d);
    T *k = p.k_caches[i].data_ptr<T>(), *v = p.v_caches[i].data_ptr<T>();
    work.k = k, work.v = v;
    for (int64_t r = 0; r < M; ++r) {
      const T* qkv_r = s.qkv + r * width;
      std::memcpy(k + s.slots[r] * row, qkv_r + s.heads * s.d, row * sizeof(T));
      std::memcpy(v + s.slots[r] * row, qkv_r + (s.heads + s.kv) * s.d, row * sizeof(T));
      std::memcpy(s.q + r * s.heads * s.d, qkv_r, s.heads * s.d * sizeof(T));
    }
  }
  bar.wait();
  const auto [begin, end] = share(work.items.size(), t, n);
  work.run(begin, end);
  bar.wait();
  if (work.splits > 1) { if (t == 0) work.merge(); bar.wait(); }
  linear_share(s.attn, M, o_l, s.x, t, n);
  bar.wait();
  if (t == 0) add_rms_norm<T>(s.x, s.residual, norm_out.data_ptr<T>(), M, s.hidden, float(eps_out), true);
  bar.wait();
  linear_share(s.x, M, gate_up_l, s.gate_up, t, n);
  bar.wait();
  if (t == 0) silu_and_mul<T>(s.gate_up, s.act, M, s.inter);
  bar.wait();
  linear_share(s.act, M, down_l, s.x, t, n);
  bar.wait();
}

// notebooks/11b_native_decode.ipynb, cell 26
// What the kernels' wrappers check in decode_step, checked before the region starts: no thread of it may throw.
void check_step(const DecodePlan& p, const torch::Tensor& x, const torch::Tensor& positions, const torch::Tensor& slots,
                const torch::Tensor& block_tables, const torch::Tensor& context_lens) {
  check_rows(x, "x");
  const int64_t M = x.size(0), n_slots = p.k_caches[0].numel() / p.k_caches[0].size(2) / p.k_caches[0].size(3);
  TORCH_CHECK(x.scalar_type() == p.cos.scalar_type() && x.size(1) == p.norm.size(0), "x must be (rows, ",
              p.norm.size(0), ") in the plan's dtype");
  TORCH_CHECK(positions.scalar_type() == at::kLong && positions.is_contiguous() && positions.numel() == M &&
              slots.scalar_type() == at::kLong && slots.is_contiguous() && slots.numel() == M,
              "positions and slots must be int64, one a row");
  for (int64_t r = 0; r < M; ++r) {
    const int64_t pos = positions.data_ptr<int64_t>()[r], slot = slots.data_ptr<int64_t>()[r];
    TORCH_CHECK(pos >= 0 && pos < p.cos.size(0), "position ", pos, " is outside [0, ", p.cos.size(0), ")");
    TORCH_CHECK(slot >= 0 && slot < n_slots, "slot ", slot, " is outside the cache's ", n_slots);
  }
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && block_tables.dim() == 2 && block_tables.stride(1) == 1 &&
              block_tables.size(0) == M && context_lens.scalar_type() == at::kInt && context_lens.is_contiguous() &&
              context_lens.numel() == M, "block_tables (rows, width) and context_lens (rows,) must be int32");
}

// Each layer's Linears as the region runs them, every layer shaped as the first and as x and the caches.
std::vector<std::array<RegionLinear, 4>> region_linears(const DecodePlan& p, const torch::Tensor& x) {
  std::vector<std::array<RegionLinear, 4>> linears;
  for (const auto& l : p.layers)
    linears.push_back({region_linear(std::get<2>(l), x), region_linear(std::get<3>(l), x),
                       region_linear(std::get<6>(l), x), region_linear(std::get<7>(l), x)});
  const int64_t hidden = x.size(1), d = p.cos.size(1), kv = p.k_caches[0].size(2);
  const auto& first = linears[0];                                    // o takes heads * d; down takes inter
  for (const auto& [qkv, o, gate_up, down] : linears)
    TORCH_CHECK(qkv.K == hidden && qkv.N == o.K + 2 * kv * d && o.K == first[1].K && o.K % d == 0 &&
                o.N == hidden && gate_up.K == hidden && gate_up.N == 2 * down.K && down.K == first[3].K &&
                down.N == hidden,
                "decode_region: every layer's Linears shaped as the first's, for x and the caches");
  return linears;
}

// notebooks/11b_native_decode.ipynb, cell 27
// decode_step in one parallel region: every thread runs every layer, taking its share of each matmul and of
// attention's items. The same kernels on the same shares: the same output.
torch::Tensor decode_region(const pybind11::capsule& plan, torch::Tensor x, torch::Tensor positions,
                            torch::Tensor slots, torch::Tensor block_tables, torch::Tensor context_lens) {
  TORCH_CHECK(plan.name() && std::string(plan.name()) == "DecodePlan", "decode_region takes decode_plan's capsule");
  const DecodePlan& p = *plan.get_pointer<DecodePlan>();
  check_step(p, x, positions, slots, block_tables, context_lens);
  const int64_t M = x.size(0), d = p.cos.size(1), kv = p.k_caches[0].size(2), bs = p.k_caches[0].size(1);
  auto linears = region_linears(p, x);
  const int64_t width = linears[0][0].N, heads = linears[0][1].K / d, inter = linears[0][3].K;
  auto residual = torch::empty_like(x), qkv = x.new_empty({M, width}), q = x.new_empty({M, heads, d});
  auto attn = torch::empty_like(q), gate_up = x.new_empty({M, 2 * inter}), act = x.new_empty({M, inter});
  const auto cu = torch::arange(M + 1, torch::kInt32);
  DISPATCH(x.scalar_type(), "decode_region", [&] {
    using T = scalar_t;
    Region<T> s{x.data_ptr<T>(), residual.data_ptr<T>(), qkv.data_ptr<T>(), q.data_ptr<T>(), attn.data_ptr<T>(),
                gate_up.data_ptr<T>(), act.data_ptr<T>(), M, x.size(1), heads, kv, d, inter,
                positions.data_ptr<int64_t>(), slots.data_ptr<int64_t>(), std::move(linears)};
    Work<T> work{q.data_ptr<T>(), nullptr, nullptr, block_tables.data_ptr<int32_t>(), context_lens.data_ptr<int32_t>(),
                 cu.data_ptr<int32_t>(), attn.data_ptr<T>(), M, heads, kv, d, bs, block_tables.stride(0),
                 float(p.scale), 1, 0};
    work.plan_items();
    SpinBarrier bar;
    in_region(bar, [&](int t, int n) {
      for (size_t i = 0; i < p.layers.size(); ++i) layer_share(p, i, s, work, bar, t, n);
    });
  });
  fused_add_rms_norm(x, residual, p.norm, p.eps, true);
  return x;
}
