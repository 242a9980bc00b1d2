// The CPU linear-recurrence kernels: rows of z_i = A_i z_{i -/+ 1} + B_i, with the
// element access of eqgp::RecurrenceOp (recurrence_op.h). A scalar path that keeps a
// few rows' dependency chains in flight, and an AVX2/FMA path (one row per SIMD lane)
// chosen at run time, since the extension is built for a generic x86-64 target.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#endif

#include "cpu_scratch.h"
#include "recurrence_op.h"

namespace eqgp::cpu {

template <typename T, bool Fma>
inline __attribute__((always_inline)) T Step(T a, T acc, T b) {
  if constexpr (Fma) return std::fma(a, acc, b);
  return a * acc + b;
}

// R rows advance together over positions [p0, p1) (in scan order) so that R
// serial dependency chains are in flight.
template <typename T, int R, bool Reverse, bool Fma, class O>
inline __attribute__((always_inline)) void ScalarSpan(const O& op, int64_t row0, T* acc, int64_t p0,
                                                      int64_t p1) {
  const int64_t n = op.n;
  for (int64_t k = p0; k < p1; ++k) {
    const int64_t p = Reverse ? p1 - 1 - (k - p0) : k;
    for (int r = 0; r < R; ++r) {
      const int64_t e = (row0 + r) * n + p;
      acc[r] = Step<T, Fma>(op.A(e, p), acc[r], op.B(e, p));
      op.Put(e, p, acc[r]);
    }
  }
}

// R is small: rows are n elements apart, and for power-of-two n every stream
// maps to the same L1 set (R = 8 thrashed L1 in the prototype at n = 4096).
template <typename T, int R, bool Reverse, bool Fma, class O>
inline __attribute__((always_inline)) void RecurGroup(const O& op, int64_t row0) {
  T acc[R];
  for (int r = 0; r < R; ++r) acc[r] = T(0);
  ScalarSpan<T, R, Reverse, Fma>(op, row0, acc, 0, op.n);
}

constexpr int kInterleave = 4;

template <typename T, bool Reverse, bool Fma, class O>
inline __attribute__((always_inline)) void RecurRowsImpl(const O& op, int64_t r0, int64_t r1) {
  int64_t r = r0;
  for (; r + kInterleave <= r1; r += kInterleave) RecurGroup<T, kInterleave, Reverse, Fma>(op, r);
  for (; r < r1; ++r) RecurGroup<T, 1, Reverse, Fma>(op, r);
}

#if defined(__GNUC__) && defined(__x86_64__)
// AVX2 + FMA: W rows at once (8 float32 or 4 float64), one row per SIMD lane. A
// block of W rows x W positions is loaded row-wise (contiguous), transposed in
// registers so that vector j holds position j of all W rows, advanced by W vector
// FMAs, transposed back and stored. The edges of a row (where a neighbour access
// would leave it) go through the scalar path, carrying the same per-row states.
#define EQGP_AVX2 __attribute__((target("avx2,fma")))

template <typename T>
struct Avx2;

template <>
struct Avx2<float> {
  using V = __m256;
  static constexpr int W = 8;
  EQGP_AVX2 static V Load(const float* p) { return _mm256_loadu_ps(p); }
  EQGP_AVX2 static void Store(float* p, V v) { _mm256_storeu_ps(p, v); }
  EQGP_AVX2 static V LoadState(const float* p) { return _mm256_load_ps(p); }
  EQGP_AVX2 static void StoreState(float* p, V v) { _mm256_store_ps(p, v); }
  EQGP_AVX2 static V One() { return _mm256_set1_ps(1.0f); }
  EQGP_AVX2 static V Add(V a, V b) { return _mm256_add_ps(a, b); }
  EQGP_AVX2 static V Mul(V a, V b) { return _mm256_mul_ps(a, b); }
  EQGP_AVX2 static V Fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  EQGP_AVX2 static void Transpose(V* v) {
    const V t0 = _mm256_unpacklo_ps(v[0], v[1]), t1 = _mm256_unpackhi_ps(v[0], v[1]);
    const V t2 = _mm256_unpacklo_ps(v[2], v[3]), t3 = _mm256_unpackhi_ps(v[2], v[3]);
    const V t4 = _mm256_unpacklo_ps(v[4], v[5]), t5 = _mm256_unpackhi_ps(v[4], v[5]);
    const V t6 = _mm256_unpacklo_ps(v[6], v[7]), t7 = _mm256_unpackhi_ps(v[6], v[7]);
    const V s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    const V s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    const V s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    const V s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    v[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
    v[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
    v[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
    v[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
    v[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
    v[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
    v[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
    v[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
  }
};

template <>
struct Avx2<double> {
  using V = __m256d;
  static constexpr int W = 4;
  EQGP_AVX2 static V Load(const double* p) { return _mm256_loadu_pd(p); }
  EQGP_AVX2 static void Store(double* p, V v) { _mm256_storeu_pd(p, v); }
  EQGP_AVX2 static V LoadState(const double* p) { return _mm256_load_pd(p); }
  EQGP_AVX2 static void StoreState(double* p, V v) { _mm256_store_pd(p, v); }
  EQGP_AVX2 static V One() { return _mm256_set1_pd(1.0); }
  EQGP_AVX2 static V Add(V a, V b) { return _mm256_add_pd(a, b); }
  EQGP_AVX2 static V Mul(V a, V b) { return _mm256_mul_pd(a, b); }
  EQGP_AVX2 static V Fma(V a, V b, V c) { return _mm256_fmadd_pd(a, b, c); }
  EQGP_AVX2 static void Transpose(V* v) {
    const V t0 = _mm256_unpacklo_pd(v[0], v[1]), t1 = _mm256_unpackhi_pd(v[0], v[1]);
    const V t2 = _mm256_unpacklo_pd(v[2], v[3]), t3 = _mm256_unpackhi_pd(v[2], v[3]);
    v[0] = _mm256_permute2f128_pd(t0, t2, 0x20);
    v[1] = _mm256_permute2f128_pd(t1, t3, 0x20);
    v[2] = _mm256_permute2f128_pd(t0, t2, 0x31);
    v[3] = _mm256_permute2f128_pd(t1, t3, 0x31);
  }
};

// Positions [base, base + W) of rows row0 .. row0 + W - 1; `acc` holds the W states.
// SameAB: a and b are one array (sumcumprod's forward), loaded and transposed once.
template <typename T, bool Reverse, bool SameAB, bool AShift, bool BScale, bool PostScale>
EQGP_AVX2 inline void SimdBlock(const RecurrenceOp<T, AShift, BScale, PostScale>& op, int64_t row0, int64_t base,
                                typename Avx2<T>::V& acc) {
  static_assert(!SameAB || (!AShift && !BScale), "a and b are only shared unshifted and unscaled");
  using S = Avx2<T>;
  constexpr int W = S::W;
  const int64_t n = op.n;
  const typename S::V one = S::One();
  typename S::V va[W], vb[W];
  for (int q = 0; q < W; ++q) {
    const int64_t e = (row0 + q) * n + base;
    va[q] = S::Load(op.a + e - (AShift ? 1 : 0));
    if constexpr (!SameAB) vb[q] = S::Load(op.b + e);
    if constexpr (BScale) vb[q] = S::Mul(vb[q], S::Add(one, S::Load(op.z + e + 1)));
  }
  S::Transpose(va);
  if constexpr (SameAB) {
    for (int q = 0; q < W; ++q) vb[q] = va[q];
  } else {
    S::Transpose(vb);
  }
  if constexpr (Reverse) {
    for (int j = W - 1; j >= 0; --j) vb[j] = acc = S::Fma(va[j], acc, vb[j]);
  } else {
    for (int j = 0; j < W; ++j) vb[j] = acc = S::Fma(va[j], acc, vb[j]);
  }
  S::Transpose(vb);
  for (int q = 0; q < W; ++q) {
    const int64_t e = (row0 + q) * n + base;
    typename S::V v = vb[q];
    if constexpr (PostScale) v = S::Mul(v, S::Add(one, S::Load(op.z + e + 1)));
    S::Store(op.out + e, v);
  }
}

template <typename T, bool Reverse, bool SameAB, bool AShift, bool BScale, bool PostScale>
EQGP_AVX2 inline void SimdBlocks(const RecurrenceOp<T, AShift, BScale, PostScale>& op, int64_t row0, int64_t b0,
                                 int64_t blocks, typename Avx2<T>::V& acc) {
  constexpr int W = Avx2<T>::W;
  for (int64_t k = 0; k < blocks; ++k) {
    const int64_t base = Reverse ? b0 + W * (blocks - 1 - k) : b0 + W * k;
    SimdBlock<T, Reverse, SameAB>(op, row0, base, acc);
  }
}

template <typename T, bool Reverse, bool AShift, bool BScale, bool PostScale>
EQGP_AVX2 void SimdRows(const RecurrenceOp<T, AShift, BScale, PostScale>& op, int64_t row0) {
  using S = Avx2<T>;
  constexpr int W = S::W;
  const int64_t n = op.n;
  // Blocks cover the W-aligned positions of the safe range; the scalar path takes
  // the edges, one span before the blocks in scan order and one after.
  const int64_t b0 = std::min(n, (op.SafeLo() + W - 1) / W * W), b1 = std::max(b0, op.SafeHi() / W * W);
  const int64_t blocks = (b1 - b0) / W;
  alignas(32) T acc[W] = {};
  const int64_t first0 = Reverse ? b1 : 0, first1 = Reverse ? n : b0;
  ScalarSpan<T, W, Reverse, true>(op, row0, acc, first0, first1);
  typename S::V vacc = S::LoadState(acc);
  bool same_ab = false;
  if constexpr (!AShift && !BScale) same_ab = op.a == op.b;
  if (same_ab) {
    if constexpr (!AShift && !BScale) SimdBlocks<T, Reverse, true>(op, row0, b0, blocks, vacc);
  } else {
    SimdBlocks<T, Reverse, false>(op, row0, b0, blocks, vacc);
  }
  S::StoreState(acc, vacc);
  const int64_t last0 = Reverse ? 0 : b1, last1 = Reverse ? b0 : n;
  ScalarSpan<T, W, Reverse, true>(op, row0, acc, last0, last1);
}

// A row that has no SIMD group (a vector, the last rows of a batch) runs one
// dependent FMA per element, 4 cycles each. Split into W pieces of n / W laid side by
// side as the SIMD path's rows, it runs W at a time: each piece's recurrence with a
// zero carry-in (`local`), the products Q_k of `a` from the piece's start (in scan
// order) to k (the recurrence with b = a at each piece's first position, zero
// elsewhere), then, piece after piece in scan order, z_k = local_k + Q_k carry with
// the carry the previous piece's last value. Plain recurrences with n % W == 0.
constexpr int64_t kSegmentMin = 256;

template <typename T>
inline bool Segmentable(int64_t n) {  // up to rows whose scratch stays with the thread
  return n >= kSegmentMin && n % Avx2<T>::W == 0 && 2 * n <= static_cast<int64_t>(kScratchKeep);
}

template <typename T, bool Reverse>
EQGP_AVX2 void SegmentedRow(const PlainOp<T>& op, int64_t row) {
  constexpr int W = Avx2<T>::W;
  const int64_t n = op.n, len = n / W;
  const T* a = op.a + row * n;
  T* out = op.out + row * n;
  Scratch<T> scratch(static_cast<size_t>(2 * n));
  T* first = scratch.data();  // b = a at each piece's first scan position
  T* q = first + n;
  std::fill(first, first + n, T(0));
  for (int s = 0; s < W; ++s) {
    const int64_t k = Reverse ? s * len + len - 1 : s * len;
    first[k] = a[k];
  }
  SimdRows<T, Reverse>(PlainOp<T>{a, op.b + row * n, nullptr, out, len}, 0);
  SimdRows<T, Reverse>(PlainOp<T>{a, first, nullptr, q, len}, 0);
  T carry = T(0);
  for (int i = 0; i < W; ++i) {
    const int s = Reverse ? W - 1 - i : i;
    T* o = out + s * len;
    const T* qs = q + s * len;
    if (carry != T(0)) {  // skipped at zero: Q may be inf where the carry is 0
      for (int64_t k = 0; k < len; ++k) o[k] = std::fma(qs[k], carry, o[k]);
    }
    carry = Reverse ? o[0] : o[len - 1];
  }
}

template <typename T, bool Reverse, class O>
EQGP_AVX2 void RecurRowsFma(const O& op, int64_t r0, int64_t r1) {
  constexpr int W = Avx2<T>::W;
  int64_t r = r0;
  for (; r + W <= r1; r += W) SimdRows<T, Reverse>(op, r);
  if constexpr (std::is_same_v<O, PlainOp<T>>) {
    if (Segmentable<T>(op.n)) {
      for (; r < r1; ++r) SegmentedRow<T, Reverse>(op, r);
      return;
    }
  }
  RecurRowsImpl<T, Reverse, true>(op, r, r1);
}

inline bool HaveAvx2Fma() {
  static const bool have = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return have;
}
#else
template <typename T, bool Reverse, class O>
void RecurRowsFma(const O& op, int64_t r0, int64_t r1) {
  RecurRowsImpl<T, Reverse, false>(op, r0, r1);  // the compiler contracts where the ISA has FMA
}
inline bool HaveAvx2Fma() { return false; }
#endif

// The extension is built for a generic x86-64 target, so the AVX2/FMA version is
// compiled separately and chosen at run time.
template <typename T, bool Reverse, class O>
void RecurRows(const O& op, int64_t r0, int64_t r1) {
  if (HaveAvx2Fma()) {
    RecurRowsFma<T, Reverse>(op, r0, r1);
  } else {
    RecurRowsImpl<T, Reverse, false>(op, r0, r1);
  }
}

}  // namespace eqgp::cpu
