// The attention options (scale, softcap, window, sinks, mask; Note [Attention options] in
// ops/local/cpu/attention.cc): against transformers' eager attention (Gemma 2's and gpt-oss's,
// tests/fixtures/attention/attention_goldens.json from tools/reference/make_attention_fixtures.py)
// on the contiguous and the paged kernels, prefill and decode, f32 and bf16, every instruction set;
// against naive loops over random shapes and windows; and their bad values refused by name.

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "dtensor/ops/local/cpu/attention.h"
#include "dtensor/ops/local/cpu/attention_kernels.h"
#include "dtensor/ops/local/ops.h"
#include "dtensor/tests/ops/local/test_util.h"
#include "dtensor/tests/test_util.h"
#include "nlohmann/json.hpp"

namespace dt::ops {
namespace {

using cpu::attention::Isa;
using Json = nlohmann::json;
using testing::RandomTensor;

std::vector<Isa> SupportedIsas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::kGeneric, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16}) {
    if (cpu::attention::IsaSupported(isa)) out.push_back(isa);
  }
  return out;
}

class ForceIsa {
 public:
  explicit ForceIsa(Isa isa) { cpu::attention::SetIsaForTesting(isa); }
  ~ForceIsa() { cpu::attention::SetIsaForTesting(std::nullopt); }
};

const Json& Goldens() {
  static const Json* j = [] {
    std::ifstream in(std::string(DT_FIXTURES_DIR) + "/attention/attention_goldens.json");
    return new Json(Json::parse(in));
  }();
  return *j;
}

// Numbers, and "-inf" (which JSON has not) for a masked key.
std::vector<double> Doubles(const Json& values) {
  std::vector<double> out;
  for (const Json& x : values) out.push_back(x.is_string() ? -INFINITY : x.get<double>());
  return out;
}
Tensor FromJson(const Json& values, const Shape& shape, DType dtype) {
  return Tensor::FromDoubles(shape, Doubles(values), dtype).value();
}

// The fixture's inputs and one case's options as ops::AttentionOptions (causal).
struct Golden {
  int64_t b, hq, hkv, s, d;
  Tensor q, k, v;
  AttentionOptions opt;
};
Golden LoadCase(const Json& c, DType dtype) {
  const Json& g = Goldens();
  Golden out;
  const Json& sh = g["shape"];
  out.b = sh["B"], out.hq = sh["Hq"], out.hkv = sh["Hkv"], out.s = sh["S"], out.d = sh["D"];
  out.q = FromJson(g["q"], {out.b, out.hq, out.s, out.d}, dtype);
  out.k = FromJson(g["k"], {out.b, out.hkv, out.s, out.d}, dtype);
  out.v = FromJson(g["v"], {out.b, out.hkv, out.s, out.d}, dtype);
  out.opt.causal = true;
  out.opt.scale = c["scale"].get<double>();
  if (c["softcap"].get<double>() > 0) out.opt.softcap = c["softcap"].get<double>();
  if (c["window"].get<int64_t>() > 0) out.opt.window = c["window"].get<int64_t>();
  if (c["sinks"].get<bool>()) out.opt.sinks = FromJson(g["sinks"], {out.hq}, dtype);
  if (c["mask"].get<bool>()) out.opt.mask = FromJson(g["mask"], {out.b, 1, out.s, out.s}, dtype);
  return out;
}

testing::Tol GoldenTol(DType dtype) {
  return dtype == DType::kF32 ? testing::Tol{2e-5, 2e-5} : testing::Tol{2.5e-2, 2e-2};
}

