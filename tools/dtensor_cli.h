#pragma once
// Internal to the `dtensor` CLI (tools/dtensor_cli*.cc): flag parsing shared by the subcommands.
//   dtensor_cli.cc            flags, `verify`, `styles`, main()
//   dtensor_cli_explain.cc    `explain`
//   dtensor_cli_calibrate.cc  `calibrate` (a cost model file from bench/collectives results)
//   dtensor_cli_inspect.cc    `inspect` (a checkpoint's tensors and each rank's reads)
//   dtensor_cli_tokenize.cc   `tokenize` (text to ids and back)

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "dtensor/core/dtype.h"
#include "dtensor/core/shape.h"
#include "dtensor/dtensor/placement.h"
#include "dtensor/dtensor/planner.h"

namespace dt::cli {

// --key value / --key=value flags after the subcommand; bare words are errors.
class Flags {
 public:
  static absl::StatusOr<Flags> Parse(int argc, char** argv, const std::vector<std::string>& known,
                                     const std::vector<std::string>& switches);
  bool Has(const std::string& key) const { return values_.count(key) > 0; }
  std::string Get(const std::string& key, const std::string& fallback = "") const;
  absl::StatusOr<std::string> Required(const std::string& key) const;

  // Typed accessors with messages naming the flag.
  absl::StatusOr<std::vector<int64_t>> Mesh() const;          // --mesh 4x2
  absl::StatusOr<std::vector<std::string>> Names() const;     // --names dp,tp
  absl::StatusOr<Shape> TensorShape() const;                  // --shape 13,2
  absl::StatusOr<Placements> PlacementList(const std::string& key) const;
  absl::StatusOr<DType> Dtype() const;                        // --dtype f32
  // --strategy best|greedy|search, --cost-model FILE, --ranks-per-host N (overrides the file's).
  absl::StatusOr<PlannerOptions> Planner() const;

 private:
  std::map<std::string, std::string> values_;
};

int Explain(const Flags& flags);
int Verify(const Flags& flags);
int Calibrate(const Flags& flags);
// `dtensor inspect PATH ...` (PATH is positional, before the flags).
int Inspect(const std::string& path, const Flags& flags);
// `dtensor tokenize` (argv after the subcommand).
int Tokenize(int argc, char** argv);

}  // namespace dt::cli
