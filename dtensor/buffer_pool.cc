#include "dtensor/dtensor/buffer_pool.h"

#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dtensor/core/env.h"
#include "dtensor/core/status.h"

namespace dt {
namespace {

// See Note [Executor buffers].
class Pool {
 public:
  static Pool& Get() {
    static Pool* pool = new Pool();  // never destroyed: buffers may return during exit
    return *pool;
  }

  void* Take(size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(bytes);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        cached_ -= static_cast<int64_t>(bytes);
        return p;
      }
    }
    return std::aligned_alloc(64, bytes);
  }

  void Give(void* p, size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (cached_ + static_cast<int64_t>(bytes) <= limit_) {
        free_[bytes].push_back(p);
        cached_ += static_cast<int64_t>(bytes);
        return;
      }
    }
    std::free(p);
  }

  int64_t limit() {
    std::lock_guard<std::mutex> lock(mu_);
    return limit_;
  }
  void set_limit(int64_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      limit_ = bytes;
    }
    if (bytes == 0) Release();
  }
  const absl::Status& config() const { return config_; }
  int64_t cached() {
    std::lock_guard<std::mutex> lock(mu_);
    return cached_;
  }
  void Release() {
    std::unordered_map<size_t, std::vector<void*>> drop;
    {
      std::lock_guard<std::mutex> lock(mu_);
      drop.swap(free_);
      cached_ = 0;
    }
    for (auto& [bytes, list] : drop) {
      for (void* p : list) std::free(p);
    }
  }

 private:
  // A bad DT_BUFFER_POOL_MB is an error of every PooledEmpty (and of making a world, which checks
  // every DT_* variable first).
  Pool() {
    absl::StatusOr<std::optional<int64_t>> mb = env::Int("DT_BUFFER_POOL_MB");
    config_ = mb.status();
    limit_ = (mb.ok() ? mb->value_or(1024) : 0) << 20;
  }

  std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  int64_t cached_ = 0;
  int64_t limit_ = 0;
  absl::Status config_;  // DT_BUFFER_POOL_MB's
};

}  // namespace

absl::StatusOr<Tensor> PooledEmpty(IntSpan shape, DType dtype, Device device) {
  for (int64_t s : shape) {
    if (s < 0) return absl::InvalidArgumentError(absl::StrCat("PooledEmpty: negative size ", s));
  }
  DT_RETURN_IF_ERROR(Pool::Get().config());
  const int64_t nbytes = Numel(shape) * DTypeSize(dtype);
  if (!device.is_cpu() || nbytes < (int64_t{64} << 10) || Pool::Get().limit() == 0) {
    return Tensor::Empty(shape, dtype, device);  // small or non-host buffers: plain allocation
  }
  const size_t rounded = static_cast<size_t>((nbytes + 4095) / 4096 * 4096);
  void* p = Pool::Get().Take(rounded);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("out of host memory allocating ", nbytes, " bytes"));
  }
  Storage storage = Storage::Wrap(p, nbytes, device, [p, rounded] { Pool::Get().Give(p, rounded); });
  return Tensor(std::move(storage), Shape(shape.begin(), shape.end()), ContiguousStrides(shape), 0,
                dtype);
}

int64_t PoolLimitBytes() { return Pool::Get().limit(); }
void SetPoolLimitBytes(int64_t bytes) { Pool::Get().set_limit(bytes); }
int64_t PoolCachedBytes() { return Pool::Get().cached(); }
void ReleasePool() { Pool::Get().Release(); }

}  // namespace dt