// Every case, prefill (all rows) and decode (the last row), through the op and through the kernel
// with small blocks (several blocks per window and row) on every instruction set.
TEST(AttentionOptionsTest, MatchesTransformersContiguous) {
  for (const Json& c : Goldens()["cases"]) {
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      Golden g = LoadCase(c, dtype);
      for (const bool decode : {false, true}) {
        const int64_t rows = decode ? 1 : g.s;
        const Tensor q = g.q.Narrow(2, g.s - rows, rows).value();
        AttentionOptions opt = g.opt;
        if (decode && opt.mask.defined()) opt.mask = opt.mask.Narrow(2, g.s - 1, 1).value();
        const std::vector<double> want =
            c[decode ? "decode" : "prefill"].get<std::vector<double>>();
        const std::string what = absl::StrCat(c["name"].get<std::string>(), " ", DTypeName(dtype),
                                              decode ? " decode" : " prefill");
        const Tensor got = ScaledDotProductAttention(q, g.k, g.v, opt).value();
        EXPECT_EQ(testing::Mismatch(got, {g.b, g.hq, rows, g.d}, want, GoldenTol(dtype)), "")
            << what;
        for (Isa isa : SupportedIsas()) {
          ForceIsa force(isa);
          for (const int64_t kv_block : {int64_t{4}, int64_t{7}}) {
            const Tensor again = ScaledDotProductAttention(q, g.k, g.v, opt).value();
            EXPECT_EQ(testing::Mismatch(again, {g.b, g.hq, rows, g.d}, want, GoldenTol(dtype)), "")
                << what << " " << cpu::attention::IsaName(isa);
            // The kernel with blocks smaller than the window.
            AttentionParams p;
            p.causal = true, p.scale = static_cast<float>(*opt.scale);
            p.kv_length = g.s, p.q_offset = g.s - rows;
            p.softcap = static_cast<float>(opt.softcap.value_or(0));
            p.window = opt.window.value_or(0);
            const Tensor sinks = opt.sinks.defined() ? opt.sinks.To(DType::kF32).value() : Tensor();
            const Tensor mask = opt.mask.defined()
                                    ? opt.mask.To(DType::kF32).value().Contiguous().value()
                                    : Tensor();
            if (sinks.defined()) p.sinks = sinks.data<float>();
            if (mask.defined()) {
              p.mask = mask.data<float>(), p.mask_bs = rows * g.s, p.mask_rs = g.s;
            }
            cpu::AttentionTuning tuning;
            tuning.q_block = 3, tuning.kv_block = kv_block;
            // kv_block 7: every call on the flash path; 4: decode (under 16 rows) on the
            // score-row path.
            if (kv_block == 7) tuning.flash_min_rows = tuning.flash_min_rows_bf16 = 0;
            if (kv_block == 4) tuning.flash_min_rows = tuning.flash_min_rows_bf16 = 16;
            const Tensor out = Tensor::Empty({g.b, g.hq, rows, g.d}, dtype).value();
            ASSERT_TRUE(cpu::AttentionTuned(q, g.k, g.v, p, tuning, out).ok());
            EXPECT_EQ(testing::Mismatch(out, {g.b, g.hq, rows, g.d}, want, GoldenTol(dtype)), "")
                << what << " " << cpu::attention::IsaName(isa) << " kv_block " << kv_block;
          }
        }
      }
    }
  }
}

