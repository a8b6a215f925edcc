// CoPE attention (Golovneva et al. 2024), causal and fused on the CPU: logits s_ij + b_ij with
// s = scale * q k^T, gates g_ij = sigmoid(s_ij), the key's position p_ij = sum_{t=j..i} g_it
// clamped to npos - 1, and b_ij = a_i[m] + w (a_i[m + 1] - a_i[m]) for m = floor(p_ij), w its
// fraction, a_i = q_i E the query's logits at the integer positions (E (d, npos), shared by the
// heads; a_i[npos] reads as a_i[npos - 1]).
//
// Each (batch, head) is one task, its queries ROWS at a time against the keys they see, as in
// band_flash.cpp: a block's scores and a_rows are two GEMMs, then each row's gates, positions
// (a running sum from the query's own key back), bias and exact softmax in one pass. The
// backward pass forms the same rows again and reads dq, dk, dv and dE off them: the softmax's
// dS, the bias's gradient per integer position (scattered into the row's npos bins), the gates'
// gradient (a running sum of the positions' gradient from key 0 on) and sigmoid's slope.
// Nothing of size L x L is kept. The gates are positive, so going back from the query the
// running sum reaches npos - 1 after a few times npos keys and stays there: only those keys
// need gates, positions and interpolation (a vector of keys at a time, gathering a_i; with
// AVX-512 the running sums too, in four shifted additions per vector), and every earlier key
// reads a_i[npos - 1] in one vector operation, forward and backward.
#include <torch/extension.h>

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>

#include <cmath>
#include <type_traits>
#include <limits>
#include <vector>

#include "cpu_blas.h"

