#pragma once
// Refcounted byte buffers. A Storage is shared by every view of it; the bytes are freed when the
// last Tensor that refers to them goes away.
//   - heap: 64-byte aligned host memory (zero-size allocations are valid and non-null); blocks of
//     64 KiB or more are kept when freed and handed out again (Note [Host block cache] in
//     storage.cc)
//   - mmap: a read-only view of a file region (checkpoints); writing through it is refused
//   - cuda: device memory (only when built with CUDA)
//   - external: memory owned by someone else, with a release callback

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "dtensor/core/device.h"

namespace dt {

// Whether freed host blocks are kept for the next request (Note [Host block cache] in
// storage.cc): not under AddressSanitizer, so that a use after free still lands in its quarantine.
#if defined(__SANITIZE_ADDRESS__)  // gcc
#define DT_ADDRESS_SANITIZER 1
#elif defined(__has_feature)  // clang
#if __has_feature(address_sanitizer)
#define DT_ADDRESS_SANITIZER 1
#endif
#endif
#ifdef DT_ADDRESS_SANITIZER
inline constexpr bool kHostBlockCache = false;
#else
inline constexpr bool kHostBlockCache = true;
#endif

class Storage {
 public:
  enum class Kind : uint8_t { kHeap, kMmap, kCuda, kExternal };

  static absl::StatusOr<Storage> Allocate(int64_t nbytes, Device device);
  // Maps [offset, offset+length) of `path` read-only. The mapping stays alive while any view does.
  static absl::StatusOr<Storage> MapFile(const std::string& path, int64_t offset, int64_t length);
  static Storage Wrap(void* data, int64_t nbytes, Device device, std::function<void()> release,
                      bool read_only = false);
  // A storage that shares ownership with `owner` but starts at `data`.
  static Storage Alias(const Storage& owner, void* data, int64_t nbytes, bool read_only);

  Storage() = default;
  void* data() const { return impl_ ? impl_->data : nullptr; }
  int64_t nbytes() const { return impl_ ? impl_->nbytes : 0; }
  Device device() const { return impl_ ? impl_->device : kCPU; }
  Kind kind() const { return impl_ ? impl_->kind : Kind::kHeap; }
  bool read_only() const { return impl_ && impl_->read_only; }
  bool defined() const { return impl_ != nullptr; }
  long use_count() const { return impl_.use_count(); }

 private:
  struct Impl {
    void* data = nullptr;
    int64_t nbytes = 0;
    Device device;
    Kind kind = Kind::kHeap;
    bool read_only = false;
    std::function<void()> release;
    std::shared_ptr<Impl> owner;  // for aliases
    ~Impl() { if (release) release(); }
  };
  std::shared_ptr<Impl> impl_;
};

// Host <-> device and device <-> device copies of raw bytes. CPU-only builds support cpu<->cpu.
absl::Status CopyBytes(void* dst, Device dst_device, const void* src, Device src_device, int64_t nbytes);

}  // namespace dt