// The same cases (but the mask, which paged attention does not take) over pages: each batch row a
// sequence whose keys lie in 3-position pages handed out in reverse.
TEST(AttentionOptionsTest, MatchesTransformersPaged) {
  for (const Json& c : Goldens()["cases"]) {
    if (c["mask"].get<bool>()) continue;
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      const Golden g = LoadCase(c, dtype);
      constexpr int64_t kPage = 3;
      const int64_t per_seq = (g.s + kPage - 1) / kPage, pool_pages = g.b * per_seq;
      const Tensor k_pages = Tensor::Zeros({pool_pages, g.hkv, kPage, g.d}, dtype).value();
      const Tensor v_pages = Tensor::Zeros({pool_pages, g.hkv, kPage, g.d}, dtype).value();
      std::vector<int32_t> table;
      for (int64_t i = 0; i < g.b; ++i) {
        std::vector<int64_t> slots;
        for (int64_t p = 0; p < per_seq; ++p) {
          table.push_back(static_cast<int32_t>(pool_pages - 1 - (i * per_seq + p)));
        }
        for (int64_t j = 0; j < g.s; ++j) {
          slots.push_back(table[i * per_seq + j / kPage] * kPage + j % kPage);
        }
        const Tensor sl = Tensor::FromVector<int64_t>({g.s}, slots).value();
        ASSERT_TRUE(WriteToPages(k_pages, g.k.Select(0, i).value(), sl).ok());
        ASSERT_TRUE(WriteToPages(v_pages, g.v.Select(0, i).value(), sl).ok());
      }
      const Tensor page_table = Tensor::FromVector<int32_t>({g.b, per_seq}, table).value();
      const Tensor lengths =
          Tensor::FromVector<int64_t>({g.b}, std::vector<int64_t>(g.b, g.s)).value();
      PagedAttentionOptions opt;
      opt.scale = g.opt.scale, opt.softcap = g.opt.softcap, opt.window = g.opt.window;
      opt.sinks = g.opt.sinks;
      for (const bool decode : {false, true}) {
        const int64_t rows = decode ? 1 : g.s;
        // q [Hq, B · rows, D]: sequence i's rows after sequence i - 1's.
        const Tensor q = g.q.Narrow(2, g.s - rows, rows)
                             .value()
                             .Permute({1, 0, 2, 3})
                             .value()
                             .Contiguous()
                             .value()
                             .View({g.hq, g.b * rows, g.d})
                             .value();
        std::vector<int64_t> starts;
        for (int64_t i = 0; i <= g.b; ++i) starts.push_back(i * rows);
        const Tensor qs = Tensor::FromVector<int64_t>({g.b + 1}, starts).value();
        // The golden [B, Hq, rows, D] as this layout [Hq, B · rows, D].
        const std::vector<double> flat =
            c[decode ? "decode" : "prefill"].get<std::vector<double>>();
        std::vector<double> want;
        for (int64_t h = 0; h < g.hq; ++h) {
          for (int64_t i = 0; i < g.b; ++i) {
            const auto at = flat.begin() + ((i * g.hq + h) * rows) * g.d;
            want.insert(want.end(), at, at + rows * g.d);
          }
        }
        for (Isa isa : SupportedIsas()) {
          ForceIsa force(isa);
          const Tensor out = Tensor::Empty({g.hq, g.b * rows, g.d}, dtype).value();
          ASSERT_TRUE(
              PagedAttentionInto(out, q, k_pages, v_pages, page_table, qs, lengths, opt).ok());
          EXPECT_EQ(testing::Mismatch(out, {g.hq, g.b * rows, g.d}, want, GoldenTol(dtype)), "")
              << c["name"].get<std::string>() << " " << DTypeName(dtype)
              << (decode ? " decode " : " prefill ") << cpu::attention::IsaName(isa);
        }
      }
    }
  }
}

