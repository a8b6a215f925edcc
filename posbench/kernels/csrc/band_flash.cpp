// Causal attention with a band bias, fused on the CPU: softmax(scale * q k^T + bias) v where
// bias[b, h, i, j] = band[b|0, h, i|0, W - 1 - (p_i - p_j)] for p_i - p_j < W and 0 further
// back, p the tokens' positions: 0 .. L - 1, or drawn ones (strictly increasing). A bias of
// the distance alone (ALiBi, KERPLE) is the band with one row, W past the widest distance.
// A dense bias (B|1, H, L, L) is read by key instead: bias[b, h, i, j] itself. A band may also
// be given as products with tables by distance (DeBERTa's terms past its span): band[i, W - 1 -
// δ] = a_i . t[δ] + c_{i - δ} . u[δ]; each task forms its rows once. A bias linear in a table
// by distance along segments of each query's keys (FIRE's) is formed in the rows themselves.
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

#include "cpu_blas.h"

namespace {

using at::vec::Vectorized;
using namespace posbench;  // gemm, row_max, row_exp, rows_per_block

// The bias of one (batch, head): bias(i, j) = base(i)[index(j)] for keys near_start(i) <= j <= i
// and 0 further back, where base(i) = band row i (or the one row) + W - 1 - p_i and index(j) =
// p_j: the token's own index at plain positions, its drawn position otherwise (strictly
// increasing, so a query's keys within W positions are a contiguous run ending at itself).
// By key (a dense bias: W = L, plain positions), base(i) is band row i itself.
struct Band {
  int64_t W, stride_b, stride_h, stride_i;  // stride 0 along a broadcast dimension
  const int64_t* positions;                  // null: plain positions 0 .. L - 1
  bool by_key;                               // band[.., i, j] is bias(i, j) itself

  int64_t position(int64_t i) const { return positions == nullptr ? i : positions[i]; }

  int64_t near_start(int64_t i) const {
    if (positions == nullptr) return std::max<int64_t>(0, i - W + 1);
    return std::upper_bound(positions, positions + i + 1, positions[i] - W) - positions;
  }

  template <typename T>
  T* base(T* band_bh, int64_t i) const {
    return band_bh + i * stride_i + (by_key ? 0 : W - 1 - position(i));
  }
};

// A bias that is each query's dot product with a table (Transformer-XL's position terms):
// bias(i, j) = a_i . t[p_i - p_j] (by distance) or a_i . t[j] (by key), a (L, r) of one
// (batch, head) and t (T, r) of its head, p the tokens' positions: 0 .. L - 1 (T = L), or
// drawn ones (strictly increasing, by distance only; T past the widest distance). For a block
// it is one product g = a_rows t^T over the block's columns (the distances its rows reach, or
// its keys), read per row at p_i - p_j or at j.
template <typename T>
struct Table {
  const T* a = nullptr;  // null: no table
  const T* t = nullptr;
  int64_t r = 0;
  bool by_distance = true;
  const int64_t* positions = nullptr;  // drawn positions (by distance), or null
  T* g = nullptr;                      // scratch, rows x columns

  // The block's columns of g: its keys, or the distances 0 .. p_{i1 - 1} - p_0 its rows reach.
  int64_t columns(int64_t i0, int64_t rows, int64_t keys) const {
    if (positions == nullptr) return keys;
    return positions[i0 + rows - 1] - positions[0] + 1;
  }

  // g = a_rows t[0 .. columns - 1]^T, then row[j] += g[r', p_i - p_j] or g[r', j] for j <= i
  void add(T* p, int64_t i0, int64_t rows, int64_t keys) const {
    using Vec = Vectorized<T>;
    const int64_t n = columns(i0, rows, keys);
    gemm<T>(false, true, rows, n, r, T(1), a + i0 * r, r, t, r, T(0), g, n);
    for (int64_t rr = 0; rr < rows; ++rr) {
      const int64_t i = i0 + rr;
      T* row = p + rr * keys;
      const T* g_row = g + rr * n;
      if (positions != nullptr) {
        const T* at_query = g_row + positions[i];  // g_row[p_i - p_j] = at_query[-p_j]
        for (int64_t j = 0; j <= i; ++j) row[j] += at_query[-positions[j]];
      } else if (by_distance) {
        for (int64_t j = 0; j <= i; ++j) row[j] += g_row[i - j];
      } else {
        int64_t j = 0;
        for (; j + Vec::size() <= i + 1; j += Vec::size()) {
          (Vec::loadu(row + j) + Vec::loadu(g_row + j)).store(row + j);
        }
        for (; j <= i; ++j) row[j] += g_row[j];
      }
    }
  }

