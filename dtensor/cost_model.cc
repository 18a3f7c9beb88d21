#include "dtensor/dtensor/cost_model.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <numeric>
#include <optional>
#include <sstream>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "dtensor/core/status.h"
#include "nlohmann/json.hpp"

namespace dt {

absl::string_view StepKindName(StepKind c) {
  switch (c) {
    case StepKind::kLocal:
      return "local";
    case StepKind::kAllGather:
      return "all_gather";
    case StepKind::kAllReduce:
      return "all_reduce";
    case StepKind::kReduceScatter:
      return "reduce_scatter";
    case StepKind::kAllToAll:
      return "all_to_all";
  }
  return "?";
}

absl::StatusOr<StepKind> ParseStepKind(absl::string_view name) {
  for (StepKind c : {StepKind::kLocal, StepKind::kAllGather, StepKind::kAllReduce,
                       StepKind::kReduceScatter, StepKind::kAllToAll}) {
    if (StepKindName(c) == name) return c;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown collective '", name,
                   "': expected local, all_gather, all_reduce, reduce_scatter or all_to_all"));
}

// ---- hosts -------------------------------------------------------------------------------------

// Note [Groups across hosts]
// With row-major strides s_i, a group along the dims D is {b + sum_{i in D} c_i s_i}: its first
// rank b has coordinate 0 on D, and it spans [b, b + span] with span = sum_{i in D} (k_i - 1) s_i,
// both ends included. It stays on one host iff (b mod H) + span < H. So a step crosses hosts iff
// span >= H, or some first rank b has b mod H >= H - span. The residues b mod H are sums of
// c_j s_j mod H over the other dims j; dims whose stride is a multiple of H add nothing, and the
// rest are enumerated as a set of at most H residues (c_j s_j mod H repeats after H / gcd(s_j, H)).
bool GroupCrossesHosts(IntSpan mesh_shape, absl::Span<const int> mesh_dims,
                       int64_t ranks_per_host) {
  const int64_t h = ranks_per_host;
  if (h <= 0) return false;
  const int m = static_cast<int>(mesh_shape.size());
  std::vector<int64_t> stride(m);
  int64_t n = 1;
  for (int i = m - 1; i >= 0; --i) {
    stride[i] = n;
    n *= mesh_shape[i];
  }
  if (n <= h) return false;
  int64_t span = 0;
  for (int d : mesh_dims) span += (mesh_shape[d] - 1) * stride[d];
  if (span == 0) return false;
  if (span >= h) return true;
  // A set, not a bitmap of h entries: memory follows the residues reached, not the host size.
  absl::flat_hash_set<int64_t> seen = {0};
  std::vector<int64_t> residues = {0};
  for (int j = 0; j < m; ++j) {
    if (mesh_shape[j] <= 1 || std::find(mesh_dims.begin(), mesh_dims.end(), j) != mesh_dims.end()) {
      continue;
    }
    const int64_t step = stride[j] % h;
    if (step == 0) continue;
    const int64_t reps = std::min(mesh_shape[j], h / std::gcd(step, h));
    const size_t before = residues.size();
    for (size_t r = 0; r < before; ++r) {
      for (int64_t c = 1; c < reps; ++c) {
        const int64_t x = (residues[r] + c * step) % h;
        if (!seen.insert(x).second) continue;
        if (x + span >= h) return true;
        residues.push_back(x);
      }
    }
  }
  return false;
}

// ---- files -------------------------------------------------------------------------------------

namespace {

using Json = nlohmann::ordered_json;

// The keys a cost model file and each of its links may have (ParseCostModelJson's loops).
constexpr absl::string_view kModelKeys =
    "description, ranks_per_host, intra, inter, copy_gb_per_s, calibration";
constexpr absl::string_view kLinkKeys = "latency_us, hop_us, gb_per_s";

absl::Status Bad(absl::string_view what, absl::string_view msg) {
  return absl::InvalidArgumentError(absl::StrCat(what, ": ", msg));
}

absl::Status UnknownKey(absl::string_view what, absl::string_view key, absl::string_view expected) {
  return Bad(what, absl::StrCat("unknown key '", key, "' (expected ", expected, ")"));
}

absl::StatusOr<double> Number(const Json& v, absl::string_view what, const std::string& key,
                              bool positive) {
  if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0 ||
      (positive && v.get<double>() == 0)) {
    return Bad(what, absl::StrCat(key, " must be a number ", positive ? "> 0" : ">= 0", ", got ",
                                  v.dump()));
  }
  return v.get<double>();
}

// A bandwidth in GB/s (> 0), as bytes per microsecond.
absl::StatusOr<double> BytesPerUs(const Json& v, absl::string_view what, const std::string& key) {
  DT_ASSIGN_OR_RETURN(double gb, Number(v, what, key, /*positive=*/true));
  return gb * 1e3;
}

