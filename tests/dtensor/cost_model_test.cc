#include "dtensor/dtensor/cost_model.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "rapidcheck/gtest.h"
#include "dtensor/tests/test_util.h"

namespace dt {
namespace {

// Brute force: every group along `dims` (ranks that differ only there), row-major numbering.
bool CrossesByEnumeration(const std::vector<int64_t>& mesh, const std::vector<int>& dims,
                          int64_t ranks_per_host) {
  if (ranks_per_host <= 0) return false;
  const int m = static_cast<int>(mesh.size());
  int64_t n = 1;
  for (int64_t k : mesh) n *= k;
  // group key (coordinates off `dims`) -> hosts seen
  std::map<std::vector<int64_t>, std::set<int64_t>> hosts;
  for (int64_t r = 0; r < n; ++r) {
    std::vector<int64_t> key;
    int64_t rest = r;
    std::vector<int64_t> coord(m);
    for (int i = m - 1; i >= 0; --i) {
      coord[i] = rest % mesh[i];
      rest /= mesh[i];
    }
    for (int i = 0; i < m; ++i) {
      if (std::find(dims.begin(), dims.end(), i) == dims.end()) key.push_back(coord[i]);
    }
    hosts[key].insert(r / ranks_per_host);
  }
  for (const auto& [key, h] : hosts) {
    if (h.size() > 1) return true;
  }
  return false;
}

TEST(GroupCrossesHostsTest, NodeLocalMeshes) {
  // (node=16, local=8), 8 ranks per host: local groups stay, node groups cross.
  EXPECT_FALSE(GroupCrossesHosts({16, 8}, {1}, 8));
  EXPECT_TRUE(GroupCrossesHosts({16, 8}, {0}, 8));
  EXPECT_TRUE(GroupCrossesHosts({16, 8}, {0, 1}, 8));
  // (node=16, dp=8, cp=8, tp=8): only tp stays on a host.
  EXPECT_FALSE(GroupCrossesHosts({16, 8, 8, 8}, {3}, 8));
  EXPECT_TRUE(GroupCrossesHosts({16, 8, 8, 8}, {2}, 8));
  // (dp=4, tp=2) with 8 ranks per host: one host.
  EXPECT_FALSE(GroupCrossesHosts({4, 2}, {0, 1}, 8));
  // (2, 2, 2), 4 ranks per host: dims 1 and 2 inside a host, dim 0 across.
  EXPECT_FALSE(GroupCrossesHosts({2, 2, 2}, {1, 2}, 4));
  EXPECT_TRUE(GroupCrossesHosts({2, 2, 2}, {0}, 4));
  // No hosts: nothing crosses.
  EXPECT_FALSE(GroupCrossesHosts({16, 8}, {0}, 0));
}

TEST(GroupCrossesHostsTest, MisalignedHosts) {
  // (3, 4) with 6 ranks per host: the dim-1 group of row 0 is {0-3} (host 0), but row 1's is
  // {4-7}, hosts 0 and 1. PyTorch's MeshTopoInfo (4 <= 6 devices per host) calls it intra-host.
  EXPECT_TRUE(GroupCrossesHosts({3, 4}, {1}, 6));
  EXPECT_FALSE(GroupCrossesHosts({3, 4}, {1}, 4));
  EXPECT_TRUE(GroupCrossesHosts({3, 4}, {0}, 4));
  // (4, 3) with 6: dim-1 groups are {0-2}, {3-5}, {6-8}, {9-11}: all inside a host.
  EXPECT_FALSE(GroupCrossesHosts({4, 3}, {1}, 6));
}

RC_GTEST_PROP(GroupCrossesHostsProp, MatchesEnumeration, ()) {
  const int m = *rc::gen::inRange(1, 5);
  const auto mesh = *rc::gen::container<std::vector<int64_t>>(m, rc::gen::inRange<int64_t>(1, 7));
  int64_t n = 1;
  for (int64_t k : mesh) n *= k;
  const int64_t h = *rc::gen::inRange<int64_t>(0, n + 3);
  std::vector<int> dims;
  for (int i = 0; i < m; ++i) {
    if (*rc::gen::arbitrary<bool>()) dims.push_back(i);
  }
  RC_ASSERT(GroupCrossesHosts(mesh, dims, h) == CrossesByEnumeration(mesh, dims, h));
}

TEST(CostModelFileTest, ParsesEveryKey) {
  auto m = ParseCostModelJson(R"({
    "description": "two links", "ranks_per_host": 8,
    "intra": {"latency_us": 5, "hop_us": 0.5, "gb_per_s": 450},
    "inter": {"latency_us": 12, "hop_us": 2.5, "gb_per_s": 50},
    "copy_gb_per_s": 1500, "calibration": {"anything": [1, 2]}})");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->ranks_per_host, 8);
  EXPECT_EQ(m->intra, (LinkCost{5, 0.5, 450e3}));
  EXPECT_EQ(m->inter, (LinkCost{12, 2.5, 50e3}));
  EXPECT_EQ(m->copy_bytes_per_us, 1500e3);
  // Missing keys keep the defaults; the JSON form round-trips.
  auto partial = ParseCostModelJson(R"({"inter": {"gb_per_s": 25}})");
  ASSERT_TRUE(partial.ok());
  EXPECT_EQ(partial->intra, CostModel().intra);
  EXPECT_EQ(partial->inter.hop_us, CostModel().inter.hop_us);
  EXPECT_EQ(partial->inter.bytes_per_us, 25e3);
  auto again = ParseCostModelJson(CostModelToJson(*m, "again", R"({"from": "test"})"));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *m);
}

