#pragma once
// Internal to the CPU kernels: the attention kernel with its tuning parameters (Note [Flash
// attention on the CPU] in attention.cc). Attention (kernels.h) runs it with the defaults; tests,
// benches and a per-CPU tuner pass their own.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dtensor/core/tensor.h"
#include "dtensor/ops/local/kernels.h"

namespace dt::ops::cpu {

namespace tune {
struct Knob;
}  // namespace tune

// Decode calls (fewer stacked query rows than this) that take the score-row path when their dtype's
// knob says "rows".
inline constexpr int64_t kScoreRowsBelow = 16;

// The choices the kernel leaves to its caller. The defaults are what measured best on the AMD EPYC
// Zen 4 VM (2 vCPUs) of Note [Flash attention on the CPU]; Attention (kernels.h) runs with the
// tuner's choices for the running CPU (TunedAttention).
struct AttentionTuning {
  // Query rows per task, the rows of every query head of a KV head's group stacked (Note [Query
  // heads share their KV head's pass]): a task takes max(1, q_block / group) queries of each.
  int64_t q_block = 64;
  // Keys per block of the flash path's online softmax.
  int64_t kv_block = 64;
  // A call whose stacked rows (group x Sq) are fewer than this takes the score-row path (decode:
  // Note [Score rows read keys in place]); the others take the flash path. Per dtype of q: the
  // score-row path widens bf16 keys and values to f32 in registers, where the flash path
  // multiplies bf16 pairs.
  int64_t flash_min_rows = kScoreRowsBelow;  // f32 and f16
  int64_t flash_min_rows_bf16 = 0;  // bf16
};

// The tuner's knobs (Note [Tuner] in tuner.cc): the blocks of the flash path, and per dtype (f32,
// bf16) the path of decode calls ("rows": calls under kScoreRowsBelow stacked rows take the
// score-row path; "flash": every call the flash path).
const tune::Knob& BlocksKnob();
const tune::Knob& DecodeKnob(DType dtype);
// The tuning the knobs choose for `dtype` (the defaults' decode threshold for f16). Fails when
// DT_TUNE is malformed.
absl::StatusOr<AttentionTuning> TunedAttention(DType dtype);

// Attention (kernels.h) with `tuning`; q_block and kv_block must be at least 1.
absl::Status AttentionTuned(const Tensor& q, const Tensor& k, const Tensor& v,
                            const AttentionParams& params, const AttentionTuning& tuning,
                            const Tensor& out);

// PagedAttention (kernels.h) with `tuning` (q_block and kv_block; the decode thresholds do not
// apply: Note [Paged attention] in attention.cc).
absl::Status PagedAttentionTuned(const Tensor& q, const Tensor& k_pages, const Tensor& v_pages,
                                 const Tensor& page_table, const Tensor& query_starts,
                                 const Tensor& kv_lengths, const PagedAttentionParams& params,
                                 const AttentionTuning& tuning, const Tensor& out);

}  // namespace dt::ops::cpu
