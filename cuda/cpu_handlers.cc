// CPU XLA FFI handlers for the linear recurrence and for the fused Jacobian of
// sumcumprod, and the pybind11 module that hands them to Python as PyCapsules.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <limits>
#include <string>
#include <memory>
#include <mutex>
#include <type_traits>

#include <pybind11/pybind11.h>

#include "linrec_common.h"
#include "xla/ffi/api/c_api.h"
#include "xla/ffi/api/ffi.h"

namespace py = pybind11;
namespace ffi = xla::ffi;

namespace {

// ---------------------------------------------------------------------------
// Element access. A scan visits a row in order (reverse or forward) and at row
// position i needs the multiplier A(i), the offset B(i) and where to put the
// state (Put). Each op is a small struct so one templated loop serves all.

// z_i = a_i z_{i-+1} + b_i.
template <typename T>
struct PlainOp {
  const T* a;
  const T* b;
  T* z;
  T A(int64_t i, int64_t) const { return a[i]; }
  T B(int64_t i, int64_t) const { return b[i]; }
  void Put(int64_t i, int64_t, T v) const { z[i] = v; }
};

// J t for J the Jacobian of sumcumprod at x (z = sumcumprod(x)): the reverse
// recurrence with multiplier x_i and offset t_i (1 + z_{i+1}).
template <typename T>
struct SumcumprodJvpOp {
  const T* x;
  const T* z;
  const T* t;
  T* out;
  // `k` is the position inside the row: z past the end of the row is zero.
  T A(int64_t i, int64_t) const { return x[i]; }
  T B(int64_t i, int64_t k) const { return t[i] * (T(1) + (k > 0 ? z[i + 1] : T(0))); }
  void Put(int64_t i, int64_t, T v) const { out[i] = v; }
};

// J^T t: the forward recurrence g_i = x_{i-1} g_{i-1} + t_i, then (1 + z_{i+1}) g_i.
template <typename T>
struct SumcumprodVjpOp {
  const T* x;
  const T* z;
  const T* t;
  T* out;
  int64_t n;
  T A(int64_t i, int64_t k) const { return k > 0 ? x[i - 1] : T(0); }
  T B(int64_t i, int64_t) const { return t[i]; }
  void Put(int64_t i, int64_t k, T v) const { out[i] = v * (T(1) + (k + 1 < n ? z[i + 1] : T(0))); }
};

// Each row is a serial dependency chain, so R rows advance together to keep R
// chains in flight. R stays small: rows are n elements apart, and for
// power-of-two n every stream maps to the same L1 set (R = 8 thrashed L1 in the
// prototype at n = 4096). `k` counts steps taken in scan order.
template <typename T, int R, bool Reverse, bool Fma, class Op>
inline __attribute__((always_inline)) void RecurGroup(const Op& op, int64_t row0, int64_t n) {
  T acc[R];
  for (int r = 0; r < R; ++r) acc[r] = T(0);
  for (int64_t k = 0; k < n; ++k) {
    const int64_t i = Reverse ? n - 1 - k : k;
    for (int r = 0; r < R; ++r) {
      const int64_t e = (row0 + r) * n + i;
      const T a = op.A(e, k), b = op.B(e, k);
      acc[r] = Fma ? std::fma(a, acc[r], b) : a * acc[r] + b;
      op.Put(e, k, acc[r]);
    }
  }
}

constexpr int kInterleave = 4;
constexpr int64_t kChunkAlign = 8;  // row-chunk granularity for the thread pool

template <typename T, bool Reverse, bool Fma, class Op>
inline __attribute__((always_inline)) void RecurRowsImpl(const Op& op, int64_t r0, int64_t r1,
                                                         int64_t n) {
  int64_t r = r0;
  for (; r + kInterleave <= r1; r += kInterleave) RecurGroup<T, kInterleave, Reverse, Fma>(op, r, n);
  for (; r < r1; ++r) RecurGroup<T, 1, Reverse, Fma>(op, r, n);
}

// The chain is latency-bound: a fused multiply-add halves its latency against a
// multiply then an add. The extension is built for a generic x86-64 target, so
// the FMA version is compiled separately and chosen at run time.
#if defined(__GNUC__) && defined(__x86_64__)
template <typename T, bool Reverse, class Op>
__attribute__((target("fma"))) void RecurRowsFma(const Op& op, int64_t r0, int64_t r1, int64_t n) {
  RecurRowsImpl<T, Reverse, true>(op, r0, r1, n);
}
inline bool HaveFma() {
  static const bool have = __builtin_cpu_supports("fma");
  return have;
}
#else
template <typename T, bool Reverse, class Op>
void RecurRowsFma(const Op& op, int64_t r0, int64_t r1, int64_t n) {
  RecurRowsImpl<T, Reverse, false>(op, r0, r1, n);  // the compiler contracts where the ISA has FMA
}
inline bool HaveFma() { return false; }
#endif

template <typename T, bool Reverse, class Op>
void RecurRows(const Op& op, int64_t r0, int64_t r1, int64_t n) {
  if (HaveFma()) {
    RecurRowsFma<T, Reverse>(op, r0, r1, n);
  } else {
    RecurRowsImpl<T, Reverse, false>(op, r0, r1, n);
  }
}

// Row-parallel loop on XLA's intra-op thread pool. The calling thread works too
// and only waits for chunks that a running thread has already claimed, so this
// cannot deadlock when the pool is busy.
template <typename F>
void ParallelForRows(ffi::ThreadPool& pool, int64_t rows, int64_t n, F f) {
  const int64_t nthreads = pool.num_threads();
  if (nthreads <= 1 || rows < 2 * kChunkAlign || rows * n < (int64_t{1} << 15)) {
    f(int64_t{0}, rows);
    return;
  }
  int64_t chunk = (rows + 4 * nthreads - 1) / (4 * nthreads);
  chunk = ((chunk + kChunkAlign - 1) / kChunkAlign) * kChunkAlign;
  const int64_t nchunks = (rows + chunk - 1) / chunk;

  struct State {
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
    std::mutex mu;
    std::condition_variable cv;
  };
  auto st = std::make_shared<State>();
  auto worker = [st, f, chunk, nchunks, rows]() {
    for (;;) {
      const int64_t c = st->next.fetch_add(1);
      if (c >= nchunks) return;
      f(c * chunk, std::min(rows, (c + 1) * chunk));
      if (st->done.fetch_add(1) + 1 == nchunks) {
        std::lock_guard<std::mutex> lock(st->mu);
        st->cv.notify_all();
      }
    }
  };
  const int64_t helpers = std::min(nthreads, nchunks) - 1;
  for (int64_t i = 0; i < helpers; ++i) pool.Schedule(decltype(worker)(worker));
  worker();
  std::unique_lock<std::mutex> lock(st->mu);
  st->cv.wait(lock, [&] { return st->done.load() == nchunks; });
}

template <typename T, bool Reverse, class Op>
void RunOp(ffi::ThreadPool& pool, const Op& op, int64_t rows, int64_t n) {
  ParallelForRows(pool, rows, n, [op, n](int64_t r0, int64_t r1) {
    RecurRows<T, Reverse>(op, r0, r1, n);
  });
}

ffi::Error LinearRecurrenceCpu(ffi::ThreadPool pool, bool reverse, ffi::AnyBuffer a,
                               ffi::AnyBuffer b, ffi::Result<ffi::AnyBuffer> z) {
  auto rn = eqgp::CheckOperands("eqgp_linear_recurrence[cpu]", a, b, *z);
  if (rn.has_error()) return rn.error();
  if (rn->rows == 0 || rn->n == 0) return ffi::Error::Success();
  auto run = [&](auto zero) {
    using T = decltype(zero);
    PlainOp<T> op{a.typed_data<T>(), b.typed_data<T>(), z->typed_data<T>()};
    if (reverse) {
      RunOp<T, true>(pool, op, rn->rows, rn->n);
    } else {
      RunOp<T, false>(pool, op, rn->rows, rn->n);
    }
  };
  if (a.element_type() == ffi::DataType::F32) {
    run(float{});
  } else {
    run(double{});
  }
  return ffi::Error::Success();
}

// transpose = false: out = J t; transpose = true: out = J^T t, J the Jacobian of
// sumcumprod at x and z = sumcumprod(x).
ffi::Error SumcumprodJvpCpu(ffi::ThreadPool pool, bool transpose, ffi::AnyBuffer x,
                            ffi::AnyBuffer z, ffi::AnyBuffer t, ffi::Result<ffi::AnyBuffer> out) {
  auto rn = eqgp::CheckOperands("eqgp_sumcumprod_jvp[cpu]", x, z, *out);
  if (rn.has_error()) return rn.error();
  auto rt = eqgp::CheckOperands("eqgp_sumcumprod_jvp[cpu]", x, t, *out);
  if (rt.has_error()) return rt.error();
  if (rn->rows == 0 || rn->n == 0) return ffi::Error::Success();
  auto run = [&](auto zero) {
    using T = decltype(zero);
    const T* xp = x.typed_data<T>();
    const T* zp = z.typed_data<T>();
    const T* tp = t.typed_data<T>();
    T* op = out->typed_data<T>();
    if (transpose) {
      RunOp<T, false>(pool, SumcumprodVjpOp<T>{xp, zp, tp, op, rn->n}, rn->rows, rn->n);
    } else {
      RunOp<T, true>(pool, SumcumprodJvpOp<T>{xp, zp, tp, op}, rn->rows, rn->n);
    }
  };
  if (x.element_type() == ffi::DataType::F32) {
    run(float{});
  } else {
    run(double{});
  }
  return ffi::Error::Success();
}

// ---------------------------------------------------------------------------
// K^{-1} from a Cholesky factor, by LAPACK's ?potri (n^3/3 + n^3/3 flops against
// 2 n^3 for two triangular solves with the identity). The LAPACK routines are the
// ones scipy ships (scipy.linalg.cython_lapack, the same source jaxlib's own CPU
// linear algebra uses); Python hands their addresses over at import.

using SPotri = void(char* uplo, int* n, float* a, int* lda, int* info);
using DPotri = void(char* uplo, int* n, double* a, int* lda, int* info);
std::atomic<SPotri*> g_spotri{nullptr};
std::atomic<DPotri*> g_dpotri{nullptr};

template <typename T, typename Potri>
ffi::Error CholeskyInverse(Potri* potri, const ffi::AnyBuffer& L, ffi::AnyBuffer& out) {
  const char* name = "eqgp_cholesky_inverse[cpu]";
  auto dims = L.dimensions();
  if (dims.size() < 2 || dims[dims.size() - 1] != dims[dims.size() - 2] || !(out.dimensions() == dims) ||
      out.element_type() != L.element_type()) {
    return ffi::Error::InvalidArgument(std::string(name) + ": expected square (..., n, n) factors, got " +
                                       eqgp::ShapeStr(dims));
  }
  if (potri == nullptr) {
    return ffi::Error::Internal(std::string(name) + ": LAPACK ?potri was not registered");
  }
  const int64_t n = dims.back();
  if (n == 0) return ffi::Error::Success();
  if (n > int64_t{std::numeric_limits<int>::max()}) {
    return ffi::Error::InvalidArgument(std::string(name) + ": n too large for LAPACK");
  }
  const int64_t batch = static_cast<int64_t>(L.element_count()) / (n * n);
  const T* src = L.typed_data<T>();
  T* dst = out.typed_data<T>();
  std::copy(src, src + batch * n * n, dst);
  for (int64_t b = 0; b < batch; ++b) {
    T* A = dst + b * n * n;
    // Row-major lower L is column-major upper L^T, with K = (L^T)^T L^T.
    char uplo = 'U';
    int nn = static_cast<int>(n), lda = nn, info = 0;
    potri(&uplo, &nn, A, &lda, &info);
    if (info != 0) {
      return ffi::Error::InvalidArgument(std::string(name) + ": ?potri failed (info = " +
                                         std::to_string(info) + "): the factor is singular");
    }
    // The column-major upper result is the row-major lower triangle: mirror it.
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = i + 1; j < n; ++j) A[i * n + j] = A[j * n + i];
  }
  return ffi::Error::Success();
}

