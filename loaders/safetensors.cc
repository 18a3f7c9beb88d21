#include "dtensor/loaders/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dtensor/core/status.h"
#include "dtensor/loaders/read_util.h"
#include "nlohmann/json.hpp"
#include "dtensor/ops/local/ops.h"

namespace dt::loaders {
namespace {

using Json = nlohmann::json;

struct DTypeEntry {
  const char* name;
  int bits;
  std::optional<DType> dtype;
};
// Every dtype of the safetensors format (0.5+).
constexpr DTypeEntry kDTypes[] = {
    {"F32", 32, DType::kF32},     {"F16", 16, DType::kF16},   {"BF16", 16, DType::kBF16},
    {"I64", 64, DType::kI64},     {"I32", 32, DType::kI32},   {"U8", 8, DType::kU8},
    {"BOOL", 8, DType::kBool},    {"F64", 64, std::nullopt},  {"I8", 8, std::nullopt},
    {"I16", 16, std::nullopt},    {"U16", 16, std::nullopt},  {"U32", 32, std::nullopt},
    {"U64", 64, std::nullopt},    {"C64", 64, std::nullopt},  {"F8_E5M2", 8, std::nullopt},
    {"F8_E4M3", 8, std::nullopt}, {"F8_E8M0", 8, std::nullopt}, {"F6_E2M3", 6, std::nullopt},
    {"F6_E3M2", 6, std::nullopt}, {"F4", 4, std::nullopt},
};

const DTypeEntry* FindDType(absl::string_view name) {
  for (const DTypeEntry& e : kDTypes) {
    if (name == e.name) return &e;
  }
  return nullptr;
}

std::string Quote(absl::string_view what) { return absl::StrCat("safetensors '", what, "'"); }

absl::Status Invalid(absl::string_view what, absl::string_view msg) {
  return absl::InvalidArgumentError(absl::StrCat(Quote(what), ": ", msg));
}

// A JSON integer >= 0 that fits int64, or nullopt.
std::optional<int64_t> NonNegativeInt(const Json& j) {
  if (j.is_number_unsigned()) {
    const uint64_t v = j.get<uint64_t>();
    if (v > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
    return static_cast<int64_t>(v);
  }
  if (j.is_number_integer()) {
    const int64_t v = j.get<int64_t>();
    if (v < 0) return std::nullopt;
    return v;
  }
  return std::nullopt;
}

absl::StatusOr<TensorInfo> ParseEntry(absl::string_view what, const std::string& name,
                                      const Json& j, int64_t data_size) {
  auto bad = [&](absl::string_view msg) {
    return Invalid(what, absl::StrCat("tensor '", name, "': ", msg));
  };
  if (name.empty()) return Invalid(what, "a tensor has an empty name");
  if (!j.is_object()) return bad(absl::StrCat("entry must be an object, got ", j.type_name()));
  TensorInfo info;
  info.name = name;
  auto dt = j.find("dtype");
  if (dt == j.end() || !dt->is_string()) return bad("missing \"dtype\" (a string)");
  info.dtype_name = dt->get<std::string>();
  const DTypeEntry* entry = FindDType(info.dtype_name);
  if (entry == nullptr) return bad(absl::StrCat("unknown dtype '", info.dtype_name, "'"));
  info.dtype = entry->dtype;

  auto shape = j.find("shape");
  if (shape == j.end() || !shape->is_array()) return bad("missing \"shape\" (a list)");
  std::vector<std::string> dims_text;
  bool dims_ok = true;
  for (const Json& d : *shape) {
    dims_text.push_back(d.dump());
    std::optional<int64_t> v = NonNegativeInt(d);
    if (!v) {
      dims_ok = false;
    } else {
      info.shape.push_back(*v);
    }
  }
  const std::string shape_text = absl::StrCat("[", absl::StrJoin(dims_text, ", "), "]");
  if (!dims_ok) {
    return bad(absl::StrCat("shape ", shape_text, ": dims must be integers >= 0"));
  }
  if (info.shape.size() > 64) return bad(absl::StrCat("shape has ", info.shape.size(), " dims"));
  // Bits, with overflow checks (a hostile shape must not wrap around to a small size).
  uint64_t numel = 1;
  for (int64_t d : info.shape) {
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel)) {
      return bad(absl::StrCat("shape ", shape_text, " has more than 2^64 elements"));
    }
  }
  uint64_t bits = 0;
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(entry->bits), &bits) ||
      bits / 8 > static_cast<uint64_t>(INT64_MAX)) {
    return bad(absl::StrCat(info.dtype_name, shape_text, ": ", numel,
                            " elements take more than 2^63 bytes"));
  }
  if (bits % 8 != 0) {
    return bad(absl::StrCat(info.dtype_name, shape_text, " is not a whole number of bytes"));
  }
  const int64_t need = static_cast<int64_t>(bits / 8);

  auto offsets = j.find("data_offsets");
  if (offsets == j.end() || !offsets->is_array() || offsets->size() != 2) {
    return bad("missing \"data_offsets\" ([begin, end])");
  }
  std::optional<int64_t> b = NonNegativeInt((*offsets)[0]), e = NonNegativeInt((*offsets)[1]);
  if (!b || !e || *b > *e) {
    return bad(absl::StrCat("data_offsets ", offsets->dump(),
                            " must be integers with 0 <= begin <= end"));
  }
  info.begin = *b;
  info.end = *e;
  if (info.nbytes() != need) {
    return bad(absl::StrCat("data_offsets [", info.begin, ", ", info.end, "] hold ",
                            info.nbytes(), " bytes, but ", info.dtype_name, shape_text,
                            " needs ", need));
  }
  if (info.end > data_size) {
    return bad(absl::StrCat("data_offsets [", info.begin, ", ", info.end,
                            "] run past the end of the data section (", data_size, " bytes)"));
  }
  return info;
}