  // From dS (rows x keys, 0 past each row's own key): da_rows = dg t, dt += dg^T a_rows, where
  // dg = dS by key, or dS placed at p_i - p_j by distance (formed in the scratch; distinct
  // positions put no two keys of a row at one distance).
  void backward(const T* ds, int64_t i0, int64_t rows, int64_t keys, T* da, T* dt) const {
    const int64_t n = columns(i0, rows, keys);
    const T* dg = ds;
    if (by_distance) {
      for (int64_t rr = 0; rr < rows; ++rr) {
        const int64_t i = i0 + rr;
        T* g_row = g + rr * n;
        const T* ds_row = ds + rr * keys;
        if (positions != nullptr) {
          std::fill(g_row, g_row + n, T(0));
          T* at_query = g_row + positions[i];
          for (int64_t j = 0; j <= i; ++j) at_query[-positions[j]] = ds_row[j];
        } else {
          for (int64_t delta = 0; delta <= i; ++delta) g_row[delta] = ds_row[i - delta];
          std::fill(g_row + i + 1, g_row + keys, T(0));
        }
      }
      dg = g;
    }
    gemm<T>(false, false, rows, r, n, T(1), dg, n, t, r, T(0), da + i0 * r, r);
    gemm<T>(true, false, n, r, rows, T(1), dg, n, a + i0 * r, r, T(1), dt, r);
  }
};

// A bias linear in a table by distance along each segment of a query's keys (FIRE's): bias(i, j)
// = f[p_i - p_j] * a(i, s) + b(i, s) for the keys j of segment s of row i, segment s running
// from start(i, s) to start(i, s + 1) (the last to the query itself), a and b of one head, p
// the tokens' positions: 0 .. L - 1, or drawn ones (strictly increasing; f then gathered). A
// row's few segments cover its keys, so the bias is formed in the row as it is read and its
// gradient reduced to per-segment sums (and to the table's, by distance): nothing of size L x L.
template <typename T>
struct Segments {
  using Index = at::vec::int_same_size_t<T>;
  const int64_t* start = nullptr;  // (L, S): non-decreasing per row, null: no segments
  const T* a = nullptr;            // (L, S) of this head
  const T* b = nullptr;
  const T* f_rev = nullptr;  // (F,): f_rev[F - 1 - u] = f[u], F > every distance
  const Index* keys = nullptr;  // drawn positions less the first, or null (plain positions)
  int64_t S = 0, F = 0;

  // f_at[k(j)] = f[p_i - p_j], k(j) = j at plain positions, keys[j] at drawn ones.
  const T* f_at(int64_t i) const { return f_rev + F - 1 - (keys == nullptr ? i : keys[i]); }

  // f[p_i - p_j] for keys j .. j + n - 1 (lanes past n read f_at[0]).
  Vectorized<T> f_of(const T* at, int64_t j, int64_t n) const {
    if (keys == nullptr) return Vectorized<T>::loadu(at + j, n);
    return at::vec::gather<sizeof(T)>(at, Vectorized<Index>::loadu(keys + j, n));
  }

  // Keys lo .. hi - 1 of segment s of row i, within the row's keys 0 .. i; false once the
  // segments have passed the query (the starts do not decrease).
  bool bounds(int64_t i, int64_t s, int64_t& lo, int64_t& hi) const {
    const int64_t* row = start + i * S;
    lo = row[s];
    hi = s + 1 < S ? std::min(row[s + 1], i + 1) : i + 1;
    return lo <= i;
  }

  // row[j] += f[p_i - p_j] * a(i, s) + b(i, s) for every key j <= i, in the pass that reads the
  // row next: with shift null, its max is taken and returned (the forward pass); else row[j]
  // becomes exp(row[j] - shift), 0 past the query, and their sum is returned (P again, from
  // the saved log-sum-exp), as row_max and row_exp would. A segment's last keys are one
  // vector with its lanes past the segment masked.
  T add(T* row, int64_t i, int64_t width, const T* shift) const {
    using Vec = Vectorized<T>;
    const T* at = f_at(i);
    const bool exp = shift != nullptr;
    const Vec vm(exp ? *shift : T(0)), none(-std::numeric_limits<T>::infinity()), zero(T(0));
    Vec peak(none), total(zero);
    int64_t j, hi;
    for (int64_t s = 0; s < S && bounds(i, s, j, hi); ++s) {
      const Vec va(a[i * S + s]), vb(b[i * S + s]);
      for (; j < hi; j += Vec::size()) {
        const int64_t n = std::min<int64_t>(Vec::size(), hi - j);
        const Vec logit = Vec::loadu(row + j, n) + at::vec::fmadd(f_of(at, j, n), va, vb);
        if (exp) {
          const Vec e = (logit - vm).exp_u20();
          e.store(row + j, n);
          total = total + Vec::set(zero, e, n);
        } else {
          logit.store(row + j, n);
          peak = at::vec::maximum(peak, Vec::set(none, logit, n));
        }
      }
    }
    if (!exp) return lanes_max(peak);
    std::fill(row + i + 1, row + width, T(0));
    return lanes_sum(total);
  }

  // From row i of dS (keys 0 .. i): da(i, s) += sum dS f[p_i - p_j], db(i, s) += sum dS over
  // the segment's keys, and df_rev[F - 1 - (p_i - p_j)] += dS a(i, s) (the table's gradient,
  // reversed; at drawn positions a row's keys are at distinct distances).
  void backward(const T* ds_row, int64_t i, T* da, T* db, T* df_rev) const {
    using Vec = Vectorized<T>;
    const T* at = f_at(i);
    T* df_at = df_rev + (at - f_rev);
    int64_t j, hi;
    for (int64_t s = 0; s < S && bounds(i, s, j, hi); ++s) {
      if (j >= hi) continue;
      const Vec va(a[i * S + s]);
      Vec sum(T(0)), moment(T(0));
      for (; j < hi; j += Vec::size()) {  // lanes past the segment read as 0
        const int64_t n = std::min<int64_t>(Vec::size(), hi - j);
        const Vec g = Vec::loadu(ds_row + j, n);
        sum = sum + g;
        moment = at::vec::fmadd(g, f_of(at, j, n), moment);
        if (keys == nullptr) {
          at::vec::fmadd(g, va, Vec::loadu(df_at + j, n)).store(df_at + j, n);
        } else {
          T lanes[Vec::size()];
          (g * va).store(lanes);
          for (int64_t lane = 0; lane < n; ++lane) df_at[keys[j + lane]] += lanes[lane];
        }
      }
      da[i * S + s] += lanes_sum(moment);
      db[i * S + s] += lanes_sum(sum);
    }
  }
};

// Adds base[index(j)] to row[j] for j in lo .. seen - 1 (vectorised at plain positions).
template <typename T>
void add_band(T* row, const T* base, const Band& g, int64_t lo, int64_t seen) {
  using Vec = Vectorized<T>;
  int64_t j = lo;
  if (g.positions == nullptr) {
    for (; j + Vec::size() <= seen; j += Vec::size()) {
      (Vec::loadu(row + j) + Vec::loadu(base + j)).store(row + j);
    }
    for (; j < seen; ++j) row[j] += base[j];
  } else {
    for (; j < seen; ++j) row[j] += base[g.positions[j]];
  }
}

// A band given as products with two tables by distance, each r wide (DeBERTa's content-to-
// position and position-to-content terms): band[i, c] = a_i . t[δ] + c_j . u[δ] for key
// j = i - δ, column c = W - 1 - δ, of one (batch, head), a and c (L, r), t and u (W, r) read
// reversed (row c: distance W - 1 - c). A task forms its band (L x W) once: a t_rev^T is one
// GEMM in the band's layout; c u_rev^T puts key j's entries in row j, each moved to its query's
// row j + W - 1 - c. The backward pass reads the four gradients off the band's, dB, once per
// task: da = dB t_rev, dt_rev += dB^T a, and the same for c and u_rev after the move back.
template <typename T>
struct BandProducts {
  const T *a = nullptr, *t_rev = nullptr;  // a null: no products
  const T *c = nullptr, *u_rev = nullptr;  // c null: no key side
  int64_t L = 0, W = 0, r = 0;

