// Scratch memory of the CPU handlers. The handlers write only the buffers XLA hands
// them; how those are allocated (glibc arenas, huge pages) is the runtime's business
// (docs/performance.md gives the environment recipe).
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

namespace eqgp::cpu {

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

}  // namespace eqgp::cpu