// Random shapes, windows, caps, sinks and masks (causal, a KV prefix, GQA, random layouts): the op
// on either path (decode shapes included), every instruction set and random blocks, agrees with
// the naive loops.
RC_GTEST_PROP(AttentionOptionsTest, AgreesWithNaiveLoops, ()) {
  const DType dtype = testing::RandomFloatDType();
  const int64_t b = *rc::gen::inRange<int64_t>(1, 3), hkv = *rc::gen::inRange<int64_t>(1, 3);
  const int64_t hq = hkv * *rc::gen::inRange<int64_t>(1, 4);
  const int64_t skv = *rc::gen::inRange<int64_t>(1, 90);
  const int64_t sq = *rc::gen::element<int64_t>(1, *rc::gen::inRange<int64_t>(1, skv + 1));
  const int64_t d = *rc::gen::inRange<int64_t>(1, 40), dv = *rc::gen::inRange<int64_t>(1, 40);
  AttentionOptions opt;
  opt.causal = true;
  opt.kv_length = *rc::gen::inRange<int64_t>(sq, skv + 1);
  testing::NaiveAttentionOptions n;
  n.kv_length = *opt.kv_length;
  n.q_offset = n.kv_length - sq;
  if (*rc::gen::arbitrary<bool>())
    n.q_offset = *(opt.q_offset = *rc::gen::inRange<int64_t>(-2, skv + 3));
  n.scale = 1 / std::sqrt(static_cast<double>(d));
  if (*rc::gen::arbitrary<bool>()) n.scale = *(opt.scale = *rc::gen::inRange(1, 20) / 10.0);
  if (*rc::gen::arbitrary<bool>()) n.softcap = *(opt.softcap = *rc::gen::inRange(1, 40) / 10.0);
  if (*rc::gen::arbitrary<bool>())
    n.window = *(opt.window = *rc::gen::inRange<int64_t>(1, skv + 3));
  const Tensor q = RandomTensor({b, hq, sq, d}, dtype);
  const Tensor k = RandomTensor({b, hkv, skv, d}, dtype);
  const Tensor v = RandomTensor({b, hkv, skv, dv}, dtype);
  if (*rc::gen::arbitrary<bool>()) {
    opt.sinks = RandomTensor({hq}, dtype);
    n.sinks = opt.sinks.ToDoubles();
  }
  if (*rc::gen::arbitrary<bool>()) {
    n.mask_b = *rc::gen::element<int64_t>(1, b);
    opt.mask = RandomTensor({n.mask_b, 1, sq, skv}, dtype);
    n.mask = opt.mask.ToDoubles();
  }
  const Isa isa = *rc::gen::elementOf(SupportedIsas());
  ForceIsa force(isa);
  RC_TAG(std::string(DTypeName(dtype)), std::string(cpu::attention::IsaName(isa)));
  const std::vector<double> want = NaiveAttention(q, k, v, n);
  const Tensor got = ScaledDotProductAttention(q, k, v, opt).value();
  RC_ASSERT(testing::Mismatch(got, {b, hq, sq, dv}, want, testing::TolFor(dtype, 3)) == "");
}