  // band (L x W) = the products; key_rows (L x W) is scratch.
  void form(T* band, T* key_rows) const {
    gemm<T>(false, true, L, W, r, T(1), a, r, t_rev, r, T(0), band, W);
    if (c == nullptr) return;
    gemm<T>(false, true, L, W, r, T(1), c, r, u_rev, r, T(0), key_rows, W);
    for (int64_t i = 0; i < L; ++i) {  // row i, column col: key i - W + 1 + col
      const int64_t first = std::max<int64_t>(0, W - 1 - i);
      T* row = band + i * W;
      for (int64_t col = first; col < W; ++col) row[col] += key_rows[(i - W + 1 + col) * W + col];
    }
  }

  // From the band's gradient dband (L x W, 0 at keys before 0): da, dt_rev, dc and du_rev.
  // key_rows is scratch (L x W).
  void backward(const T* dband, T* key_rows, T* da, T* dt_rev, T* dc, T* du_rev) const {
    gemm<T>(false, false, L, r, W, T(1), dband, W, t_rev, r, T(0), da, r);
    gemm<T>(true, false, W, r, L, T(1), dband, W, a, r, T(1), dt_rev, r);
    if (c == nullptr) return;
    for (int64_t j = 0; j < L; ++j) {  // key j, column col: query j + W - 1 - col
      T* row = key_rows + j * W;
      const int64_t reached = std::min<int64_t>(W, L - j);  // queries j .. L - 1
      std::fill(row, row + W - reached, T(0));
      for (int64_t col = W - reached; col < W; ++col) row[col] = dband[(j + W - 1 - col) * W + col];
    }
    gemm<T>(false, false, L, r, W, T(1), key_rows, W, u_rev, r, T(0), dc, r);
    gemm<T>(true, false, W, r, L, T(1), key_rows, W, c, r, T(1), du_rev, r);
  }
};

// Scores of rows i0 .. i1 - 1 against keys 0 .. i1 - 1, scale * q k^T with the band added,
// then P = exp(s - shift[i]) for keys j <= i and 0 beyond; with shift null, each row's max is
// its shift and its sum goes to sums[r] (the row is left unnormalised).
template <typename T>
void probabilities(const T* q, const T* k, const T* band_bh, const Band& g,
                   const Table<T>& table, const Segments<T>& segments, int64_t i0, int64_t i1,
                   int64_t d, T scale, const T* shift, T* sums, T* p) {
  const int64_t rows = i1 - i0, keys = i1;
  gemm<T>(false, true, rows, keys, d, scale, q + i0 * d, d, k, d, T(0), p, keys);
  if (table.a != nullptr) table.add(p, i0, rows, keys);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = i0 + r, seen = i + 1;
    T* row = p + r * keys;
    if (g.W > 0) add_band(row, g.base(band_bh, i), g, g.near_start(i), seen);
    if (segments.start != nullptr && shift != nullptr) {  // P again: one pass over the row
      segments.add(row, i, keys, shift + i);
      continue;
    }
    const T m = segments.start != nullptr ? segments.add(row, i, keys, nullptr)
                : shift == nullptr        ? row_max(row, seen)
                                          : shift[i];
    const T sum = row_exp(row, i, keys, m);
    if (shift == nullptr) {
      sums[r] = sum;
      sums[rows + r] = m;
    }
  }
}

template <typename T>
T* band_of(const at::Tensor& band, const Band& g, int64_t b, int64_t h) {
  return band.data_ptr<T>() + b * g.stride_b + h * g.stride_h;
}

Band geometry_of(const at::Tensor& band, int64_t B, const at::Tensor& positions,
                 bool by_key) {
  return {band.size(3), band.size(0) == B && B > 1 ? band.stride(0) : 0, band.stride(1),
          band.size(2) > 1 ? band.stride(2) : 0,
          positions.defined() ? positions.data_ptr<int64_t>() : nullptr, by_key};
}

// The band a task forms from products: (B, H, L, W), a row per query.
Band product_geometry(const at::Tensor& product_band) {
  return {product_band.size(3), product_band.stride(0), product_band.stride(1),
          product_band.stride(2), nullptr, false};
}