namespace {

using at::vec::Vectorized;
using namespace posbench;  // gemm, row_max, row_exp, rows_per_block

#if defined(CPU_CAPABILITY_AVX512)
// Running sums across the 16 lanes of v in four shifted additions: from lane 0 up (lane k:
// v[0] + ... + v[k]) or, from_end, from lane 15 down (lane k: v[k] + ... + v[15]).
template <bool from_end>
__m512 lane_sums(__m512 v) {
  const __m512i zero = _mm512_setzero_si512();
  const auto add_shifted = [&](__m512 x, auto lanes) {  // lane k: x[k] + x[k -+ lanes]
    const __m512i bits = _mm512_castps_si512(x);
    if constexpr (from_end) {
      return _mm512_add_ps(x, _mm512_castsi512_ps(_mm512_alignr_epi32(zero, bits, lanes())));
    } else {
      return _mm512_add_ps(
          x, _mm512_castsi512_ps(_mm512_alignr_epi32(bits, zero, 16 - lanes())));
    }
  };
  v = add_shifted(v, std::integral_constant<int, 1>());
  v = add_shifted(v, std::integral_constant<int, 2>());
  v = add_shifted(v, std::integral_constant<int, 4>());
  return add_shifted(v, std::integral_constant<int, 8>());
}
#endif

// A vector of gates g[0 .. size - 1] into raw positions, the running sum from the last key
// back: raw[k] = running + g[k] + ... + g[size - 1] (AVX-512, float; elsewhere it returns
// false and the caller sums one key at a time). running becomes raw[0]; reached is the number
// of leading lanes whose position is clamped: up to and including the last lane whose sum is
// at least top (0: none).
template <typename T>
bool suffix_sums(const T* g, T* raw, T& running, T top, int64_t& reached) {
#if defined(CPU_CAPABILITY_AVX512)
  if constexpr (std::is_same_v<T, float>) {
    const __m512 v = _mm512_add_ps(lane_sums<true>(_mm512_loadu_ps(g)), _mm512_set1_ps(running));
    _mm512_storeu_ps(raw, v);
    running = raw[0];
    const __mmask16 at_top = _mm512_cmp_ps_mask(v, _mm512_set1_ps(top), _CMP_GE_OQ);
    reached = at_top == 0 ? 0 : 32 - __builtin_clz(static_cast<unsigned>(at_top));
    return true;
  }
#endif
  return false;
}

// values[k] = carry + values[0] + ... + values[k] for a vector of values, in place (AVX-512,
// float; elsewhere it returns false and the caller sums one value at a time); carry becomes
// the last.
template <typename T>
bool prefix_sums(T* values, T& carry) {
#if defined(CPU_CAPABILITY_AVX512)
  if constexpr (std::is_same_v<T, float>) {
    const __m512 v = lane_sums<false>(_mm512_loadu_ps(values));
    _mm512_storeu_ps(values, _mm512_add_ps(v, _mm512_set1_ps(carry)));
    carry = values[15];
    return true;
  }
#endif
  return false;
}

// Row i's keys 0 .. i: the logits s + b into s, in place; a holds the row's a_i (npos values).
// Returns c, the number of keys whose position is clamped: the gates are positive, so the
// running sum from the query's own key back reaches npos - 1 at some key and stays there, and
// keys 0 .. c - 1 all read a_i[npos - 1] (their gates are never needed, forward or backward).
// For keys c .. i, g holds the gates and raw the positions before the clamp. Gates are formed
// a vector's width at a time going back from key i, only until the clamp is reached.
template <typename T>
int64_t row_logits(T* s, T* g, T* raw, const T* a, int64_t i, int64_t npos) {
  using Vec = Vectorized<T>;
  const Vec one(T(1));
  const T top = T(npos - 1);
  T running = 0;
  int64_t clamped = 0;
  for (int64_t hi = i; hi >= 0 && clamped == 0; hi -= Vec::size()) {
    const int64_t lo = std::max<int64_t>(0, hi - Vec::size() + 1);
    if (hi - lo + 1 == Vec::size()) {
      (one / (one + (Vec(T(0)) - Vec::loadu(s + lo)).exp_u20())).store(g + lo);
    } else {
      for (int64_t j = lo; j <= hi; ++j) g[j] = T(1) / (T(1) + std::exp(-s[j]));
    }
    int64_t first = lo;  // the chunk's first key below the clamp
    int64_t reached = 0;
    if (hi - lo + 1 == Vec::size() && suffix_sums(g + lo, raw + lo, running, top, reached)) {
      if (reached > 0) clamped = first = lo + reached;
    } else {
      for (int64_t j = hi; j >= lo; --j) {  // the running sum: raw positions
        running += g[j];
        raw[j] = running;
        if (running >= top) {  // this key and every earlier one: position npos - 1
          clamped = j + 1;
          first = j + 1;
          break;
        }
      }
    }
    if (first == lo && hi - lo + 1 == Vec::size()) {  // interpolate a_i at a vector of positions
      const Vec p = Vec::loadu(raw + lo);
      const Vec whole = p.floor();
      const auto m = at::vec::convert_to_int_of_same_size<T>(whole);  // exact: whole numbers
      const Vec below = at::vec::gather<sizeof(T)>(a, m);
      const Vec above = at::vec::gather<sizeof(T)>(a, m + decltype(m)(1));
      const Vec w = p - whole;
      (Vec::loadu(s + lo) + (below + w * (above - below))).store(s + lo);
    } else {
      for (int64_t j = first; j <= hi; ++j) {
        const int64_t m = static_cast<int64_t>(raw[j]);
        s[j] += a[m] + (raw[j] - T(m)) * (a[m + 1] - a[m]);
      }
    }
  }
  const Vec far(a[npos - 1]);
  int64_t j = 0;
  for (; j + Vec::size() <= clamped; j += Vec::size()) (Vec::loadu(s + j) + far).store(s + j);
  for (; j < clamped; ++j) s[j] += a[npos - 1];
  return clamped;
}

template <typename T>
void forward_kernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                    const at::Tensor& table, double scale, at::Tensor& out, at::Tensor& lse) {
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2), d = q.size(3);
  const int64_t npos = table.size(1), R = rows_per_block(L);
  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    const int previous = MKL_Set_Num_Threads_Local(1);  // the tasks are the parallelism
    std::vector<T> s(R * L), g(L), raw(L), a(R * npos), sums(R);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t offset = task * L * d;
      const T *q_bh = q.data_ptr<T>() + offset, *k_bh = k.data_ptr<T>() + offset;
      T* out_bh = out.data_ptr<T>() + offset;
      for (int64_t i0 = 0; i0 < L; i0 += R) {
        const int64_t i1 = std::min(i0 + R, L), rows = i1 - i0, keys = i1;
        gemm<T>(false, true, rows, keys, d, T(scale), q_bh + i0 * d, d, k_bh, d, T(0), s.data(),
                keys);
        gemm<T>(false, false, rows, npos, d, T(1), q_bh + i0 * d, d, table.data_ptr<T>(), npos,
                T(0), a.data(), npos);
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t i = i0 + r;
          T* row = s.data() + r * keys;
          row_logits(row, g.data(), raw.data(), a.data() + r * npos, i, npos);
          const T m = row_max(row, i + 1);
          sums[r] = row_exp(row, i, keys, m);
          lse.data_ptr<T>()[task * L + i] = m + std::log(sums[r]);
        }
        gemm<T>(false, false, rows, d, keys, T(1), s.data(), keys, v.data_ptr<T>() + offset, d,
                T(0), out_bh + i0 * d, d);
        for (int64_t r = 0; r < rows; ++r) {  // normalise the (rows, d) output
          const T inverse = T(1) / sums[r];
          for (int64_t c = 0; c < d; ++c) out_bh[(i0 + r) * d + c] *= inverse;
        }
      }
    }
    MKL_Set_Num_Threads_Local(previous);
  });
}

