// Shared pieces of the linear-recurrence FFI handlers (CPU and CUDA).
//
//   forward (reverse = false): z_i = a_i * z_{i-1} + b_i,  z_{-1} = 0
//   reverse (reverse = true) : z_i = a_i * z_{i+1} + b_i,  z_{n}  = 0
//
// along the last axis; every leading axis is a row. sumcumprod is the reverse
// recurrence with a = b = x. Shapes, dtypes, batching and differentiation rules
// live in Python (eqgp/_ops.py); these checks only keep a bad call from crashing.
#pragma once

#include <cstdint>
#include <string>

#include "xla/ffi/api/ffi.h"

namespace eqgp {

namespace ffi = xla::ffi;

inline std::string DTypeName(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::F16: return "float16";
    case ffi::DataType::BF16: return "bfloat16";
    case ffi::DataType::F32: return "float32";
    case ffi::DataType::F64: return "float64";
    case ffi::DataType::S32: return "int32";
    case ffi::DataType::S64: return "int64";
    case ffi::DataType::PRED: return "bool";
    case ffi::DataType::C64: return "complex64";
    case ffi::DataType::C128: return "complex128";
    default: return "dtype#" + std::to_string(static_cast<int>(t));
  }
}

inline std::string ShapeStr(ffi::AnyBuffer::Dimensions d) {
  std::string s = "(";
  for (size_t i = 0; i < d.size(); ++i) {
    s += std::to_string(d[i]);
    if (i + 1 < d.size() || d.size() == 1) s += ",";
  }
  return s + ")";
}

struct RowsN {
  int64_t rows = 0;  // product of the leading axes
  int64_t n = 0;     // length of the last axis
};

// Three float32/float64 buffers of one dtype and one shape, rank >= 1, named in
// errors as `names` (the recurrence's a, b, z by default).
inline ffi::ErrorOr<RowsN> CheckOperands(const char* op, const ffi::AnyBuffer& a, const ffi::AnyBuffer& b,
                                         const ffi::AnyBuffer& z, const char* const (&names)[3] = {"a", "b", "z"}) {
  auto dims = a.dimensions();
  if (dims.size() == 0) {
    return ffi::Unexpected(ffi::Error::InvalidArgument(
        std::string(op) + ": operands must have rank >= 1 (the recurrence runs along the last axis)"));
  }
  auto t = a.element_type();
  if (t != ffi::DataType::F32 && t != ffi::DataType::F64) {
    return ffi::Unexpected(ffi::Error::InvalidArgument(
        std::string(op) + ": unsupported dtype " + DTypeName(t) + " (expected float32 or float64)"));
  }
  const ffi::AnyBuffer* others[2] = {&b, &z};
  for (int k = 0; k < 2; ++k) {
    if (others[k]->element_type() != t || !(others[k]->dimensions() == dims)) {
      return ffi::Unexpected(ffi::Error::InvalidArgument(
          std::string(op) + ": '" + names[k + 1] + "' is " + DTypeName(others[k]->element_type()) +
          ShapeStr(others[k]->dimensions()) + " but '" + names[0] + "' is " + DTypeName(t) + ShapeStr(dims) +
          "; all operands must share dtype and shape"));
    }
  }
  RowsN r;
  r.n = dims.back();
  r.rows = r.n == 0 ? 0 : static_cast<int64_t>(a.element_count()) / r.n;
  return r;
}

// The operands of sumcumprod's Jacobian products: x, the tangent t and the output.
inline ffi::ErrorOr<RowsN> CheckJacobianOperands(const char* op, const ffi::AnyBuffer& x, const ffi::AnyBuffer& t,
                                                 const ffi::AnyBuffer& out) {
  return CheckOperands(op, x, t, out, {"x", "t", "out"});
}

// Calls f(T{}) with T the C type of a checked float32/float64 dtype.
template <class F>
void ForFloatType(ffi::DataType t, F f) {
  if (t == ffi::DataType::F32) {
    f(float{});
  } else {
    f(double{});
  }
}

}  // namespace eqgp
