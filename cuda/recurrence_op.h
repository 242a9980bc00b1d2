// Element access of the linear-recurrence scans, shared by the CPU and CUDA kernels.
//
// A scan visits a row in order (reverse or forward) and at row position p needs the
// multiplier A, the offset B and what to store for the state (Put). One struct,
// specialised by three flags, covers all three ops:
//
//   plain  z = LR(a, b):         A = a_p,      B = b_p,                 out = state
//   J t    (sumcumprod at x):    A = x_p,      B = t_p (1 + z_{p+1}),   out = state   (reverse)
//   J^T t:                       A = x_{p-1},  B = t_p,                 out = state (1 + z_{p+1})  (forward)
//
// z past the end of a row is zero, and x_{-1} multiplies the zero initial state.
// e is the flat index of position p of a row of length n.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define EQGP_HD __host__ __device__ __forceinline__
#else
#define EQGP_HD inline __attribute__((always_inline))
#endif

namespace eqgp {

template <typename T, bool AShift, bool BScale, bool PostScale>
struct RecurrenceOp {
  const T* __restrict__ a;
  const T* __restrict__ b;
  const T* __restrict__ z;  // only read with BScale or PostScale
  T* __restrict__ out;
  int64_t n;

  EQGP_HD T A(int64_t e, int64_t p) const {
    if constexpr (AShift) {
      return p > 0 ? a[e - 1] : T(0);
    } else {
      return a[e];
    }
  }
  EQGP_HD T Scale(int64_t e, int64_t p) const { return T(1) + (p + 1 < n ? z[e + 1] : T(0)); }
  EQGP_HD T B(int64_t e, int64_t p) const {
    if constexpr (BScale) {
      return b[e] * Scale(e, p);
    } else {
      return b[e];
    }
  }
  EQGP_HD void Put(int64_t e, int64_t p, T v) const {
    if constexpr (PostScale) v *= Scale(e, p);
    out[e] = v;
  }
  // Positions [SafeLo, SafeHi) where every neighbour access stays inside the row, so
  // a block of positions can be handled without the edge checks.
  EQGP_HD int64_t SafeLo() const { return AShift ? 1 : 0; }
  EQGP_HD int64_t SafeHi() const { return (BScale || PostScale) ? n - 1 : n; }
};

template <typename T>
using PlainOp = RecurrenceOp<T, false, false, false>;
template <typename T>
using SumcumprodJvpOp = RecurrenceOp<T, false, true, false>;
template <typename T>
using SumcumprodVjpOp = RecurrenceOp<T, true, false, true>;

}  // namespace eqgp
