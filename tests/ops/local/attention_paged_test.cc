// PagedAttentionInto and WriteToPages (ops/local/ops.h; Note [Paged attention] in
// ops/local/cpu/attention.cc): many sequences over KV pages give, row for row and bit for bit, what
// the contiguous flash kernel gives each sequence alone over its keys laid out in one tensor (and
// on the score-row path, within rounding, what the contiguous score-row path gives); and their
// argument errors name the op and the values.

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "dtensor/ops/local/cpu/attention.h"
#include "dtensor/ops/local/cpu/attention_kernels.h"
#include "dtensor/ops/local/ops.h"
#include "dtensor/tests/ops/local/test_util.h"
#include "dtensor/tests/test_util.h"

namespace dt::ops {
namespace {

using cpu::attention::Isa;

std::vector<Isa> SupportedIsas() {
  return testing::SupportedIsas({Isa::kGeneric, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16},
                                cpu::attention::IsaSupported);
}

using ForceIsa = testing::Forced<Isa, cpu::attention::SetIsaForTesting>;

// Sequences of random lengths over a pool of pages handed out in a shuffled order: each sequence's
// keys written with WriteToPages, its query rows (its last positions) stacked with the others'. The
// paged result of every sequence equals, bit for bit, the contiguous flash kernel's with the same
// blocks on that sequence's keys alone (Note [Paged attention]: the same tasks and blocks, each
// block read in runs that do not cross a page, the P·V sums carried across runs unrounded), for
// every dtype, instruction set, page size (1 to past the blocks), block sizes and layout of q.
RC_GTEST_PROP(PagedAttentionTest, EachSequenceEqualsTheContiguousKernel, ()) {
  const DType dtype = *rc::gen::element(DType::kF32, DType::kBF16, DType::kF16);
  // The pools' dtype: q's, or one of its own (Note [A KV cache of its own dtype]).
  const DType kv_dtype = *rc::gen::element(dtype, DType::kF32, DType::kBF16, DType::kF16);
  const int64_t hkv = *rc::gen::inRange<int64_t>(1, 3);
  const int64_t hq = hkv * *rc::gen::inRange<int64_t>(1, 4);
  const int64_t d = *rc::gen::inRange<int64_t>(1, 70), dv = *rc::gen::inRange<int64_t>(1, 70);
  const int64_t page = *rc::gen::element<int64_t>(1, 3, 16, *rc::gen::inRange<int64_t>(1, 90));
  const int64_t seqs = *rc::gen::inRange<int64_t>(1, 5);
  cpu::AttentionTuning tuning;
  tuning.q_block = *rc::gen::element(int64_t{64}, *rc::gen::inRange<int64_t>(1, 70));
  tuning.kv_block = *rc::gen::element(int64_t{64}, *rc::gen::inRange<int64_t>(1, 70));
  // Both sides on the flash path (bit for bit), or both on the score-row path (every task under
  // flash_min_rows: within rounding, the paged side summing p v a page's run at a time).
  const bool score_rows = *rc::gen::arbitrary<bool>();
  tuning.flash_min_rows = tuning.flash_min_rows_bf16 = score_rows ? int64_t{1} << 20 : 0;
  const bool causal = *rc::gen::arbitrary<bool>();
  const Isa isa = *rc::gen::elementOf(SupportedIsas());
  RC_TAG(std::string(DTypeName(dtype)), std::string(DTypeName(kv_dtype)),
         std::string(cpu::attention::IsaName(isa)),
         score_rows ? "score rows" : "flash");

  std::vector<int64_t> lengths(seqs), rows(seqs), starts = {0};
  int64_t max_pages = 1, total_pages = 0;
  for (int64_t i = 0; i < seqs; ++i) {
    lengths[i] = *rc::gen::inRange<int64_t>(0, 120);
    rows[i] = *rc::gen::element(int64_t{1}, std::min<int64_t>(lengths[i], 1),
                                *rc::gen::inRange<int64_t>(0, lengths[i] + 1));
    rows[i] = std::min(rows[i], lengths[i]);
    starts.push_back(starts.back() + rows[i]);
    const int64_t pages = (lengths[i] + page - 1) / page;
    max_pages = std::max(max_pages, pages);
    total_pages += pages;
  }
  const int64_t t = starts.back();
  const int64_t spare = *rc::gen::inRange<int64_t>(0, 4);  // pages no sequence holds
  const int64_t pool_pages = total_pages + spare;
  std::vector<int32_t> order(pool_pages);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(*rc::gen::arbitrary<uint64_t>()));
  std::vector<int32_t> table(seqs * max_pages, -1);  // unread entries stay out of range
  for (int64_t i = 0, next = 0; i < seqs; ++i) {
    for (int64_t p = 0; p < (lengths[i] + page - 1) / page; ++p) table[i * max_pages + p] = order[next++];
  }
  const Tensor k_pages = testing::RandomTensor({pool_pages, hkv, page, d}, kv_dtype);
  const Tensor v_pages = testing::RandomTensor({pool_pages, hkv, page, dv}, kv_dtype);
  // q [Hq, T, D] as the projections make it ([T, Hq, D] seen transposed), or contiguous.
  const bool token_major = *rc::gen::arbitrary<bool>();
  const Tensor q = token_major ? testing::RandomTensor({t, hq, d}, dtype).Transpose(0, 1).value()
                               : testing::RandomTensor({hq, t, d}, dtype);
  std::vector<Tensor> keys, values;  // each sequence's, contiguous [1, Hkv, L, D]
  for (int64_t i = 0; i < seqs; ++i) {
    const int64_t len = lengths[i];
    Tensor k = Tensor::Zeros({1, hkv, std::max<int64_t>(len, 1), d}, kv_dtype).value();
    Tensor v = Tensor::Zeros({1, hkv, std::max<int64_t>(len, 1), dv}, kv_dtype).value();
    for (int64_t p = 0; p < len; ++p) {
      const int64_t id = table[i * max_pages + p / page], row = p % page;
      for (int64_t h = 0; h < hkv; ++h) {
        const Tensor ks = k_pages.Narrow(0, id, 1).value().Narrow(1, h, 1).value().Narrow(2, row, 1).value();
        const Tensor vs = v_pages.Narrow(0, id, 1).value().Narrow(1, h, 1).value().Narrow(2, row, 1).value();
        RC_ASSERT(k.Narrow(1, h, 1).value().Narrow(2, p, 1).value().CopyFrom(ks).ok());
        RC_ASSERT(v.Narrow(1, h, 1).value().Narrow(2, p, 1).value().CopyFrom(vs).ok());
      }
    }
    keys.push_back(k);
    values.push_back(v);
  }
  const Tensor table_t = Tensor::FromVector<int32_t>({seqs, max_pages}, table).value();
  const Tensor starts_t = Tensor::FromVector<int64_t>({seqs + 1}, starts).value();
  const Tensor lengths_t = Tensor::FromVector<int64_t>({seqs}, lengths).value();
  PagedAttentionParams params;
  params.causal = causal;
  params.scale = static_cast<float>(1 / std::sqrt(static_cast<double>(d)));
  ForceIsa force(isa);
  const Tensor out = Tensor::Empty({hq, t, dv}, dtype).value();
  const absl::Status st = cpu::PagedAttentionTuned(q, k_pages, v_pages, table_t, starts_t,
                                                   lengths_t, params, tuning, out);
  if (!st.ok()) RC_FAIL(st.ToString());
  for (int64_t i = 0; i < seqs; ++i) {
    if (rows[i] == 0) continue;
    const Tensor qi = q.Narrow(1, starts[i], rows[i]).value().Unsqueeze(0).value();
    AttentionParams p;
    p.causal = causal;
    p.scale = params.scale;
    p.kv_length = lengths[i];
    p.q_offset = lengths[i] - rows[i];
    const Tensor want = Tensor::Empty({1, hq, rows[i], dv}, dtype).value();
    const absl::Status sc = cpu::AttentionTuned(qi, keys[i], values[i], p, tuning, want);
    if (!sc.ok()) RC_FAIL(sc.ToString());
    const Tensor got = out.Narrow(1, starts[i], rows[i]).value().Unsqueeze(0).value().Contiguous().value();
    if (score_rows) {
      RC_ASSERT(testing::Mismatch(got, {1, hq, rows[i], dv}, want.ToDoubles(),
                                  testing::TolFor(dtype, 2)) == "");
    } else {
      RC_ASSERT(Equal(got, want));
    }
  }
}

// The public op: WriteToPages then PagedAttentionInto on two sequences against
// ScaledDotProductAttention of each (the default tuning; within f32 rounding, since a decode row
// there may take the score-row path).
TEST(PagedAttentionTest, PublicOpsAgainstScaledDotProductAttention) {
  const int64_t hq = 4, hkv = 2, d = 8, page = 4;
  // Sequence 0: 6 positions, 2 query rows (its last); sequence 1: 3 positions, 1 query row.
  const Tensor k_pages = Tensor::Zeros({5, hkv, page, d}).value();
  const Tensor v_pages = Tensor::Zeros({5, hkv, page, d}).value();
  const Tensor k0 = Tensor::Randn({hkv, 6, d}, 1).value();
  const Tensor v0 = Tensor::Randn({hkv, 6, d}, 2).value();
  const Tensor k1 = Tensor::Randn({hkv, 3, d}, 3).value();
  const Tensor v1 = Tensor::Randn({hkv, 3, d}, 4).value();
  // Sequence 0 in pages 3 then 1, sequence 1 in page 4.
  const Tensor slots0 = Tensor::FromVector<int64_t>({6}, {12, 13, 14, 15, 4, 5}).value();
  const Tensor slots1 = Tensor::FromVector<int64_t>({3}, {16, 17, 18}).value();
  ASSERT_TRUE(WriteToPages(k_pages, k0, slots0).ok());
  ASSERT_TRUE(WriteToPages(v_pages, v0, slots0).ok());
  ASSERT_TRUE(WriteToPages(k_pages, k1, slots1).ok());
  ASSERT_TRUE(WriteToPages(v_pages, v1, slots1).ok());
  const Tensor q = Tensor::Randn({hq, 3, d}, 5).value();
  const Tensor table = Tensor::FromVector<int32_t>({2, 2}, {3, 1, 4, -1}).value();
  const Tensor starts = Tensor::FromVector<int64_t>({3}, {0, 2, 3}).value();
  const Tensor lengths = Tensor::FromVector<int64_t>({2}, {6, 3}).value();
  const Tensor out = Tensor::Empty({hq, 3, d}).value();
  const absl::Status st = PagedAttentionInto(out, q, k_pages, v_pages, table, starts, lengths);
  ASSERT_TRUE(st.ok()) << st;
  AttentionOptions opt;
  opt.causal = true;
  const Tensor want0 = ScaledDotProductAttention(q.Narrow(1, 0, 2).value().Unsqueeze(0).value(),
                                                 k0.Unsqueeze(0).value(), v0.Unsqueeze(0).value(), opt)
                           .value();
  const Tensor want1 = ScaledDotProductAttention(q.Narrow(1, 2, 1).value().Unsqueeze(0).value(),
                                                 k1.Unsqueeze(0).value(), v1.Unsqueeze(0).value(), opt)
                           .value();
  const std::vector<float> got0 = out.Narrow(1, 0, 2).value().Contiguous().value().ToVector<float>();
  const std::vector<float> got1 = out.Narrow(1, 2, 1).value().Contiguous().value().ToVector<float>();
  const std::vector<float> w0 = want0.ToVector<float>(), w1 = want1.ToVector<float>();
  ASSERT_EQ(got0.size(), w0.size());
  for (size_t i = 0; i < w0.size(); ++i) EXPECT_NEAR(got0[i], w0[i], 1e-5) << i;
  ASSERT_EQ(got1.size(), w1.size());
  for (size_t i = 0; i < w1.size(); ++i) EXPECT_NEAR(got1[i], w1[i], 1e-5) << i;
}

TEST(PagedAttentionTest, Errors) {
  const Tensor pool = Tensor::Zeros({2, 1, 4, 8}).value();
  const Tensor q = Tensor::Zeros({2, 3, 8}).value();
  const Tensor out = Tensor::Zeros({2, 3, 8}).value();
  const Tensor table = Tensor::FromVector<int32_t>({1, 1}, {0}).value();
  const Tensor starts = Tensor::FromVector<int64_t>({2}, {0, 3}).value();
  const Tensor lengths = Tensor::FromVector<int64_t>({1}, {3}).value();
  EXPECT_TRUE(PagedAttentionInto(out, q, pool, pool, table, starts, lengths).ok());
  using dt::testing::Contains;
  EXPECT_TRUE(Contains(
      PagedAttentionInto(out, q, pool, pool, Tensor::FromVector<int32_t>({1, 1}, {2}).value(),
                         starts, lengths),
      "PagedAttentionInto: sequence 0 page 0 is 2, outside the pool's [0, 2)"));
  EXPECT_TRUE(Contains(
      PagedAttentionInto(out, q, pool, pool, table, starts,
                         Tensor::FromVector<int64_t>({1}, {5}).value()),
      "PagedAttentionInto: sequence 0 has 3 query rows and 5 keys: need 0 <= rows <= keys <= "
      "max_pages · P = 4"));
  EXPECT_TRUE(Contains(
      PagedAttentionInto(out, q, pool, pool, table, Tensor::FromVector<int64_t>({2}, {0, 2}).value(),
                         lengths),
      "PagedAttentionInto: query_starts must run from 0 to T = 3, got 0 to 2"));
  EXPECT_TRUE(Contains(
      PagedAttentionInto(out, q, pool, pool, Tensor::FromVector<int64_t>({1, 1}, {0}).value(),
                         starts, lengths),
      "PagedAttentionInto: page_table must be i32 [S, max_pages], got i64[1, 1] cpu"));
  EXPECT_TRUE(Contains(
      PagedAttentionInto(out, Tensor::Zeros({2, 3, 7}).value(), pool, pool, table, starts, lengths),
      "PagedAttentionInto: expected q [Hq, T, D], k_pages [N, Hkv, P, D], v_pages [N, Hkv, P, Dv]"));
  EXPECT_TRUE(Contains(PagedAttentionInto(q, q, pool, pool, table, starts, lengths),
                       "PagedAttentionInto: out f32[2, 3, 8] cpu shares its storage with q"));
  const Tensor x = Tensor::Zeros({1, 2, 8}).value();
  EXPECT_TRUE(Contains(WriteToPages(pool, x, Tensor::FromVector<int64_t>({2}, {0, 8}).value()),
                       "WriteToPages: slot 8 is outside the pool's [0, 8)"));
  EXPECT_TRUE(Contains(WriteToPages(pool, x, Tensor::FromVector<int64_t>({1}, {0}).value()),
                       "WriteToPages: expected pool [N, H, P, W], x [H, T, W] and slots i64 [T]"));
}

}  // namespace
}  // namespace dt::ops