// A row-major tensor in the file: sizes and strides in bytes.
struct Layout {
  Shape shape;
  Shape byte_strides;
  int64_t elt = 0;
};

absl::Status ReadExactly(int fd, int64_t offset, int64_t n, char* out, absl::string_view path) {
  int64_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd, out + done, static_cast<size_t>(n - done), offset + done);
    if (r < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(absl::StrCat(Quote(path), ": read failed: ", std::strerror(errno)));
    }
    if (r == 0) {
      return Invalid(path, absl::StrCat("truncated: wanted ", n, " bytes at offset ", offset));
    }
    done += r;
  }
  return absl::OkStatus();
}

}  // namespace

std::string TensorInfo::Describe() const {
  return absl::StrCat(dtype_name, ShapeToString(shape));
}

absl::StatusOr<DType> DTypeFromSafetensors(absl::string_view name) {
  const DTypeEntry* e = FindDType(name);
  if (e == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("unknown safetensors dtype '", name, "'"));
  }
  if (!e->dtype) {
    return absl::UnimplementedError(absl::StrCat(
        "safetensors dtype ", name, " is not supported (supported: F32 F16 BF16 I64 I32 U8 BOOL)"));
  }
  return *e->dtype;
}

absl::string_view SafetensorsDTypeName(DType dtype) {
  for (const DTypeEntry& e : kDTypes) {
    if (e.dtype == dtype) return e.name;
  }
  return "?";
}

// ---- SafetensorsFile -----------------------------------------------------------------------------

