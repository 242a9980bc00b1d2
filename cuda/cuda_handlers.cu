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

template <typename T>
struct Affine {
  T a, b;
};

struct Compose {  // p applied first, then c
  template <typename T>
  __device__ __forceinline__ Affine<T> operator()(const Affine<T>& p, const Affine<T>& c) const {
    return Affine<T>{c.a * p.a, c.a * p.b + c.b};
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
  return Affine<T>{op.A(off + p, p), op.B(off + p, p)};
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
    RunningPrefix<T> prefix{Affine<T>{T(1), T(0)}};
    for (int64_t base = 0; base < n; base += kTile) {
      Affine<T> it[kItems];
#pragma unroll
      for (int k = 0; k < kItems; ++k) {  // striped: consecutive threads, consecutive elements
        const int64_t s = base + k * kBlock + threadIdx.x;
        if (s < n) {
          it[k] = Load<T>(op, off, Pos<Reverse>(s, n));
        } else {
          it[k] = Affine<T>{T(1), T(0)};  // identity map
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
    Affine<T> running{T(1), T(0)};
    for (int64_t base = 0; base < n; base += 32) {
      const int64_t s = base + lane;
      Affine<T> it{T(1), T(0)};
      if (s < n) it = Load<T>(op, off, Pos<Reverse>(s, n));
      WarpScan(temp[warp]).InclusiveScan(it, it, Compose{});
      it = Compose{}(running, it);
      if (s < n) Store(op, off, Pos<Reverse>(s, n), it.b);
      running.a = __shfl_sync(0xffffffffu, it.a, 31);
      running.b = __shfl_sync(0xffffffffu, it.b, 31);
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

// transpose = false: out = J t; true: out = J^T t (J the Jacobian of sumcumprod at x).
// z = sumcumprod(x) goes to a scratch buffer from XLA's allocator first, then the
// product reads it (the CPU handler recomputes z in cache instead).
ffi::Error SumcumprodJvpCuda(cudaStream_t stream, ffi::ScratchAllocator scratch, bool transpose, ffi::AnyBuffer x,
                             ffi::AnyBuffer t, ffi::Result<ffi::AnyBuffer> out) {
  const char* name = "eqgp_sumcumprod_jvp[cuda]";
  auto rn = eqgp::CheckJacobianOperands(name, x, t, *out);
  if (rn.has_error()) return rn.error();
  if (rn->rows == 0 || rn->n == 0) return ffi::Error::Success();
  auto mem = scratch.Allocate(x.size_bytes(), 256);
  if (!mem.has_value()) {
    return ffi::Error(ffi::ErrorCode::kResourceExhausted,
                      std::string(name) + ": could not allocate " + std::to_string(x.size_bytes()) +
                          " bytes of scratch for sumcumprod(x)");
  }
  auto run = [&](auto zero) {
    using T = decltype(zero);
    const T* xp = x.typed_data<T>();
    const T* tp = t.typed_data<T>();
    T* zp = static_cast<T*>(*mem);
    T* op = out->typed_data<T>();
    Launch<T, true>(stream, PlainOp<T>{xp, xp, nullptr, zp, rn->n}, rn->rows, rn->n);
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
                                  .Ctx<ffi::ScratchAllocator>()
                                  .Attr<bool>("transpose")
                                  .Arg<ffi::AnyBuffer>()    // x
                                  .Arg<ffi::AnyBuffer>()    // t
                                  .Ret<ffi::AnyBuffer>());  // J t or J^T t
