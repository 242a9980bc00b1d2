// CPU XLA FFI handler for the linear recurrence, and the pybind11 module that
// hands it to Python as a PyCapsule.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
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

// Each row is a serial dependency chain, so R rows advance together to keep R
// chains in flight. R stays small: rows are n elements apart, and for
// power-of-two n every stream maps to the same L1 set (R = 8 thrashed L1 in the
// prototype at n = 4096).
template <typename T, int R, bool Reverse>
inline void RecurGroup(const T* __restrict a, const T* __restrict b, T* __restrict z,
                       int64_t n) {
  T acc[R];
  for (int r = 0; r < R; ++r) acc[r] = T(0);
  for (int64_t k = 0; k < n; ++k) {
    const int64_t i = Reverse ? n - 1 - k : k;
    for (int r = 0; r < R; ++r) {
      acc[r] = a[r * n + i] * acc[r] + b[r * n + i];
      z[r * n + i] = acc[r];
    }
  }
}

constexpr int kInterleave = 4;
constexpr int64_t kChunkAlign = 8;  // row-chunk granularity for the thread pool

template <typename T, bool Reverse>
void RecurRows(const T* a, const T* b, T* z, int64_t r0, int64_t r1, int64_t n) {
  int64_t r = r0;
  for (; r + kInterleave <= r1; r += kInterleave)
    RecurGroup<T, kInterleave, Reverse>(a + r * n, b + r * n, z + r * n, n);
  for (; r < r1; ++r) RecurGroup<T, 1, Reverse>(a + r * n, b + r * n, z + r * n, n);
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

template <typename T>
void Run(ffi::ThreadPool& pool, bool reverse, const ffi::AnyBuffer& a, const ffi::AnyBuffer& b,
         ffi::AnyBuffer& z, int64_t rows, int64_t n) {
  const T* ap = a.typed_data<T>();
  const T* bp = b.typed_data<T>();
  T* zp = z.typed_data<T>();
  if (reverse) {
    ParallelForRows(pool, rows, n, [=](int64_t r0, int64_t r1) {
      RecurRows<T, true>(ap, bp, zp, r0, r1, n);
    });
  } else {
    ParallelForRows(pool, rows, n, [=](int64_t r0, int64_t r1) {
      RecurRows<T, false>(ap, bp, zp, r0, r1, n);
    });
  }
}

ffi::Error LinearRecurrenceCpu(ffi::ThreadPool pool, bool reverse, ffi::AnyBuffer a,
                               ffi::AnyBuffer b, ffi::Result<ffi::AnyBuffer> z) {
  auto rn = eqgp::CheckOperands("eqgp_linear_recurrence[cpu]", a, b, *z);
  if (rn.has_error()) return rn.error();
  if (rn->rows == 0 || rn->n == 0) return ffi::Error::Success();
  if (a.element_type() == ffi::DataType::F32) {
    Run<float>(pool, reverse, a, b, *z, rn->rows, rn->n);
  } else {
    Run<double>(pool, reverse, a, b, *z, rn->rows, rn->n);
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(EqgpLinearRecurrenceCpu, LinearRecurrenceCpu,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Attr<bool>("reverse")
                                  .Arg<ffi::AnyBuffer>()   // a
                                  .Arg<ffi::AnyBuffer>()   // b
                                  .Ret<ffi::AnyBuffer>()); // z

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
    return d;
  });
}
