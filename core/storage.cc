#include "dtensor/core/storage.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "dtensor/core/cuda_module.h"
#include "dtensor/core/status.h"

namespace dt {

namespace {

// Note [Host block cache]
// Every op allocates its output, and a forward frees as many tensors as it makes. glibc serves a
// block of 128 KiB or more with a fresh mmap (and gives it back with munmap) until a large free
// has raised its thresholds, and trims the top of its heap back to the OS beyond 128 KiB free: so
// whether each [224, 1536] activation of a prefill costs 84 page faults and zeroed pages depended
// on what the process happened to free earlier (SmolLM2 prefill, 2 threads, AMD EPYC Zen 4: 810
// tokens/s cold against 1160 with the same blocks kept). Host blocks of kMinBytes or more are
// therefore kept here when freed, up to kMaxBytes in all (glibc's own dynamic ceiling: 32 MiB
// mmap threshold, 64 MiB trim threshold), and handed out again to a request they fit within
// 1/8. Sizes round up to 4 KiB so that near-equal requests share blocks. What does not fit in the
// budget goes back to malloc, largest cached blocks first. Under AddressSanitizer nothing is
// cached, so that a use after free still lands in ASan's quarantine.
class HostBlockCache {
 public:
  static constexpr size_t kMinBytes = size_t{64} << 10;
  static constexpr size_t kMaxBytes = size_t{64} << 20;

  static HostBlockCache& Get() {
    static HostBlockCache* const cache = new HostBlockCache();  // leaked: outlives every Storage
    return *cache;
  }

  // A block of at least `bytes` (its capacity in *capacity), or nullptr when out of memory.
  void* Take(size_t bytes, size_t* capacity) {
    *capacity = bytes;
    if (bytes < kMinBytes || !kHostBlockCache) return std::aligned_alloc(64, bytes);
    *capacity = (bytes + 4095) / 4096 * 4096;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.lower_bound(*capacity);
      if (it != free_.end() && it->first <= *capacity + *capacity / 8) {
        *capacity = it->first;
        void* p = it->second;
        cached_ -= it->first;
        free_.erase(it);
        return p;
      }
    }
    void* p = std::aligned_alloc(64, *capacity);
    if (p == nullptr) {  // what the cache holds first
      Release(0);
      p = std::aligned_alloc(64, *capacity);
    }
    return p;
  }

  void Give(void* p, size_t capacity) {
    if (capacity < kMinBytes || capacity > kMaxBytes || !kHostBlockCache) {
      std::free(p);
      return;
    }
    Release(kMaxBytes - capacity);
    std::lock_guard<std::mutex> lock(mu_);
    free_.emplace(capacity, p);
    cached_ += capacity;
  }

 private:
  // Frees cached blocks, largest first, until at most `keep` bytes are cached.
  void Release(size_t keep) {
    std::lock_guard<std::mutex> lock(mu_);
    while (cached_ > keep && !free_.empty()) {
      auto last = std::prev(free_.end());
      cached_ -= last->first;
      std::free(last->second);
      free_.erase(last);
    }
  }

  std::mutex mu_;
  std::multimap<size_t, void*> free_;
  size_t cached_ = 0;
};

}  // namespace

