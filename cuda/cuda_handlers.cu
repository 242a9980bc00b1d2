// CUDA XLA FFI handlers: the linear recurrence z_i = a_i z_{i-1} + b_i
// (reverse: z_i = a_i z_{i+1} + b_i) along the last axis, and the fused J t / J^T t of sumcumprod.
//
// An element is the affine map t -> a t + b; applying p then c is
// (c.a p.a, c.a p.b + c.b), an associative composition, so a row is an
// inclusive scan of affine maps and z_i is the b part of the i-th prefix.
// Rows up to kWarpRowMax long: one warp per row (cub::WarpScan, a running
// prefix carried across 32-wide tiles). Longer rows: one block per row
// (cub::BlockScan over tiles of kBlock * kItems, running prefix across tiles),
// with striped (coalesced) global loads/stores and a shared-memory exchange
// into the blocked order the scan wants.
#include <cstdint>
#include <string>

#include <cuda_runtime.h>
#include <cub/block/block_exchange.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/warp/warp_scan.cuh>

#include "linrec_common.h"
#include "recurrence_op.h"
#include "xla/ffi/api/c_api.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// flags: kReal (a map of the row, not the scan's identity padding) and kNonFinite (some
// `a` in the composed segment is inf or NaN).
constexpr unsigned kReal = 1, kNonFinite = 2;

template <typename T>
struct Affine {
  T a, b;
  unsigned flags;
};

template <typename T>
__device__ __forceinline__ Affine<T> Identity() {
  return Affine<T>{T(1), T(0), 0u};
}

// The composition follows what the sequential recurrence computes where arithmetic is not
// exact: the identity (padding, the empty running prefix) leaves a map unchanged instead of
// multiplying its `a` by a zero carry (inf * 0 = NaN where a row starts with an inf), and a
// zero carry through a segment of finite `a`s adds nothing even where their product
// overflows (the sequential recurrence multiplies one finite `a` at a time by a zero).
struct Compose {  // p applied first, then c
  template <typename T>
  __device__ __forceinline__ Affine<T> operator()(const Affine<T>& p, const Affine<T>& c) const {
    if (!(p.flags & kReal)) return c;
    if (!(c.flags & kReal)) return p;
    const bool skip = p.b == T(0) && !(c.flags & kNonFinite);
    return Affine<T>{c.a * p.a, skip ? c.b : c.a * p.b + c.b, p.flags | c.flags};
  }
};

template <typename T>
struct RunningPrefix {  // the composition of every earlier tile of the row
  Affine<T> running;
  __device__ Affine<T> operator()(const Affine<T>& tile_aggregate) {
    Affine<T> old = running;
    running = Compose{}(running, tile_aggregate);
    return old;
  }
};

// Element access (eqgp::RecurrenceOp, shared with the CPU kernels) as affine maps.
template <typename T, class O>
__device__ __forceinline__ Affine<T> Load(const O& op, int64_t off, int64_t p) {
  const T a = op.A(off + p, p);
  return Affine<T>{a, op.B(off + p, p), isfinite(a) ? kReal : kReal | kNonFinite};
}
template <typename T, class O>
__device__ __forceinline__ void Store(const O& op, int64_t off, int64_t p, T state) {
  op.Put(off + p, p, state);
}

using eqgp::PlainOp;
using eqgp::SumcumprodJvpOp;
using eqgp::SumcumprodVjpOp;

constexpr int kBlock = 256;
constexpr int kItems = 4;
constexpr int kTile = kBlock * kItems;
constexpr int64_t kWarpRowMax = 256;
constexpr int kWarpsPerBlock = 8;

// Position of the k-th element of the scan order in the row.
template <bool Reverse>
__device__ __forceinline__ int64_t Pos(int64_t k, int64_t n) {
  return Reverse ? n - 1 - k : k;
}

template <typename T, bool Reverse, class O>
__global__ void BlockRowKernel(O op, int64_t rows, int64_t n) {
  using BlockScan = cub::BlockScan<Affine<T>, kBlock>;
  using Exchange = cub::BlockExchange<Affine<T>, kBlock, kItems>;
  __shared__ union {
    typename BlockScan::TempStorage scan;
    typename Exchange::TempStorage exchange;
  } temp;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t off = row * n;
    RunningPrefix<T> prefix{Identity<T>()};
    for (int64_t base = 0; base < n; base += kTile) {
      Affine<T> it[kItems];
#pragma unroll
      for (int k = 0; k < kItems; ++k) {  // striped: consecutive threads, consecutive elements
        const int64_t s = base + k * kBlock + threadIdx.x;
        if (s < n) {
          it[k] = Load<T>(op, off, Pos<Reverse>(s, n));
        } else {
          it[k] = Identity<T>();  // padding
        }
      }
      Exchange(temp.exchange).StripedToBlocked(it);
      __syncthreads();
      BlockScan(temp.scan).InclusiveScan(it, it, Compose{}, prefix);
      __syncthreads();
      Exchange(temp.exchange).BlockedToStriped(it);
      __syncthreads();
#pragma unroll
      for (int k = 0; k < kItems; ++k) {
        const int64_t s = base + k * kBlock + threadIdx.x;
        if (s < n) Store(op, off, Pos<Reverse>(s, n), it[k].b);
      }
    }
  }
}

