// CPU XLA FFI handlers of the linear recurrence and of sumcumprod's fused Jacobian
// products: checks, dtype dispatch and the row-parallel loop around the kernels of
// cpu_recurrence.h.
#include <algorithm>
#include <cstdint>

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
using eqgp::cpu::RecurRows;

template <typename T, bool Reverse, class O>
void RunOp(ffi::ThreadPool& pool, const O& op, int64_t rows) {
  ParallelForRows(pool, rows, op.n, [op](int64_t r0, int64_t r1) { RecurRows<T, Reverse>(op, r0, r1); });
}

ffi::Error LinearRecurrenceCpu(ffi::ThreadPool pool, bool reverse, ffi::AnyBuffer a,
                               ffi::AnyBuffer b, ffi::Result<ffi::AnyBuffer> z) {
  auto rn = eqgp::CheckOperands("eqgp_linear_recurrence[cpu]", a, b, *z);
  if (rn.has_error()) return rn.error();
  if (rn->rows == 0 || rn->n == 0) return ffi::Error::Success();
  auto run = [&](auto zero) {
    using T = decltype(zero);
    PlainOp<T> op{a.typed_data<T>(), b.typed_data<T>(), nullptr, z->typed_data<T>(), rn->n};
    if (reverse) {
      RunOp<T, true>(pool, op, rn->rows);
    } else {
      RunOp<T, false>(pool, op, rn->rows);
    }
  };
  eqgp::ForFloatType(a.element_type(), run);
  return ffi::Error::Success();
}

// transpose = false: out = J t; transpose = true: out = J^T t, J the Jacobian of
// sumcumprod at x, given z = sumcumprod(x) (the lowering computes it first with the
// recurrence; in a reverse pass it is the forward's output, which XLA reuses). The same
// operands as the CUDA handler.
ffi::Error SumcumprodJvpCpu(ffi::ThreadPool pool, bool transpose, ffi::AnyBuffer x, ffi::AnyBuffer t,
                            ffi::AnyBuffer z, ffi::Result<ffi::AnyBuffer> out) {
  const char* name = "eqgp_sumcumprod_jvp[cpu]";
  auto rn = eqgp::CheckJacobianOperands(name, x, t, *out);
  if (rn.has_error()) return rn.error();
  auto rz = eqgp::CheckOperands(name, x, z, *out, {"x", "z", "out"});
  if (rz.has_error()) return rz.error();
  if (rn->rows == 0 || rn->n == 0) return ffi::Error::Success();
  auto run = [&](auto zero) {
    using T = decltype(zero);
    const T* xp = x.typed_data<T>();
    const T* tp = t.typed_data<T>();
    const T* zp = z.typed_data<T>();
    T* op = out->typed_data<T>();
    if (transpose) {
      RunOp<T, false>(pool, SumcumprodVjpOp<T>{xp, tp, zp, op, rn->n}, rn->rows);
    } else {
      RunOp<T, true>(pool, SumcumprodJvpOp<T>{xp, tp, zp, op, rn->n}, rn->rows);
    }
  };
  eqgp::ForFloatType(x.element_type(), run);
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
                                  .Arg<ffi::AnyBuffer>()   // z = sumcumprod(x)
                                  .Ret<ffi::AnyBuffer>()); // J t or J^T t
