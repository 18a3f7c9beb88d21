// `dtensor calibrate`: this machine's kernel choices, or a cost model file (dtensor/cost_model.h)
// fitted to a bench/collectives run.
//
//   dtensor calibrate            every kernel knob's choice on this CPU with the figures behind it
//                                (measured now where the tuner's cache has none: Note [Tuner])
//   dtensor calibrate --again    the same, every knob measured again and the cache rewritten
//
//   build/bin/bench_collectives --quick --backends mpi,gloo > collectives.txt
//   dtensor calibrate --bench collectives.txt --intra mpi --inter gloo --ranks-per-host 2
//                     --description "..." --out tools/cost_models/loopback_2vcpu.json
//
// Input: the driver's table rows ("mpi  2 all_gather  64  ours_ms raw_ms ratio ours_GB/s raw_GB/s
// memcpy_GB/s") and small all_reduce latencies ("mpi  2  14.1 us /  9.9 us"), or the workers' raw
// "ROW ..." / "LAT ..." lines; anything else is skipped. For each of the two backends, every timing
// of our communicator (the "ours" column; latencies without argument verification, the transport's
// own) goes to FitLinkCost: latency and per-hop time come from the small messages and the group
// sizes, bandwidth from the large ones. The copy bandwidth is the median memcpy rate of the intra
// backend's rows of >= 16 MiB.
//
// On one machine "intra" is a shared-memory transport (mpi) and "inter" a network one (gloo over
// TCP); on a cluster, run bench/collectives within a host and across two hosts and pass both files'
// lines in one input.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "dtensor/core/status.h"
#include "dtensor/dtensor/cost_model.h"
#include "dtensor/ops/local/cpu/cpu_info.h"
#include "dtensor/ops/local/cpu/tuner.h"
#include "nlohmann/json.hpp"
#include "dtensor/tools/dtensor_cli.h"

ABSL_FLAG(std::string, bench, "", "bench/collectives' output to fit into a cost model, or - for stdin");
ABSL_FLAG(bool, again, false, "measure every kernel knob again and rewrite the tuner's cache");
ABSL_FLAG(std::string, intra, "mpi", "the backend whose rows price links within a host");
ABSL_FLAG(std::string, inter, "gloo", "the backend whose rows price links across hosts");
ABSL_FLAG(std::string, description, "", "the model's description (default: where it was calibrated from)");
ABSL_FLAG(std::string, out, "", "write the cost model file here (default: stdout)");

