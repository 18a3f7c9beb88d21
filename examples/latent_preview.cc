#include "dtensor/examples/latent_preview.h"

#include <png.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dtensor/core/status.h"

namespace dt::examples {
namespace {

// One row-major RGB8 picture to `path` through libpng (errors come back through setjmp, as
// libpng's C API requires).
absl::Status WritePng(const std::string& path, const std::vector<uint8_t>& rgb, int64_t width,
                      int64_t height) {
  FILE* fp = std::fopen(path.c_str(), "wb");
  if (fp == nullptr) return absl::InternalError(absl::StrCat("cannot create '", path, "'"));
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png != nullptr ? png_create_info_struct(png) : nullptr;
  if (info == nullptr || setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, info != nullptr ? &info : nullptr);
    std::fclose(fp);
    return absl::InternalError(absl::StrCat("libpng could not write '", path, "'"));
  }
  png_init_io(png, fp);
  png_set_IHDR(png, info, static_cast<png_uint_32>(width), static_cast<png_uint_32>(height), 8,
               PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  for (int64_t y = 0; y < height; ++y) {
    png_write_row(png, const_cast<png_bytep>(rgb.data() + y * width * 3));
  }
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  if (std::fclose(fp) != 0) return absl::InternalError(absl::StrCat("cannot write '", path, "'"));
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteLatentPreview(const std::string& path, const Tensor& latents, int64_t height,
                                int64_t width) {
  Tensor t = latents;
  if (t.defined() && t.dim() == 3 && t.size(0) == 1) {
    DT_ASSIGN_OR_RETURN(t, t.Select(0, 0));
  }
  if (!t.defined() || t.dim() != 2 || t.size(0) != height * width || t.size(1) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "latent preview: want [", height * width, ", C] latents for a ", height, " x ", width,
        " grid, got ", t.defined() ? t.Describe() : "undefined"));
  }
  DT_ASSIGN_OR_RETURN(Tensor f, t.To(DType::kF32));
  const std::vector<float> v = f.ToVector<float>();
  const int64_t c = t.size(1);
  const bool patched = c % 4 == 0;
  const int64_t p = patched ? 2 : 1, channels = patched ? c / 4 : c;
  const int64_t ph = height * p, pw = width * p;
  const int64_t shown = std::min<int64_t>(channels, 3);
  // channel k of pixel (y, x)
  auto at = [&](int64_t k, int64_t y, int64_t x) {
    const int64_t token = (y / p) * width + x / p;
    const int64_t ch = patched ? k * 4 + (y % 2) * 2 + x % 2 : k;
    return v[token * c + ch];
  };
  std::vector<double> lo(shown), span(shown);
  for (int64_t k = 0; k < shown; ++k) {
    double sum = 0, sq = 0;
    for (int64_t y = 0; y < ph; ++y) {
      for (int64_t x = 0; x < pw; ++x) {
        sum += at(k, y, x);
        sq += double(at(k, y, x)) * at(k, y, x);
      }
    }
    const double n = double(ph * pw), mean = sum / n;
    const double sd = std::sqrt(std::max(0.0, sq / n - mean * mean));
    lo[k] = mean - 2.5 * sd;
    span[k] = sd > 0 ? 5.0 * sd : 1.0;
  }
  const int64_t scale = std::max<int64_t>(1, (256 + std::min(ph, pw) - 1) / std::min(ph, pw));
  const int64_t ow = pw * scale, oh = ph * scale;
  std::vector<uint8_t> rgb(static_cast<size_t>(ow * oh * 3));
  for (int64_t y = 0; y < oh; ++y) {
    for (int64_t x = 0; x < ow; ++x) {
      for (int64_t k = 0; k < 3; ++k) {
        const int64_t src = std::min(k, shown - 1);
        const double u = (at(src, y / scale, x / scale) - lo[src]) / span[src];
        rgb[(y * ow + x) * 3 + k] =
            static_cast<uint8_t>(std::lround(std::clamp(u, 0.0, 1.0) * 255.0));
      }
    }
  }
  return WritePng(path, rgb, ow, oh);
}

}  // namespace dt::examples
