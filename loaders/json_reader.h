#pragma once
// Internal to loaders/: typed reads of a JSON config with errors that name the file and the field
// (config.json of transformers and diffusers models, scheduler configs).
//
//   "config 'tiny/config.json': \"num_layers\" must be a positive integer, got -1"

#include <cmath>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "dtensor/core/dtype.h"
#include "nlohmann/json.hpp"

namespace dt::loaders::internal {

class Reader {
 public:
  using Json = nlohmann::json;

  Reader(const Json& j, absl::string_view what) : j_(j), what_(what) {}

  absl::Status Error(absl::string_view msg) const {
    return absl::InvalidArgumentError(absl::StrCat("config '", what_, "': ", msg));
  }
  // A valid value this implementation does not support.
  absl::Status Unsupported(absl::string_view msg) const {
    return absl::UnimplementedError(absl::StrCat("config '", what_, "': ", msg));
  }
  // The whole config, parsed from `text` without exceptions: valid JSON and an object. An empty
  // or cut-off file says so.
  absl::Status CheckObject(absl::string_view text) const {
    if (j_.is_discarded()) {
      if (absl::StripAsciiWhitespace(text).empty()) {
        return Error(absl::StrCat("is empty (", text.size(), " bytes); expected a JSON object"));
      }
      std::string why = "unknown error";
      try {
        const Json again = Json::parse(text.begin(), text.end());  // throws: the message
        (void)again;
      } catch (const std::exception& e) {
        why = e.what();
      }
      return Error(absl::StrCat("not valid JSON (", text.size(), " bytes): ", why));
    }
    if (!j_.is_object()) return Error(absl::StrCat("must be a JSON object, got ", j_.type_name()));
    return absl::OkStatus();
  }
  const Json* Find(const Json& obj, absl::string_view key) const {
    auto it = obj.find(std::string(key));
    if (it == obj.end() || it->is_null()) return nullptr;
    return &*it;
  }

  // A positive integer; `required` or `fallback`.
  absl::StatusOr<int64_t> PositiveInt(const Json& obj, absl::string_view key,
                                      std::optional<int64_t> fallback) const {
    const Json* v = Find(obj, key);
    if (v == nullptr) {
      if (fallback) return *fallback;
      return Error(absl::StrCat("missing required field \"", key, "\""));
    }
    if (!v->is_number_integer() || v->get<int64_t>() <= 0) {
      return Error(absl::StrCat("\"", key, "\" must be a positive integer, got ", v->dump()));
    }
    return v->get<int64_t>();
  }
  // An integer >= 0 of the top level, `fallback` when absent.
  absl::StatusOr<int64_t> NonNegativeInt(absl::string_view key, int64_t fallback) const {
    const Json* v = Find(j_, key);
    if (v == nullptr) return fallback;
    if (!v->is_number_integer() || v->get<int64_t>() < 0) {
      return Error(absl::StrCat("\"", key, "\" must be an integer >= 0, got ", v->dump()));
    }
    return v->get<int64_t>();
  }
  absl::StatusOr<double> PositiveNumber(const Json& obj, absl::string_view key,
                                        double fallback) const {
    const Json* v = Find(obj, key);
    if (v == nullptr) return fallback;
    if (!v->is_number() || !(v->get<double>() > 0) || !std::isfinite(v->get<double>())) {
      return Error(absl::StrCat("\"", key, "\" must be a positive number, got ", v->dump()));
    }
    return v->get<double>();
  }
  absl::StatusOr<bool> Bool(absl::string_view key, bool fallback) const {
    const Json* v = Find(j_, key);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) {
      return Error(absl::StrCat("\"", key, "\" must be true or false, got ", v->dump()));
    }
    return v->get<bool>();
  }
  absl::StatusOr<std::optional<std::string>> String(absl::string_view key) const {
    const Json* v = Find(j_, key);
    if (v == nullptr) return std::optional<std::string>();
    if (!v->is_string()) {
      return Error(absl::StrCat("\"", key, "\" must be a string, got ", v->dump()));
    }
    return std::optional<std::string>(v->get<std::string>());
  }

  const Json& j() const { return j_; }

 private:
  const Json& j_;
  std::string what_;
};

inline absl::StatusOr<DType> TorchDType(const Reader& r, const std::string& name) {
  if (name == "float32" || name == "float") return DType::kF32;
  if (name == "bfloat16") return DType::kBF16;
  if (name == "float16" || name == "half") return DType::kF16;
  return r.Error(absl::StrCat("torch_dtype \"", name,
                              "\" is not supported (float32, bfloat16, float16)"));
}

}  // namespace dt::loaders::internal
