// Memory on the CPU side of the handlers: how outputs are written and where scratch
// comes from. Large buffers that XLA hands out are fresh mmaps (glibc serves them
// outside its heaps, and XLA's pool threads allocate from per-thread arenas), so the
// first write to each 4 KiB page faults: ~60 ms for 64 MiB here, more than the
// recurrence itself. Asking for transparent huge pages on an output before writing
// it makes that one fault per 2 MiB (what numpy does for its own large arrays).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

namespace eqgp::cpu {

#if defined(__linux__)
inline uintptr_t PageSize() { return static_cast<uintptr_t>(sysconf(_SC_PAGESIZE)); }
#endif

// Whether the pages of [data, data + bytes) are backed by memory already (a buffer
// XLA reuses) rather than fresh (a new mmap whose first write faults). Sampled at
// the first, middle and last page: three mincore calls, a few microseconds.
inline bool PagesResident(const void* data, size_t bytes) {
#if defined(__linux__)
  if (bytes == 0) return true;
  const uintptr_t page = PageSize();
  for (const size_t offset : {size_t{0}, bytes / 2, bytes - 1}) {
    const uintptr_t p = (reinterpret_cast<uintptr_t>(data) + offset) & ~(page - 1);
    unsigned char resident = 0;
    if (mincore(reinterpret_cast<void*>(p), page, &resident) != 0 || !(resident & 1)) return false;
  }
  return true;
#else
  (void)data;
  (void)bytes;
  return true;
#endif
}

// Large outputs whose pages are already resident are written with non-temporal
// stores: they would not stay in cache for the consumer anyway (L2 is 1-2 MiB a
// core, L3 tens of MiB). Fresh pages are not: the page fault zeroes each one through
// the cache just before we write it, and plain stores then hit those cached lines,
// where non-temporal ones must first evict them (measured on 64 MiB, 2 threads:
// 8.5 ms streaming into fresh pages, 7.1 ms with plain stores; 2.9 vs 4.5 ms into
// resident ones).
constexpr size_t kStreamBytes = size_t{16} << 20;
inline bool StreamOutput(const void* data, size_t bytes) {
  return bytes >= kStreamBytes && PagesResident(data, bytes);
}

// Outputs from this size up get madvise(MADV_HUGEPAGE) before the first write, over the
// pages they lie in (rounded out to 4 KiB pages, not in to 2 MiB ones: XLA's 64 MiB
// buffer is a mapping that ends on a 2 MiB boundary 4 KiB past the data's last byte, so
// rounding in left its last 2 MiB to 512 small-page faults, ~1-2 ms of a 9 ms forward).
// The kernel backs each 2 MiB-aligned stretch inside the advised range with one huge
// page. Harmless where the pages are already there (a reused buffer) or where THP is
// off, and for the bytes of a shared edge page (a hint, not a write); errors are ignored
// (the hint is best effort).
constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kAdviseBytes = 2 * kHugePage;

inline void AdviseHugePages(void* data, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (bytes < kAdviseBytes) return;
  const uintptr_t page = PageSize();
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data);
  const uintptr_t lo = begin & ~(page - 1);
  const uintptr_t hi = (begin + bytes + page - 1) & ~(page - 1);
  madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE);
#else
  (void)data;
  (void)bytes;
#endif
}

// What a handler does with its output before writing it: asks for huge pages and says
// whether to stream it (residency is read first; the hint itself touches no page).
inline bool PrepareOutput(void* data, size_t bytes) {
  const bool stream = StreamOutput(data, bytes);
  AdviseHugePages(data, bytes);
  return stream;
}

// A per-thread buffer reused across calls: a fresh one would be page-faulted on
// every call. Requests above kScratchKeep elements get a buffer of their own, so
// one huge call does not pin its memory to a pool thread for good. Each Tag is a
// buffer of its own, for scratch users that can be live at once on one thread.
constexpr size_t kScratchKeep = size_t{1} << 21;

template <typename T, int Tag = 0>
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
