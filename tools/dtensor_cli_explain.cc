// `dtensor explain`: per-rank layout, a block picture and the redistribute plan, on an abstract
// mesh (no processes), as text, JSON or SVG.
//
// Note [Explain at scale]
// explain must stay readable (and fast) on cluster-sized meshes such as 16x8x8x8 = 8192 ranks. The
// rank table lists every rank up to --max-ranks (default 16), else the first and last
// max-ranks / 2 and a "(N more)" row, followed by the distinct local shapes with how many ranks
// hold each. The block picture shows at most 16 row blocks by 8 column blocks. --json lists the
// same ranks as the table, with num_ranks, ranks_omitted and local_shapes, so a script always
// knows when it got a sample; `--max-ranks all` lists every rank in both forms (8192 ranks: about
// 3 MB of JSON). Everything else (plan, hosts, cost model) is always complete.

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "dtensor/core/status.h"
#include "dtensor/dtensor/cost_model.h"
#include "dtensor/dtensor/planner.h"
#include "dtensor/dtensor/spec.h"
#include "nlohmann/json.hpp"
#include "dtensor/tools/dtensor_cli.h"

ABSL_FLAG(std::string, placements, "", "the layout's placements, e.g. 'S(0),S(0)' (required)");
ABSL_FLAG(std::string, svg, "", "also draw the layout into this SVG file");
ABSL_FLAG(std::string, max_ranks, "16", "list at most this many ranks (>= 2), or 'all'");
ABSL_FLAG(bool, json, false, "print JSON instead of text");

