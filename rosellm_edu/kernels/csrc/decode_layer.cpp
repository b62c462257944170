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
