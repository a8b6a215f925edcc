// Causal attention with a band bias, fused on the CPU: softmax(scale * q k^T + bias) v where
// bias[b, h, i, j] = band[b|0, h, i|0, j - i + W - 1] for i - W < j <= i and 0 further back.
// A Toeplitz bias (a function of i - j alone) is the band with W = L and one row.
//
// Each (batch, head) is one task. A task takes its queries ROWS at a time against every key
// they can see (keys 0 .. i1 - 1), so a block's scores are one GEMM and its softmax is exact
// (no running rescale); the bias is added in place, row by row, from a contiguous slice of
// the band. The backward pass forms P and dS = P * (dP - rowsum(dO * O)) for the same blocks
// and reads dq, dk, dv and the band's gradient off them: five GEMMs per block, as the flash
// backward does, and nothing of size L x L.
#include <torch/extension.h>

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

extern "C" {
void sgemm_(const char*, const char*, const int*, const int*, const int*, const float*,
            const float*, const int*, const float*, const int*, const float*, float*,
            const int*);
void dgemm_(const char*, const char*, const int*, const int*, const int*, const double*,
            const double*, const int*, const double*, const int*, const double*, double*,
            const int*);
int MKL_Set_Num_Threads_Local(int);
}

namespace {

using at::vec::Vectorized;

// Row-major C (M x N) = alpha * op(A) op(B) + beta * C, op(A) M x K, op(B) K x N; a transposed
// operand is stored as its transpose (K x M, N x K). BLAS is column-major: C^T = op(B)^T op(A)^T.
template <typename T>
void gemm(bool trans_a, bool trans_b, int M, int N, int K, T alpha, const T* A, int lda,
          const T* B, int ldb, T beta, T* C, int ldc) {
  const char ta = trans_b ? 'T' : 'N', tb = trans_a ? 'T' : 'N';
  if constexpr (std::is_same_v<T, float>) {
    sgemm_(&ta, &tb, &N, &M, &K, &alpha, B, &ldb, A, &lda, &beta, C, &ldc);
  } else {
    dgemm_(&ta, &tb, &N, &M, &K, &alpha, B, &ldb, A, &lda, &beta, C, &ldc);
  }
}

template <typename T>
T lanes_max(const Vectorized<T>& v) {
  T lanes[Vectorized<T>::size()];
  v.store(lanes);
  return *std::max_element(lanes, lanes + Vectorized<T>::size());
}

template <typename T>
T lanes_sum(const Vectorized<T>& v) {
  T lanes[Vectorized<T>::size()];
  v.store(lanes);
  T sum = 0;
  for (int n = 0; n < Vectorized<T>::size(); ++n) sum += lanes[n];
  return sum;
}

// Query rows per block: a block's scores (ROWS x L) stay within the core's cache.
int64_t rows_per_block(int64_t L) {
  const int64_t budget = 64 * 1024;  // score elements per block
  return std::clamp<int64_t>(budget / std::max<int64_t>(L, 1), 16, 128);
}

struct Band {
  const void* data;
  int64_t W, stride_b, stride_h, stride_i;  // stride 0 along a broadcast dimension
};

// Scores of rows i0 .. i1 - 1 against keys 0 .. i1 - 1 with the band added; then P = exp(s -
// shift[i]) for keys j <= i and 0 beyond. With shift null, each row's own max is the shift and
// the row is normalised, its log-sum-exp written to lse_out.
template <typename T>
void probabilities(const T* q, const T* k, const T* band, const Band& geometry, int64_t i0,
                   int64_t i1, int64_t d, T scale, const T* shift, T* lse_out, T* p) {
  using Vec = Vectorized<T>;
  const int64_t rows = i1 - i0, keys = i1, W = geometry.W;
  gemm<T>(false, true, rows, keys, d, scale, q + i0 * d, d, k, d, T(0), p, keys);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = i0 + r, seen = i + 1, lo = std::max<int64_t>(0, i - W + 1);
    T* row = p + r * keys;
    int64_t j = lo;
    if (W > 0) {
      const T* band_row = band + i * geometry.stride_i + (W - 1 - i);  // [j], j in lo .. i
      for (; j + Vec::size() <= seen; j += Vec::size()) {
        (Vec::loadu(row + j) + Vec::loadu(band_row + j)).store(row + j);
      }
      for (; j < seen; ++j) row[j] += band_row[j];
    }
    T m;
    if (shift == nullptr) {
      Vec peak(-std::numeric_limits<T>::infinity());
      j = 0;
      for (; j + Vec::size() <= seen; j += Vec::size()) peak = at::vec::maximum(peak, Vec::loadu(row + j));
      m = lanes_max(peak);
      for (; j < seen; ++j) m = std::max(m, row[j]);
    } else {
      m = shift[i];
    }
    const Vec vm(m);
    Vec total(T(0));
    j = 0;
    for (; j + Vec::size() <= seen; j += Vec::size()) {
      Vec e = (Vec::loadu(row + j) - vm).exp_u20();
      e.store(row + j);
      total = total + e;
    }
    T sum = lanes_sum(total);
    for (; j < seen; ++j) {
      row[j] = std::exp(row[j] - m);
      sum += row[j];
    }
    std::fill(row + seen, row + keys, T(0));
    if (shift == nullptr) {
      const Vec inv(T(1) / sum);
      j = 0;
      for (; j + Vec::size() <= seen; j += Vec::size()) (Vec::loadu(row + j) * inv).store(row + j);
      for (; j < seen; ++j) row[j] /= sum;
      lse_out[i] = m + std::log(sum);
    }
  }
}