ffi::Error CholeskyInverseCpu(ffi::AnyBuffer L, ffi::Result<ffi::AnyBuffer> out) {
  switch (L.element_type()) {
    case ffi::DataType::F32:
      return CholeskyInverse<float>(g_spotri.load(), L, *out);
    case ffi::DataType::F64:
      return CholeskyInverse<double>(g_dpotri.load(), L, *out);
    default:
      return ffi::Error::InvalidArgument("eqgp_cholesky_inverse[cpu]: unsupported dtype " +
                                         eqgp::DTypeName(L.element_type()) + " (expected float32 or float64)");
  }
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(EqgpCholeskyInverseCpu, CholeskyInverseCpu,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()   // L, lower, (..., n, n)
                                  .Ret<ffi::AnyBuffer>()); // (L L^T)^{-1}

XLA_FFI_DEFINE_HANDLER_SYMBOL(EqgpLinearRecurrenceCpu, LinearRecurrenceCpu,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Attr<bool>("reverse")
                                  .Arg<ffi::AnyBuffer>()   // a
                                  .Arg<ffi::AnyBuffer>()   // b
                                  .Ret<ffi::AnyBuffer>()); // z

XLA_FFI_DEFINE_HANDLER_SYMBOL(EqgpSumcumprodJvpCpu, SumcumprodJvpCpu,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Attr<bool>("transpose")
                                  .Arg<ffi::AnyBuffer>()   // x
                                  .Arg<ffi::AnyBuffer>()   // z = sumcumprod(x)
                                  .Arg<ffi::AnyBuffer>()   // t
                                  .Ret<ffi::AnyBuffer>()); // J t or J^T t

template <typename T>
py::capsule EncapsulateFfiHandler(T* fn) {
  static_assert(std::is_invocable_r_v<XLA_FFI_Error*, T, XLA_FFI_CallFrame*>,
                "Encapsulated function must be an XLA FFI handler");
  return py::capsule(reinterpret_cast<void*>(fn));
}

PYBIND11_MODULE(_native_cpu, m) {
  m.doc() = "eqgp CPU XLA FFI handlers";
  m.def("registrations", []() {
    py::dict d;
    d["eqgp_linear_recurrence"] = EncapsulateFfiHandler(EqgpLinearRecurrenceCpu);
    d["eqgp_sumcumprod_jvp"] = EncapsulateFfiHandler(EqgpSumcumprodJvpCpu);
    d["eqgp_cholesky_inverse"] = EncapsulateFfiHandler(EqgpCholeskyInverseCpu);
    return d;
  });
  // spotri and dpotri as the PyCapsules of scipy.linalg.cython_lapack.__pyx_capi__.
  m.def("set_lapack", [](py::capsule spotri, py::capsule dpotri) {
    void* s = PyCapsule_GetPointer(spotri.ptr(), PyCapsule_GetName(spotri.ptr()));
    void* d = s == nullptr ? nullptr : PyCapsule_GetPointer(dpotri.ptr(), PyCapsule_GetName(dpotri.ptr()));
    if (s == nullptr || d == nullptr) throw py::error_already_set();
    g_spotri.store(reinterpret_cast<SPotri*>(s));
    g_dpotri.store(reinterpret_cast<DPotri*>(d));
  });
}