namespace dt::cli {
namespace {

struct RankInfo {
  int rank;
  std::vector<int64_t> coord;
  Shape local, offset;
  DimRanges ranges;
};

std::string Join(IntSpan v) { return absl::StrCat("(", absl::StrJoin(v, ", "), ")"); }

std::string RangesText(const DimRanges& ranges) {
  std::vector<std::string> dims;
  for (const RangeList& r : ranges) {
    dims.push_back(r.size() > 1 ? absl::StrCat("{", RangesToString(r), "}") : RangesToString(r));
  }
  return absl::StrJoin(dims, " x ");
}

// "0-3,8" for {0,1,2,3,8}; "0-56 by 8" for {0,8,...,56}; "0,8,...,7679 (1024)" when long.
std::string RankList(const std::vector<int>& ranks) {
  if (ranks.size() >= 3 && ranks[1] - ranks[0] > 1) {
    const int step = ranks[1] - ranks[0];
    bool progression = true;
    for (size_t i = 2; i < ranks.size(); ++i) progression &= ranks[i] - ranks[i - 1] == step;
    if (progression) return absl::StrCat(ranks.front(), "-", ranks.back(), " by ", step);
  }
  std::vector<std::string> parts;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    parts.push_back(j == i ? absl::StrCat(ranks[i]) : absl::StrCat(ranks[i], "-", ranks[j]));
    i = j + 1;
  }
  std::string s = absl::StrJoin(parts, ",");
  // Too long: the first two runs, the last rank and the count, "0,8,...,7679 (1024)".
  if (s.size() > 24 && parts.size() > 2) {
    s = absl::StrCat(parts[0], ",", parts[1], ",...,", ranks.back(), " (", ranks.size(), ")");
  }
  return s;
}

// The block picture: up to two tensor dims (the sharded ones first), cut at every piece boundary;
// each cell lists the ranks that hold it.
struct Picture {
  std::vector<int> dims;                             // tensor dims shown (0, 1 or 2)
  std::vector<std::vector<IndexRange>> segments;     // per shown dim
  std::vector<std::vector<std::vector<int>>> cells;  // [row][col] -> ranks
  std::vector<int> empty_ranks;
  int64_t hidden_rows = 0, hidden_cols = 0;
};

Picture MakePicture(const DTensorSpec& spec, const std::vector<RankInfo>& ranks) {
  constexpr size_t kMaxRows = 16, kMaxCols = 8;
  Picture pic;
  const int nd = spec.ndim();
  std::vector<bool> sharded(nd, false);
  for (int i = 0; i < static_cast<int>(spec.placements().size()); ++i) {
    const Placement& p = spec.placements()[i];
    if (p.is_any_shard() && spec.mesh().Size(i) > 1) sharded[p.dim()] = true;
  }
  for (int d = 0; d < nd && pic.dims.size() < 2; ++d) {
    if (sharded[d]) pic.dims.push_back(d);
  }
  for (int d = 0; d < nd && pic.dims.size() < 2; ++d) {
    if (!sharded[d]) pic.dims.push_back(d);
  }
  std::sort(pic.dims.begin(), pic.dims.end());
  for (int d : pic.dims) {
    std::set<int64_t> cuts = {0, spec.shape()[d]};
    for (const RankInfo& r : ranks) {
      for (const IndexRange& x : r.ranges[d]) {
        cuts.insert(x.start);
        cuts.insert(x.stop);
      }
    }
    std::vector<IndexRange> segs;
    for (auto it = cuts.begin(); std::next(it) != cuts.end(); ++it)
      segs.push_back({*it, *std::next(it)});
    pic.segments.push_back(std::move(segs));
  }
  for (const RankInfo& r : ranks) {
    if (Numel(r.local) == 0) pic.empty_ranks.push_back(r.rank);
  }
  auto holds = [&](const RankInfo& r, int k, const IndexRange& seg) {
    for (const IndexRange& x : r.ranges[pic.dims[k]]) {
      if (x.start <= seg.start && seg.stop <= x.stop) return true;
    }
    return false;
  };
  const size_t rows = pic.dims.empty() ? 1 : std::min(pic.segments[0].size(), kMaxRows);
  const size_t cols = pic.dims.size() < 2 ? 1 : std::min(pic.segments[1].size(), kMaxCols);
  if (!pic.dims.empty()) pic.hidden_rows = pic.segments[0].size() - rows;
  if (pic.dims.size() >= 2) pic.hidden_cols = pic.segments[1].size() - cols;
  pic.cells.assign(rows, std::vector<std::vector<int>>(cols));
  for (const RankInfo& r : ranks) {
    if (Numel(r.local) == 0) continue;
    for (size_t i = 0; i < rows; ++i) {
      if (!pic.dims.empty() && !holds(r, 0, pic.segments[0][i])) continue;
      for (size_t j = 0; j < cols; ++j) {
        if (pic.dims.size() >= 2 && !holds(r, 1, pic.segments[1][j])) continue;
        pic.cells[i][j].push_back(r.rank);
      }
    }
  }
  return pic;
}

std::string SegText(const IndexRange& s) {
  return s.size() == 1 ? absl::StrCat(s.start) : absl::StrCat(s.start, "-", s.stop - 1);
}

void PrintPicture(const Picture& pic) {
  if (pic.dims.empty()) {
    std::printf("\nblocks: a scalar, held by ranks %s\n", RankList(pic.cells[0][0]).c_str());
    return;
  }
  std::printf("\nblocks (%s; each cell: the ranks holding it)\n",
              pic.dims.size() == 2
                  ? absl::StrCat("rows: dim ", pic.dims[0], ", columns: dim ", pic.dims[1]).c_str()
                  : absl::StrCat("rows: dim ", pic.dims[0]).c_str());
  const size_t rows = pic.cells.size(), cols = pic.cells[0].size();
  std::vector<size_t> width(cols + 1, 0);
  for (size_t i = 0; i < rows; ++i)
    width[0] = std::max(width[0], SegText(pic.segments[0][i]).size());
  for (size_t j = 0; j < cols; ++j) {
    width[j + 1] = pic.dims.size() == 2 ? SegText(pic.segments[1][j]).size() : 5;
    for (size_t i = 0; i < rows; ++i)
      width[j + 1] = std::max(width[j + 1], RankList(pic.cells[i][j]).size());
  }
  std::string header = std::string(width[0], ' ') + " |";
  for (size_t j = 0; j < cols; ++j) {
    const std::string label = pic.dims.size() == 2 ? SegText(pic.segments[1][j]) : "ranks";
    absl::StrAppend(&header, " ", label, std::string(width[j + 1] - label.size(), ' '), " |");
  }
  std::printf("  %s\n", header.c_str());
  std::string rule = std::string(width[0], '-') + "-+";
  for (size_t j = 0; j < cols; ++j) absl::StrAppend(&rule, std::string(width[j + 1] + 2, '-'), "+");
  std::printf("  %s\n", rule.c_str());
  for (size_t i = 0; i < rows; ++i) {
    const std::string label = SegText(pic.segments[0][i]);
    std::string line = std::string(width[0] - label.size(), ' ') + label + " |";
    for (size_t j = 0; j < cols; ++j) {
      const std::string cell = pic.cells[i][j].empty() ? "." : RankList(pic.cells[i][j]);
      absl::StrAppend(&line, " ", cell, std::string(width[j + 1] - cell.size(), ' '), " |");
    }
    std::printf("  %s\n", line.c_str());
  }
  if (pic.hidden_rows || pic.hidden_cols) {
    std::printf("  (%lld more row blocks, %lld more column blocks not shown)\n",
                static_cast<long long>(pic.hidden_rows), static_cast<long long>(pic.hidden_cols));
  }
  if (!pic.empty_ranks.empty()) {
    std::printf("  ranks holding nothing: %s\n", RankList(pic.empty_ranks).c_str());
  }
}

absl::Status WriteSvg(const std::string& path, const DTensorSpec& spec, const Picture& pic) {
  const size_t rows = pic.cells.size(), cols = pic.cells[0].size();
  const int cw = std::max(48, static_cast<int>(720 / std::max<size_t>(cols, 1)));
  const int ch = 28, left = 90, top = 50;
  std::string svg = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
      "font-family=\"monospace\" "
      "font-size=\"12\">\n<text x=\"10\" y=\"20\">%s</text>\n",
      left + cw * static_cast<int>(cols) + 20, top + ch * static_cast<int>(rows) + 40,
      spec.Describe());
  for (size_t j = 0; j < cols && pic.dims.size() == 2; ++j) {
    absl::StrAppendFormat(&svg, "<text x=\"%d\" y=\"%d\">%s</text>\n",
                          left + cw * static_cast<int>(j) + 4, top - 6,
                          SegText(pic.segments[1][j]));
  }
  for (size_t i = 0; i < rows; ++i) {
    const int y = top + ch * static_cast<int>(i);
    if (!pic.dims.empty()) {
      absl::StrAppendFormat(&svg, "<text x=\"10\" y=\"%d\">%s</text>\n", y + 18,
                            SegText(pic.segments[0][i]));
    }
    for (size_t j = 0; j < cols; ++j) {
      const auto& cell = pic.cells[i][j];
      const int hue = cell.empty() ? 0 : (cell[0] * 47) % 360;
      absl::StrAppendFormat(&svg,
                            "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"%s\" "
                            "stroke=\"#333\"/>\n<text x=\"%d\" y=\"%d\">%s</text>\n",
                            left + cw * static_cast<int>(j), y, cw, ch,
                            cell.empty() ? "#eee" : absl::StrFormat("hsl(%d,60%%,75%%)", hue),
                            left + cw * static_cast<int>(j) + 4, y + 18,
                            cell.empty() ? std::string() : absl::StrCat("r", RankList(cell)));
    }
  }
  svg += "</svg>\n";
  std::ofstream out(path);
  if (!out) return absl::InvalidArgumentError(absl::StrCat("cannot write --svg ", path));
  out << svg;
  return absl::OkStatus();
}