// The products of a whole call: a and c (B, H, L, r), t_rev and u_rev (1|H, W, r), or none.
struct ProductInputs {
  at::Tensor a, t_rev, c, u_rev;
  int64_t L = 0, W = 0, r = 0;

  bool defined() const { return a.defined(); }
  bool key_side() const { return c.defined(); }
  int64_t table_offset(const at::Tensor& table, int64_t h) const {
    return (table.size(0) > 1 ? h : 0) * W * r;
  }

  template <typename T>
  BandProducts<T> of(int64_t task, int64_t h) const {
    BandProducts<T> products;
    products.a = a.data_ptr<T>() + task * L * r;
    products.t_rev = t_rev.data_ptr<T>() + table_offset(t_rev, h);
    if (key_side()) {
      products.c = c.data_ptr<T>() + task * L * r;
      products.u_rev = u_rev.data_ptr<T>() + table_offset(u_rev, h);
    }
    products.L = L;
    products.W = W;
    products.r = r;
    return products;
  }
};

// The table inputs of a whole call: a (B, H, L, r) and t (1|H, T, r), or none; drawn
// positions by distance, or null.
struct TableInputs {
  at::Tensor a, t;
  bool by_distance = true;
  const int64_t* positions = nullptr;
  int64_t L = 0, r = 0;

  bool defined() const { return a.defined(); }
  int64_t rows() const { return t.size(1); }  // T >= L
  int64_t table_offset(int64_t h) const { return (t.size(0) > 1 ? h : 0) * rows() * r; }
  // a block's scratch: at most R rows of T columns
  int64_t scratch_size(int64_t R) const { return defined() ? R * rows() : 0; }

  template <typename T>
  Table<T> of(int64_t task, int64_t h, T* scratch) const {
    Table<T> table;
    if (!defined()) return table;
    table.a = a.data_ptr<T>() + task * L * r;
    table.t = t.data_ptr<T>() + table_offset(h);
    table.r = r;
    table.by_distance = by_distance;
    table.positions = positions;
    table.g = scratch;
    return table;
  }
};

// The segments of a whole call: start (L, S) int64, a and b (H, L, S), the table f reversed
// (F,), or none. Their gradients go to buffers summed after: da and db (1|threads, H, L, S),
// one where each head is one thread's, and df_rev (threads, F), the heads sharing f.
struct SegmentInputs {
  at::Tensor start, a, b, f_rev;
  at::Tensor keys;  // drawn positions less the first, int32 (float) or int64 (double), or none
  int64_t L = 0, S = 0, F = 0;

  bool defined() const { return start.defined(); }

  template <typename T>
  Segments<T> of(int64_t h) const {
    Segments<T> segments;
    if (!defined()) return segments;
    if (keys.defined()) segments.keys = keys.data_ptr<typename Segments<T>::Index>();
    segments.start = start.data_ptr<int64_t>();
    segments.a = a.data_ptr<T>() + h * L * S;
    segments.b = b.data_ptr<T>() + h * L * S;
    segments.f_rev = f_rev.data_ptr<T>();
    segments.S = S;
    segments.F = F;
    return segments;
  }
};

// Where a thread adds the segments' gradients of head h (see SegmentInputs).
struct SegmentGradients {
  at::Tensor da_buffers, db_buffers, df_rev_buffers;

  template <typename T>
  void of_thread(int64_t h, int64_t L, int64_t S, T*& da, T*& db, T*& df_rev) const {
    if (!da_buffers.defined()) return;
    const int64_t thread = at::get_thread_num();
    const int64_t buffer = da_buffers.size(0) > 1 ? thread : 0;
    da = da_buffers[buffer].data_ptr<T>() + h * L * S;
    db = db_buffers[buffer].data_ptr<T>() + h * L * S;
    df_rev = df_rev_buffers[thread].data_ptr<T>();
  }
};

template <typename T>
void forward_kernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                    const at::Tensor& band, const at::Tensor& positions, bool by_key,
                    const TableInputs& tab, const ProductInputs& prod,
                    const SegmentInputs& seg, double scale, at::Tensor& out, at::Tensor& lse,
                    at::Tensor& product_band) {
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2), d = q.size(3);
  const Band g = prod.defined() ? product_geometry(product_band)
                                : geometry_of(band, B, positions, by_key);
  const int64_t R = rows_per_block(L);
  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    const int previous = MKL_Set_Num_Threads_Local(1);  // the tasks are the parallelism
    std::vector<T> p(R * L), sums(2 * R), scratch(tab.scratch_size(R));
    std::vector<T> key_rows(prod.key_side() ? L * prod.W : 0);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / H, h = task % H, offset = task * L * d;
      const T* band_bh;
      if (prod.defined()) {  // this task's rows of the product band, formed here
        T* formed = band_of<T>(product_band, g, b, h);
        prod.of<T>(task, h).form(formed, key_rows.data());
        band_bh = formed;
      } else {
        band_bh = band_of<T>(band, g, b, h);
      }
      const Table<T> table = tab.of<T>(task, h, scratch.data());
      const Segments<T> segments = seg.of<T>(h);
      T* out_bh = out.data_ptr<T>() + offset;
      T* lse_bh = lse.data_ptr<T>() + task * L;
      for (int64_t i0 = 0; i0 < L; i0 += R) {
        const int64_t i1 = std::min(i0 + R, L), rows = i1 - i0;
        probabilities<T>(q.data_ptr<T>() + offset, k.data_ptr<T>() + offset, band_bh, g, table,
                         segments, i0, i1, d, T(scale), nullptr, sums.data(), p.data());
        gemm<T>(false, false, rows, d, i1, T(1), p.data(), i1, v.data_ptr<T>() + offset, d,
                T(0), out_bh + i0 * d, d);
        for (int64_t r = 0; r < rows; ++r) {  // normalise the (rows, d) output, not P
          const T inverse = T(1) / sums[r];
          for (int64_t c = 0; c < d; ++c) out_bh[(i0 + r) * d + c] *= inverse;
          lse_bh[i0 + r] = sums[rows + r] + std::log(sums[r]);
        }
      }
    }
    MKL_Set_Num_Threads_Local(previous);
  });
}