template <typename T>
void backward_kernel(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                     const at::Tensor& v, const at::Tensor& table, const at::Tensor& out,
                     const at::Tensor& lse, double scale, at::Tensor& dq, at::Tensor& dk,
                     at::Tensor& dv, at::Tensor& dtable_buffers) {
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2), d = q.size(3);
  const int64_t npos = table.size(1), R = rows_per_block(L);
  const T* E = table.data_ptr<T>();
  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    const int previous = MKL_Set_Num_Threads_Local(1);
    std::vector<T> p(R * L), ds(R * L), g(L), raw(L), a(R * npos), da(R * npos);
    T* dtable = dtable_buffers[at::get_thread_num()].data_ptr<T>();  // (d, npos), summed later
    for (int64_t task = begin; task < end; ++task) {
      const int64_t offset = task * L * d;
      const T *q_bh = q.data_ptr<T>() + offset, *k_bh = k.data_ptr<T>() + offset;
      const T *v_bh = v.data_ptr<T>() + offset, *do_bh = grad_out.data_ptr<T>() + offset;
      const T* o_bh = out.data_ptr<T>() + offset;
      T *dq_bh = dq.data_ptr<T>() + offset, *dk_bh = dk.data_ptr<T>() + offset;
      T* dv_bh = dv.data_ptr<T>() + offset;
      for (int64_t i0 = 0; i0 < L; i0 += R) {
        const int64_t i1 = std::min(i0 + R, L), rows = i1 - i0, keys = i1;
        gemm<T>(false, true, rows, keys, d, T(scale), q_bh + i0 * d, d, k_bh, d, T(0), p.data(),
                keys);
        gemm<T>(false, false, rows, npos, d, T(1), q_bh + i0 * d, d, E, npos, T(0), a.data(),
                npos);
        gemm<T>(false, true, rows, keys, d, T(1), do_bh + i0 * d, d, v_bh, d, T(0), ds.data(),
                keys);  // dP
        std::fill(da.begin(), da.end(), T(0));
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t i = i0 + r, seen = i + 1;
          T* p_row = p.data() + r * keys;
          T* ds_row = ds.data() + r * keys;
          const T* a_row = a.data() + r * npos;
          T* da_row = da.data() + r * npos;
          const int64_t clamped = row_logits(p_row, g.data(), raw.data(), a_row, i, npos);
          row_exp(p_row, i, keys, lse.data_ptr<T>()[task * L + i]);  // P, exact
          T delta = 0;
          for (int64_t c = 0; c < d; ++c) delta += do_bh[i * d + c] * o_bh[i * d + c];
          // dlogit = P (dP - delta); the bias's gradient per integer position and per raw
          // position; the gates' gradient is the running sum of the latter from key 0 on, zero
          // over the clamped keys, whose bias reads position npos - 1 alone
          using Vec = Vectorized<T>;
          const Vec delta_vec(delta);
          Vec far_vec(T(0));
          int64_t j = 0;
          for (; j + Vec::size() <= clamped; j += Vec::size()) {
            const Vec dlogit = Vec::loadu(p_row + j) * (Vec::loadu(ds_row + j) - delta_vec);
            far_vec = far_vec + dlogit;
            dlogit.store(ds_row + j);
          }
          T lanes[Vec::size()];
          far_vec.store(lanes);
          T far_grad = 0;
          for (int64_t lane = 0; lane < Vec::size(); ++lane) far_grad += lanes[lane];
          for (; j < clamped; ++j) {
            const T dlogit = p_row[j] * (ds_row[j] - delta);
            far_grad += dlogit;
            ds_row[j] = dlogit;
          }
          da_row[npos - 1] += far_grad;
          T gates_grad = 0;
          j = clamped;
          for (; j + Vec::size() <= seen; j += Vec::size()) {  // a vector of keys at a time
            const Vec dlogit = Vec::loadu(p_row + j) * (Vec::loadu(ds_row + j) - delta_vec);
            const Vec pos = Vec::loadu(raw.data() + j);  // raw < npos - 1 here
            const Vec whole = pos.floor();
            const auto m = at::vec::convert_to_int_of_same_size<T>(whole);
            const Vec below = at::vec::gather<sizeof(T)>(a_row, m);
            const Vec above = at::vec::gather<sizeof(T)>(a_row, m + decltype(m)(1));
            T logit[Vec::size()], w[Vec::size()], running[Vec::size()];
            at::vec::int_same_size_t<T> index[Vec::size()];
            dlogit.store(logit);
            (pos - whole).store(w);
            (dlogit * (above - below)).store(running);
            m.store(index);
            const bool summed = prefix_sums(running, gates_grad);
            for (int64_t lane = 0; lane < Vec::size(); ++lane) {  // scatter, and the running sum
              da_row[index[lane]] += logit[lane] * (T(1) - w[lane]);
              da_row[index[lane] + 1] += logit[lane] * w[lane];
              if (!summed) {
                gates_grad += running[lane];
                running[lane] = gates_grad;
              }
            }
            const Vec gate = Vec::loadu(g.data() + j);
            (dlogit + Vec::loadu(running) * gate * (Vec(T(1)) - gate)).store(ds_row + j);
          }
          for (; j < seen; ++j) {
            const T dlogit = p_row[j] * (ds_row[j] - delta);
            const int64_t m = static_cast<int64_t>(raw[j]);  // raw < npos - 1 here
            const T w = raw[j] - T(m);
            da_row[m] += dlogit * (T(1) - w);
            da_row[m + 1] += dlogit * w;
            gates_grad += dlogit * (a_row[m + 1] - a_row[m]);
            ds_row[j] = dlogit + gates_grad * g[j] * (T(1) - g[j]);  // dS of the content
          }
          std::fill(ds_row + seen, ds_row + keys, T(0));
        }
        gemm<T>(true, false, keys, d, rows, T(1), p.data(), keys, do_bh + i0 * d, d, T(1), dv_bh,
                d);  // dV += P^T dO
        gemm<T>(false, false, rows, d, keys, T(scale), ds.data(), keys, k_bh, d, T(0),
                dq_bh + i0 * d, d);  // dQ = scale dS K
        gemm<T>(false, true, rows, d, npos, T(1), da.data(), npos, E, npos, T(1), dq_bh + i0 * d,
                d);  // dQ += dA E^T
        gemm<T>(true, false, keys, d, rows, T(scale), ds.data(), keys, q_bh + i0 * d, d, T(1),
                dk_bh, d);  // dK += scale dS^T Q
        gemm<T>(true, false, d, npos, rows, T(1), q_bh + i0 * d, d, da.data(), npos, T(1), dtable,
                npos);  // dE += Q^T dA
      }
    }
    MKL_Set_Num_Threads_Local(previous);
  });
}

