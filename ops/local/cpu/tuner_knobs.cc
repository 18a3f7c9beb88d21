// Every knob of the tuner (Note [Tuner] in tuner.cc), in the order `dtensor calibrate` prints them,
// and the cache key that names the kernels they steer. A knob is declared beside the kernel it
// steers; adding one means adding it here too, so that DT_TUNE accepts it and `dtensor calibrate`
// shows it. What knows the kernels is here, so that tuner.cc stays below them (Note [Include
// graph]).

#include "absl/strings/str_cat.h"
#include "dtensor/ops/local/cpu/attention.h"
#include "dtensor/ops/local/cpu/cpu_info.h"
#include "dtensor/ops/local/cpu/gemm_backends.h"
#include "dtensor/ops/local/cpu/gemm_dispatch.h"
#include "dtensor/ops/local/cpu/gemm_kernels.h"
#include "dtensor/ops/local/cpu/gemm_paths.h"
#include "dtensor/ops/local/cpu/qgemm.h"
#include "dtensor/ops/local/cpu/tuner.h"

namespace dt::ops::cpu::tune {

const std::vector<const Knob*>& AllKnobs() {
  static const std::vector<const Knob*> knobs = [] {
    std::vector<const Knob*> v = {&qgemm::IsaKnob(), &qgemm::DotWidthKnob(),
                                  &qgemm::DotPrefetchKnob(), &qgemm::DotPairsKnob(),
                                  &qgemm::PanelsPrefetchKnob(), &qgemm::PanelChunkKnob(),
                                  &qgemm::DotMaxRowsKnob(false),
                                  &qgemm::DotMaxRowsKnob(true)};
    for (const Knob* k : qgemm::DotSplitKnobs()) v.push_back(k);
    v.push_back(&gemm::IsaKnob());
    v.push_back(&gemm::SkinnyPrefetchKnob());
    v.push_back(&gemm::SkinnyRowsKnob());
    for (const Knob* k : gemm::SkinnySplitKnobs()) v.push_back(k);
    for (const Knob* k : gemm::BackendKnobs()) v.push_back(k);
    for (const DType t : {DType::kF32, DType::kBF16}) v.push_back(&gemm::DnnlWeightsKnob(t));
    for (const Knob* k : {&BlocksKnob(), &DecodeKnob(DType::kF32), &DecodeKnob(DType::kBF16)}) {
      v.push_back(k);
    }
    return v;
  }();
  return knobs;
}

// Raised when a change to our kernels moves the figures that cached lines compare (v3: the
// quantized panels' prefetch and smaller panels made them faster, which moves where Dot stops
// paying, qgemm.dot_max_rows; v4: the quantized dot's scales in one permute), so that every cache
// file is measured again.
constexpr int kKernelsVersion = 4;

// The most preferred instruction sets (or a test's), not the knobs' picks: the knobs gemm.isa and
// qgemm.isa are read from the file this key names (Note [Tuned instruction set]).
std::string CacheKey() {
  return absl::StrCat("v", kKernelsVersion, " | ", ThisCpu().Describe(), " | ",
                      gemm::DnnlDescription(), " | ", gemm::OpenBlasDescription(), " | own ",
                      gemm::IsaName(gemm::BaseIsa()), " | quantized ",
                      qgemm::IsaName(qgemm::BaseIsa()));
}

}  // namespace dt::ops::cpu::tune