// The gradients of a call's products: da and dc (B, H, L, r), every row written, and buffers
// of dt_rev and du_rev per thread, summed after.
struct ProductGradients {
  at::Tensor da, dc, dt_rev_buffers, du_rev_buffers;

  template <typename T>
  T* thread_buffer(const at::Tensor& buffers) const {
    return buffers.defined() ? buffers[at::get_thread_num()].data_ptr<T>() : nullptr;
  }
};

template <typename T>
void backward_kernel(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                     const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                     const at::Tensor& band, const at::Tensor& positions, bool by_key,
                     const TableInputs& tab, const ProductInputs& prod, double scale,
                     at::Tensor& dq, at::Tensor& dk, at::Tensor& dv, at::Tensor& dband_buffers,
                     bool by_head, bool rows_own, at::Tensor& da, at::Tensor& dtable_buffers,
                     const ProductGradients& dprod, const SegmentInputs& seg,
                     const SegmentGradients& dseg) {
  using Vec = Vectorized<T>;
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2), d = q.size(3);
  // With products, band is the product band the forward pass formed.
  const Band g = prod.defined() ? product_geometry(band) : geometry_of(band, B, positions, by_key);
  const int64_t R = rows_per_block(L);
  const bool want_dband = dband_buffers.defined() && g.W > 0;
  // By head (a dense bias shared across the batch): each head is one thread's, its batch
  // entries in turn (t = h * B + b); the first writes the head's gradient, zeros above the
  // diagonal included, and the rest add to it, so no buffer is zeroed or summed. With rows
  // own (a row per query and batch entry), every task writes its rows once, the same way.
  const int64_t per_unit = by_head ? B : 1;
  at::parallel_for(0, B * H / per_unit, 1, [&](int64_t begin, int64_t end) {
    const int previous = MKL_Set_Num_Threads_Local(1);  // the tasks are the parallelism
    std::vector<T> p(R * L), ds(R * L), scratch(tab.scratch_size(R));
    // a buffer per thread where the band is shared across the batch, else one (the tasks'
    // slices of it are disjoint); it has the band's contiguous layout
    const int64_t buffer = dband_buffers.defined() && dband_buffers.size(0) > 1
                               ? at::get_thread_num() : 0;
    T* dband_thread = want_dband ? dband_buffers[buffer].data_ptr<T>() : nullptr;
    T* dtable_thread = tab.defined() ? dtable_buffers[at::get_thread_num()].data_ptr<T>() : nullptr;
    // a task's product band gradient (L x W), every entry written, and the tables' buffers
    std::vector<T> dproduct(prod.defined() ? L * prod.W : 0), key_rows(dproduct.size());
    T* dt_rev_thread = dprod.thread_buffer<T>(dprod.dt_rev_buffers);
    T* du_rev_thread = dprod.thread_buffer<T>(dprod.du_rev_buffers);
    for (int64_t t = begin * per_unit; t < end * per_unit; ++t) {
      const int64_t task = by_head ? (t % B) * H + t / B : t;
      const bool assign = prod.defined() || rows_own || (by_head && t % B == 0);
      const int64_t b = task / H, h = task % H, offset = task * L * d;
      const T *q_bh = q.data_ptr<T>() + offset, *k_bh = k.data_ptr<T>() + offset;
      const T *v_bh = v.data_ptr<T>() + offset, *do_bh = grad_out.data_ptr<T>() + offset;
      const T* o_bh = out.data_ptr<T>() + offset;
      T *dq_bh = dq.data_ptr<T>() + offset, *dk_bh = dk.data_ptr<T>() + offset;
      T* dv_bh = dv.data_ptr<T>() + offset;
      const T* band_bh = band_of<T>(band, g, b, h);
      T* dband_bh = prod.defined() ? dproduct.data()
                    : want_dband  ? dband_thread + b * g.stride_b + h * g.stride_h
                                  : nullptr;
      const Table<T> table = tab.of<T>(task, h, scratch.data());
      const Segments<T> segments = seg.of<T>(h);
      T *dseg_a = nullptr, *dseg_b = nullptr, *dseg_f_rev = nullptr;
      dseg.of_thread<T>(h, L, seg.S, dseg_a, dseg_b, dseg_f_rev);
      for (int64_t i0 = 0; i0 < L; i0 += R) {
        const int64_t i1 = std::min(i0 + R, L), rows = i1 - i0, keys = i1;
        probabilities<T>(q_bh, k_bh, band_bh, g, table, segments, i0, i1, d, T(scale),
                         lse.data_ptr<T>() + task * L, nullptr, p.data());
        gemm<T>(false, true, rows, keys, d, T(1), do_bh + i0 * d, d, v_bh, d, T(0), ds.data(),
                keys);  // dP
        for (int64_t r = 0; r < rows; ++r) {  // dS = P * (dP - rowsum(dO * O)), in place
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
          if (dseg_a != nullptr) segments.backward(ds_row, i, dseg_a, dseg_b, dseg_f_rev);
          if (dband_bh != nullptr) {  // the bias's gradient is dS: summed into the band
            T* base = g.base(dband_bh, i);
            const int64_t lo = g.near_start(i);
            if (assign) {  // the row's entries: keys i - W + 1 .. i (by key: 0 .. L - 1)
              const int64_t from = g.by_key ? 0 : i - g.W + 1, to = g.by_key ? L : seen;
              std::fill(base + from, base + lo, T(0));
              std::copy(ds_row + lo, ds_row + seen, base + lo);
              std::fill(base + seen, base + to, T(0));
            } else if (g.positions == nullptr) {
              j = lo;
              for (; j + Vec::size() <= seen; j += Vec::size()) {
                (Vec::loadu(base + j) + Vec::loadu(ds_row + j)).store(base + j);
              }
              for (; j < seen; ++j) base[j] += ds_row[j];
            } else {  // distinct positions: no two keys of a row share an entry
              for (j = lo; j < seen; ++j) base[g.positions[j]] += ds_row[j];
            }
          }
        }
        if (table.a != nullptr) {
          table.backward(ds.data(), i0, rows, keys, da.data_ptr<T>() + task * L * tab.r,
                         dtable_thread + tab.table_offset(h));
        }
        gemm<T>(true, false, keys, d, rows, T(1), p.data(), keys, do_bh + i0 * d, d, T(1), dv_bh,
                d);  // dV += P^T dO
        gemm<T>(false, false, rows, d, keys, T(scale), ds.data(), keys, k_bh, d, T(0),
                dq_bh + i0 * d, d);  // dQ = scale dS K
        gemm<T>(true, false, keys, d, rows, T(scale), ds.data(), keys, q_bh + i0 * d, d, T(1),
                dk_bh, d);  // dK += scale dS^T Q
      }
      if (prod.defined()) {
        const int64_t rows_at = task * L * prod.r;
        prod.of<T>(task, h).backward(
            dproduct.data(), key_rows.data(), dprod.da.data_ptr<T>() + rows_at,
            dt_rev_thread + prod.table_offset(prod.t_rev, h),
            prod.key_side() ? dprod.dc.data_ptr<T>() + rows_at : nullptr,
            prod.key_side() ? du_rev_thread + prod.table_offset(prod.u_rev, h) : nullptr);
      }
    }
    MKL_Set_Num_Threads_Local(previous);
  });
}