absl::StatusOr<Storage> Storage::Allocate(int64_t nbytes, Device device) {
  if (nbytes < 0) return absl::InvalidArgumentError(absl::StrCat("cannot allocate ", nbytes, " bytes"));
  Storage s;
  s.impl_ = std::make_shared<Impl>();
  s.impl_->nbytes = nbytes;
  s.impl_->device = device;
  if (device.is_cpu()) {
    const size_t rounded = static_cast<size_t>((nbytes + 63) / 64 * 64 + (nbytes == 0 ? 64 : 0));
    size_t capacity = 0;
    void* p = HostBlockCache::Get().Take(rounded, &capacity);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat("out of host memory allocating ", nbytes, " bytes"));
    }
    s.impl_->data = p;
    s.impl_->kind = Kind::kHeap;
    s.impl_->release = [p, capacity] { HostBlockCache::Get().Give(p, capacity); };
    return s;
  }
  absl::StatusOr<const internal::CudaModule*> cuda = internal::LoadCudaModule();
  if (!cuda.ok()) {
    return internal::InContext(cuda.status(), absl::StrCat("cannot allocate on ", device.ToString()));
  }
  const internal::CudaMemory& memory = (*cuda)->memory;
  DT_ASSIGN_OR_RETURN(void* p, memory.allocate(nbytes, device.index));
  s.impl_->data = p;
  s.impl_->kind = Kind::kCuda;
  const int idx = device.index;
  s.impl_->release = [p, idx, release = memory.release] { release(p, idx); };
  return s;
}

absl::StatusOr<Storage> Storage::MapFile(const std::string& path, int64_t offset, int64_t length) {
  if (offset < 0 || length < 0) {
    return absl::InvalidArgumentError(absl::StrCat("MapFile '", path, "': bad range ", offset, "+", length));
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("cannot open '", path, "': ", std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    return absl::InternalError(absl::StrCat("cannot stat '", path, "': ", std::strerror(e)));
  }
  if (offset + length > st.st_size) {
    ::close(fd);
    return absl::OutOfRangeError(absl::StrCat("'", path, "' has ", st.st_size, " bytes; range ", offset,
                                              "+", length, " runs past its end"));
  }
  Storage s;
  s.impl_ = std::make_shared<Impl>();
  s.impl_->nbytes = length;
  s.impl_->kind = Kind::kMmap;
  s.impl_->read_only = true;
  if (length == 0) {
    ::close(fd);
    static char empty[64];
    s.impl_->data = empty;
    return s;
  }
  const long page = ::sysconf(_SC_PAGESIZE);
  const int64_t base = offset / page * page;
  const size_t map_len = static_cast<size_t>(offset - base + length);
  void* p = ::mmap(nullptr, map_len, PROT_READ, MAP_PRIVATE, fd, base);
  const int e = errno;
  ::close(fd);
  if (p == MAP_FAILED) return absl::InternalError(absl::StrCat("mmap '", path, "': ", std::strerror(e)));
  s.impl_->data = static_cast<char*>(p) + (offset - base);
  s.impl_->release = [p, map_len] { ::munmap(p, map_len); };
  return s;
}

Storage Storage::Wrap(void* data, int64_t nbytes, Device device, std::function<void()> release,
                      bool read_only) {
  Storage s;
  s.impl_ = std::make_shared<Impl>();
  s.impl_->data = data;
  s.impl_->nbytes = nbytes;
  s.impl_->device = device;
  s.impl_->kind = Kind::kExternal;
  s.impl_->read_only = read_only;
  s.impl_->release = std::move(release);
  return s;
}

Storage Storage::Alias(const Storage& owner, void* data, int64_t nbytes, bool read_only) {
  Storage s;
  s.impl_ = std::make_shared<Impl>();
  s.impl_->data = data;
  s.impl_->nbytes = nbytes;
  s.impl_->device = owner.device();
  s.impl_->kind = owner.kind();
  s.impl_->read_only = read_only || owner.read_only();
  s.impl_->owner = owner.impl_;
  return s;
}

absl::Status CopyBytes(void* dst, Device dst_device, const void* src, Device src_device, int64_t nbytes) {
  if (nbytes == 0) return absl::OkStatus();
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memcpy(dst, src, static_cast<size_t>(nbytes));
    return absl::OkStatus();
  }
  absl::StatusOr<const internal::CudaModule*> cuda = internal::LoadCudaModule();
  if (!cuda.ok()) {
    return internal::InContext(cuda.status(),
                               absl::StrCat("cannot copy ", src_device.ToString(), " -> ", dst_device.ToString()));
  }
  return (*cuda)->memory.copy_bytes(dst, dst_device, src, src_device, nbytes);
}

}  // namespace dt
