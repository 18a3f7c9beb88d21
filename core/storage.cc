#include "dtensor/core/storage.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "dtensor/core/cuda_module.h"
#include "dtensor/core/status.h"

namespace dt {

absl::StatusOr<Storage> Storage::Allocate(int64_t nbytes, Device device) {
  if (nbytes < 0) return absl::InvalidArgumentError(absl::StrCat("cannot allocate ", nbytes, " bytes"));
  Storage s;
  s.impl_ = std::make_shared<Impl>();
  s.impl_->nbytes = nbytes;
  s.impl_->device = device;
  if (device.is_cpu()) {
    const size_t rounded = static_cast<size_t>((nbytes + 63) / 64 * 64 + (nbytes == 0 ? 64 : 0));
    void* p = std::aligned_alloc(64, rounded);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat("out of host memory allocating ", nbytes, " bytes"));
    }
    s.impl_->data = p;
    s.impl_->kind = Kind::kHeap;
    s.impl_->release = [p] { std::free(p); };
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
