// CPU XLA FFI handlers: the Cholesky factor of K in place by LAPACK's ?potrf, and K^{-1}
// from a Cholesky factor by LAPACK's ?potri (or the factor's own inverse by ?trtri).
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
// ?trtri (the first half of ?potri): the inverse of the triangular factor only.
using STrtri = void(char* uplo, char* diag, int* n, float* a, int* lda, int* info);
using DTrtri = void(char* uplo, char* diag, int* n, double* a, int* lda, int* info);
std::atomic<STrtri*> g_strtri{nullptr};
std::atomic<DTrtri*> g_dtrtri{nullptr};

// BLAS level 3 (scipy.linalg.cython_blas) for the tiled factorisation below.
template <typename T>
using Trsm = void(char* side, char* uplo, char* transa, char* diag, int* m, int* n, T* alpha, T* a, int* lda, T* b,
                  int* ldb);
template <typename T>
using Syrk = void(char* uplo, char* trans, int* n, int* k, T* alpha, T* a, int* lda, T* beta, T* c, int* ldc);
template <typename T>
using Gemm = void(char* transa, char* transb, int* m, int* n, int* k, T* alpha, T* a, int* lda, T* b, int* ldb,
                  T* beta, T* c, int* ldc);
template <typename T>
struct Blas {
  std::atomic<Trsm<T>*> trsm{nullptr};
  std::atomic<Syrk<T>*> syrk{nullptr};
  std::atomic<Gemm<T>*> gemm{nullptr};
};
Blas<float> g_sblas;
Blas<double> g_dblas;

// Column-major lower Cholesky in place (`a`, order n, leading dimension n), right-looking
// in tiles of `nb`: ?potrf on each diagonal tile, ?trsm for the tiles below it, ?syrk/?gemm
// for each tile of the trailing matrix. Every BLAS/LAPACK call sees at most nb x nb tiles
// (its pointer offset here, in 64 bits). Why: scipy's OpenBLAS 0.3.30 (the one jaxlib's and
// scipy's Cholesky use) segfaults in its threaded ?potrf and ?syrk on large orders (n >= 16 384
// on 2 threads; scipy.linalg.cho_factor and jax.lax.linalg.cholesky crash alike). Returns
// LAPACK's info (0, or the order of the first minor that is not positive definite).
template <typename T, typename Potrf>
int64_t TiledPotrf(Potrf* potrf, const Blas<T>& blas, T* a, int64_t n, int64_t nb) {
  Trsm<T>* trsm = blas.trsm.load();
  Syrk<T>* syrk = blas.syrk.load();
  Gemm<T>* gemm = blas.gemm.load();
  int ld = static_cast<int>(n);
  auto at = [&](int64_t i, int64_t j) { return a + i + j * n; };
  char L = 'L', R = 'R', N = 'N', Tr = 'T';
  T one = 1, minus_one = -1;
  for (int64_t k = 0; k < n; k += nb) {
    int kb = static_cast<int>(std::min(nb, n - k)), info = 0;
    potrf(&L, &kb, at(k, k), &ld, &info);
    if (info != 0) return k + info;
    for (int64_t i = k + kb; i < n; i += nb) {  // L21 = A21 L11^{-T}
      int ib = static_cast<int>(std::min(nb, n - i));
      trsm(&R, &L, &Tr, &N, &ib, &kb, &one, at(k, k), &ld, at(i, k), &ld);
    }
    for (int64_t j = k + kb; j < n; j += nb) {  // A22 -= L21 L21^T, the lower tiles
      int jb = static_cast<int>(std::min(nb, n - j));
      syrk(&L, &N, &jb, &kb, &minus_one, at(j, k), &ld, &one, at(j, j), &ld);
      for (int64_t i = j + jb; i < n; i += nb) {
        int ib = static_cast<int>(std::min(nb, n - i));
        gemm(&N, &Tr, &ib, &jb, &kb, &minus_one, at(i, k), &ld, at(j, k), &ld, &one, at(i, j), &ld);
      }
    }
  }
  return 0;
}