void check(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
           const at::Tensor& band, const at::Tensor& positions, bool by_key) {
  TORCH_CHECK(q.device().is_cpu() && q.dim() == 4, "q: (B, H, L, d) on the CPU");
  TORCH_CHECK(k.sizes() == q.sizes() && v.sizes() == q.sizes(), "k, v: q's shape");
  TORCH_CHECK(q.is_contiguous() && k.is_contiguous() && v.is_contiguous() &&
                  band.is_contiguous(), "contiguous q, k, v and band");
  TORCH_CHECK(band.dim() == 4 && band.size(1) == q.size(1), "band: (B|1, H, L|1, W)");
  TORCH_CHECK(band.size(0) == 1 || band.size(0) == q.size(0), "band: batch 1 or B");
  TORCH_CHECK(band.size(2) == 1 || band.size(2) == q.size(2), "band: rows 1 or L");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type() &&
                  q.scalar_type() == band.scalar_type(), "one dtype");
  if (by_key) {
    TORCH_CHECK(!positions.defined() && band.size(2) == q.size(2) && band.size(3) == q.size(2),
                "a dense bias: (B|1, H, L, L), no positions");
  } else if (positions.defined()) {
    TORCH_CHECK(positions.scalar_type() == at::kLong && positions.is_contiguous() &&
                    positions.dim() == 1 && positions.size(0) == q.size(2),
                "positions: (L,) int64, strictly increasing");
    const int64_t* p = positions.data_ptr<int64_t>();
    for (int64_t i = 1; i < positions.size(0); ++i) {
      TORCH_CHECK(p[i] > p[i - 1], "positions: strictly increasing");  // indexes read by p_i - p_j
    }
  } else {
    TORCH_CHECK(band.size(3) <= q.size(2), "band: W <= L (W = 0: no bias)");
  }
}

at::Tensor defined_or_empty(const std::optional<at::Tensor>& tensor) {
  return tensor.has_value() ? *tensor : at::Tensor();
}

TableInputs table_inputs(const at::Tensor& q, const std::optional<at::Tensor>& a,
                         const std::optional<at::Tensor>& table, bool by_distance,
                         const at::Tensor& positions) {
  TableInputs tab;
  if (!a.has_value()) return tab;
  tab.a = *a;
  tab.t = *table;
  tab.by_distance = by_distance;
  tab.L = q.size(2);
  tab.r = tab.a.size(3);
  TORCH_CHECK(tab.a.dim() == 4 && tab.a.size(0) == q.size(0) && tab.a.size(1) == q.size(1) &&
                  tab.a.size(2) == q.size(2) && tab.a.is_contiguous(),
              "a: contiguous (B, H, L, r)");
  TORCH_CHECK(tab.t.dim() == 3 && (tab.t.size(0) == 1 || tab.t.size(0) == q.size(1)) &&
                  tab.t.size(2) == tab.r && tab.t.is_contiguous(),
              "table: contiguous (1|H, T, r)");
  if (by_distance && positions.defined()) {  // strictly increasing: check() saw to it
    const int64_t* p = positions.data_ptr<int64_t>();
    TORCH_CHECK(tab.t.size(1) >= p[tab.L - 1] - p[0] + 1,
                "table by distance at drawn positions: T > p_last - p_first");
    tab.positions = p;
  } else {
    TORCH_CHECK(tab.t.size(1) == tab.L, "table: (1|H, L, r) at plain positions or by key");
  }
  TORCH_CHECK(tab.a.scalar_type() == q.scalar_type() && tab.t.scalar_type() == q.scalar_type(),
              "one dtype");
  return tab;
}

