// Generated from notebooks/04_paged_attention.ipynb by `python -m rosellm_edu.book.export`.
// Do not edit: change the notebook's `%%cpp` cells and export again. Each part names its cell.

// notebooks/04_paged_attention.ipynb, cell 48
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

// One work item per (sequence, kv head): its query group walks the block table once, keeping an online softmax.
template <typename T>
void decode(const T* q, const T* k, const T* v, const int32_t* tables, const int32_t* lens, T* out, int64_t seqs,
            int64_t heads, int64_t kv_heads, int64_t d, int64_t bs, int64_t table_stride, float scale) {
  const int64_t group = heads / kv_heads, row = kv_heads * d;   // row: distance between two slots of one head
  at::parallel_for(0, seqs * kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qf(group * d), acc(group * d), m(group), l(group), s(bs);
    for (int64_t w = begin; w < end; ++w) {
      const int64_t seq = w / kv_heads, h = w % kv_heads, len = lens[seq];
      const T* qs = q + (seq * heads + h * group) * d;
      for (int64_t i = 0; i < group * d; ++i) qf[i] = float(qs[i]) * scale;
      std::fill(acc.begin(), acc.end(), 0.f);
      std::fill(m.begin(), m.end(), -std::numeric_limits<float>::infinity());
      std::fill(l.begin(), l.end(), 0.f);
      for (int64_t start = 0; start < len; start += bs) {
        const int64_t block = tables[seq * table_stride + start / bs], n = std::min(bs, len - start);
        const T* kb = k + block * bs * row + h * d;
        const T* vb = v + block * bs * row + h * d;

// notebooks/04_paged_attention.ipynb, cell 49
// ... then, block by block, the online softmax of each query head of the group
        for (int64_t g = 0; g < group; ++g) {
          const float* qg = qf.data() + g * d;
          float* ag = acc.data() + g * d;
          float mx = m[g];
          for (int64_t t = 0; t < n; ++t) {
            const T* kt = kb + t * row;
            float dot = 0.f;
#pragma omp simd reduction(+ : dot)
            for (int64_t i = 0; i < d; ++i) dot += qg[i] * float(kt[i]);
            s[t] = dot;
            mx = std::max(mx, dot);
          }
          const float alpha = std::exp(m[g] - mx);   // rescales what was summed under the old maximum
          float sum = 0.f;
#pragma omp simd
          for (int64_t i = 0; i < d; ++i) ag[i] *= alpha;
          for (int64_t t = 0; t < n; ++t) {
            const float p = std::exp(s[t] - mx);
            const T* vt = vb + t * row;
            sum += p;
#pragma omp simd
            for (int64_t i = 0; i < d; ++i) ag[i] += p * float(vt[i]);
          }
          l[g] = l[g] * alpha + sum;
          m[g] = mx;
        }
      }
      T* os = out + (seq * heads + h * group) * d;
      for (int64_t i = 0; i < group * d; ++i) os[i] = T(acc[i] / l[i / d]);
    }
  });
}

// notebooks/04_paged_attention.ipynb, cell 51
torch::Tensor paged_decode_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                     torch::Tensor block_tables, torch::Tensor context_lens, double scale) {
  TORCH_CHECK(q.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous(), "contiguous tensors expected");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && context_lens.scalar_type() == at::kInt, "int32 tables expected");
  TORCH_CHECK(block_tables.stride(1) == 1, "block table rows must be contiguous");
  auto out = torch::empty_like(q);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "paged_decode_attention", [&] {
    decode<scalar_t>(q.data_ptr<scalar_t>(), k_cache.data_ptr<scalar_t>(), v_cache.data_ptr<scalar_t>(),
                     block_tables.data_ptr<int32_t>(), context_lens.data_ptr<int32_t>(), out.data_ptr<scalar_t>(),
                     q.size(0), q.size(1), k_cache.size(2), q.size(2), k_cache.size(1), block_tables.stride(0),
                     float(scale));
  });
  return out;
}
