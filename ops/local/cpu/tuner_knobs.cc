// Every knob of the tuner (Note [Tuner] in tuner.cc), in the order `dtensor calibrate` prints them.
// A knob is declared beside the kernel it steers; adding one means adding it here too, so that
// DT_TUNE accepts it and `dtensor calibrate` shows it.

#include "dtensor/ops/local/cpu/attention.h"
#include "dtensor/ops/local/cpu/gemm.h"
#include "dtensor/ops/local/cpu/gemm_dispatch.h"
#include "dtensor/ops/local/cpu/qgemm.h"
#include "dtensor/ops/local/cpu/tuner.h"

namespace dt::ops::cpu::tune {

const std::vector<const Knob*>& AllKnobs() {
  static const std::vector<const Knob*> knobs = [] {
    std::vector<const Knob*> v = {&qgemm::DotPrefetchKnob(), &qgemm::DotMaxRowsKnob(),
                                  &gemm::SkinnyPrefetchKnob()};
    for (const Knob* k : gemm::BackendKnobs()) v.push_back(k);
    for (const Knob* k : {&BlocksKnob(), &DecodeKnob(DType::kF32), &DecodeKnob(DType::kBF16)}) {
      v.push_back(k);
    }
    return v;
  }();
  return knobs;
}

}  // namespace dt::ops::cpu::tune