// What both handlers check: square (..., n, n) matrices of one dtype in and out, the LAPACK
// routine registered, and an order LAPACK's int can hold.
ffi::Error CheckSquare(const std::string& name, const ffi::AnyBuffer& in, const ffi::AnyBuffer& out,
                       const void* routine, const char* routine_name) {
  auto dims = in.dimensions();
  if (dims.size() < 2 || dims[dims.size() - 1] != dims[dims.size() - 2] || !(out.dimensions() == dims) ||
      out.element_type() != in.element_type()) {
    return ffi::Error::InvalidArgument(name + ": expected square (..., n, n) matrices, got " + eqgp::ShapeStr(dims));
  }
  if (routine == nullptr) {
    return ffi::Error::Internal(name + ": LAPACK " + routine_name + " was not registered");
  }
  if (dims.back() > int64_t{std::numeric_limits<int>::max()}) {
    return ffi::Error::InvalidArgument(name + ": n too large for LAPACK");
  }
  return ffi::Error::Success();
}

// The factor of a symmetric K held as L^T, row-major (which is LAPACK's column-major L):
// ?potrf('L') on the row-major buffer reads K's upper triangle (K is symmetric) and
// overwrites it with L^T; the other triangle is zeroed; a matrix that is not numerically
// positive definite gives NaN throughout (as jax.lax.linalg.cholesky does). Row-major in,
// row-major out, and XLA aliases the output to the input: no layout copy, no second matrix.
template <typename T, typename Potrf>
ffi::Error CholeskyT(Potrf* potrf, const Blas<T>& blas, const ffi::AnyBuffer& K, ffi::AnyBuffer& out, int64_t tile) {
  const std::string name = "eqgp_cholesky_t[cpu]";
  if (ffi::Error err = CheckSquare(name, K, out, reinterpret_cast<const void*>(potrf), "?potrf"); err.failure()) {
    return err;
  }
  auto dims = K.dimensions();
  if (tile < 0) return ffi::Error::InvalidArgument(name + ": tile must be >= 0");
  const bool tiled = tile > 0 && tile < dims.back();
  if (tiled && (blas.trsm.load() == nullptr || blas.syrk.load() == nullptr || blas.gemm.load() == nullptr)) {
    return ffi::Error::Internal(name + ": BLAS ?trsm/?syrk/?gemm were not registered");
  }
  const int64_t n = dims.back();
  if (n == 0) return ffi::Error::Success();
  const int64_t batch = static_cast<int64_t>(K.element_count()) / (n * n);
  const T* src = K.typed_data<T>();
  T* dst = out.typed_data<T>();
  if (src != dst) std::copy(src, src + batch * n * n, dst);
  for (int64_t b = 0; b < batch; ++b) {
    T* A = dst + b * n * n;
    // One tile of order n is a single ?potrf call.
    if (TiledPotrf<T>(potrf, blas, A, n, tiled ? tile : n) != 0) {
      std::fill(A, A + n * n, std::numeric_limits<T>::quiet_NaN());
      continue;
    }
    for (int64_t i = 1; i < n; ++i) std::fill(A + i * n, A + i * n + i, T(0));
  }
  return ffi::Error::Success();
}