nlohmann::ordered_json RangesJson(const DimRanges& ranges) {
  nlohmann::ordered_json dims = nlohmann::ordered_json::array();
  for (const RangeList& r : ranges) {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const IndexRange& x : r) list.push_back({x.start, x.stop});
    dims.push_back(list);
  }
  return dims;
}

std::string DimLabel(const DTensorSpec& spec, const PlanStep& s) {
  std::vector<std::string> names;
  for (int i : s.mesh_dims) names.push_back(MeshDimName(spec.mesh().names(), i));
  return absl::StrCat(absl::StrJoin(s.mesh_dims, "+"), " (", absl::StrJoin(names, "+"), ")");
}

// "1835008 (1.75 MiB)"; small counts as they are.
std::string BytesText(int64_t bytes) {
  if (bytes < (int64_t{1} << 20)) return absl::StrCat(bytes);
  const double mib = static_cast<double>(bytes) / (1 << 20);
  return mib < 1024 ? absl::StrFormat("%d (%.3g MiB)", bytes, mib)
                    : absl::StrFormat("%d (%.3g GiB)", bytes, mib / 1024);
}

// "10.8 us", "1.23 ms".
std::string TimeText(double us) {
  return us < 1000 ? absl::StrFormat("%.1f us", us) : absl::StrFormat("%.3g ms", us / 1000);
}

