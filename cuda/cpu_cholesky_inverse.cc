// CPU XLA FFI handlers: the Cholesky factor of K in place by LAPACK's ?potrf, and K^{-1}
// from a Cholesky factor by LAPACK's ?potri.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <string>

#include "cpu_cholesky_inverse.h"
#include "linrec_common.h"
#include "xla/ffi/api/c_api.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// K^{-1} from a Cholesky factor, by LAPACK's ?potri (n^3/3 + n^3/3 flops against
// 2 n^3 for two triangular solves with the identity). The LAPACK routines are the
// ones scipy ships (scipy.linalg.cython_lapack, the same source jaxlib's own CPU
// linear algebra uses); Python hands their addresses over at import.

using SPotri = void(char* uplo, int* n, float* a, int* lda, int* info);
using DPotri = void(char* uplo, int* n, double* a, int* lda, int* info);
std::atomic<SPotri*> g_spotri{nullptr};
std::atomic<DPotri*> g_dpotri{nullptr};
// ?potrf has the same signature.
std::atomic<SPotri*> g_spotrf{nullptr};
std::atomic<DPotri*> g_dpotrf{nullptr};

// The factor of a symmetric K held as L^T, row-major (which is LAPACK's column-major L):
// ?potrf('L') on the row-major buffer reads K's upper triangle (K is symmetric) and
// overwrites it with L^T; the other triangle is zeroed; a matrix that is not numerically
// positive definite gives NaN throughout (as jax.lax.linalg.cholesky does). Row-major in,
// row-major out, and XLA aliases the output to the input: no layout copy, no second matrix.
template <typename T, typename Potrf>
ffi::Error CholeskyT(Potrf* potrf, const ffi::AnyBuffer& K, ffi::AnyBuffer& out) {
  const char* name = "eqgp_cholesky_t[cpu]";
  auto dims = K.dimensions();
  if (dims.size() < 2 || dims[dims.size() - 1] != dims[dims.size() - 2] || !(out.dimensions() == dims) ||
      out.element_type() != K.element_type()) {
    return ffi::Error::InvalidArgument(std::string(name) + ": expected square (..., n, n) matrices, got " +
                                       eqgp::ShapeStr(dims));
  }
  if (potrf == nullptr) {
    return ffi::Error::Internal(std::string(name) + ": LAPACK ?potrf was not registered");
  }
  const int64_t n = dims.back();
  if (n == 0) return ffi::Error::Success();
  if (n > int64_t{std::numeric_limits<int>::max()}) {
    return ffi::Error::InvalidArgument(std::string(name) + ": n too large for LAPACK");
  }
  const int64_t batch = static_cast<int64_t>(K.element_count()) / (n * n);
  const T* src = K.typed_data<T>();
  T* dst = out.typed_data<T>();
  if (src != dst) std::copy(src, src + batch * n * n, dst);
  for (int64_t b = 0; b < batch; ++b) {
    T* A = dst + b * n * n;
    char uplo = 'L';
    int nn = static_cast<int>(n), lda = nn, info = 0;
    potrf(&uplo, &nn, A, &lda, &info);
    if (info != 0) {
      std::fill(A, A + n * n, std::numeric_limits<T>::quiet_NaN());
      continue;
    }
    for (int64_t i = 1; i < n; ++i) std::fill(A + i * n, A + i * n + i, T(0));
  }
  return ffi::Error::Success();
}

template <typename T, typename Potri>
ffi::Error CholeskyInverse(Potri* potri, const ffi::AnyBuffer& L, ffi::AnyBuffer& out, bool transposed) {
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
  if (src != dst) std::copy(src, src + batch * n * n, dst);
  for (int64_t b = 0; b < batch; ++b) {
    T* A = dst + b * n * n;
    // Row-major lower L is column-major upper L^T, with K = (L^T)^T L^T; `transposed`:
    // row-major L^T (upper) is column-major lower L, with K = L L^T.
    char uplo = transposed ? 'L' : 'U';
    int nn = static_cast<int>(n), lda = nn, info = 0;
    potri(&uplo, &nn, A, &lda, &info);
    if (info != 0) {
      return ffi::Error::InvalidArgument(std::string(name) + ": ?potri failed (info = " +
                                         std::to_string(info) + "): the factor is singular");
    }
    // The result is one row-major triangle (lower, or upper where `transposed`): mirror it
    // into the other, in tiles (a column walk misses the cache on every element for large n).
    constexpr int64_t kTile = 64;
    for (int64_t i0 = 0; i0 < n; i0 += kTile)
      for (int64_t j0 = i0; j0 < n; j0 += kTile)
        for (int64_t i = i0; i < std::min(n, i0 + kTile); ++i)
          for (int64_t j = std::max(j0, i + 1); j < std::min(n, j0 + kTile); ++j) {
            if (transposed) {
              A[j * n + i] = A[i * n + j];
            } else {
              A[i * n + j] = A[j * n + i];
            }
          }
  }
  return ffi::Error::Success();
}

ffi::Error CholeskyInverseCpu(ffi::AnyBuffer L, ffi::Result<ffi::AnyBuffer> out, bool transposed) {
  switch (L.element_type()) {
    case ffi::DataType::F32:
      return CholeskyInverse<float>(g_spotri.load(), L, *out, transposed);
    case ffi::DataType::F64:
      return CholeskyInverse<double>(g_dpotri.load(), L, *out, transposed);
    default:
      return ffi::Error::InvalidArgument("eqgp_cholesky_inverse[cpu]: unsupported dtype " +
                                         eqgp::DTypeName(L.element_type()) + " (expected float32 or float64)");
  }
}

ffi::Error CholeskyTCpu(ffi::AnyBuffer K, ffi::AnyBuffer /*after*/, ffi::Result<ffi::AnyBuffer> out) {
  switch (K.element_type()) {
    case ffi::DataType::F32:
      return CholeskyT<float>(g_spotrf.load(), K, *out);
    case ffi::DataType::F64:
      return CholeskyT<double>(g_dpotrf.load(), K, *out);
    default:
      return ffi::Error::InvalidArgument("eqgp_cholesky_t[cpu]: unsupported dtype " +
                                         eqgp::DTypeName(K.element_type()) + " (expected float32 or float64)");
  }
}

}  // namespace

void EqgpSetLapackPotri(void* spotri, void* dpotri) {
  g_spotri.store(reinterpret_cast<SPotri*>(spotri));
  g_dpotri.store(reinterpret_cast<DPotri*>(dpotri));
}

void EqgpSetLapackPotrf(void* spotrf, void* dpotrf) {
  g_spotrf.store(reinterpret_cast<SPotri*>(spotrf));
  g_dpotrf.store(reinterpret_cast<DPotri*>(dpotrf));
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(EqgpCholeskyInverseCpu, CholeskyInverseCpu,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()   // L, lower, (..., n, n), or L^T
                                  .Ret<ffi::AnyBuffer>()   // (L L^T)^{-1} (may alias the factor)
                                  .Attr<bool>("transposed"));  // the factor is L^T (upper)

XLA_FFI_DEFINE_HANDLER_SYMBOL(EqgpCholeskyTCpu, CholeskyTCpu,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()   // K, symmetric, (..., n, n)
                                  .Arg<ffi::AnyBuffer>()   // not read: values computed from K that
                                                           // must be read before K is overwritten
                                  .Ret<ffi::AnyBuffer>()); // L^T, row-major (aliases K)