void check(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
           const at::Tensor& table) {
  TORCH_CHECK(q.device().is_cpu() && q.dim() == 4, "q: (B, H, L, d) on the CPU");
  TORCH_CHECK(k.sizes() == q.sizes() && v.sizes() == q.sizes(), "k, v: q's shape");
  TORCH_CHECK(table.dim() == 2 && table.size(0) == q.size(3) && table.size(1) >= 2,
              "table: (d, npos), npos >= 2");
  TORCH_CHECK(q.is_contiguous() && k.is_contiguous() && v.is_contiguous() &&
                  table.is_contiguous(), "contiguous q, k, v and table");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type() &&
                  q.scalar_type() == table.scalar_type(), "one dtype");
}

}  // namespace

std::vector<at::Tensor> cope_flash_forward(const at::Tensor& q, const at::Tensor& k,
                                           const at::Tensor& v, const at::Tensor& table,
                                           double scale) {
  check(q, k, v, table);
  auto out = at::empty_like(q);
  auto lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "cope_flash_forward", [&] {
    forward_kernel<scalar_t>(q, k, v, table, scale, out, lse);
  });
  return {out, lse};
}

std::vector<at::Tensor> cope_flash_backward(const at::Tensor& grad_out, const at::Tensor& q,
                                            const at::Tensor& k, const at::Tensor& v,
                                            const at::Tensor& table, const at::Tensor& out,
                                            const at::Tensor& lse, double scale) {
  check(q, k, v, table);
  TORCH_CHECK(grad_out.is_contiguous() && out.is_contiguous() && lse.is_contiguous(),
              "contiguous grad_out, out and lse");
  auto dq = at::empty_like(q);
  auto dk = at::zeros_like(q);
  auto dv = at::zeros_like(q);
  auto buffers = at::zeros({at::get_num_threads(), table.size(0), table.size(1)}, table.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "cope_flash_backward", [&] {
    backward_kernel<scalar_t>(grad_out, q, k, v, table, out, lse, scale, dq, dk, dv, buffers);
  });
  return {dq, dk, dv, buffers.sum(0)};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &cope_flash_forward, "(out, lse) of causal CoPE attention");
  m.def("backward", &cope_flash_backward, "(dq, dk, dv, dtable) of forward");
}