// A window wider than every row's keys gives the plain call's result (a decode-sized f32 call: the
// score-row path).
// Sequences of random lengths over shuffled pages with softcap, window and sinks: each sequence's
// rows (its last positions) agree with the naive loops over its keys alone, every instruction set.
RC_GTEST_PROP(AttentionOptionsTest, PagedAgreesWithNaiveLoops, ()) {
  const DType dtype = *rc::gen::element(DType::kF32, DType::kBF16, DType::kF16);
  const int64_t hkv = *rc::gen::inRange<int64_t>(1, 3), hq = hkv * *rc::gen::inRange<int64_t>(1, 4);
  const int64_t d = *rc::gen::inRange<int64_t>(1, 40), page = *rc::gen::inRange<int64_t>(1, 20);
  const int64_t seqs = *rc::gen::inRange<int64_t>(1, 4);
  PagedAttentionOptions opt;
  testing::NaiveAttentionOptions n;
  n.scale = 1 / std::sqrt(static_cast<double>(d));
  if (*rc::gen::arbitrary<bool>()) n.softcap = *(opt.softcap = *rc::gen::inRange(1, 40) / 10.0);
  if (*rc::gen::arbitrary<bool>()) n.window = *(opt.window = *rc::gen::inRange<int64_t>(1, 80));
  if (*rc::gen::arbitrary<bool>()) {
    opt.sinks = RandomTensor({hq}, dtype);
    n.sinks = opt.sinks.ToDoubles();
  }
  std::vector<int64_t> lengths, starts = {0};
  int64_t total_pages = 0, max_pages = 1;
  for (int64_t i = 0; i < seqs; ++i) {
    lengths.push_back(*rc::gen::inRange<int64_t>(1, 90));
    starts.push_back(starts.back() + *rc::gen::inRange<int64_t>(1, lengths.back() + 1));
    const int64_t pages = (lengths.back() + page - 1) / page;
    total_pages += pages, max_pages = std::max(max_pages, pages);
  }
  std::vector<int32_t> order(total_pages), table(seqs * max_pages, 0);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(*rc::gen::arbitrary<uint64_t>()));
  const Tensor k_pages = Tensor::Zeros({total_pages, hkv, page, d}, dtype).value();
  const Tensor v_pages = Tensor::Zeros({total_pages, hkv, page, d}, dtype).value();
  const Tensor q = RandomTensor({hq, starts.back(), d}, dtype, testing::Values::kNormal, true);
  const Isa isa = *rc::gen::elementOf(SupportedIsas());
  ForceIsa force(isa);
  std::vector<std::vector<double>> want(seqs);
  for (int64_t i = 0, next = 0; i < seqs; ++i) {
    const int64_t len = lengths[i], rows = starts[i + 1] - starts[i];
    std::vector<int64_t> slots;
    for (int64_t p = 0; p < (len + page - 1) / page; ++p) table[i * max_pages + p] = order[next++];
    for (int64_t j = 0; j < len; ++j)
      slots.push_back(table[i * max_pages + j / page] * page + j % page);
    const Tensor k = RandomTensor({1, hkv, len, d}, dtype, testing::Values::kNormal, true);
    const Tensor v = RandomTensor({1, hkv, len, d}, dtype, testing::Values::kNormal, true);
    const Tensor sl = Tensor::FromVector<int64_t>({len}, slots).value();
    RC_ASSERT(WriteToPages(k_pages, k.Select(0, 0).value(), sl).ok());
    RC_ASSERT(WriteToPages(v_pages, v.Select(0, 0).value(), sl).ok());
    const Tensor qi = q.Narrow(1, starts[i], rows).value().Unsqueeze(0).value();
    n.kv_length = len, n.q_offset = len - rows;
    want[i] = NaiveAttention(qi, k, v, n);  // [1, hq, rows, d]
  }
  const Tensor out = Tensor::Empty({hq, starts.back(), d}, dtype).value();
  RC_ASSERT(PagedAttentionInto(out, q, k_pages, v_pages,
                               Tensor::FromVector<int32_t>({seqs, max_pages}, table).value(),
                               Tensor::FromVector<int64_t>({seqs + 1}, starts).value(),
                               Tensor::FromVector<int64_t>({seqs}, lengths).value(), opt)
                .ok());
  for (int64_t i = 0; i < seqs; ++i) {
    const int64_t rows = starts[i + 1] - starts[i];
    const Tensor got = out.Narrow(1, starts[i], rows).value().Unsqueeze(0).value();
    RC_ASSERT(testing::Mismatch(got, {1, hq, rows, d}, want[i], testing::TolFor(dtype, 3)) == "");
  }
}

TEST(AttentionOptionsTest, DefaultsChangeNothing) {
  const Tensor q = Tensor::Randn({1, 4, 5, 16}, 1).value();
  const Tensor k = Tensor::Randn({1, 2, 30, 16}, 2).value();
  const Tensor v = Tensor::Randn({1, 2, 30, 16}, 3).value();
  AttentionOptions plain;
  plain.causal = true;
  AttentionOptions wide = plain;
  wide.window = 1000;  // wider than every row's keys: the same keys
  const Tensor a = ScaledDotProductAttention(q, k, v, plain).value();
  const Tensor b = ScaledDotProductAttention(q, k, v, wide).value();
  EXPECT_EQ(testing::Mismatch(b, {1, 4, 5, 16}, a.ToDoubles(), {1e-6, 1e-6}), "");
}