absl::StatusOr<SafetensorsFile::Header> SafetensorsFile::ParseHeader(absl::string_view what,
                                                                     absl::string_view json,
                                                                     int64_t data_size) {
  // Duplicate names are legal JSON (the last one wins in most parsers): catch them while parsing.
  std::set<std::string> seen;
  std::string duplicate;
  Json::parser_callback_t callback = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (depth == 1 && event == Json::parse_event_t::key && parsed.is_string()) {
      const std::string& key = *parsed.get_ptr<const std::string*>();
      if (!seen.insert(key).second && duplicate.empty()) duplicate = key;
    }
    return true;
  };
  Json j;
  try {
    j = Json::parse(json.begin(), json.end(), callback, /*allow_exceptions=*/false);
  } catch (const std::exception& e) {  // the boundary: nlohmann must not throw past it
    return Invalid(what, absl::StrCat("header is not valid JSON (", e.what(), ")"));
  }
  if (j.is_discarded()) return Invalid(what, "header is not valid JSON");
  if (!j.is_object()) {
    return Invalid(what, absl::StrCat("header must be a JSON object, got ", j.type_name()));
  }
  if (!duplicate.empty()) {
    return Invalid(what, absl::StrCat("duplicate tensor '", duplicate, "' in the header"));
  }
  Header h;
  try {
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (it.key() == "__metadata__") {
        if (!it->is_object()) return Invalid(what, "__metadata__ must be an object of strings");
        for (auto m = it->begin(); m != it->end(); ++m) {
          if (!m->is_string()) {
            return Invalid(what, absl::StrCat("__metadata__ '", m.key(), "' must be a string"));
          }
          h.metadata[m.key()] = m->get<std::string>();
        }
        continue;
      }
      DT_ASSIGN_OR_RETURN(TensorInfo info, ParseEntry(what, it.key(), *it, data_size));
      h.tensors.push_back(std::move(info));
    }
  } catch (const std::exception& e) {
    return Invalid(what, absl::StrCat("malformed header (", e.what(), ")"));
  }
  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  int64_t at = 0;
  const TensorInfo* prev = nullptr;
  for (const TensorInfo& t : h.tensors) {
    if (t.begin < at) {
      return Invalid(what, absl::StrCat("tensor '", t.name, "': data_offsets [", t.begin, ", ",
                                        t.end, "] overlap tensor '", prev->name, "' [",
                                        prev->begin, ", ", prev->end, "]"));
    }
    if (t.begin > at) {
      return Invalid(what, absl::StrCat("tensor '", t.name, "': data_offsets [", t.begin, ", ",
                                        t.end, "] leave a gap of ", t.begin - at,
                                        " bytes before them (at ", at, ")"));
    }
    at = t.end;
    prev = &t;
  }
  if (at != data_size) {
    return Invalid(what, absl::StrCat("the tensors cover ", at, " bytes of a data section of ",
                                      data_size, " bytes"));
  }
  return h;
}

absl::StatusOr<std::shared_ptr<const SafetensorsFile>> SafetensorsFile::Open(
    const std::string& path) {
  DT_ASSIGN_OR_RETURN(OpenFile file, OpenForRead(path, Quote(path)));
  const int fd = file.fd;
  const int64_t size = file.size;
  if (size < 8) {
    return TooShort(Quote(path), size, "a safetensors file",
                    "it starts with an 8-byte header length");
  }
  unsigned char len_bytes[8];
  DT_RETURN_IF_ERROR(ReadExactly(fd, 0, 8, reinterpret_cast<char*>(len_bytes), path));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
  if (n > static_cast<uint64_t>(kMaxHeaderBytes)) {
    return Invalid(path, absl::StrCat("header length ", n, " is absurdly large (the limit is ",
                                      kMaxHeaderBytes, " bytes)"));
  }
  if (static_cast<int64_t>(n) > size - 8) {
    return Invalid(path, absl::StrCat("header length ", n, " runs past the end of the file (",
                                      size, " bytes)"));
  }
  std::string json(n, '\0');
  DT_RETURN_IF_ERROR(ReadExactly(fd, 8, static_cast<int64_t>(n), json.data(), path));
  const int64_t data_offset = 8 + static_cast<int64_t>(n);
  DT_ASSIGN_OR_RETURN(Header header, ParseHeader(path, json, size - data_offset));

  std::shared_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->data_offset_ = data_offset;
  f->header_ = std::move(header);
  for (size_t i = 0; i < f->header_.tensors.size(); ++i) f->index_[f->header_.tensors[i].name] = i;
  DT_ASSIGN_OR_RETURN(f->data_, Storage::MapFile(path, data_offset, size - data_offset));
  return std::shared_ptr<const SafetensorsFile>(std::move(f));
}

