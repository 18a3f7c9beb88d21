#pragma once
// CostModel: the alpha-beta model the planner prices collectives with, aware of hosts.
//
// A collective over a group of k ranks costs, on the link its group uses,
//   latency_us + hops * hop_us + bytes_sent / bandwidth     hops = k-1 (2(k-1) for all_reduce)
// plus local packing at copy bandwidth (dtensor/planner.h has each collective's bytes_sent).
//
// Hosts. Mesh positions are numbered row-major, and host h holds positions
// [h * ranks_per_host, (h+1) * ranks_per_host): the global ranks of InitDeviceMesh under every
// launcher that places ranks in blocks per node (dtrun, torchrun, mpirun --map-by slot), and the
// rows of InitNodeLocalMesh (mesh/device_mesh.h) with ranks_per_host = ranks per node, whatever the
// launcher. A step runs on the inter-host link when any group of its mesh dims holds ranks of two
// hosts (GroupCrossesHosts), otherwise on the intra-host link. This is exact for every mesh shape;
// PyTorch's MeshTopoInfo instead assumes the outer mesh dims are the host dims. DTensor's
// Redistribute plans for one host unless RedistributeOptions::planner.cost says otherwise.
//
//   mesh (node=16, local=8), 8 ranks per host   groups along local: intra-host
//                                               groups along node, and node+local: cross-host
//   mesh (3, 4), 6 ranks per host               groups along dim 1 are {0-3} (one host) but
//                                               {4-7} spans hosts 0 and 1: cross-host
//   ranks_per_host 0 (the default)              one host: everything intra-host
//
//   model                          intra: latency, hop, GB/s   inter: latency, hop, GB/s
//   default (PyTorch's constants)  6.6 us, 0.6 us, 87.7        6.6 us, 2.7 us, 19.3 (0.22x)
//   tools/cost_models/h100_ib.json 6.6 us, 0.6 us, 450           10 us, 2.7 us, 50   (assumed)
//   tools/cost_models/loopback_... this VM, fitted by `dtensor calibrate` (docs/dtensor.md)
//
// Files (ParseCostModelJson / LoadCostModel) are JSON; every key is optional (defaults above),
// unknown keys are errors, bandwidths are GB/s (1e9 bytes per second):
//   {"description": "8x H100 per host, NVLink + 8x 400 Gb/s InfiniBand",
//    "ranks_per_host": 8,
//    "intra": {"latency_us": 6.6, "hop_us": 0.6, "gb_per_s": 450},
//    "inter": {"latency_us": 10, "hop_us": 2.7, "gb_per_s": 50},
//    "copy_gb_per_s": 1500,
//    "calibration": {... provenance, not read ...}}
//
// FitLinkCost fits one link's latency, hop and bandwidth to timed collectives (`dtensor calibrate`
// feeds it bench/collectives results).

#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "dtensor/core/shape.h"

namespace dt {

enum class StepKind : uint8_t { kLocal, kAllGather, kAllReduce, kReduceScatter, kAllToAll };
// "local", "all_gather", "all_reduce", "reduce_scatter", "all_to_all".
absl::string_view StepKindName(StepKind c);
// The inverse of CollectiveName; InvalidArgument naming the text otherwise.
absl::StatusOr<StepKind> ParseStepKind(absl::string_view name);

// Hops of a collective over k ranks: k-1, 2(k-1) for all_reduce, 0 for a local step.
double Hops(StepKind c, int64_t k);

// One class of link: within a host or between hosts.
struct LinkCost {
  double latency_us = 6.6;
  double hop_us = 0.6;
  double bytes_per_us = 87.7e3;  // 87.7 GB/s

  double gb_per_s() const { return bytes_per_us / 1e3; }
  // The model's time of a collective: latency + hops * hop + bytes sent / bandwidth.
  double TimeUs(double hops, double bytes_sent) const {
    return latency_us + hops * hop_us + bytes_sent / bytes_per_us;
  }
  friend bool operator==(const LinkCost&, const LinkCost&) = default;
};

struct CostModel {
  LinkCost intra;                           // groups within one host
  LinkCost inter{6.6, 2.7, 87.7e3 * 0.22};  // groups spanning hosts
  int64_t ranks_per_host = 0;               // 0: one host
  double copy_bytes_per_us = 350.0e3;       // local memory copies (packing)

  // The link of a group that crosses hosts or not.
  const LinkCost& Link(bool crosses_hosts) const { return crosses_hosts ? inter : intra; }
  friend bool operator==(const CostModel&, const CostModel&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const CostModel& m) {
    return H::combine(std::move(h), m.intra.latency_us, m.intra.hop_us, m.intra.bytes_per_us,
                      m.inter.latency_us, m.inter.hop_us, m.inter.bytes_per_us, m.ranks_per_host,
                      m.copy_bytes_per_us);
  }
};

// Whether some group along `mesh_dims` (the positions that differ only in those coordinates) holds
// ranks of two hosts, with row-major positions and `ranks_per_host` consecutive positions per host
// (<= 0: one host). Cost: O(1) in the aligned cases, else at most ranks_per_host x the sizes of the
// other dims.
bool GroupCrossesHosts(IntSpan mesh_shape, absl::Span<const int> mesh_dims, int64_t ranks_per_host);

// A cost model from JSON text (format above). `what` names the source in messages, e.g.
// "cost model 'h100.json'". Errors: bad JSON (with line and column), unknown keys, wrong types,
// negative latencies, bandwidths <= 0, ranks_per_host < 0.
absl::StatusOr<CostModel> ParseCostModelJson(absl::string_view text,
                                             absl::string_view what = "cost model");
// The same from a file; NotFound when it cannot be read.
absl::StatusOr<CostModel> LoadCostModel(const std::string& path);
// JSON text of a model (every key; `description` and `calibration_json`, an object, when given).
std::string CostModelToJson(const CostModel& model, absl::string_view description = "",
                            absl::string_view calibration_json = "");

// One timed collective over `group_size` ranks. `buffer_bytes` is nccl-tests' S: all_reduce's
// buffer, all_gather's output, reduce_scatter's input, all_to_all's input (bench/collectives).
struct CollectiveTiming {
  StepKind collective = StepKind::kAllReduce;
  int64_t group_size = 2;
  double buffer_bytes = 0;
  double time_us = 0;
};
// Bytes each rank sends and hops for a timing under the planner's accounting.
double TimingBytesSent(const CollectiveTiming& t);
double TimingHops(const CollectiveTiming& t);

struct LinkFit {
  LinkCost link;
  double max_relative_error = 0;  // over the timings, |predicted - measured| / measured
  int samples = 0;
};
// Least squares over relative errors of time = latency + hops * hop + bytes_sent / bandwidth, with
// latency, hop >= 0, not both 0 (a parameter the data cannot separate is 0; hop needs two group
// sizes or two kinds of collective). Errors: fewer than 2 timings, non-positive times, times that
// do not grow with bytes.
absl::StatusOr<LinkFit> FitLinkCost(absl::Span<const CollectiveTiming> timings);

}  // namespace dt
