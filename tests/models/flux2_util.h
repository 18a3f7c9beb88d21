#pragma once
// Shared by the Flux2 tests: the fixtures of tools/reference/make_flux2_fixtures.py (diffusers'
// inputs and outputs as safetensors) and the comparison against them.
#include <algorithm>
#include <cmath>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "dtensor/core/status.h"
#include "dtensor/core/tensor.h"
#include "dtensor/loaders/checkpoint.h"
#include "dtensor/nn/models/flux2.h"

namespace dt::nn::testing {

inline std::string Flux2Fixture(const std::string& name) {
  return std::string(DT_FIXTURES_DIR) + "/" + name;
}

// One tensor of tests/fixtures/<fixture>/<file>.safetensors.
inline absl::StatusOr<Tensor> FixtureTensor(const std::string& fixture, const std::string& file,
                                            const std::string& name) {
  DT_ASSIGN_OR_RETURN(loaders::Checkpoint c,
                      loaders::Checkpoint::Open(Flux2Fixture(fixture) + "/" + file));
  return c.Read(name);
}

// inputs.safetensors as Flux2Transformer2DModel::Run takes it (guidance when the file has it).
inline absl::StatusOr<Flux2Inputs> FixtureInputs(const std::string& fixture) {
  DT_ASSIGN_OR_RETURN(loaders::Checkpoint c,
                      loaders::Checkpoint::Open(Flux2Fixture(fixture) + "/inputs.safetensors"));
  Flux2Inputs in;
  DT_ASSIGN_OR_RETURN(in.hidden_states, c.Read("hidden_states"));
  DT_ASSIGN_OR_RETURN(in.encoder_hidden_states, c.Read("encoder_hidden_states"));
  DT_ASSIGN_OR_RETURN(in.timestep, c.Read("timestep"));
  if (c.Info("guidance").ok()) {
    DT_ASSIGN_OR_RETURN(in.guidance, c.Read("guidance"));
  }
  DT_ASSIGN_OR_RETURN(in.img_ids, c.Read("img_ids"));
  DT_ASSIGN_OR_RETURN(in.txt_ids, c.Read("txt_ids"));
  return in;
}

// max |got - want| / max |want|: "within tol relative to the output's scale".
inline absl::StatusOr<double> RelativeError(const Tensor& got, const Tensor& want) {
  return MaxRelativeDiff(got, want);
}

}  // namespace dt::nn::testing