TEST(AttentionOptionsTest, BadOptionsAreRefusedByName) {
  const Tensor q = Tensor::Randn({2, 4, 3, 8}, 1).value();
  const Tensor k = Tensor::Randn({2, 2, 5, 8}, 2).value();
  const Tensor v = Tensor::Randn({2, 2, 5, 8}, 3).value();
  auto run = [&](auto&& set) {
    AttentionOptions opt;
    opt.causal = true;
    set(opt);
    return ScaledDotProductAttention(q, k, v, opt).status();
  };
  EXPECT_TRUE(testing::Contains(run([](AttentionOptions& o) { o.window = 0; }),
                                "window must be >= 1 and causal attention, got window 0"));
  EXPECT_TRUE(testing::Contains(run([](AttentionOptions& o) { o.window = -3; }), "got window -3"));
  EXPECT_TRUE(testing::Contains(run([](AttentionOptions& o) { o.window = 2, o.causal = false; }),
                                "got window 2 without causal"));
  for (const double cap : {0.0, -1.0, double{INFINITY}, double{NAN}}) {
    const absl::Status s = run([&](AttentionOptions& o) { o.softcap = cap; });
    EXPECT_TRUE(testing::Contains(s, "softcap must be finite and > 0, got")) << s;
    EXPECT_TRUE(testing::Contains(s, absl::StrCat(cap))) << s;
  }
  EXPECT_TRUE(
      testing::Contains(run([](AttentionOptions& o) { o.sinks = Tensor::Zeros({3}).value(); }),
                        "sinks must be [Hq] = [4] (one per query head), got f32[3]"));
  EXPECT_TRUE(testing::Contains(run([](AttentionOptions& o) {
                                  o.sinks = Tensor::Zeros({1, 4}).value();
                                }),
                                "got f32[1, 4]"));
  EXPECT_TRUE(testing::Contains(
      run([](AttentionOptions& o) { o.sinks = Tensor::Zeros({4}, DType::kI64).value(); }),
      "sinks"));
  EXPECT_TRUE(testing::Contains(run([](AttentionOptions& o) {
                                  o.mask = Tensor::Zeros({2, 1, 3, 4}).value();
                                }),
                                "mask must be [B or 1, 1, Sq, Skv] = [2 or 1, 1, 3, 5]"));
  EXPECT_TRUE(testing::Contains(run([](AttentionOptions& o) {
                                  o.mask = Tensor::Zeros({2, 4, 3, 5}).value();
                                }),
                                "got f32[2, 4, 3, 5]"));
  EXPECT_TRUE(run([](AttentionOptions& o) { o.mask = Tensor::Zeros({1, 1, 3, 5}).value(); }).ok());
  // Paged: the same checks.
  const Tensor pq = Tensor::Randn({4, 2, 8}, 1).value();
  const Tensor pool = Tensor::Zeros({2, 2, 4, 8}).value();
  const Tensor table = Tensor::FromVector<int32_t>({1, 2}, {0, 1}).value();
  const Tensor starts = Tensor::FromVector<int64_t>({2}, {0, 2}).value();
  const Tensor lengths = Tensor::FromVector<int64_t>({1}, {6}).value();
  const Tensor out = Tensor::Empty({4, 2, 8}).value();
  PagedAttentionOptions po;
  po.window = 0;
  EXPECT_TRUE(testing::Contains(PagedAttentionInto(out, pq, pool, pool, table, starts, lengths, po),
                                "PagedAttentionInto: window must be >= 1"));
  po = {};
  po.softcap = -2;
  EXPECT_TRUE(testing::Contains(PagedAttentionInto(out, pq, pool, pool, table, starts, lengths, po),
                                "softcap must be finite and > 0, got -2"));
  po = {};
  po.sinks = Tensor::Zeros({2}).value();
  EXPECT_TRUE(testing::Contains(PagedAttentionInto(out, pq, pool, pool, table, starts, lengths, po),
                                "sinks must be [Hq] = [4]"));
}

}  // namespace
}  // namespace dt::ops