// Distinct local shapes in order of first appearance, with the ranks holding each.
std::vector<std::pair<Shape, std::vector<int>>> LocalShapes(const std::vector<RankInfo>& ranks) {
  std::vector<std::pair<Shape, std::vector<int>>> out;
  std::map<std::vector<int64_t>, size_t> index;
  for (const RankInfo& r : ranks) {
    auto [it, inserted] =
        index.try_emplace(std::vector<int64_t>(r.local.begin(), r.local.end()), out.size());
    if (inserted) out.push_back({r.local, {}});
    out[it->second].second.push_back(r.rank);
  }
  return out;
}

std::string LinkText(const LinkCost& l) {
  return absl::StrFormat("%.3g us + %.3g us/hop, %.4g GB/s", l.latency_us, l.hop_us, l.gb_per_s());
}

// Mesh dims whose groups cross hosts (each alone).
std::vector<int> CrossHostDims(const DeviceMesh& mesh, int64_t ranks_per_host) {
  std::vector<int> dims;
  for (int i = 0; i < mesh.ndim(); ++i) {
    if (GroupCrossesHosts(mesh.shape(), {i}, ranks_per_host)) dims.push_back(i);
  }
  return dims;
}

std::string DimNames(const DeviceMesh& mesh, const std::vector<int>& dims) {
  std::vector<std::string> names;
  for (int i : dims)
    names.push_back(absl::StrCat(MeshDimName(mesh.names(), i), "(", mesh.Size(i), ")"));
  return names.empty() ? "none" : absl::StrJoin(names, ", ");
}

}  // namespace

