// CUDA XLA FFI handler for the linear recurrence z_i = a_i z_{i-1} + b_i
// (reverse: z_i = a_i z_{i+1} + b_i) along the last axis.
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

template <typename T, bool Reverse>
__global__ void BlockRowKernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ z,
                               int64_t rows, int64_t n) {
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
          const int64_t i = off + Pos<Reverse>(s, n);
          it[k] = Affine<T>{a[i], b[i]};
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
        if (s < n) z[off + Pos<Reverse>(s, n)] = it[k].b;
      }
    }
  }
}

template <typename T, bool Reverse>
__global__ void WarpRowKernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ z,
                              int64_t rows, int64_t n) {
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
      if (s < n) {
        const int64_t i = off + Pos<Reverse>(s, n);
        it = Affine<T>{a[i], b[i]};
      }
      WarpScan(temp[warp]).InclusiveScan(it, it, Compose{});
      it = Compose{}(running, it);
      if (s < n) z[off + Pos<Reverse>(s, n)] = it.b;
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

template <typename T, bool Reverse>
void Launch(cudaStream_t s, const T* a, const T* b, T* z, int64_t rows, int64_t n) {
  if (n <= kWarpRowMax) {
    WarpRowKernel<T, Reverse>
        <<<GridFor(rows, kWarpsPerBlock), 32 * kWarpsPerBlock, 0, s>>>(a, b, z, rows, n);
  } else {
    BlockRowKernel<T, Reverse><<<GridFor(rows, 1), kBlock, 0, s>>>(a, b, z, rows, n);
  }
}

template <typename T>
void Dispatch(cudaStream_t s, bool reverse, const ffi::AnyBuffer& a, const ffi::AnyBuffer& b,
              ffi::AnyBuffer& z, int64_t rows, int64_t n) {
  const T* ap = a.typed_data<T>();
  const T* bp = b.typed_data<T>();
  T* zp = z.typed_data<T>();
  if (reverse) {
    Launch<T, true>(s, ap, bp, zp, rows, n);
  } else {
    Launch<T, false>(s, ap, bp, zp, rows, n);
  }
}

ffi::Error LinearRecurrenceCuda(cudaStream_t stream, bool reverse, ffi::AnyBuffer a,
                                ffi::AnyBuffer b, ffi::Result<ffi::AnyBuffer> z) {
  auto rn = eqgp::CheckOperands("eqgp_linear_recurrence[cuda]", a, b, *z);
  if (rn.has_error()) return rn.error();
  if (rn->rows == 0 || rn->n == 0) return ffi::Error::Success();  // never launch an empty grid
  if (a.element_type() == ffi::DataType::F32) {
    Dispatch<float>(stream, reverse, a, b, *z, rn->rows, rn->n);
  } else {
    Dispatch<double>(stream, reverse, a, b, *z, rn->rows, rn->n);
  }
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return ffi::Error::Internal(std::string("eqgp_linear_recurrence[cuda]: kernel launch failed: ") +
                                cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
  }
  return ffi::Error::Success();
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