template <typename T, typename Potri, typename Trtri>
ffi::Error CholeskyInverse(Potri* potri, Trtri* trtri, const ffi::AnyBuffer& L, ffi::AnyBuffer& out, bool transposed,
                           bool factor) {
  const std::string name = "eqgp_cholesky_inverse[cpu]";
  const void* routine = factor ? reinterpret_cast<const void*>(trtri) : reinterpret_cast<const void*>(potri);
  if (ffi::Error err = CheckSquare(name, L, out, routine, factor ? "?trtri" : "?potri"); err.failure()) {
    return err;
  }
  const int64_t n = L.dimensions().back();
  if (n == 0) return ffi::Error::Success();
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
    if (factor) {
      // The factor's own inverse, in its triangle (row-major: L^{-1} lower, or L^{-T} upper
      // where `transposed`); the other triangle is zeroed.
      char diag = 'N';
      trtri(&uplo, &diag, &nn, A, &lda, &info);
      if (info != 0) {
        return ffi::Error::InvalidArgument(name + ": ?trtri failed (info = " + std::to_string(info) +
                                           "): the factor is singular");
      }
      for (int64_t i = 0; i < n; ++i) {
        if (transposed) {
          std::fill(A + i * n, A + i * n + i, T(0));
        } else {
          std::fill(A + i * n + i + 1, A + (i + 1) * n, T(0));
        }
      }
      continue;
    }
    potri(&uplo, &nn, A, &lda, &info);
    if (info != 0) {
      return ffi::Error::InvalidArgument(name + ": ?potri failed (info = " +
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

ffi::Error CholeskyInverseCpu(ffi::AnyBuffer L, ffi::AnyBuffer /*after*/, ffi::Result<ffi::AnyBuffer> out,
                              bool transposed, bool factor) {
  switch (L.element_type()) {
    case ffi::DataType::F32:
      return CholeskyInverse<float>(g_spotri.load(), g_strtri.load(), L, *out, transposed, factor);
    case ffi::DataType::F64:
      return CholeskyInverse<double>(g_dpotri.load(), g_dtrtri.load(), L, *out, transposed, factor);
    default:
      return ffi::Error::InvalidArgument("eqgp_cholesky_inverse[cpu]: unsupported dtype " +
                                         eqgp::DTypeName(L.element_type()) + " (expected float32 or float64)");
  }
}

ffi::Error CholeskyTCpu(ffi::AnyBuffer K, ffi::AnyBuffer /*after*/, ffi::Result<ffi::AnyBuffer> out, int64_t tile) {
  switch (K.element_type()) {
    case ffi::DataType::F32:
      return CholeskyT<float>(g_spotrf.load(), g_sblas, K, *out, tile);
    case ffi::DataType::F64:
      return CholeskyT<double>(g_dpotrf.load(), g_dblas, K, *out, tile);
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

void EqgpSetLapackTrtri(void* strtri, void* dtrtri) {
  g_strtri.store(reinterpret_cast<STrtri*>(strtri));
  g_dtrtri.store(reinterpret_cast<DTrtri*>(dtrtri));
}

void EqgpSetLapackPotrf(void* spotrf, void* dpotrf) {
  g_spotrf.store(reinterpret_cast<SPotri*>(spotrf));
  g_dpotrf.store(reinterpret_cast<DPotri*>(dpotrf));
}

void EqgpSetBlas(void* strsm, void* dtrsm, void* ssyrk, void* dsyrk, void* sgemm, void* dgemm) {
  g_sblas.trsm.store(reinterpret_cast<Trsm<float>*>(strsm));
  g_dblas.trsm.store(reinterpret_cast<Trsm<double>*>(dtrsm));
  g_sblas.syrk.store(reinterpret_cast<Syrk<float>*>(ssyrk));
  g_dblas.syrk.store(reinterpret_cast<Syrk<double>*>(dsyrk));
  g_sblas.gemm.store(reinterpret_cast<Gemm<float>*>(sgemm));
  g_dblas.gemm.store(reinterpret_cast<Gemm<double>*>(dgemm));
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(EqgpCholeskyInverseCpu, CholeskyInverseCpu,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()   // L, lower, (..., n, n), or L^T
                                  .Arg<ffi::AnyBuffer>()   // not read: values computed from L that
                                                           // must be read before L is overwritten
                                  .Ret<ffi::AnyBuffer>()   // (L L^T)^{-1} (may alias the factor)
                                  .Attr<bool>("transposed")  // the factor is L^T (upper)
                                  .Attr<bool>("factor"));    // only the factor's inverse (?trtri)

XLA_FFI_DEFINE_HANDLER_SYMBOL(EqgpCholeskyTCpu, CholeskyTCpu,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()   // K, symmetric, (..., n, n)
                                  .Arg<ffi::AnyBuffer>()   // not read: values computed from K that
                                                           // must be read before K is overwritten
                                  .Ret<ffi::AnyBuffer>()   // L^T, row-major (aliases K)
                                  .Attr<int64_t>("tile"));  // 0: one ?potrf; else tiles of this order