int Explain(const Flags& flags) {
  auto fail = [](const absl::Status& s) {
    std::fprintf(stderr, "dtensor explain: %s\n", std::string(s.message()).c_str());
    return 2;
  };
  auto mesh_shape = flags.Mesh();
  if (!mesh_shape.ok()) return fail(mesh_shape.status());
  auto names = flags.Names();
  if (!names.ok()) return fail(names.status());
  auto shape = flags.TensorShape();
  if (!shape.ok()) return fail(shape.status());
  auto placements = flags.PlacementList("placements");
  if (!placements.ok()) return fail(placements.status());
  auto dtype = flags.Dtype();
  if (!dtype.ok()) return fail(dtype.status());
  auto mesh = DeviceMesh::Abstract(*mesh_shape, *names);
  if (!mesh.ok()) return fail(mesh.status());
  auto spec = DTensorSpec::Create(*mesh, *placements, *shape, *dtype);
  if (!spec.ok()) return fail(spec.status());
  auto options = flags.Planner();
  if (!options.ok()) return fail(options.status());
  const CostModel& cost = options->cost;
  // See Note [Explain at scale].
  int64_t max_ranks = 16;
  if (const std::string m = flags.Get("max-ranks", "16"); m == "all") {
    max_ranks = std::numeric_limits<int64_t>::max();
  } else if (!absl::SimpleAtoi(m, &max_ranks) || max_ranks < 2) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat("bad --max-ranks '", m, "': expected a number >= 2 or 'all'")));
  }

  std::optional<RedistributePlan> plan;
  if (flags.Has("to")) {
    auto to = flags.PlacementList("to");
    if (!to.ok()) return fail(to.status());
    auto dst = spec->WithPlacements(*to);
    if (!dst.ok()) return fail(dst.status());
    auto p = PlanRedistribute(*spec, *dst, *options);
    if (!p.ok()) return fail(p.status());
    plan = *std::move(p);
  }

  std::vector<RankInfo> ranks;
  for (int r = 0; r < static_cast<int>(mesh->Size()); ++r) {
    RankInfo info;
    info.rank = r;
    info.coord = mesh->CoordinateOf(r).value();
    info.local = spec->LocalShape(info.coord);
    info.offset = spec->Offset(info.coord);
    info.ranges = spec->Ranges(info.coord);
    ranks.push_back(std::move(info));
  }
  const Picture pic = MakePicture(*spec, ranks);
  if (flags.Has("svg")) {
    if (absl::Status s = WriteSvg(flags.Get("svg"), *spec, pic); !s.ok()) return fail(s);
  }
  // The ranks listed: all of them, or the first and last max_ranks / 2.
  const int64_t n = static_cast<int64_t>(ranks.size());
  const int64_t head = n > max_ranks ? max_ranks / 2 : n;
  const int64_t tail_from = n > max_ranks ? n - max_ranks / 2 : n;
  const auto shapes = LocalShapes(ranks);
  const int64_t num_hosts =
      cost.ranks_per_host > 0 ? (n + cost.ranks_per_host - 1) / cost.ranks_per_host : 1;
  const std::vector<int> cross_dims = CrossHostDims(*mesh, cost.ranks_per_host);

  if (flags.Has("json")) {
    using Json = nlohmann::ordered_json;
    Json j;
    j["mesh"] = {{"shape", *mesh_shape}, {"names", *names}, {"text", mesh->ToString()}};
    j["shape"] = std::vector<int64_t>(shape->begin(), shape->end());
    j["dtype"] = std::string(DTypeName(*dtype));
    j["placements"] = PlacementsToCompactString(spec->placements());
    j["num_ranks"] = n;
    j["ranks_omitted"] = tail_from - head;
    j["local_shapes"] = Json::array();
    for (const auto& [local, holders] : shapes) {
      j["local_shapes"].push_back(
          {{"shape", std::vector<int64_t>(local.begin(), local.end())}, {"ranks", holders.size()}});
    }
    j["ranks"] = Json::array();
    for (int64_t i = 0; i < n; ++i) {
      if (i == head) i = tail_from;
      if (i >= n) break;
      const RankInfo& r = ranks[i];
      j["ranks"].push_back({{"rank", r.rank},
                            {"coordinate", r.coord},
                            {"local_shape", std::vector<int64_t>(r.local.begin(), r.local.end())},
                            {"offset", std::vector<int64_t>(r.offset.begin(), r.offset.end())},
                            {"ranges", RangesJson(r.ranges)}});
    }
    j["cost_model"] = Json::parse(CostModelToJson(cost));
    if (cost.ranks_per_host > 0) {
      j["hosts"] = {{"ranks_per_host", cost.ranks_per_host},
                    {"num_hosts", num_hosts},
                    {"cross_host_mesh_dims", cross_dims}};
    }
    if (plan) {
      j["to"] = PlacementsToCompactString(plan->dst);
      j["strategy"] = plan->strategy;
      j["cost_us"] = plan->cost_us;
      j["plan"] = Json::array();
      for (const PlanStep& s : plan->steps) {
        Json dims(std::vector<int>(s.mesh_dims.begin(), s.mesh_dims.end()));
        j["plan"].push_back({{"mesh_dim", s.mesh_dims.size() == 1 ? Json(s.mesh_dims[0]) : dims},
                             {"mesh_dims", dims},
                             {"from", PlacementsToCompactString(s.from)},
                             {"to", PlacementsToCompactString(s.to)},
                             {"collective", std::string(StepKindName(s.collective))},
                             {"bytes", s.bytes},
                             {"group_size", s.group_size},
                             {"logical_shape",
                              std::vector<int64_t>(s.cost_shape.begin(), s.cost_shape.end())},
                             {"crosses_hosts", s.crosses_hosts},
                             {"cost_us", s.cost_us}});
      }
    }
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }

  std::printf("%s: %lld ranks\n", spec->Describe().c_str(), static_cast<long long>(n));
  if (cost.ranks_per_host > 0) {
    std::printf(
        "hosts: %lld of %lld ranks (rank r on host r / %lld); groups along %s cross hosts\n",
        static_cast<long long>(num_hosts), static_cast<long long>(cost.ranks_per_host),
        static_cast<long long>(cost.ranks_per_host), DimNames(*mesh, cross_dims).c_str());
  }
  std::printf("\n");
  std::vector<std::string> header = {"rank", "coordinate", "local_shape", "offset", "ranges"};
  std::vector<std::vector<std::string>> rows;
  for (int64_t i = 0; i < n; ++i) {
    if (i == head && tail_from > head) {
      rows.push_back({"...", absl::StrCat("(", tail_from - head, " more)"), "", "", ""});
      i = tail_from;
      if (i >= n) break;
    }
    const RankInfo& r = ranks[i];
    rows.push_back({absl::StrCat(r.rank), Join(r.coord), ShapeToString(r.local),
                    ShapeToString(r.offset), RangesText(r.ranges)});
  }
  std::vector<size_t> w(header.size());
  for (size_t c = 0; c < header.size(); ++c) {
    w[c] = header[c].size();
    for (const auto& row : rows) w[c] = std::max(w[c], row[c].size());
  }
  auto print_row = [&](const std::vector<std::string>& row) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      absl::StrAppend(&line, row[c],
                      c + 1 < row.size() ? std::string(w[c] - row[c].size() + 2, ' ') : "");
    }
    std::printf("%s\n", std::string(absl::StripTrailingAsciiWhitespace(line)).c_str());
  };
  print_row(header);
  for (const auto& row : rows) print_row(row);
  if (tail_from > head || shapes.size() > 1) {
    constexpr size_t kMaxShapes = 8;
    std::printf("\nlocal shapes (%zu distinct):", shapes.size());
    for (size_t i = 0; i < shapes.size() && i < kMaxShapes; ++i) {
      const auto& [local, holders] = shapes[i];
      std::printf("%s %s on %zu rank%s (%s)", i ? "," : "", ShapeToString(local).c_str(),
                  holders.size(), holders.size() == 1 ? "" : "s", RankList(holders).c_str());
    }
    if (shapes.size() > kMaxShapes) std::printf(", %zu more", shapes.size() - kMaxShapes);
    std::printf("\n");
  }
  PrintPicture(pic);

  if (plan) {
    const size_t nsteps = plan->steps.size();
    const int ncoll = plan->num_collectives();
    std::printf("\nplan %s -> %s: %zu step%s, %d collective%s (%s planner, est. %s)\n",
                PlacementsToString(plan->src).c_str(), PlacementsToString(plan->dst).c_str(),
                nsteps, nsteps == 1 ? "" : "s", ncoll, ncoll == 1 ? "" : "s", plan->strategy,
                TimeText(plan->cost_us).c_str());
    if (flags.Has("cost-model") || cost.ranks_per_host > 0) {
      std::printf("cost model%s: intra-host %s",
                  flags.Has("cost-model") ? absl::StrCat(" ", flags.Get("cost-model")).c_str() : "",
                  LinkText(cost.intra).c_str());
      if (cost.ranks_per_host > 0) std::printf("; cross-host %s", LinkText(cost.inter).c_str());
      std::printf("\n");
    }
    if (plan->steps.empty()) {
      std::printf("  nothing to do: the layouts are the same\n");
      return 0;
    }
    const bool hosts = cost.ranks_per_host > 0;
    std::vector<std::string> ph = {"step",       "mesh_dim",   "from",         "to",
                                   "collective", "bytes/rank", "logical_shape"};
    if (hosts) ph.push_back("hosts");
    ph.push_back("est");
    std::vector<std::vector<std::string>> prow;
    for (size_t i = 0; i < plan->steps.size(); ++i) {
      const PlanStep& s = plan->steps[i];
      prow.push_back({absl::StrCat(i), DimLabel(*spec, s), PlacementsToCompactString(s.from),
                      PlacementsToCompactString(s.to), std::string(StepKindName(s.collective)),
                      BytesText(s.bytes), ShapeToString(s.cost_shape)});
      if (hosts) {
        prow.back().push_back(s.collective == StepKind::kLocal ? "-"
                              : s.crosses_hosts                  ? "cross-host"
                                                                 : "intra-host");
      }
      prow.back().push_back(TimeText(s.cost_us));
    }
    w.assign(ph.size(), 0);
    for (size_t c = 0; c < ph.size(); ++c) {
      w[c] = ph[c].size();
      for (const auto& row : prow) w[c] = std::max(w[c], row[c].size());
    }
    print_row(ph);
    for (const auto& row : prow) print_row(row);
  }
  return 0;
}

}  // namespace dt::cli
