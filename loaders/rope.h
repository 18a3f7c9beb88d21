#pragma once
// Rotary position embedding tables as transformers computes them for Llama (modeling_rope_utils:
// the rope_init functions and dynamic_rope_update), for every rope_type its LlamaConfig accepts.
//
//   rope_type  parameters (config.json "rope_scaling" / "rope_parameters")       table
//   default    -                                                                 theta^(-2i/D)
//   linear     factor                                                            default / factor
//   dynamic    factor                                                            NTK: theta grows with
//                                                                                the sequence length
//   yarn       factor, original_max_position_embeddings, [attention_factor,      blend of default and
//              beta_fast 32, beta_slow 1, mscale, mscale_all_dim, truncate true] default / factor by
//                                                                                frequency; cos/sin
//                                                                                scaled (attention_factor)
//   longrope   short_factor, long_factor (D/2 each), original_max_position_      default / short or long
//              embeddings, [factor, attention_factor]                            factors; cos/sin scaled
//   llama3     factor, low_freq_factor, high_freq_factor,                        default smoothed
//              original_max_position_embeddings                                  between two bands
//
// Numerics follow torch's: the frequencies in f32 (scalars rounded to f32 where torch does), the
// correction ranges and scales in double. tests/loaders/rope_test.cc compares every type, the
// sequence-length updates included, with transformers 5.24 (tests/fixtures/rope, made by
// tools/reference/make_rope_fixtures.py).
//
// Sequence-length dependence (dynamic_rope_update): `dynamic` recomputes its table when a forward's
// positions reach past the longest length seen so far (seq_len = max position + 1, starting from
// max_position_embeddings) and returns to the original table when a forward is shorter than
// max_position_embeddings again; `longrope` uses long_factor while seq_len exceeds
// original_max_position_embeddings and short_factor otherwise. RopeSchedule keeps that state.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dt::loaders {

struct RopeScaling {
  std::string rope_type = "default";  // default, linear, dynamic, yarn, longrope, llama3
  double factor = 1.0;                // linear, dynamic, yarn, llama3; longrope: optional
  double low_freq_factor = 1.0;       // llama3
  double high_freq_factor = 4.0;      // llama3
  int64_t original_max_position_embeddings = 8192;  // llama3, yarn, longrope
  // yarn and longrope: the cos/sin scale; nullopt: derived (mscale / the context ratio).
  std::optional<double> attention_factor;
  std::optional<double> beta_fast, beta_slow;      // yarn: 32 and 1 when absent
  std::optional<double> mscale, mscale_all_dim;    // yarn
  bool truncate = true;                            // yarn
  std::vector<double> short_factor, long_factor;   // longrope
  bool has_factor = true;  // longrope: whether "factor" was given (else max / original)

  bool operator==(const RopeScaling&) const = default;
};

// What a forward uses: the D/2 inverse frequencies and the factor cos and sin are multiplied by.
struct RopeTable {
  std::vector<float> inv_freq;
  float attention_scaling = 1.0f;

  bool operator==(const RopeTable&) const = default;
};

// The model's rope numbers that the tables depend on.
struct RopeSpec {
  RopeScaling scaling;
  int64_t head_dim = 0;
  double theta = 10000.0;
  int64_t max_position_embeddings = 2048;
};

// transformers' rope_init_fn for `spec` called with `seq_len` (nullopt: at construction).
RopeTable ComputeRope(const RopeSpec& spec, std::optional<int64_t> seq_len = std::nullopt);

// The table each forward uses, with dynamic_rope_update's state (see the file comment).
class RopeSchedule {
 public:
  explicit RopeSchedule(RopeSpec spec);
  // The table for a forward whose positions reach seq_len - 1.
  const RopeTable& ForLength(int64_t seq_len);
  const RopeTable& current() const { return current_; }
  // True for the types whose table depends on the sequence length (dynamic, longrope).
  bool depends_on_length() const;

 private:
  RopeSpec spec_;
  RopeTable original_, current_;
  std::optional<RopeTable> long_;  // longrope
  int64_t max_seq_len_cached_;
};

}  // namespace dt::loaders
