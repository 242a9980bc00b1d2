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
#include <vector>

#include <pybind11/pybind11.h>

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#endif

#include "linrec_common.h"
#include "xla/ffi/api/c_api.h"
#include "xla/ffi/api/ffi.h"

namespace py = pybind11;
namespace ffi = xla::ffi;

namespace {

// ---------------------------------------------------------------------------
// Element access. A scan visits a row in order (reverse or forward) and at row
// position p needs the multiplier A, the offset B and what to store for the
// state (Put). One struct, specialised by three flags, covers all three ops:
//
//   plain  z = LR(a, b):         A = a_p,      B = b_p,                 out = state
//   J t    (sumcumprod at x):    A = x_p,      B = t_p (1 + z_{p+1}),   out = state   (reverse)
//   J^T t:                       A = x_{p-1},  B = t_p,                 out = state (1 + z_{p+1})  (forward)
//
// z past the end of a row is zero, and x_{-1} multiplies the zero initial state.
template <typename T, bool AShift, bool BScale, bool PostScale>
struct Op {
  const T* a;
  const T* b;
  const T* z;  // only read with BScale or PostScale
  T* out;
  int64_t n;
  // Write `out` with non-temporal stores where the SIMD path can: for outputs too
  // large to stay in cache, it saves reading each line in before overwriting it.
  bool stream = false;
  // e: flat index, p: position in the row.
  T A(int64_t e, int64_t p) const {
    if constexpr (AShift) return p > 0 ? a[e - 1] : T(0);
    return a[e];
  }
  T Scale(int64_t e, int64_t p) const { return T(1) + (p + 1 < n ? z[e + 1] : T(0)); }
  T B(int64_t e, int64_t p) const {
    if constexpr (BScale) return b[e] * Scale(e, p);
    return b[e];
  }
  void Put(int64_t e, int64_t p, T v) const {
    if constexpr (PostScale) v *= Scale(e, p);
    out[e] = v;
  }
  // Positions [lo, hi) where every neighbour access is inside the row, so a block
  // of positions can be handled without the edge checks.
  int64_t SafeLo() const { return AShift ? 1 : 0; }
  int64_t SafeHi() const { return (BScale || PostScale) ? n - 1 : n; }
};

template <typename T>
using PlainOp = Op<T, false, false, false>;
template <typename T>
using SumcumprodJvpOp = Op<T, false, true, false>;
template <typename T>
using SumcumprodVjpOp = Op<T, true, false, true>;

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
constexpr int64_t kChunkAlign = 8;  // row-chunk granularity for the thread pool

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
  EQGP_AVX2 static void Stream(float* p, V v) { _mm256_stream_ps(p, v); }  // p 32-byte aligned
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
  EQGP_AVX2 static void Stream(double* p, V v) { _mm256_stream_pd(p, v); }  // p 32-byte aligned
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
// Stream: the outputs are stored non-temporally (every row's address is aligned).
template <typename T, bool Reverse, bool SameAB, bool Stream, bool AShift, bool BScale, bool PostScale>
EQGP_AVX2 inline void SimdBlock(const Op<T, AShift, BScale, PostScale>& op, int64_t row0, int64_t base,
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
    if constexpr (Stream) {
      S::Stream(op.out + e, v);
    } else {
      S::Store(op.out + e, v);
    }
  }
}

template <typename T, bool Reverse, bool SameAB, bool Stream, bool AShift, bool BScale, bool PostScale>
EQGP_AVX2 inline void SimdBlocks(const Op<T, AShift, BScale, PostScale>& op, int64_t row0, int64_t b0,
                                 int64_t blocks, typename Avx2<T>::V& acc) {
  constexpr int W = Avx2<T>::W;
  for (int64_t k = 0; k < blocks; ++k) {
    const int64_t base = Reverse ? b0 + W * (blocks - 1 - k) : b0 + W * k;
    SimdBlock<T, Reverse, SameAB, Stream>(op, row0, base, acc);
  }
}

template <typename T, bool Reverse, bool AShift, bool BScale, bool PostScale>
EQGP_AVX2 void SimdRows(const Op<T, AShift, BScale, PostScale>& op, int64_t row0) {
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
  bool stream = op.stream;
  for (int q = 0; q < W && stream; ++q) stream = reinterpret_cast<uintptr_t>(op.out + (row0 + q) * n + b0) % 32 == 0;
  bool same_ab = false;
  if constexpr (!AShift && !BScale) same_ab = op.a == op.b;
  if (same_ab) {
    if constexpr (!AShift && !BScale) {
      if (stream) {
        SimdBlocks<T, Reverse, true, true>(op, row0, b0, blocks, vacc);
      } else {
        SimdBlocks<T, Reverse, true, false>(op, row0, b0, blocks, vacc);
      }
    }
  } else if (stream) {
    SimdBlocks<T, Reverse, false, true>(op, row0, b0, blocks, vacc);
  } else {
    SimdBlocks<T, Reverse, false, false>(op, row0, b0, blocks, vacc);
  }
  if (stream) _mm_sfence();  // non-temporal stores are weakly ordered: publish them
  S::StoreState(acc, vacc);
  const int64_t last0 = Reverse ? 0 : b1, last1 = Reverse ? b0 : n;
  ScalarSpan<T, W, Reverse, true>(op, row0, acc, last0, last1);
}

template <typename T, bool Reverse, class O>
EQGP_AVX2 void RecurRowsFma(const O& op, int64_t r0, int64_t r1) {
  constexpr int W = Avx2<T>::W;
  int64_t r = r0;
  for (; r + W <= r1; r += W) SimdRows<T, Reverse>(op, r);
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

// Outputs from this size up are written with non-temporal stores: they would not
// stay in cache for the consumer anyway (L2 is 1-2 MiB a core, L3 tens of MiB).
constexpr size_t kStreamBytes = size_t{16} << 20;
inline bool StreamOutput(size_t bytes) { return bytes >= kStreamBytes; }

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
    PlainOp<T> op{a.typed_data<T>(), b.typed_data<T>(), nullptr, z->typed_data<T>(), rn->n,
                  StreamOutput(z->size_bytes())};
    if (reverse) {
      RunOp<T, true>(pool, op, rn->rows);
    } else {
      RunOp<T, false>(pool, op, rn->rows);
    }
  };
  eqgp::ForFloatType(a.element_type(), run);
  return ffi::Error::Success();
}

// A per-thread buffer reused across calls: a fresh one would be page-faulted on
// every call. Requests above kScratchKeep elements get a buffer of their own, so
// one huge call does not pin its memory to a pool thread for good.
constexpr size_t kScratchKeep = size_t{1} << 21;

template <typename T>
class Scratch {
 public:
  explicit Scratch(size_t count) {
    if (count > kScratchKeep) {
      own_.reset(new T[count]);
      data_ = own_.get();
      return;
    }
    thread_local std::vector<T> kept;
    if (kept.size() < count) kept.resize(count);
    data_ = kept.data();
  }
  T* data() const { return data_; }

 private:
  std::unique_ptr<T[]> own_;
  T* data_ = nullptr;
};

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
  auto run = [&](auto zero) {
    using T = decltype(zero);
    const T* xp = x.typed_data<T>();
    const T* tp = t.typed_data<T>();
    T* op = out->typed_data<T>();
    const int64_t n = rn->n;
    const bool stream = StreamOutput(out->size_bytes());
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
