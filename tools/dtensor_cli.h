#pragma once
// Internal to the `dtensor` CLI (tools/dtensor_cli*.cc): flag parsing shared by the subcommands.
//   dtensor_cli.cc            flags, `verify`, `styles`, main()
//   dtensor_cli_explain.cc    `explain`
//   dtensor_cli_calibrate.cc  `calibrate` (a cost model file from bench/collectives results)
//   dtensor_cli_inspect.cc    `inspect` (a checkpoint's tensors and each rank's reads)
//   dtensor_cli_tokenize.cc   `tokenize` (text to ids and back)
//   dtensor_cli_serve.cc      `serve` (the OpenAI API over the ranks: tools/serve_http.h)

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "dtensor/core/dtype.h"
#include "dtensor/core/shape.h"
#include "dtensor/dtensor/placement.h"
#include "dtensor/dtensor/planner.h"

namespace dt::cli {

// The flags a subcommand was given (abseil flags parsed by tools/flags.h, each defined in the file
// of the subcommand that reads it), by their command-line names ("cost-model"), and its
// positional arguments.
class Flags {
 public:
  // Parses argv (the arguments after the subcommand), accepting only `names` (abseil's names);
  // exits with 2 on a bad command line and with 0 after --help, which prints `usage` and them.
  static Flags Parse(const std::string& command, int argc, char** argv, const std::vector<std::string>& names,
                     absl::string_view usage);
  const std::vector<std::string>& positional() const { return positional_; }
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
  std::vector<std::string> positional_;
};

int Explain(const Flags& flags);
int Verify(const Flags& flags);
int Calibrate(const Flags& flags);
// `dtensor inspect PATH ...` (PATH is positional, before the flags).
int Inspect(const std::string& path, const Flags& flags);
// `dtensor tokenize ... TEXT`.
int Tokenize(const std::string& text, const Flags& flags);
// `dtensor serve --model ...` (under a launcher: one process per rank).
int Serve(const Flags& flags);

}  // namespace dt::cli
