// Row-parallel loops on XLA's intra-op thread pool for the CPU handlers.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>

#include "xla/ffi/api/ffi.h"

namespace eqgp::cpu {

namespace ffi = xla::ffi;

constexpr int64_t kChunkAlign = 8;  // row-chunk granularity

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

}  // namespace eqgp::cpu