absl::Status ParseLink(const Json& j, absl::string_view what, const std::string& name,
                       LinkCost& link) {
  if (!j.is_object()) {
    return Bad(what, absl::StrCat(name,
                                  " must be an object like {\"latency_us\": 6.6, \"hop_us\": "
                                  "0.6, \"gb_per_s\": 87.7}, got ",
                                  j.dump()));
  }
  for (const auto& [key, v] : j.items()) {
    const std::string path = absl::StrCat(name, ".", key);
    if (key == "latency_us") {
      DT_ASSIGN_OR_RETURN(link.latency_us, Number(v, what, path, false));
    } else if (key == "hop_us") {
      DT_ASSIGN_OR_RETURN(link.hop_us, Number(v, what, path, false));
    } else if (key == "gb_per_s") {
      DT_ASSIGN_OR_RETURN(link.bytes_per_us, BytesPerUs(v, what, path));
    } else {
      return UnknownKey(what, path,
                        absl::StrCat(kLinkKeys, "; bandwidths are GB/s, 1e9 bytes per second"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CostModel> ParseCostModelJson(absl::string_view text, absl::string_view what) {
  Json j;
  try {  // nlohmann reports parse errors (with their position) only as exceptions
    j = Json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    std::string msg = e.what();
    if (const size_t close = msg.find("] ");
        msg.rfind("[json.exception", 0) == 0 && close != std::string::npos) {
      msg = msg.substr(close + 2);
    }
    return Bad(what, absl::StrCat("not valid JSON: ", msg));
  }
  if (!j.is_object()) {
    return Bad(what, absl::StrCat("expected a JSON object with keys ", kModelKeys, ", got ",
                                  j.type_name()));
  }
  CostModel model;
  for (const auto& [key, v] : j.items()) {
    if (key == "description") {
      if (!v.is_string())
        return Bad(what, absl::StrCat("description must be a string, got ", v.dump()));
    } else if (key == "calibration") {
      // Provenance (how the numbers were measured); not read.
    } else if (key == "ranks_per_host") {
      if (!v.is_number_integer() || v.get<int64_t>() < 0) {
        return Bad(what, absl::StrCat("ranks_per_host must be an integer >= 0 (0: one host), got ",
                                      v.dump()));
      }
      model.ranks_per_host = v.get<int64_t>();
    } else if (key == "intra") {
      DT_RETURN_IF_ERROR(ParseLink(v, what, key, model.intra));
    } else if (key == "inter") {
      DT_RETURN_IF_ERROR(ParseLink(v, what, key, model.inter));
    } else if (key == "copy_gb_per_s") {
      DT_ASSIGN_OR_RETURN(model.copy_bytes_per_us, BytesPerUs(v, what, key));
    } else {
      return UnknownKey(what, key, kModelKeys);
    }
  }
  return model;
}

absl::StatusOr<CostModel> LoadCostModel(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read cost model file '", path, "'"));
  std::stringstream text;
  text << in.rdbuf();
  return ParseCostModelJson(text.str(), absl::StrCat("cost model '", path, "'"));
}

std::string CostModelToJson(const CostModel& model, absl::string_view description,
                            absl::string_view calibration_json) {
  auto round = [](double x) { return std::round(x * 1000) / 1000; };
  auto link = [&](const LinkCost& l) {
    Json o;
    o["latency_us"] = round(l.latency_us);
    o["hop_us"] = round(l.hop_us);
    o["gb_per_s"] = round(l.gb_per_s());
    return o;
  };
  Json j;
  if (!description.empty()) j["description"] = std::string(description);
  j["ranks_per_host"] = model.ranks_per_host;
  j["intra"] = link(model.intra);
  j["inter"] = link(model.inter);
  j["copy_gb_per_s"] = round(model.copy_bytes_per_us / 1e3);
  if (!calibration_json.empty()) {
    Json c = Json::parse(calibration_json.begin(), calibration_json.end(), nullptr,
                         /*allow_exceptions=*/false);
    j["calibration"] = c.is_discarded() ? Json(std::string(calibration_json)) : c;
  }
  return j.dump(2) + "\n";
}

// ---- fitting -----------------------------------------------------------------------------------

double TimingBytesSent(const CollectiveTiming& t) {
  const double k = static_cast<double>(t.group_size);
  switch (t.collective) {
    case StepKind::kAllReduce:
      return 2 * (k - 1) / k * t.buffer_bytes;
    case StepKind::kAllGather:
    case StepKind::kReduceScatter:
    case StepKind::kAllToAll:
      return (k - 1) / k * t.buffer_bytes;
    case StepKind::kLocal:
      return 0;
  }
  return 0;
}

double Hops(StepKind c, int64_t k) {
  switch (c) {
    case StepKind::kAllReduce:
      return 2.0 * static_cast<double>(k - 1);
    case StepKind::kLocal:
      return 0;
    default:
      return static_cast<double>(k - 1);
  }
}

double TimingHops(const CollectiveTiming& t) { return Hops(t.collective, t.group_size); }

namespace {

// Solves the least-squares problem min |A x - 1|^2 over the columns `cols` of A (rows already
// divided by the measured times, so residuals are relative). Empty when singular.
std::optional<std::vector<double>> SolveColumns(const std::vector<std::array<double, 3>>& a,
                                                const std::vector<int>& cols) {
  const int p = static_cast<int>(cols.size());
  // Columns scaled to a max of 1 (latency ~1, bytes ~1e7).
  std::vector<double> scale(p, 0);
  for (const auto& row : a) {
    for (int c = 0; c < p; ++c) scale[c] = std::max(scale[c], std::abs(row[cols[c]]));
  }
  for (double s : scale) {
    if (s == 0) return std::nullopt;
  }
  std::vector<std::vector<double>> m(p, std::vector<double>(p + 1, 0));
  for (const auto& row : a) {
    for (int r = 0; r < p; ++r) {
      const double xr = row[cols[r]] / scale[r];
      for (int c = 0; c < p; ++c) m[r][c] += xr * row[cols[c]] / scale[c];
      m[r][p] += xr;
    }
  }
  for (int c = 0; c < p; ++c) {  // Gaussian elimination, partial pivoting
    int piv = c;
    for (int r = c + 1; r < p; ++r) {
      if (std::abs(m[r][c]) > std::abs(m[piv][c])) piv = r;
    }
    if (std::abs(m[piv][c]) < 1e-9 * static_cast<double>(a.size())) return std::nullopt;
    std::swap(m[c], m[piv]);
    for (int r = 0; r < p; ++r) {
      if (r == c) continue;
      const double f = m[r][c] / m[c][c];
      for (int k = c; k <= p; ++k) m[r][k] -= f * m[c][k];
    }
  }
  std::vector<double> x(3, 0);
  for (int c = 0; c < p; ++c) x[cols[c]] = m[c][p] / m[c][c] / scale[c];
  return x;
}

}  // namespace

absl::StatusOr<LinkFit> FitLinkCost(absl::Span<const CollectiveTiming> timings) {
  if (timings.size() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("fitting a link needs at least 2 timings, got ", timings.size()));
  }
  std::vector<std::array<double, 3>> rows;  // (1, hops, bytes) / time
  for (const CollectiveTiming& t : timings) {
    if (!(t.time_us > 0) || !std::isfinite(t.time_us) || t.group_size < 2 || t.buffer_bytes < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bad timing: ", StepKindName(t.collective), " on ", t.group_size, " ranks of ",
          t.buffer_bytes, " bytes in ", t.time_us, " us (need time > 0 and >= 2 ranks)"));
    }
    rows.push_back({1 / t.time_us, TimingHops(t) / t.time_us, TimingBytesSent(t) / t.time_us});
  }
  // Latency and hop, latency alone or hop alone, each with the bandwidth term; the feasible fit
  // (latency, hop >= 0, bandwidth > 0) with the smallest residual wins. Bandwidth alone is no model
  // of small messages.
  std::optional<std::vector<double>> best;
  double best_residual = 0;
  for (const std::vector<int>& cols :
       {std::vector<int>{0, 1, 2}, std::vector<int>{0, 2}, std::vector<int>{1, 2}}) {
    std::optional<std::vector<double>> x = SolveColumns(rows, cols);
    if (!x || (*x)[0] < 0 || (*x)[1] < 0 || !((*x)[2] > 0)) continue;
    double residual = 0;
    for (const auto& row : rows) {
      const double e = row[0] * (*x)[0] + row[1] * (*x)[1] + row[2] * (*x)[2] - 1;
      residual += e * e;
    }
    if (!best || residual < best_residual - 1e-12) {
      best = x;
      best_residual = residual;
    }
  }
  if (!best) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot fit latency + bytes / bandwidth to ", timings.size(),
        " timings: times do not grow with the bytes sent (need small and large messages)"));
  }
  LinkFit fit;
  fit.link = LinkCost{(*best)[0], (*best)[1], 1 / (*best)[2]};
  fit.samples = static_cast<int>(timings.size());
  for (const auto& row : rows) {
    const double e = row[0] * (*best)[0] + row[1] * (*best)[1] + row[2] * (*best)[2] - 1;
    fit.max_relative_error = std::max(fit.max_relative_error, std::abs(e));
  }
  return fit;
}

}  // namespace dt