// A factor (B, H, L, r) and its table by distance (1|H, W, r), checked; the table reversed.
void check_product(const at::Tensor& q, const at::Tensor& factor, const at::Tensor& table,
                   int64_t W, int64_t r) {
  TORCH_CHECK(factor.dim() == 4 && factor.size(0) == q.size(0) && factor.size(1) == q.size(1) &&
                  factor.size(2) == q.size(2) && factor.size(3) == r && factor.is_contiguous(),
              "a product's factor: contiguous (B, H, L, r)");
  TORCH_CHECK(table.dim() == 3 && (table.size(0) == 1 || table.size(0) == q.size(1)) &&
                  table.size(1) == W && table.size(2) == r,
              "a product's table: (1|H, W, r), W <= L");
  TORCH_CHECK(factor.scalar_type() == q.scalar_type() && table.scalar_type() == q.scalar_type(),
              "one dtype");
}

// The band products (a, t) and (c, u), each table by distance (1|H, W, r); c optional. They
// replace the band (W = 0) and take plain positions.
ProductInputs product_inputs(const at::Tensor& q, const at::Tensor& band,
                             const at::Tensor& positions, bool by_key,
                             const std::optional<at::Tensor>& a,
                             const std::optional<at::Tensor>& t,
                             const std::optional<at::Tensor>& c,
                             const std::optional<at::Tensor>& u) {
  ProductInputs prod;
  if (!a.has_value()) return prod;
  TORCH_CHECK(band.size(3) == 0 && !positions.defined() && !by_key,
              "band products: no band beside them, plain positions");
  prod.L = q.size(2);
  prod.r = a->size(3);
  prod.W = t->size(1);
  TORCH_CHECK(prod.W >= 1 && prod.W <= prod.L, "band products: 1 <= W <= L");
  check_product(q, *a, *t, prod.W, prod.r);
  prod.a = *a;
  prod.t_rev = t->flip(1).contiguous();
  if (c.has_value()) {
    check_product(q, *c, *u, prod.W, prod.r);
    prod.c = *c;
    prod.u_rev = u->flip(1).contiguous();
  }
  return prod;
}

// The segments (FIRE's bias): start (L, S) int64, a and b (H, L, S), f (F,) by distance with
// F past the widest distance. They replace the band (W = 0), at plain or drawn positions.
SegmentInputs segment_inputs(const at::Tensor& q, const at::Tensor& band,
                             const at::Tensor& positions, bool by_key,
                             const std::optional<at::Tensor>& start,
                             const std::optional<at::Tensor>& a,
                             const std::optional<at::Tensor>& b,
                             const std::optional<at::Tensor>& f) {
  SegmentInputs seg;
  if (!start.has_value()) return seg;
  TORCH_CHECK(a.has_value() && b.has_value() && f.has_value(), "segments: start, a, b and f");
  TORCH_CHECK(band.size(3) == 0 && !by_key, "segments: no band beside them");
  const int64_t H = q.size(1), L = q.size(2);
  TORCH_CHECK(start->scalar_type() == at::kLong && start->dim() == 2 && start->size(0) == L &&
                  start->is_contiguous(), "segment starts: contiguous (L, S) int64");
  seg.L = L;
  seg.S = start->size(1);
  for (const auto* t : {&*a, &*b}) {
    TORCH_CHECK(t->dim() == 3 && t->size(0) == H && t->size(1) == L && t->size(2) == seg.S &&
                    t->is_contiguous() && t->scalar_type() == q.scalar_type(),
                "segment values: contiguous (H, L, S) of q's dtype");
  }
  int64_t widest = L - 1;
  if (positions.defined()) {  // strictly increasing: check() saw to it
    const at::Tensor relative = positions - positions[0];
    widest = relative[L - 1].item<int64_t>();
    seg.keys = relative.to(q.scalar_type() == at::kFloat ? at::kInt : at::kLong).contiguous();
  }
  TORCH_CHECK(f->dim() == 1 && f->size(0) > widest && f->scalar_type() == q.scalar_type(),
              "segment table: (F,) past the widest distance, of q's dtype");
  seg.start = *start;
  seg.a = *a;
  seg.b = *b;
  seg.f_rev = f->flip(0).contiguous();
  seg.F = f->size(0);
  return seg;
}

}  // namespace

std::vector<at::Tensor> band_flash_forward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& band,
    const std::optional<at::Tensor>& positions, bool by_key, const std::optional<at::Tensor>& a,
    const std::optional<at::Tensor>& table, bool by_distance,
    const std::optional<at::Tensor>& band_a, const std::optional<at::Tensor>& band_t,
    const std::optional<at::Tensor>& band_c, const std::optional<at::Tensor>& band_u,
    const std::optional<at::Tensor>& seg_start, const std::optional<at::Tensor>& seg_a,
    const std::optional<at::Tensor>& seg_b, const std::optional<at::Tensor>& seg_f,
    double scale) {
  const at::Tensor pos = defined_or_empty(positions);
  check(q, k, v, band, pos, by_key);
  const TableInputs tab = table_inputs(q, a, table, by_distance, pos);
  const ProductInputs prod = product_inputs(q, band, pos, by_key, band_a, band_t, band_c, band_u);
  const SegmentInputs seg = segment_inputs(q, band, pos, by_key, seg_start, seg_a, seg_b, seg_f);
  auto out = at::empty_like(q);
  auto lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options());
  at::Tensor product_band;  // the band the products form, kept for the backward pass
  if (prod.defined()) product_band = at::empty({q.size(0), q.size(1), q.size(2), prod.W},
                                               q.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "band_flash_forward", [&] {
    forward_kernel<scalar_t>(q, k, v, band, pos, by_key, tab, prod, seg, scale, out, lse,
                             product_band);
  });
  return {out, lse, product_band};
}