TEST(CostModelFileTest, ErrorsAreClear) {
  auto err = [](const std::string& text) {
    auto m = ParseCostModelJson(text, "cost model 'x.json'");
    EXPECT_FALSE(m.ok()) << text;
    return std::string(m.status().message());
  };
  EXPECT_EQ(err(R"({"intra": {"gbps": 450}})"),
            "cost model 'x.json': unknown key 'intra.gbps' (expected latency_us, hop_us, "
            "gb_per_s; bandwidths are GB/s, 1e9 bytes per second)");
  EXPECT_EQ(err(R"({"ranks_per_node": 8})"),
            "cost model 'x.json': unknown key 'ranks_per_node' (expected description, "
            "ranks_per_host, intra, inter, copy_gb_per_s, calibration)");
  EXPECT_EQ(err(R"({"inter": {"latency_us": -1}})"),
            "cost model 'x.json': inter.latency_us must be a number >= 0, got -1");
  EXPECT_EQ(err(R"({"intra": {"gb_per_s": 0}})"),
            "cost model 'x.json': intra.gb_per_s must be a number > 0, got 0");
  EXPECT_EQ(err(R"({"intra": {"gb_per_s": "fast"}})"),
            "cost model 'x.json': intra.gb_per_s must be a number > 0, got \"fast\"");
  EXPECT_EQ(err(R"({"ranks_per_host": 8.5})"),
            "cost model 'x.json': ranks_per_host must be an integer >= 0 (0: one host), got 8.5");
  EXPECT_EQ(err(R"({"ranks_per_host": -8})"),
            "cost model 'x.json': ranks_per_host must be an integer >= 0 (0: one host), got -8");
  EXPECT_EQ(err(R"({"intra": 450})"),
            "cost model 'x.json': intra must be an object like {\"latency_us\": 6.6, \"hop_us\": "
            "0.6, \"gb_per_s\": 87.7}, got 450");
  EXPECT_EQ(err("[1, 2]"),
            "cost model 'x.json': expected a JSON object with keys description, ranks_per_host, "
            "intra, inter, copy_gb_per_s, calibration, got array");
  const std::string syntax = err("{\n  \"intra\": {\"latency_us\": 6.6,}\n}");
  EXPECT_EQ(syntax.rfind("cost model 'x.json': not valid JSON: parse error at line 2, column", 0),
            0u)
      << syntax;
  auto missing = LoadCostModel("/nonexistent/cost.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message(), "cannot read cost model file '/nonexistent/cost.json'");
}

TEST(CostModelFileTest, CommittedModelsLoad) {
  for (const char* name : {"h100_ib.json", "loopback_2vcpu.json"}) {
    const std::string path = std::string(DT_SOURCE_DIR) + "/tools/cost_models/" + name;
    auto m = LoadCostModel(path);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_GT(m->ranks_per_host, 0) << path;
    // Within a host is faster than across hosts, in both latency (a collective of no bytes, per
    // hop and at its base) and bandwidth.
    for (int64_t k : {2, 8}) {
      const double hops = Hops(StepKind::kAllGather, k);
      EXPECT_LT(m->intra.TimeUs(hops, 0), m->inter.TimeUs(hops, 0)) << path << " k=" << k;
    }
    EXPECT_LE(m->intra.latency_us, m->inter.latency_us) << path;
    EXPECT_LT(m->intra.hop_us, m->inter.hop_us) << path;
    EXPECT_GT(m->intra.bytes_per_us, m->inter.bytes_per_us) << path;
  }
}

// Timings of `link` for every collective at 2 and 4 ranks, from 32 B to 64 MiB.
std::vector<CollectiveTiming> Synthetic(const LinkCost& link, double noise = 0) {
  std::vector<CollectiveTiming> out;
  int i = 0;
  for (StepKind c : {StepKind::kAllReduce, StepKind::kAllGather, StepKind::kReduceScatter,
                       StepKind::kAllToAll}) {
    for (int64_t k : {2, 4}) {
      for (double bytes : {32.0, 1048576.0, 16777216.0, 67108864.0}) {
        CollectiveTiming t{c, k, bytes, 0};
        t.time_us =
            link.latency_us + TimingHops(t) * link.hop_us + TimingBytesSent(t) / link.bytes_per_us;
        t.time_us *= 1 + noise * ((i++ % 3) - 1);  // -noise, 0, +noise
        out.push_back(t);
      }
    }
  }
  return out;
}

TEST(FitLinkCostTest, RecoversTheModel) {
  const LinkCost truth{12, 3, 5e3};  // 12 us, 3 us per hop, 5 GB/s
  auto fit = FitLinkCost(Synthetic(truth));
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_NEAR(fit->link.latency_us, 12, 1e-6);
  EXPECT_NEAR(fit->link.hop_us, 3, 1e-6);
  EXPECT_NEAR(fit->link.bytes_per_us, 5e3, 1e-3);
  EXPECT_LT(fit->max_relative_error, 1e-9);
  EXPECT_EQ(fit->samples, 32);
  // 5% noise: still close (the large messages pin the bandwidth, the small ones the latency).
  auto noisy = FitLinkCost(Synthetic(truth, 0.05));
  ASSERT_TRUE(noisy.ok());
  EXPECT_NEAR(noisy->link.bytes_per_us, 5e3, 5e3 * 0.1);
  EXPECT_NEAR(noisy->link.latency_us + 2 * noisy->link.hop_us, 18, 18 * 0.15);
  EXPECT_GT(noisy->max_relative_error, 0.01);
}

TEST(FitLinkCostTest, OneGroupSizeLeavesHopAtZero) {
  // A single group size cannot separate latency from per-hop time: hop is 0, latency absorbs it.
  std::vector<CollectiveTiming> t;
  for (double bytes : {32.0, 64.0 * (1 << 20)}) {
    CollectiveTiming x{StepKind::kAllGather, 2, bytes, 0};
    x.time_us = 10 + 2 + TimingBytesSent(x) / 1e3;  // latency 10 us, one hop of 2 us, 1 GB/s
    t.push_back(x);
  }
  auto fit = FitLinkCost(t);
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_EQ(fit->link.hop_us, 0);
  EXPECT_NEAR(fit->link.latency_us, 12, 1e-6);
  EXPECT_NEAR(fit->link.bytes_per_us, 1e3, 1e-6);
}

TEST(FitLinkCostTest, Errors) {
  EXPECT_EQ(FitLinkCost({}).status().message(), "fitting a link needs at least 2 timings, got 0");
  // Faster with more bytes: no positive bandwidth fits.
  std::vector<CollectiveTiming> t = {{StepKind::kAllGather, 2, 32, 500},
                                     {StepKind::kAllGather, 2, 64 << 20, 100}};
  auto fit = FitLinkCost(t);
  ASSERT_FALSE(fit.ok());
  EXPECT_TRUE(dt::testing::Contains(fit.status(), "times do not grow with the bytes sent"));
  t[1].time_us = 0;
  EXPECT_TRUE(dt::testing::Contains(FitLinkCost(t).status(), "need time > 0"));
}

}  // namespace
}  // namespace dt
