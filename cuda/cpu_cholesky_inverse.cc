// CPU XLA FFI handler: K^{-1} from a Cholesky factor by LAPACK's ?potri.
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
    // The column-major upper result is the row-major lower triangle: mirror it, in tiles
    // (a column walk of the lower triangle misses the cache on every element for large n).
    constexpr int64_t kTile = 64;
    for (int64_t i0 = 0; i0 < n; i0 += kTile)
      for (int64_t j0 = i0; j0 < n; j0 += kTile)
        for (int64_t i = i0; i < std::min(n, i0 + kTile); ++i)
          for (int64_t j = std::max(j0, i + 1); j < std::min(n, j0 + kTile); ++j) A[i * n + j] = A[j * n + i];
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

void EqgpSetLapackPotri(void* spotri, void* dpotri) {
  g_spotri.store(reinterpret_cast<SPotri*>(spotri));
  g_dpotri.store(reinterpret_cast<DPotri*>(dpotri));
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(EqgpCholeskyInverseCpu, CholeskyInverseCpu,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()   // L, lower, (..., n, n)
                                  .Ret<ffi::AnyBuffer>()); // (L L^T)^{-1}