template <typename T, bool Reverse, class O>
__global__ void WarpRowKernel(O op, int64_t rows, int64_t n) {
  using WarpScan = cub::WarpScan<Affine<T>>;
  __shared__ typename WarpScan::TempStorage temp[kWarpsPerBlock];
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  for (int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + warp; row < rows;
       row += int64_t(gridDim.x) * kWarpsPerBlock) {
    const int64_t off = row * n;
    Affine<T> running = Identity<T>();
    for (int64_t base = 0; base < n; base += 32) {
      const int64_t s = base + lane;
      Affine<T> it = Identity<T>();
      if (s < n) it = Load<T>(op, off, Pos<Reverse>(s, n));
      WarpScan(temp[warp]).InclusiveScan(it, it, Compose{});
      it = Compose{}(running, it);
      if (s < n) Store(op, off, Pos<Reverse>(s, n), it.b);
      running.a = __shfl_sync(0xffffffffu, it.a, 31);
      running.b = __shfl_sync(0xffffffffu, it.b, 31);
      running.flags = __shfl_sync(0xffffffffu, it.flags, 31);
    }
  }
}

inline unsigned GridFor(int64_t work_items, int64_t per_block) {
  int64_t g = (work_items + per_block - 1) / per_block;
  if (g > int64_t{1} << 20) g = int64_t{1} << 20;  // grid-stride loops cover the rest
  return static_cast<unsigned>(g < 1 ? 1 : g);
}

template <typename T, bool Reverse, class O>
void Launch(cudaStream_t s, const O& op, int64_t rows, int64_t n) {
  if (n <= kWarpRowMax) {
    WarpRowKernel<T, Reverse><<<GridFor(rows, kWarpsPerBlock), 32 * kWarpsPerBlock, 0, s>>>(op, rows, n);
  } else {
    BlockRowKernel<T, Reverse><<<GridFor(rows, 1), kBlock, 0, s>>>(op, rows, n);
  }
}

ffi::Error LaunchError(const char* op) {
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return ffi::Error::Internal(std::string(op) + ": kernel launch failed: " + cudaGetErrorName(err) +
                                ": " + cudaGetErrorString(err));
  }
  return ffi::Error::Success();
}

ffi::Error LinearRecurrenceCuda(cudaStream_t stream, bool reverse, ffi::AnyBuffer a,
                                ffi::AnyBuffer b, ffi::Result<ffi::AnyBuffer> z) {
  const char* name = "eqgp_linear_recurrence[cuda]";
  auto rn = eqgp::CheckOperands(name, a, b, *z);
  if (rn.has_error()) return rn.error();
  if (rn->rows == 0 || rn->n == 0) return ffi::Error::Success();  // never launch an empty grid
  auto run = [&](auto zero) {
    using T = decltype(zero);
    PlainOp<T> op{a.typed_data<T>(), b.typed_data<T>(), nullptr, z->typed_data<T>(), rn->n};
    if (reverse) {
      Launch<T, true>(stream, op, rn->rows, rn->n);
    } else {
      Launch<T, false>(stream, op, rn->rows, rn->n);
    }
  };
  eqgp::ForFloatType(a.element_type(), run);
  return LaunchError(name);
}

// transpose = false: out = J t; true: out = J^T t (J the Jacobian of sumcumprod at x),
// given z = sumcumprod(x), which the lowering computes first with the native recurrence
// into a buffer XLA plans (XLA:GPU's FFI scratch allocator refused every request on an
// H200 under jax 0.11; an operand XLA allocates is the documented way).
ffi::Error SumcumprodJvpCuda(cudaStream_t stream, bool transpose, ffi::AnyBuffer x, ffi::AnyBuffer t,
                             ffi::AnyBuffer z, ffi::Result<ffi::AnyBuffer> out) {
  const char* name = "eqgp_sumcumprod_jvp[cuda]";
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
      Launch<T, false>(stream, SumcumprodVjpOp<T>{xp, tp, zp, op, rn->n}, rn->rows, rn->n);
    } else {
      Launch<T, true>(stream, SumcumprodJvpOp<T>{xp, tp, zp, op, rn->n}, rn->rows, rn->n);
    }
  };
  eqgp::ForFloatType(x.element_type(), run);
  return LaunchError(name);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(EqgpLinearRecurrenceCuda, LinearRecurrenceCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Attr<bool>("reverse")
                                  .Arg<ffi::AnyBuffer>()   // a
                                  .Arg<ffi::AnyBuffer>()   // b
                                  .Ret<ffi::AnyBuffer>(),  // z
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(EqgpSumcumprodJvpCuda, SumcumprodJvpCuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Attr<bool>("transpose")
                                  .Arg<ffi::AnyBuffer>()   // x
                                  .Arg<ffi::AnyBuffer>()   // t
                                  .Arg<ffi::AnyBuffer>()   // z = sumcumprod(x)
                                  .Ret<ffi::AnyBuffer>(),  // J t or J^T t
                              {ffi::Traits::kCmdBufferCompatible});