namespace dt::cli {
namespace {

struct BenchData {
  std::map<std::string, std::vector<CollectiveTiming>> timings;  // by backend
  std::map<std::string, std::vector<double>> memcpy_gbps;        // by backend, rows >= 16 MiB
};

constexpr double kMiB = 1024.0 * 1024.0;

void AddRow(BenchData& data, const std::string& backend, int64_t n, StepKind op, double mib,
            double ours_ms, double memcpy_gbps) {
  data.timings[backend].push_back({op, n, mib * kMiB, ours_ms * 1000});
  if (mib >= 16 && memcpy_gbps > 0) data.memcpy_gbps[backend].push_back(memcpy_gbps);
}

void AddLatency(BenchData& data, const std::string& backend, int64_t n, double plain_us) {
  // bench/collectives times an all_reduce of 8 floats.
  data.timings[backend].push_back({StepKind::kAllReduce, n, 32, plain_us});
}

BenchData ParseBench(std::istream& in) {
  BenchData data;
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    int64_t n = 0;
    double mib = 0, a = 0, b = 0, c = 0, d = 0;
    if (f.size() == 9 && f[0] == "ROW") {  // ROW backend n op MiB ours_ms raw_ms memcpy_ms ratio
      auto op = ParseStepKind(f[3]);
      if (op.ok() && absl::SimpleAtoi(f[2], &n) && absl::SimpleAtod(f[4], &mib) &&
          absl::SimpleAtod(f[5], &a) && absl::SimpleAtod(f[7], &c) && c > 0) {
        AddRow(data, f[1], n, *op, mib, a, mib * kMiB / c / 1e6);
      }
    } else if (f.size() == 5 && f[0] == "LAT") {  // LAT backend n verify_us plain_us
      if (absl::SimpleAtoi(f[2], &n) && absl::SimpleAtod(f[4], &a)) AddLatency(data, f[1], n, a);
    } else if (f.size() == 10) {  // backend n op MiB ours_ms raw_ms ratio ours raw memcpy (GB/s)
      auto op = ParseStepKind(f[2]);
      if (op.ok() && absl::SimpleAtoi(f[1], &n) && absl::SimpleAtod(f[3], &mib) &&
          absl::SimpleAtod(f[4], &a) && absl::SimpleAtod(f[9], &d)) {
        AddRow(data, f[0], n, *op, mib, a, d);
      }
    } else if (f.size() == 7 && f[3] == "us" && f[4] == "/" &&
               f[6] == "us") {  // backend n v us / p us
      if (absl::SimpleAtoi(f[1], &n) && absl::SimpleAtod(f[5], &b)) AddLatency(data, f[0], n, b);
    }
  }
  return data;
}

// Every kernel knob: its choice, where it came from and the figures behind it.
int KernelChoices(bool again) {
  std::printf("kernel choices on %s, tuner cache %s\n", ops::cpu::ThisCpu().Describe().c_str(),
              ops::cpu::tune::CachePath().empty() ? "(none: no HOME or XDG_CACHE_HOME)"
                                                  : ops::cpu::tune::CachePath().c_str());
  int status = 0;
  for (const ops::cpu::tune::Knob* knob : ops::cpu::tune::AllKnobs()) {
    if (again) std::fprintf(stderr, "measuring %s ...\n", knob->name.c_str());
    absl::StatusOr<ops::cpu::tune::Choice> c =
        again ? ops::cpu::tune::Remeasure(*knob) : ops::cpu::tune::Explain(*knob);
    if (!c.ok()) {
      std::fprintf(stderr, "dtensor calibrate: %s: %s\n", knob->name.c_str(), std::string(c.status().message()).c_str());
      status = 2;
      continue;
    }
    std::printf("%-22s %-9s %s\n%22s %s\n", knob->name.c_str(), knob->candidates[c->index].c_str(),
                c->why.c_str(), "", knob->what.c_str());
  }
  return status;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int Calibrate(const Flags& flags) {
  auto fail = [](const absl::Status& s) {
    std::fprintf(stderr, "dtensor calibrate: %s\n", std::string(s.message()).c_str());
    return 2;
  };
  if (!flags.Has("bench")) {
    for (const char* f : {"intra", "inter", "ranks-per-host", "description", "out"}) {
      if (flags.Has(f)) {
        return fail(absl::InvalidArgumentError(
            absl::StrCat("--", f, " belongs to a cost model fit: give --bench FILE (the output of "
                         "build/bin/bench_collectives) too")));
      }
    }
    return KernelChoices(flags.Has("again"));
  }
  if (flags.Has("again")) {
    return fail(absl::InvalidArgumentError("--again measures kernel knobs: it takes no --bench"));
  }
  auto path = flags.Required("bench");
  BenchData data;
  if (*path == "-") {
    data = ParseBench(std::cin);
  } else {
    std::ifstream in(*path);
    if (!in) return fail(absl::NotFoundError(absl::StrCat("cannot read --bench ", *path)));
    data = ParseBench(in);
  }
  CostModel model;
  if (flags.Has("ranks-per-host") &&
      (!absl::SimpleAtoi(flags.Get("ranks-per-host"), &model.ranks_per_host) ||
       model.ranks_per_host < 0)) {
    return fail(absl::InvalidArgumentError(absl::StrCat(
        "bad --ranks-per-host '", flags.Get("ranks-per-host"), "': expected an integer >= 0")));
  }
  std::vector<std::string> found;
  for (const auto& [backend, t] : data.timings) found.push_back(backend);
  nlohmann::ordered_json calibration;
  calibration["source"] = absl::StrCat("bench/collectives output ", *path);
  for (const char* side : {"intra", "inter"}) {
    const std::string backend = flags.Get(side, side == std::string("intra") ? "mpi" : "gloo");
    auto it = data.timings.find(backend);
    if (it == data.timings.end()) {
      return fail(absl::InvalidArgumentError(absl::StrCat(
          "no timings for backend '", backend, "' (--", side, ") in ", *path,
          ": expected bench/collectives rows such as 'mpi  2 all_gather  64  1.234 ...'; found ",
          found.empty() ? "none" : absl::StrCat("backends ", absl::StrJoin(found, ", ")))));
    }
    auto fit = FitLinkCost(it->second);
    if (!fit.ok())
      return fail(absl::InvalidArgumentError(absl::StrCat(backend, ": ", fit.status().message())));
    (side == std::string("intra") ? model.intra : model.inter) = fit->link;
    calibration[side] = {{"backend", backend},
                         {"timings", fit->samples},
                         {"max_relative_error", std::round(fit->max_relative_error * 1000) / 1000}};
    std::fprintf(stderr,
                 "%s-host (%s, %d timings): latency %.2f us, %.2f us per hop, %.3g GB/s; largest "
                 "error %.0f%%\n",
                 side, backend.c_str(), fit->samples, fit->link.latency_us, fit->link.hop_us,
                 fit->link.gb_per_s(), fit->max_relative_error * 100);
  }
  const std::string intra = flags.Get("intra", "mpi");
  if (auto m = data.memcpy_gbps.find(intra); m != data.memcpy_gbps.end() && !m->second.empty()) {
    model.copy_bytes_per_us = Median(m->second) * 1e3;
    calibration["copy"] = absl::StrCat("median memcpy rate of the ", intra, " rows >= 16 MiB");
  }
  const std::string json = CostModelToJson(
      model, flags.Get("description", absl::StrCat("calibrated from ", *path)), calibration.dump());
  if (flags.Has("out")) {
    std::ofstream out(flags.Get("out"));
    if (!(out << json))
      return fail(
          absl::InvalidArgumentError(absl::StrCat("cannot write --out ", flags.Get("out"))));
  } else {
    std::fputs(json.c_str(), stdout);
  }
  return 0;
}

}  // namespace dt::cli
