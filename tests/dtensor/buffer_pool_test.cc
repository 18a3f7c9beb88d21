#include "dtensor/dtensor/buffer_pool.h"

#include "gtest/gtest.h"

namespace dt {
namespace {

TEST(BufferPoolTest, ReusesFreedBuffersOfTheSameSize) {
  ReleasePool();
  const void* first = nullptr;
  {
    Tensor a = PooledEmpty({1024, 64}, DType::kF32, kCPU).value();
    EXPECT_EQ(a.shape(), (Shape{1024, 64}));
    EXPECT_TRUE(a.is_contiguous());
    first = a.raw_data();
    EXPECT_EQ(PoolCachedBytes(), 0);
  }
  EXPECT_EQ(PoolCachedBytes(), 1024 * 64 * 4);
  Tensor b = PooledEmpty({64, 1024}, DType::kF32, kCPU).value();  // same bytes
  EXPECT_EQ(b.raw_data(), first);
  EXPECT_EQ(PoolCachedBytes(), 0);
  // Small buffers are not pooled.
  { Tensor s = PooledEmpty({4}, DType::kF32, kCPU).value(); }
  EXPECT_EQ(PoolCachedBytes(), 0);
}

TEST(BufferPoolTest, LimitBoundsTheCache) {
  ReleasePool();
  const int64_t old = PoolLimitBytes();
  SetPoolLimitBytes(1 << 20);
  { Tensor a = PooledEmpty({1 << 19}, DType::kF32, kCPU).value(); }  // 2 MiB > limit: freed
  EXPECT_EQ(PoolCachedBytes(), 0);
  { Tensor a = PooledEmpty({1 << 17}, DType::kF32, kCPU).value(); }  // 512 KiB: kept
  EXPECT_EQ(PoolCachedBytes(), 512 << 10);
  SetPoolLimitBytes(0);
  EXPECT_EQ(PoolCachedBytes(), 0);
  SetPoolLimitBytes(old);
  EXPECT_FALSE(PooledEmpty({-1}, DType::kF32, kCPU).ok());
}

}  // namespace
}  // namespace dt
