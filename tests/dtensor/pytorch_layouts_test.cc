// Layouts against PyTorch DTensor: for every case of tests/fixtures/dtensor-layouts/layouts.json
// (made by tools/reference/make_dtensor_layout_fixtures.py on real gloo ranks; see its docstring),
// the elements each rank holds here (DTensorSpec::Ranges, LocalShape, Offset) against the local
// tensors PyTorch computed, rank by rank. docs/dtensor.md "Against PyTorch" quotes these counts.
//
// distribute  PyTorch's distribute_tensor with R / S(d) / _StridedShard(d, sf): every case must be
//             identical (same local shape, same global indices in the same order, same offset as
//             PyTorch's compute_local_shape_and_global_offset).
// order       PyTorch's non-default DTensorSpec.shard_order (a tensor dim sharded over several mesh
//             dims, executed in another order than left to right, e.g. FSDP after TP). Here:
//             - the placements PyTorch's _convert_shard_order_to_StridedShard encodes the order
//               as (e.g. [_S(0,2), S(0)]) give exactly PyTorch's distribute_tensor layout for
//               those placements (identical, like the distribute cases), but that is the order's
//               layout only when the pieces line up; the cases where it is not are predicted from
//               our own shard math (below) and must be exactly the ones that differ;
//             - the plain shards on a mesh whose dims are listed in execution order (the same
//               ranks at permuted coordinates: DeviceMesh::Create with a transposed rank list)
//               give PyTorch's order layout exactly, in every case.
//
// Prediction for the order cases: nested sharding here splits left to right (Note [Shard math]),
// so "tensor dim d split over mesh dims m1, m2, ... in that order" is ShardRanges on the mesh
// permuted to put m1, m2, ... in that order. The strided encoding differs from the order exactly
// where its ranges differ from those; the test asserts that those cases, and no others, differ from
// PyTorch's order layout, and that their ids are the ones docs/dtensor.md lists.

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dtensor/dtensor/spec.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace dt {
namespace {

using json = nlohmann::json;

// One rank of a PyTorch record: [local_shape, global_offset | null, per-dim runs | null].
struct TorchRank {
  Shape shape;
  std::optional<Shape> offset;
  std::optional<DimRanges> ranges;  // nullopt: the local tensor is empty
};

Shape ToShape(const json& j) {
  Shape s;
  for (const auto& v : j) s.push_back(v.get<int64_t>());
  return s;
}

std::vector<TorchRank> ParseRanks(const json& ranks) {
  std::vector<TorchRank> out;
  for (const json& r : ranks) {
    TorchRank t;
    t.shape = ToShape(r.at(0));
    if (!r.at(1).is_null()) t.offset = ToShape(r.at(1));
    if (!r.at(2).is_null()) {
      DimRanges d;
      for (const json& dim : r.at(2)) {
        RangeList list;
        for (const json& run : dim) list.push_back({run.at(0).get<int64_t>(), run.at(1).get<int64_t>()});
        d.push_back(list);
      }
      t.ranges = d;
    }
    out.push_back(std::move(t));
  }
  return out;
}

std::string DimRangesToString(const DimRanges& d) {
  std::vector<std::string> parts;
  for (const RangeList& l : d) parts.push_back(absl::StrCat("{", RangesToString(l), "}"));
  return absl::StrJoin(parts, " x ");
}

// What one rank holds here: shape, offset and ranges at a coordinate.
struct OurRank {
  Shape shape;
  Shape offset;
  DimRanges ranges;
};

// Compares one rank; returns "" when identical, else a description. Offsets are compared when
// PyTorch recorded one.
std::string CompareRank(const OurRank& ours, const TorchRank& torch) {
  if (ours.shape != torch.shape) {
    return absl::StrCat("local shape ", ShapeToString(ours.shape), " here, ",
                        ShapeToString(torch.shape), " in PyTorch");
  }
  if (torch.ranges.has_value()) {
    if (ours.ranges != *torch.ranges) {
      return absl::StrCat("elements ", DimRangesToString(ours.ranges), " here, ",
                          DimRangesToString(*torch.ranges), " in PyTorch");
    }
  } else if (Numel(ours.shape) != 0) {
    return absl::StrCat("elements ", DimRangesToString(ours.ranges), " here, none in PyTorch");
  }
  if (torch.offset.has_value() && ours.offset != *torch.offset) {
    return absl::StrCat("offset ", ShapeToString(ours.offset), " here, ",
                        ShapeToString(*torch.offset), " in PyTorch");
  }
  return "";
}

OurRank Ours(const DTensorSpec& spec, IntSpan coord) {
  return {spec.LocalShape(coord), spec.Offset(coord), spec.Ranges(coord)};
}

// Compares every rank of a spec with a PyTorch record; the first difference, or "".
std::string CompareSpec(const DTensorSpec& spec, const std::vector<TorchRank>& torch) {
  if (static_cast<int64_t>(torch.size()) != spec.mesh().Size()) return "rank count";
  for (int r = 0; r < static_cast<int>(torch.size()); ++r) {
    const std::vector<int64_t> coord = spec.mesh().CoordinateOf(r).value();
    const std::string diff = CompareRank(Ours(spec, coord), torch[r]);
    if (!diff.empty()) return absl::StrCat("rank ", r, ": ", diff);
  }
  return "";
}

// Mesh dims in an order in which, for every tensor dim, its mesh dims appear in execution order
// (`order`: tensor dim -> mesh dims); smallest index first among the free ones. nullopt if the
// orders of two tensor dims conflict.
std::optional<std::vector<int>> ExecutionOrderPermutation(
    int mesh_ndim, const std::map<int, std::vector<int>>& order) {
  std::vector<std::set<int>> before(mesh_ndim);  // before[b] = dims that must precede b
  for (const auto& [dim, mesh_dims] : order) {
    for (size_t i = 1; i < mesh_dims.size(); ++i) before[mesh_dims[i]].insert(mesh_dims[i - 1]);
  }
  std::vector<int> perm;
  std::vector<bool> used(mesh_ndim, false);
  while (static_cast<int>(perm.size()) < mesh_ndim) {
    int pick = -1;
    for (int m = 0; m < mesh_ndim && pick < 0; ++m) {
      if (used[m]) continue;
      bool free = true;
      for (int b : before[m]) free = free && used[b];
      if (free) pick = m;
    }
    if (pick < 0) return std::nullopt;
    used[pick] = true;
    perm.push_back(pick);
  }
  return perm;
}

// The order's layout by our shard math: plain shards on the mesh with dims permuted by `perm`.
OurRank InExecutionOrder(IntSpan shape, IntSpan mesh, absl::Span<const Placement> placements,
                         IntSpan coord, const std::vector<int>& perm) {
  Shape pmesh, pcoord;
  Placements pplacements;
  for (int m : perm) {
    pmesh.push_back(mesh[m]);
    pcoord.push_back(coord[m]);
    pplacements.push_back(placements[m]);
  }
  OurRank out;
  out.ranges = ShardRanges(shape, pmesh, pplacements, pcoord);
  out.shape = ShardShape(shape, pmesh, pplacements, pcoord);
  return out;
}

json LoadFixture() {
  const std::string path = std::string(DT_FIXTURES_DIR) + "/dtensor-layouts/layouts.json";
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  return json::parse(in);
}

DTensorSpec MakeSpec(const json& c, const std::string& placements_key) {
  auto mesh = DeviceMesh::Abstract(c.at("mesh").get<std::vector<int64_t>>());
  EXPECT_TRUE(mesh.ok()) << mesh.status();
  auto placements = ParsePlacements(c.at(placements_key).get<std::string>());
  EXPECT_TRUE(placements.ok()) << placements.status();
  auto spec = DTensorSpec::Create(*mesh, *placements, ToShape(c.at("shape")), DType::kF32);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

// The fixture's numbers as docs/dtensor.md states them; regenerating the fixture with other
// cases means updating both.
constexpr int kDistributeCases = 360;
constexpr int kOrderCases = 120;
// Order cases whose _StridedShard encoding is not the order's layout (in PyTorch as here).
const std::set<int> kEncodingDiffers = {361, 366, 429, 440, 446};

TEST(PyTorchLayoutsTest, FixtureIsPyTorch215) {
  const json f = LoadFixture();
  EXPECT_EQ(f.at("meta").at("torch").get<std::string>().rfind("2.15.", 0), 0u)
      << f.at("meta").at("torch");
  EXPECT_EQ(f.at("meta").at("counts").at("distribute").get<int>(), kDistributeCases);
  EXPECT_EQ(f.at("meta").at("counts").at("order").get<int>(), kOrderCases);
}

TEST(PyTorchLayoutsTest, DistributeTensorLayoutsAreIdentical) {
  const json f = LoadFixture();
  int identical = 0, differs = 0, cases = 0;
  for (const json& c : f.at("cases")) {
    if (c.at("kind") != "distribute") continue;
    ++cases;
    const DTensorSpec spec = MakeSpec(c, "placements");
    const std::string diff = CompareSpec(spec, ParseRanks(c.at("ranks")));
    if (diff.empty()) {
      ++identical;
    } else {
      ++differs;
      ADD_FAILURE() << "case " << c.at("id") << " " << spec.Describe() << ": " << diff;
    }
  }
  std::printf("distribute_tensor: %d cases, %d identical, %d differ\n", cases, identical, differs);
  EXPECT_EQ(cases, kDistributeCases);
  EXPECT_EQ(identical, kDistributeCases);
}

TEST(PyTorchLayoutsTest, ShardOrderLayouts) {
  const json f = LoadFixture();
  int cases = 0, encoding_identical = 0, in_order_identical = 0, even_cases = 0;
  std::set<int> predicted, differs;
  for (const json& c : f.at("cases")) {
    if (c.at("kind") != "order") continue;
    ++cases;
    const int id = c.at("id").get<int>();
    const Shape shape = ToShape(c.at("shape"));
    const Shape mesh = ToShape(c.at("mesh"));
    const std::vector<TorchRank> order_layout = ParseRanks(c.at("ranks"));
    const DTensorSpec plain = MakeSpec(c, "placements");
    const DTensorSpec strided = MakeSpec(c, "strided");
    SCOPED_TRACE(absl::StrCat("case ", id, " ", plain.Describe(), " order ", c.at("order").dump(),
                              " encoded as ", strided.ToString()));

    // 1. The strided encoding: PyTorch's distribute_tensor of it, here as there.
    const std::string enc_diff = CompareSpec(strided, ParseRanks(c.at("strided_ranks")));
    EXPECT_EQ(enc_diff, "") << "strided encoding differs from PyTorch's distribute_tensor";
    if (enc_diff.empty()) ++encoding_identical;

    // 2. The order's layout: plain shards on the mesh in execution order.
    std::map<int, std::vector<int>> order;
    for (const json& e : c.at("order")) order[e.at(0).get<int>()] = e.at(1).get<std::vector<int>>();
    const auto perm = ExecutionOrderPermutation(static_cast<int>(mesh.size()), order);
    ASSERT_TRUE(perm.has_value()) << "no mesh order satisfies " << c.at("order").dump();
    bool in_order_ok = true, predicted_differ = false, actual_differ = false;
    for (int r = 0; r < static_cast<int>(order_layout.size()); ++r) {
      const std::vector<int64_t> coord = strided.mesh().CoordinateOf(r).value();
      const OurRank in_order = InExecutionOrder(shape, mesh, plain.placements(), coord, *perm);
      const std::string diff = CompareRank(in_order, order_layout[r]);
      EXPECT_EQ(diff, "") << "rank " << r << ": the mesh in execution order differs";
      in_order_ok = in_order_ok && diff.empty();
      // Prediction from our own shard math only: does the encoding cut other pieces than the order?
      const OurRank enc = Ours(strided, coord);
      if (enc.shape != in_order.shape || (Numel(enc.shape) > 0 && enc.ranges != in_order.ranges)) {
        predicted_differ = true;
      }
      // (The order's record has no offset: PyTorch's offset function takes placements only.)
      if (!CompareRank(enc, order_layout[r]).empty()) actual_differ = true;
    }
    if (in_order_ok) ++in_order_identical;
    // Even splits (every reordered dim divisible by the product of its mesh sizes) line up.
    bool even = true;
    for (const auto& [dim, mesh_dims] : order) {
      int64_t ways = 1;
      for (int m : mesh_dims) ways *= mesh[m];
      even = even && shape[dim] % ways == 0;
    }
    if (even) {
      ++even_cases;
      EXPECT_FALSE(actual_differ) << "an even split whose strided encoding differs";
    }
    if (predicted_differ) predicted.insert(id);
    if (actual_differ) differs.insert(id);
  }
  std::printf("shard_order: %d cases (%d split evenly); the mesh in execution order is identical "
              "in %d; the _StridedShard encoding differs from the order in %d (%s), as predicted: "
              "%s\n",
              cases, even_cases, in_order_identical, static_cast<int>(differs.size()),
              absl::StrJoin(differs, ",").c_str(), predicted == differs ? "yes" : "no");
  EXPECT_EQ(cases, kOrderCases);
  EXPECT_EQ(encoding_identical, kOrderCases);
  EXPECT_EQ(in_order_identical, kOrderCases);
  EXPECT_EQ(differs, predicted) << "the cases that differ are not the predicted ones";
  EXPECT_EQ(differs, kEncodingDiffers) << "update docs/dtensor.md and kEncodingDiffers";
}

}  // namespace
}  // namespace dt