template <typename T>
const T* band_of(const at::Tensor& band, const Band& g, int64_t b, int64_t h) {
  return band.data_ptr<T>() + b * g.stride_b + h * g.stride_h;
}

Band geometry_of(const at::Tensor& band, int64_t B) {
  return {band.data_ptr(), band.size(3), band.size(0) == B && B > 1 ? band.stride(0) : 0,
          band.stride(1), band.size(2) > 1 ? band.stride(2) : 0};
}

template <typename T>
void forward_kernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                    const at::Tensor& band, double scale, at::Tensor& out, at::Tensor& lse) {
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2), d = q.size(3);
  const Band g = geometry_of(band, B);
  const int64_t R = rows_per_block(L);
  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    const int previous = MKL_Set_Num_Threads_Local(1);
    std::vector<T> p(R * L);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / H, h = task % H, offset = task * L * d;
      const T* band_bh = band_of<T>(band, g, b, h);
      for (int64_t i0 = 0; i0 < L; i0 += R) {
        const int64_t i1 = std::min(i0 + R, L);
        probabilities<T>(q.data_ptr<T>() + offset, k.data_ptr<T>() + offset, band_bh, g, i0, i1,
                         d, T(scale), nullptr, lse.data_ptr<T>() + task * L, p.data());
        gemm<T>(false, false, i1 - i0, d, i1, T(1), p.data(), i1, v.data_ptr<T>() + offset, d,
                T(0), out.data_ptr<T>() + offset + i0 * d, d);
      }
    }
  });
}

template <typename T>
void backward_kernel(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                     const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                     const at::Tensor& band, double scale, at::Tensor& dq, at::Tensor& dk,
                     at::Tensor& dv, at::Tensor& dband_per_thread) {
  using Vec = Vectorized<T>;
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2), d = q.size(3);
  const Band g = geometry_of(band, B);
  const int64_t W = g.W, R = rows_per_block(L);
  const bool want_dband = dband_per_thread.defined();
  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> p(R * L), ds(R * L), minus_delta(R);
    const int64_t buffer = dband_per_thread.size(0) > 1 ? at::get_thread_num() : 0;
    T* dband_thread = want_dband ? dband_per_thread[buffer].data_ptr<T>() : nullptr;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / H, h = task % H, offset = task * L * d;
      const T *q_bh = q.data_ptr<T>() + offset, *k_bh = k.data_ptr<T>() + offset;
      const T *v_bh = v.data_ptr<T>() + offset, *do_bh = grad_out.data_ptr<T>() + offset;
      const T* o_bh = out.data_ptr<T>() + offset;
      T *dq_bh = dq.data_ptr<T>() + offset, *dk_bh = dk.data_ptr<T>() + offset;
      T* dv_bh = dv.data_ptr<T>() + offset;
      const T* band_bh = band_of<T>(band, g, b, h);
      // the thread's gradient buffer has the band's layout: (Bb, H, Lb, W), contiguous
      T* dband_bh = want_dband ? dband_thread + b * g.stride_b + h * g.stride_h : nullptr;
      for (int64_t i0 = 0; i0 < L; i0 += R) {
        const int64_t i1 = std::min(i0 + R, L), rows = i1 - i0, keys = i1;
        probabilities<T>(q_bh, k_bh, band_bh, g, i0, i1, d, T(scale),
                         lse.data_ptr<T>() + task * L, nullptr, p.data());
        gemm<T>(false, true, rows, keys, d, T(1), do_bh + i0 * d, d, v_bh, d, T(0), ds.data(),
                keys);  // dP
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t i = i0 + r, seen = i + 1;
          T delta = 0;
          for (int64_t c = 0; c < d; ++c) delta += do_bh[i * d + c] * o_bh[i * d + c];
          T* ds_row = ds.data() + r * keys;
          const T* p_row = p.data() + r * keys;
          const Vec vdelta(delta);
          int64_t j = 0;
          for (; j + Vec::size() <= seen; j += Vec::size()) {
            (Vec::loadu(p_row + j) * (Vec::loadu(ds_row + j) - vdelta)).store(ds_row + j);
          }
          for (; j < seen; ++j) ds_row[j] = p_row[j] * (ds_row[j] - delta);
          std::fill(ds_row + seen, ds_row + keys, T(0));
          if (dband_bh != nullptr && W > 0) {
            const int64_t lo = std::max<int64_t>(0, i - W + 1);
            T* dband_row = dband_bh + i * g.stride_i + (W - 1 - i);
            j = lo;
            for (; j + Vec::size() <= seen; j += Vec::size()) {
              (Vec::loadu(dband_row + j) + Vec::loadu(ds_row + j)).store(dband_row + j);
            }
            for (; j < seen; ++j) dband_row[j] += ds_row[j];
          }
        }
        gemm<T>(true, false, keys, d, rows, T(1), p.data(), keys, do_bh + i0 * d, d, T(1), dv_bh,
                d);  // dV += P^T dO
        gemm<T>(false, false, rows, d, keys, T(scale), ds.data(), keys, k_bh, d, T(0),
                dq_bh + i0 * d, d);  // dQ = scale dS K
        gemm<T>(true, false, keys, d, rows, T(scale), ds.data(), keys, q_bh + i0 * d, d, T(1),
                dk_bh, d);  // dK += scale dS^T Q
      }
    }
  });
}

