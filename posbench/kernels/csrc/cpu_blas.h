// What posbench's C++ attention kernels share: torch's BLAS (MKL's gemm, single-threaded
// inside a kernel's own threads), row-major GEMM on top of it, reductions of torch's vector
// types, a row's max and exponentials for its softmax, and the rows per block.
#pragma once

#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

extern "C" {
void sgemm_(const char*, const char*, const int*, const int*, const int*, const float*,
            const float*, const int*, const float*, const int*, const float*, float*,
            const int*);
void dgemm_(const char*, const char*, const int*, const int*, const int*, const double*,
            const double*, const int*, const double*, const int*, const double*, double*,
            const int*);
int MKL_Set_Num_Threads_Local(int);
}

namespace posbench {

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

// exp(s - shift) of a row's logits for keys 0 .. i, in place, shift its max or a saved
// log-sum-exp; returns their sum. Keys i + 1 .. keys - 1 get 0.
template <typename T>
T row_exp(T* s, int64_t i, int64_t keys, T shift) {
  using Vec = Vectorized<T>;
  const int64_t seen = i + 1;
  const Vec vm(shift);
  Vec total(T(0));
  int64_t j = 0;
  for (; j + Vec::size() <= seen; j += Vec::size()) {
    const Vec e = (Vec::loadu(s + j) - vm).exp_u20();
    e.store(s + j);
    total = total + e;
  }
  T sum = lanes_sum(total);
  for (; j < seen; ++j) {
    s[j] = std::exp(s[j] - shift);
    sum += s[j];
  }
  std::fill(s + seen, s + keys, T(0));
  return sum;
}

// The largest of a row's first `seen` logits.
template <typename T>
T row_max(const T* s, int64_t seen) {
  using Vec = Vectorized<T>;
  Vec peak(-std::numeric_limits<T>::infinity());
  int64_t j = 0;
  for (; j + Vec::size() <= seen; j += Vec::size()) {
    peak = at::vec::maximum(peak, Vec::loadu(s + j));
  }
  T m = lanes_max(peak);
  for (; j < seen; ++j) m = std::max(m, s[j]);
  return m;
}

// Query rows per block: a block's scores (ROWS x L) stay within the core's cache.
inline int64_t rows_per_block(int64_t L) {
  const int64_t budget = 64 * 1024;  // score elements per block
  return std::clamp<int64_t>(budget / std::max<int64_t>(L, 1), 16, 128);
}

}  // namespace posbench
