#pragma once
// A PNG preview of Flux2 latents, written with libpng. It is not a decoded image (the VAE is not
// part of this project): the packed latents [S, C] of an h × w token grid are unpacked as the
// pipeline's _unpatchify_latents does (C = 4·c channels of a 2 × 2 patch: channel k·4 + dy·2 + dx
// of token (r, col) is pixel (2r + dy, 2col + dx) of channel k), channels 0, 1, 2 become red, green
// and blue (one channel: grey), each mapped from mean ± 2.5 std onto 0..255, and the picture is
// scaled up by whole pixels until its shorter side is at least 256.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "dtensor/core/tensor.h"

namespace dt::examples {

// `latents`: [S, C] or [1, S, C] with S = height · width tokens.
absl::Status WriteLatentPreview(const std::string& path, const Tensor& latents, int64_t height,
                                int64_t width);

}  // namespace dt::examples