void check(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
           const at::Tensor& band) {
  TORCH_CHECK(q.device().is_cpu() && q.dim() == 4 && q.is_contiguous(), "q: contiguous (B, H, L, d) on the CPU");
  TORCH_CHECK(k.sizes() == q.sizes() && v.sizes() == q.sizes(), "k, v: q's shape");
  TORCH_CHECK(k.is_contiguous() && v.is_contiguous() && band.is_contiguous(), "contiguous inputs");
  TORCH_CHECK(band.dim() == 4 && band.size(1) == q.size(1), "band: (B|1, H, L|1, W)");
  TORCH_CHECK(band.size(0) == 1 || band.size(0) == q.size(0), "band: batch 1 or B");
  TORCH_CHECK(band.size(2) == 1 || band.size(2) == q.size(2), "band: rows 1 or L");
  TORCH_CHECK(band.size(3) <= q.size(2), "band: W <= L (W = 0: no bias)");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type() &&
                  q.scalar_type() == band.scalar_type(), "one dtype");
}

}  // namespace

std::vector<at::Tensor> band_flash_forward(const at::Tensor& q, const at::Tensor& k,
                                           const at::Tensor& v, const at::Tensor& band,
                                           double scale) {
  check(q, k, v, band);
  auto out = at::empty_like(q);
  auto lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "band_flash_forward",
                             [&] { forward_kernel<scalar_t>(q, k, v, band, scale, out, lse); });
  return {out, lse};
}

std::vector<at::Tensor> band_flash_backward(const at::Tensor& grad_out, const at::Tensor& q,
                                            const at::Tensor& k, const at::Tensor& v,
                                            const at::Tensor& out, const at::Tensor& lse,
                                            const at::Tensor& band, double scale,
                                            bool band_grad) {
  check(q, k, v, band);
  TORCH_CHECK(grad_out.is_contiguous() && out.is_contiguous() && lse.is_contiguous(),
              "contiguous grad_out, out and lse");
  auto dq = at::empty_like(q);
  auto dk = at::zeros_like(q);
  auto dv = at::zeros_like(q);
  // Tasks are (batch, head) pairs: a band of its own per batch row gets each task's gradient
  // in a slice of its own; a band shared across the batch gets one buffer per thread, summed.
  const bool shared = band.size(0) == 1 && q.size(0) > 1;
  at::Tensor per_thread;
  if (band_grad) {
    std::vector<int64_t> shape{shared ? at::get_num_threads() : 1};
    for (auto size : band.sizes()) shape.push_back(size);
    per_thread = at::zeros(shape, band.options());
  }
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "band_flash_backward", [&] {
    backward_kernel<scalar_t>(grad_out, q, k, v, out, lse, band, scale, dq, dk, dv, per_thread);
  });
  at::Tensor dband = !band_grad ? at::Tensor() : shared ? per_thread.sum(0) : per_thread[0];
  return {dq, dk, dv, dband};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &band_flash_forward, "(out, lse) of causal attention with a band bias");
  m.def("backward", &band_flash_backward, "(dq, dk, dv, dband) of band_flash forward");
}