std::vector<at::Tensor> band_flash_backward(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const at::Tensor& band,
    const std::optional<at::Tensor>& positions, bool by_key, const std::optional<at::Tensor>& a,
    const std::optional<at::Tensor>& table, bool by_distance,
    const std::optional<at::Tensor>& band_a, const std::optional<at::Tensor>& band_t,
    const std::optional<at::Tensor>& band_c, const std::optional<at::Tensor>& band_u,
    const std::optional<at::Tensor>& seg_start, const std::optional<at::Tensor>& seg_a,
    const std::optional<at::Tensor>& seg_b, const std::optional<at::Tensor>& seg_f,
    const std::optional<at::Tensor>& product_band, double scale, bool band_grad) {
  const at::Tensor pos = defined_or_empty(positions);
  check(q, k, v, band, pos, by_key);
  const TableInputs tab = table_inputs(q, a, table, by_distance, pos);
  const ProductInputs prod = product_inputs(q, band, pos, by_key, band_a, band_t, band_c, band_u);
  const SegmentInputs seg = segment_inputs(q, band, pos, by_key, seg_start, seg_a, seg_b, seg_f);
  TORCH_CHECK(grad_out.is_contiguous() && out.is_contiguous() && lse.is_contiguous(),
              "contiguous grad_out, out and lse");
  TORCH_CHECK(!prod.defined() || product_band.has_value(), "band products: the product band");
  // With products, the kernel reads the band the forward pass formed; the given band is empty.
  const at::Tensor read_band = prod.defined() ? *product_band : band;
  auto dq = at::empty_like(q);
  auto dk = at::zeros_like(q);
  auto dv = at::zeros_like(q);
  // Tasks are (batch, head) pairs: a band of its own per batch entry gets each task's gradient
  // in a slice of its own; a band shared across the batch gets one buffer per thread, summed.
  // A dense bias shared across the batch goes by head where the heads share out evenly.
  const bool shared = band.size(0) == 1 && q.size(0) > 1;
  // So do segments (their values are per head), their gradients then in one buffer.
  const bool by_head = ((band_grad && shared && by_key) || seg.defined()) &&
                       q.size(1) % at::get_num_threads() == 0;
  // A row per query and batch entry: each task writes its own rows once, nothing to zero.
  const bool rows_own = band.size(2) == q.size(2) && !shared && !pos.defined();
  at::Tensor band_buffers, da, table_buffers;
  if (band_grad && !prod.defined()) {
    std::vector<int64_t> shape{shared && !by_head ? at::get_num_threads() : 1};
    for (auto size : band.sizes()) shape.push_back(size);
    band_buffers = by_head || rows_own ? at::empty(shape, band.options())
                                       : at::zeros(shape, band.options());
  }
  if (tab.defined()) {  // every row of da is written; the table is shared across the batch
    da = at::empty_like(tab.a);
    table_buffers = at::zeros({at::get_num_threads(), tab.t.size(0), tab.rows(), tab.r},
                              tab.t.options());
  }
  ProductGradients dprod;
  if (prod.defined()) {
    const auto buffers = [](const at::Tensor& table) {
      return at::zeros({at::get_num_threads(), table.size(0), table.size(1), table.size(2)},
                       table.options());
    };
    dprod.da = at::empty_like(prod.a);
    dprod.dt_rev_buffers = buffers(prod.t_rev);
    if (prod.key_side()) {
      dprod.dc = at::empty_like(prod.c);
      dprod.du_rev_buffers = buffers(prod.u_rev);
    }
  }
  SegmentGradients dseg;
  if (seg.defined()) {
    const int64_t threads = at::get_num_threads();
    dseg.da_buffers = at::zeros({by_head ? 1 : threads, q.size(1), seg.L, seg.S}, q.options());
    dseg.db_buffers = at::zeros_like(dseg.da_buffers);
    dseg.df_rev_buffers = at::zeros({threads, seg.F}, q.options());
  }
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "band_flash_backward", [&] {
    backward_kernel<scalar_t>(grad_out, q, k, v, out, lse, read_band, pos, by_key, tab, prod,
                              scale, dq, dk, dv, band_buffers, by_head, rows_own, da,
                              table_buffers, dprod, seg, dseg);
  });
  at::Tensor dband;
  if (band_grad && !prod.defined()) {
    dband = shared && !by_head ? band_buffers.sum(0) : band_buffers[0];
  }
  at::Tensor dtable = tab.defined() ? table_buffers.sum(0) : at::Tensor();
  const auto table_gradient = [](const at::Tensor& buffers) {  // summed, by distance again
    return buffers.defined() ? buffers.sum(0).flip(1) : at::Tensor();
  };
  at::Tensor dseg_a, dseg_b, dseg_f;
  if (seg.defined()) {
    const auto summed = [](const at::Tensor& buffers) {
      return buffers.size(0) > 1 ? buffers.sum(0) : buffers[0];
    };
    dseg_a = summed(dseg.da_buffers);
    dseg_b = summed(dseg.db_buffers);
    dseg_f = dseg.df_rev_buffers.sum(0).flip(0);
  }
  return {dq, dk, dv, dband, da, dtable, dprod.da, table_gradient(dprod.dt_rev_buffers),
          dprod.dc, table_gradient(dprod.du_rev_buffers), dseg_a, dseg_b, dseg_f};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &band_flash_forward,
        "(out, lse, product band) of causal attention with a bias");
  m.def("backward", &band_flash_backward,
        "(dq, dk, dv, dband, da, dtable, d band_a, d band_t, d band_c, d band_u, d seg_a, "
        "d seg_b, d seg_f) of forward");
}