const TensorInfo* SafetensorsFile::Find(absl::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

absl::StatusOr<Tensor> SafetensorsFile::Read(absl::string_view name, const ReadOptions& options,
                                             ReadStats* stats) const {
  const TensorInfo* info = Find(name);
  if (info == nullptr) {
    return absl::NotFoundError(absl::StrCat(Quote(path_), ": no tensor '", name, "'"));
  }
  return ReadRanges(name, FullRanges(info->shape), options, stats);
}

absl::StatusOr<Tensor> SafetensorsFile::ReadRanges(absl::string_view name, const DimRanges& ranges,
                                                   const ReadOptions& options,
                                                   ReadStats* stats) const {
  const TensorInfo* info = Find(name);
  if (info == nullptr) {
    return absl::NotFoundError(absl::StrCat(Quote(path_), ": no tensor '", name, "'"));
  }
  if (!info->dtype) {
    return absl::UnimplementedError(absl::StrCat(
        Quote(path_), ": tensor '", info->name, "' has dtype ", info->dtype_name,
        ", which dtensor does not support (supported: F32 F16 BF16 I64 I32 U8 BOOL)"));
  }
  DT_RETURN_IF_ERROR(CheckRanges(Quote(path_), info->name, info->Describe(), info->shape, ranges));
  const DType dtype = *info->dtype;
  Layout l;
  l.shape = info->shape;
  l.elt = DTypeSize(dtype);
  l.byte_strides = ContiguousStrides(info->shape);
  for (int64_t& s : l.byte_strides) s *= l.elt;
  Shape out_shape;
  for (const RangeList& r : ranges) out_shape.push_back(RangesSize(r));
  const int ndim = static_cast<int>(l.shape.size());
  // k: the last dim that is not whole; the dims after it are copied as whole runs.
  int k = -1;
  for (int d = ndim - 1; d >= 0; --d) {
    const bool whole = ranges[d].size() == 1 && ranges[d][0].start == 0 &&
                       ranges[d][0].stop == l.shape[d];
    if (!whole) {
      k = d;
      break;
    }
  }
  const char* base = static_cast<const char*>(data_.data()) + info->begin;
  const int64_t out_bytes = Numel(out_shape) * l.elt;
  // One contiguous run: a single index in every dim before k, one range in dim k.
  bool contiguous = true;
  int64_t offset = 0;
  for (int d = 0; d <= k; ++d) {
    if (ranges[d].size() != 1 || (d < k && ranges[d][0].size() != 1)) {
      contiguous = false;
      break;
    }
    offset += ranges[d][0].start * l.byte_strides[d];
  }
  if (out_bytes == 0) contiguous = false;  // nothing to view or copy
  Tensor piece;
  int64_t viewed = 0, copied = 0;
  const char* run = base + offset;
  if (contiguous && options.zero_copy && reinterpret_cast<uintptr_t>(run) % l.elt == 0) {
    Storage view = Storage::Alias(data_, const_cast<char*>(run), out_bytes, /*read_only=*/true);
    piece = Tensor(std::move(view), out_shape, ContiguousStrides(out_shape), 0, dtype);
    viewed = out_bytes;
  } else {
    DT_ASSIGN_OR_RETURN(piece, Tensor::Empty(out_shape, dtype));
    if (out_bytes > 0) {
      if (k < 0) {
        std::memcpy(piece.raw_data(), base, out_bytes);
      } else {
        Storage whole = Storage::Alias(data_, const_cast<char*>(base), info->nbytes(),
                                       /*read_only=*/true);
        const Tensor src(std::move(whole), l.shape, ContiguousStrides(l.shape), 0, dtype);
        DT_RETURN_IF_ERROR(CopyBox(piece, ranges, src, FullRanges(l.shape), ranges));
      }
      copied = out_bytes;
      DropMappedPages(base, info->nbytes());
    }
  }
  // Note [Non-finite weights] (loaders/read_util.h).
  if (std::optional<NonFinite> bad = FindNonFinite(dtype, piece.raw_data(), piece.numel())) {
    return Invalid(path_, absl::StrCat("tensor '", info->name, "' ", info->Describe(), ": element ",
                                       PieceElement(ranges, bad->index), " is ", bad->value,
                                       "; weights must be finite"));
  }
  if (dtype == DType::kBool) {
    // A BOOL byte other than 0 or 1 is not a bool: refused, not read as undefined behaviour.
    const auto* b = static_cast<const uint8_t*>(piece.raw_data());
    for (int64_t i = 0; i < out_bytes; ++i) {
      if (b[i] > 1) {
        return Invalid(path_, absl::StrCat("tensor '", info->name, "' ", info->Describe(), ": byte ",
                                           static_cast<int>(b[i]), " at element ", i,
                                           " of the piece read is neither 0 nor 1"));
      }
    }
  }
  int64_t converted = 0;
  if (options.dtype && *options.dtype != dtype) {
    DT_ASSIGN_OR_RETURN(piece, ops::Cast(piece, *options.dtype));
    converted = piece.nbytes();
  }
  AccountRead(stats, viewed, copied, converted);
  return piece;
}

}  // namespace dt::loaders
