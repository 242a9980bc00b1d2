// CPU XLA FFI handlers of the linear recurrence and of sumcumprod's fused Jacobian
// products: checks, dtype dispatch and the row-parallel loop around the kernels of
// cpu_recurrence.h.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "cpu_memory.h"
#include "cpu_parallel.h"
#include "cpu_recurrence.h"
#include "linrec_common.h"
#include "xla/ffi/api/c_api.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using eqgp::PlainOp;
using eqgp::SumcumprodJvpOp;
using eqgp::SumcumprodVjpOp;
using eqgp::cpu::ParallelForRows;
using eqgp::cpu::PrepareOutput;
using eqgp::cpu::RecurRows;
using eqgp::cpu::Scratch;

template <typename T, bool Reverse, class O>
void RunOp(ffi::ThreadPool& pool, const O& op, int64_t rows) {
  ParallelForRows(pool, rows, op.n, [op](int64_t r0, int64_t r1) { RecurRows<T, Reverse>(op, r0, r1); });
}

ffi::Error LinearRecurrenceCpu(ffi::ThreadPool pool, bool reverse, ffi::AnyBuffer a,
                               ffi::AnyBuffer b, ffi::Result<ffi::AnyBuffer> z) {
  auto rn = eqgp::CheckOperands("eqgp_linear_recurrence[cpu]", a, b, *z);
  if (rn.has_error()) return rn.error();
  if (rn->rows == 0 || rn->n == 0) return ffi::Error::Success();
  const bool stream = PrepareOutput(z->untyped_data(), z->size_bytes());
  auto run = [&](auto zero) {
    using T = decltype(zero);
    PlainOp<T> op{a.typed_data<T>(), b.typed_data<T>(), nullptr, z->typed_data<T>(), rn->n, stream};
    if (reverse) {
      RunOp<T, true>(pool, op, rn->rows);
    } else {
      RunOp<T, false>(pool, op, rn->rows);
    }
  };
  eqgp::ForFloatType(a.element_type(), run);
  return ffi::Error::Success();
}

// Rows sumcumprod's Jacobian products work through at a time: z = sumcumprod(x) of
// these rows goes to a scratch buffer that stays in cache while the product reads
// it, so z is recomputed (cheap) instead of stored and read back (a memory pass each).
constexpr int64_t kJacobianRows = 8;

template <typename T, bool Transpose>
void SumcumprodJacobianRows(const T* x, const T* t, T* out, int64_t n, bool stream, int64_t r0, int64_t r1) {
  Scratch<T> z(static_cast<size_t>(std::min(kJacobianRows, r1 - r0) * n));
  for (int64_t r = r0; r < r1; r += kJacobianRows) {
    const int64_t rows = std::min(kJacobianRows, r1 - r);
    const T* xr = x + r * n;
    const T* tr = t + r * n;
    T* outr = out + r * n;
    RecurRows<T, true>(PlainOp<T>{xr, xr, nullptr, z.data(), n}, 0, rows);
    if constexpr (Transpose) {
      RecurRows<T, false>(SumcumprodVjpOp<T>{xr, tr, z.data(), outr, n, stream}, 0, rows);
    } else {
      RecurRows<T, true>(SumcumprodJvpOp<T>{xr, tr, z.data(), outr, n, stream}, 0, rows);
    }
  }
}

// transpose = false: out = J t; transpose = true: out = J^T t, J the Jacobian of
// sumcumprod at x.
ffi::Error SumcumprodJvpCpu(ffi::ThreadPool pool, bool transpose, ffi::AnyBuffer x, ffi::AnyBuffer t,
                            ffi::Result<ffi::AnyBuffer> out) {
  auto rn = eqgp::CheckJacobianOperands("eqgp_sumcumprod_jvp[cpu]", x, t, *out);
  if (rn.has_error()) return rn.error();
  if (rn->rows == 0 || rn->n == 0) return ffi::Error::Success();
  const bool stream = PrepareOutput(out->untyped_data(), out->size_bytes());
  auto run = [&](auto zero) {
    using T = decltype(zero);
    const T* xp = x.typed_data<T>();
    const T* tp = t.typed_data<T>();
    T* op = out->typed_data<T>();
    const int64_t n = rn->n;
    ParallelForRows(pool, rn->rows, n, [=](int64_t r0, int64_t r1) {
      if (transpose) {
        SumcumprodJacobianRows<T, true>(xp, tp, op, n, stream, r0, r1);
      } else {
        SumcumprodJacobianRows<T, false>(xp, tp, op, n, stream, r0, r1);
      }
    });
  };
  eqgp::ForFloatType(x.element_type(), run);
  return ffi::Error::Success();
}

// A zero-filled buffer in huge pages, for XLA to compute a large result into (eqgp adds
// the result to it; XLA writes the sum in place). XLA's own outputs of 32 MiB and more
// are fresh mappings whose first touch faults every 4 KiB page: for a (3 300, 3 300)
// float64 gram that was 21 000 faults and ~2/3 of its time. Zeroed in 2 MiB pieces on
// XLA's intra-op pool, so each huge-page fault happens on the thread that fills it.
ffi::Error ZerosCpu(ffi::ThreadPool pool, ffi::Result<ffi::AnyBuffer> out) {
  const size_t bytes = out->size_bytes();
  if (bytes == 0) return ffi::Error::Success();
  eqgp::cpu::AdviseHugePages(out->untyped_data(), bytes);
  char* p = static_cast<char*>(out->untyped_data());
  constexpr int64_t kPiece = int64_t{1} << 21;
  const int64_t pieces = static_cast<int64_t>((bytes + kPiece - 1) / kPiece);
  ParallelForRows(pool, pieces, kPiece, [=](int64_t c0, int64_t c1) {
    const size_t lo = static_cast<size_t>(c0) * kPiece;
    const size_t hi = std::min(bytes, static_cast<size_t>(c1) * kPiece);
    std::memset(p + lo, 0, hi - lo);
  });
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

XLA_FFI_DEFINE_HANDLER_SYMBOL(EqgpSumcumprodJvpCpu, SumcumprodJvpCpu,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Attr<bool>("transpose")
                                  .Arg<ffi::AnyBuffer>()   // x
                                  .Arg<ffi::AnyBuffer>()   // t
                                  .Ret<ffi::AnyBuffer>()); // J t or J^T t

XLA_FFI_DEFINE_HANDLER_SYMBOL(EqgpZerosCpu, ZerosCpu,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Ret<ffi::AnyBuffer>()); // zeros, any dtype
