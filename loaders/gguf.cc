#include "dtensor/loaders/gguf.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dtensor/core/status.h"
#include "dtensor/loaders/read_util.h"
#include "dtensor/ops/local/ops.h"

namespace dt::loaders {
namespace {

std::string Quote(absl::string_view path) { return absl::StrCat("gguf '", path, "'"); }

// Sizes of the fixed-width value types, 0 for string/array.
int64_t ScalarBytes(uint32_t type) {
  switch (type) {
    case GgufValue::kU8: case GgufValue::kI8: case GgufValue::kBool: return 1;
    case GgufValue::kU16: case GgufValue::kI16: return 2;
    case GgufValue::kU32: case GgufValue::kI32: case GgufValue::kF32: return 4;
    case GgufValue::kU64: case GgufValue::kI64: case GgufValue::kF64: return 8;
    default: return 0;
  }
}

// The fewest bytes one value of `type` occupies (a string: its u64 length; an array: its u32 type
// and u64 count), for checking a count against the bytes left before allocating.
int64_t MinBytes(uint32_t type) {
  if (type == GgufValue::kString) return 8;
  if (type == GgufValue::kArray) return 12;
  return ScalarBytes(type);
}

// Sequential reads of the header through a 1 MiB pread buffer. Every read is checked against the
// file's size first, so a hostile length fails with the field's name, before any allocation.
class HeaderReader {
 public:
  HeaderReader(int fd, int64_t size, std::string path) : fd_(fd), size_(size), path_(std::move(path)) {}

  int64_t pos() const { return pos_; }
  int64_t remaining() const { return size_ - pos_; }

  absl::Status Bytes(int64_t n, void* out, absl::string_view field) {
    if (n < 0 || n > remaining()) {
      return absl::InvalidArgumentError(absl::StrCat(Quote(path_), ": ", field, ": ", n,
                                                     " bytes at offset ", pos_,
                                                     " run past the end of the file (", size_,
                                                     " bytes)"));
    }
    char* dst = static_cast<char*>(out);
    while (n > 0) {
      if (pos_ < buf_start_ || pos_ >= buf_start_ + static_cast<int64_t>(buf_.size())) {
        DT_RETURN_IF_ERROR(Fill());
      }
      const int64_t at = pos_ - buf_start_;
      const int64_t take = std::min<int64_t>(n, static_cast<int64_t>(buf_.size()) - at);
      std::memcpy(dst, buf_.data() + at, take);
      dst += take;
      pos_ += take;
      n -= take;
    }
    return absl::OkStatus();
  }

  template <typename T>
  absl::StatusOr<T> Get(absl::string_view field) {
    T v;
    DT_RETURN_IF_ERROR(Bytes(sizeof(T), &v, field));
    return v;
  }

  absl::StatusOr<std::string> String(absl::string_view field) {
    DT_ASSIGN_OR_RETURN(uint64_t n, Get<uint64_t>(field));
    if (n > static_cast<uint64_t>(remaining())) {
      return absl::InvalidArgumentError(absl::StrCat(Quote(path_), ": ", field, ": string length ",
                                                     n, " runs past the end of the file"));
    }
    std::string s(n, '\0');
    DT_RETURN_IF_ERROR(Bytes(static_cast<int64_t>(n), s.data(), field));
    return s;
  }

 private:
  absl::Status Fill() {
    buf_.resize(static_cast<size_t>(std::min<int64_t>(1 << 20, size_ - pos_)));
    buf_start_ = pos_;
    int64_t done = 0;
    while (done < static_cast<int64_t>(buf_.size())) {
      const ssize_t r = ::pread(fd_, buf_.data() + done, buf_.size() - done, pos_ + done);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        return absl::InternalError(absl::StrCat(Quote(path_), ": read failed at offset ",
                                                pos_ + done, ": ",
                                                r < 0 ? std::strerror(errno) : "end of file"));
      }
      done += r;
    }
    return absl::OkStatus();
  }

  int fd_;
  int64_t size_;
  std::string path_;
  int64_t pos_ = 0;
  int64_t buf_start_ = 0;
  std::string buf_;
};

struct ParseState {
  HeaderReader* in;
  const std::string* path;
  int64_t values = 0;  // metadata values so far (every array element counts)
  bool tokenizer_arrays = true;  // GgufOpenOptions
};

absl::Status Invalid(const ParseState& s, absl::string_view msg) {
  return absl::InvalidArgumentError(absl::StrCat(Quote(*s.path), ": ", msg));
}

absl::StatusOr<GgufValue> ReadValue(ParseState& s, uint32_t type, const std::string& key,
                                    int depth) {
  const std::string field = absl::StrCat("metadata '", key, "'");
  if (++s.values > GgufFile::kMaxMetadataValues) {
    return Invalid(s, absl::StrCat(field, ": more than ", GgufFile::kMaxMetadataValues,
                                   " metadata values in all"));
  }
  GgufValue v;
  v.type = static_cast<GgufValue::Type>(type);
  HeaderReader& in = *s.in;
  switch (type) {
    case GgufValue::kU8: { DT_ASSIGN_OR_RETURN(uint8_t x, in.Get<uint8_t>(field)); v.value = uint64_t{x}; break; }
    case GgufValue::kI8: { DT_ASSIGN_OR_RETURN(int8_t x, in.Get<int8_t>(field)); v.value = int64_t{x}; break; }
    case GgufValue::kU16: { DT_ASSIGN_OR_RETURN(uint16_t x, in.Get<uint16_t>(field)); v.value = uint64_t{x}; break; }
    case GgufValue::kI16: { DT_ASSIGN_OR_RETURN(int16_t x, in.Get<int16_t>(field)); v.value = int64_t{x}; break; }
    case GgufValue::kU32: { DT_ASSIGN_OR_RETURN(uint32_t x, in.Get<uint32_t>(field)); v.value = uint64_t{x}; break; }
    case GgufValue::kI32: { DT_ASSIGN_OR_RETURN(int32_t x, in.Get<int32_t>(field)); v.value = int64_t{x}; break; }
    case GgufValue::kU64: { DT_ASSIGN_OR_RETURN(uint64_t x, in.Get<uint64_t>(field)); v.value = x; break; }
    case GgufValue::kI64: { DT_ASSIGN_OR_RETURN(int64_t x, in.Get<int64_t>(field)); v.value = x; break; }
    case GgufValue::kF32: { DT_ASSIGN_OR_RETURN(float x, in.Get<float>(field)); v.value = double{x}; break; }
    case GgufValue::kF64: { DT_ASSIGN_OR_RETURN(double x, in.Get<double>(field)); v.value = x; break; }
    case GgufValue::kBool: {
      DT_ASSIGN_OR_RETURN(uint8_t x, in.Get<uint8_t>(field));
      if (x > 1) return Invalid(s, absl::StrCat(field, ": bool value ", int{x}, " is not 0 or 1"));
      v.value = x == 1;
      break;
    }
    case GgufValue::kString: {
      DT_ASSIGN_OR_RETURN(std::string x, in.String(field));
      v.value = std::move(x);
      break;
    }
    case GgufValue::kArray: {
      if (depth >= GgufFile::kMaxNesting) {
        return Invalid(s, absl::StrCat(field, ": arrays nested deeper than ",
                                       GgufFile::kMaxNesting));
      }
      DT_ASSIGN_OR_RETURN(uint32_t et, in.Get<uint32_t>(field));
      if (et > GgufValue::kF64) {
        return Invalid(s, absl::StrCat(field, ": unknown array element type ", et));
      }
      DT_ASSIGN_OR_RETURN(uint64_t n, in.Get<uint64_t>(field));
      const uint64_t room = static_cast<uint64_t>(in.remaining()) / MinBytes(et);
      if (n > room) {
        return Invalid(s, absl::StrCat(field, ": array of ", n, " ", GgufTypeName(et),
                                       " runs past the end of the file"));
      }
      if (static_cast<int64_t>(n) > GgufFile::kMaxMetadataValues - s.values) {
        return Invalid(s, absl::StrCat(field, ": array of ", n, " values: more than ",
                                       GgufFile::kMaxMetadataValues, " metadata values in all"));
      }
      v.element_type = static_cast<GgufValue::Type>(et);
      // Every element is parsed and validated; a tokenizer array's are dropped unless kept.
      const bool keep = s.tokenizer_arrays || key.rfind("tokenizer.", 0) != 0;
      std::vector<GgufValue> items;
      if (keep) items.reserve(n);
      for (uint64_t i = 0; i < n; ++i) {
        DT_ASSIGN_OR_RETURN(GgufValue item, ReadValue(s, et, key, depth + 1));
        if (keep) items.push_back(std::move(item));
      }
      if (!keep) v.omitted = static_cast<int64_t>(n);
      v.value = std::move(items);
      break;
    }
    default:
      return Invalid(s, absl::StrCat(field, ": unknown value type ", type));
  }
  return v;
}

}  // namespace

// ---- values --------------------------------------------------------------------------------------

std::string GgufTypeName(uint32_t type) {
  static constexpr const char* kNames[] = {"u8",  "i8",   "u16",    "i16",   "u32",
                                           "i32", "f32",  "bool",   "string", "array",
                                           "u64", "i64",  "f64"};
  if (type <= GgufValue::kF64) return kNames[type];
  return absl::StrCat("type ", type);
}

std::optional<int64_t> GgufValue::AsInt() const {
  if (const int64_t* i = std::get_if<int64_t>(&value)) return *i;
  if (const uint64_t* u = std::get_if<uint64_t>(&value)) {
    if (*u <= static_cast<uint64_t>(INT64_MAX)) return static_cast<int64_t>(*u);
  }
  return std::nullopt;
}

std::optional<double> GgufValue::AsDouble() const {
  if (const double* d = std::get_if<double>(&value)) return *d;
  if (const int64_t* i = std::get_if<int64_t>(&value)) return static_cast<double>(*i);
  if (const uint64_t* u = std::get_if<uint64_t>(&value)) return static_cast<double>(*u);
  return std::nullopt;
}

const std::string* GgufValue::AsString() const { return std::get_if<std::string>(&value); }

const std::vector<GgufValue>* GgufValue::AsArray() const {
  return std::get_if<std::vector<GgufValue>>(&value);
}

int64_t GgufValue::ArrayLength() const {
  const std::vector<GgufValue>* a = AsArray();
  return a == nullptr ? 0 : omitted > 0 ? omitted : static_cast<int64_t>(a->size());
}

std::string GgufValue::ToString() const {
  if (const int64_t* i = std::get_if<int64_t>(&value)) return absl::StrCat(*i);
  if (const uint64_t* u = std::get_if<uint64_t>(&value)) return absl::StrCat(*u);
  if (const double* d = std::get_if<double>(&value)) return absl::StrCat(*d);
  if (const bool* b = std::get_if<bool>(&value)) return *b ? "true" : "false";
  if (const std::string* s = AsString()) {
    return absl::StrCat("\"", s->size() > 60 ? s->substr(0, 57) + "..." : *s, "\"");
  }
  const std::vector<GgufValue>& a = *AsArray();
  if (omitted > 0) return absl::StrCat("[...(", omitted, ", not kept)]");
  std::vector<std::string> parts;
  for (size_t i = 0; i < a.size() && i < 4; ++i) parts.push_back(a[i].ToString());
  if (a.size() > 4) parts.push_back(absl::StrCat("...(", a.size(), ")"));
  return absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
}

std::string GgufTensorInfo::Describe() const {
  return absl::StrCat(type->name, ShapeToString(shape));
}

// ---- GgufFile ------------------------------------------------------------------------------------

bool GgufFile::HasMagic(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char magic[4] = {};
  const ssize_t r = ::pread(fd, magic, 4, 0);
  ::close(fd);
  return r == 4 && std::memcmp(magic, "GGUF", 4) == 0;
}

absl::StatusOr<std::shared_ptr<const GgufFile>> GgufFile::Open(const std::string& path,
                                                              const GgufOpenOptions& options) {
  DT_ASSIGN_OR_RETURN(OpenFile file, OpenForRead(path, Quote(path)));
  HeaderReader in(file.fd, file.size, path);
  ParseState s{&in, &path};
  s.tokenizer_arrays = options.tokenizer_arrays;
  std::shared_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;

  char magic[4] = {};
  if (in.remaining() < 4 || !in.Bytes(4, magic, "magic").ok() || std::memcmp(magic, "GGUF", 4) != 0) {
    return Invalid(s, absl::StrCat("is not a GGUF file (the first 4 bytes are not \"GGUF\"; the "
                                   "file has ", file.size, " bytes)"));
  }
  DT_ASSIGN_OR_RETURN(f->version_, in.Get<uint32_t>("version"));
  if (f->version_ != 2 && f->version_ != 3) {
    return Invalid(s, absl::StrCat("version ", f->version_, " is not supported (2 and 3 are",
                                   f->version_ > 0xFFFF ? "; a big-endian file?" : "", ")"));
  }
  DT_ASSIGN_OR_RETURN(uint64_t n_tensors, in.Get<uint64_t>("tensor count"));
  DT_ASSIGN_OR_RETURN(uint64_t n_kv, in.Get<uint64_t>("metadata count"));
  // A metadata entry is at least a key length, a type and one byte; a tensor info at least a
  // name length, a dim count, one dim, a type and an offset.
  if (n_kv > static_cast<uint64_t>(in.remaining()) / 13) {
    return Invalid(s, absl::StrCat("metadata count ", n_kv, " runs past the end of the file"));
  }
  if (n_tensors > static_cast<uint64_t>(in.remaining()) / 32) {
    return Invalid(s, absl::StrCat("tensor count ", n_tensors, " runs past the end of the file"));
  }
  for (uint64_t i = 0; i < n_kv; ++i) {
    DT_ASSIGN_OR_RETURN(std::string key, in.String(absl::StrCat("metadata key #", i)));
    DT_ASSIGN_OR_RETURN(uint32_t type, in.Get<uint32_t>(absl::StrCat("metadata '", key, "'")));
    DT_ASSIGN_OR_RETURN(GgufValue v, ReadValue(s, type, key, 0));
    if (!f->metadata_.emplace(key, std::move(v)).second) {
      return Invalid(s, absl::StrCat("duplicate metadata key '", key, "'"));
    }
  }
  if (const GgufValue* a = f->Find("general.alignment")) {
    const std::optional<int64_t> v = a->AsInt();
    if (!v || *v <= 0 || (*v & (*v - 1)) != 0 || *v > (1 << 24)) {
      return Invalid(s, absl::StrCat("general.alignment ", a->ToString(),
                                     " must be a power of two (at most 2^24)"));
    }
    f->alignment_ = *v;
  }
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensorInfo t;
    DT_ASSIGN_OR_RETURN(t.name, in.String(absl::StrCat("tensor name #", i)));
    const std::string field = absl::StrCat("tensor '", t.name, "'");
    DT_ASSIGN_OR_RETURN(uint32_t dims, in.Get<uint32_t>(field));
    if (dims < 1 || dims > kMaxDims) {
      return Invalid(s, absl::StrCat(field, ": ", dims, " dims (1 to ", kMaxDims, ")"));
    }
    uint64_t ne[kMaxDims];
    uint64_t numel = 1;
    for (uint32_t d = 0; d < dims; ++d) {
      DT_ASSIGN_OR_RETURN(ne[d], in.Get<uint64_t>(field));
      if (ne[d] < 1 || __builtin_mul_overflow(numel, ne[d], &numel) ||
          numel > static_cast<uint64_t>(INT64_MAX) / 64) {
        return Invalid(s, absl::StrCat(field, ": dim ", d, " of ", ne[d],
                                       ne[d] < 1 ? " (dims must be >= 1)" : " overflows 64-bit sizes"));
      }
    }
    for (int d = static_cast<int>(dims) - 1; d >= 0; --d) t.shape.push_back(static_cast<int64_t>(ne[d]));
    DT_ASSIGN_OR_RETURN(uint32_t type, in.Get<uint32_t>(field));
    t.type = FindGgmlType(type);
    if (t.type == nullptr) return Invalid(s, absl::StrCat(field, ": unknown ggml type ", type));
    if (static_cast<int64_t>(ne[0]) % t.type->block != 0) {
      return Invalid(s, absl::StrCat(field, ": ", t.type->name, " rows of ", ne[0],
                                     " elements are not whole ", t.type->block,
                                     "-element blocks"));
    }
    t.nbytes = static_cast<int64_t>(numel) / t.type->block * t.type->block_bytes;
    DT_ASSIGN_OR_RETURN(uint64_t offset, in.Get<uint64_t>(field));
    if (offset % static_cast<uint64_t>(f->alignment_) != 0 ||
        offset > static_cast<uint64_t>(INT64_MAX / 2)) {
      return Invalid(s, absl::StrCat(field, ": offset ", offset, " is not a multiple of the ",
                                     f->alignment_, "-byte alignment"));
    }
    t.offset = static_cast<int64_t>(offset);
    if (f->index_.count(t.name)) return Invalid(s, absl::StrCat("duplicate tensor '", t.name, "'"));
    f->index_[t.name] = f->tensors_.size();
    f->tensors_.push_back(std::move(t));
  }
  f->data_offset_ = (in.pos() + f->alignment_ - 1) / f->alignment_ * f->alignment_;
  const int64_t data_size = file.size - f->data_offset_;
  if (data_size < 0 && !f->tensors_.empty()) {
    return Invalid(s, absl::StrCat("the data section (at offset ", f->data_offset_,
                                   ") starts past the end of the file (", file.size, " bytes)"));
  }
  std::vector<const GgufTensorInfo*> by_offset;
  for (const GgufTensorInfo& t : f->tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const GgufTensorInfo* a, const GgufTensorInfo* b) {
    return a->offset < b->offset;
  });
  const GgufTensorInfo* prev = nullptr;
  for (const GgufTensorInfo* t : by_offset) {
    if (t->offset + t->nbytes > data_size) {
      return Invalid(s, absl::StrCat("tensor '", t->name, "' ", t->Describe(), ": data [",
                                     t->offset, ", ", t->offset + t->nbytes,
                                     ") runs past the end of the data section (",
                                     std::max<int64_t>(data_size, 0), " bytes)"));
    }
    if (prev != nullptr && t->offset < prev->offset + prev->nbytes) {
      return Invalid(s, absl::StrCat("tensor '", t->name, "': data [", t->offset, ", ",
                                     t->offset + t->nbytes, ") overlaps tensor '", prev->name,
                                     "' [", prev->offset, ", ", prev->offset + prev->nbytes, ")"));
    }
    prev = t;
  }
  f->file_ = std::make_shared<const OpenFile>(std::move(file));
  return std::shared_ptr<const GgufFile>(std::move(f));
}

const GgufValue* GgufFile::Find(absl::string_view key) const {
  auto it = metadata_.find(std::string(key));
  return it == metadata_.end() ? nullptr : &it->second;
}

const GgufTensorInfo* GgufFile::FindTensor(absl::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

namespace {

absl::Status WrongType(const std::string& path, absl::string_view key, const GgufValue& v,
                       absl::string_view want) {
  return absl::InvalidArgumentError(absl::StrCat(Quote(path), ": metadata '", key, "' must be ",
                                                 want, ", got ", GgufTypeName(v.type), " ",
                                                 v.ToString()));
}

absl::Status Kept(const std::string& path, absl::string_view key, const GgufValue& v) {
  if (v.omitted == 0) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      Quote(path), ": metadata '", key, "' (", v.omitted, " values) was not kept: the file was "
      "opened without its tokenizer arrays (GgufOpenOptions::tokenizer_arrays)"));
}

}  // namespace

absl::StatusOr<std::optional<int64_t>> GgufFile::GetOptionalInt(absl::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return std::optional<int64_t>();
  std::optional<int64_t> i = v->AsInt();
  if (!i || v->type == GgufValue::kBool) return WrongType(path_, key, *v, "an integer");
  return i;
}

absl::StatusOr<int64_t> GgufFile::GetInt(absl::string_view key) const {
  DT_ASSIGN_OR_RETURN(std::optional<int64_t> v, GetOptionalInt(key));
  if (!v) return absl::NotFoundError(absl::StrCat(Quote(path_), ": no metadata '", key, "'"));
  return *v;
}

absl::StatusOr<std::optional<double>> GgufFile::GetOptionalDouble(absl::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return std::optional<double>();
  std::optional<double> d = v->AsDouble();
  if (!d) return WrongType(path_, key, *v, "a number");
  return d;
}

absl::StatusOr<std::optional<std::string>> GgufFile::GetOptionalString(
    absl::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return std::optional<std::string>();
  if (v->AsString() == nullptr) return WrongType(path_, key, *v, "a string");
  return std::optional<std::string>(*v->AsString());
}

absl::StatusOr<std::string> GgufFile::GetString(absl::string_view key) const {
  DT_ASSIGN_OR_RETURN(std::optional<std::string> v, GetOptionalString(key));
  if (!v) return absl::NotFoundError(absl::StrCat(Quote(path_), ": no metadata '", key, "'"));
  return *v;
}

absl::StatusOr<std::vector<std::string>> GgufFile::GetStrings(absl::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return absl::NotFoundError(absl::StrCat(Quote(path_), ": no metadata '", key, "'"));
  if (v->AsArray() == nullptr || v->element_type != GgufValue::kString) {
    return WrongType(path_, key, *v, "an array of strings");
  }
  DT_RETURN_IF_ERROR(Kept(path_, key, *v));
  std::vector<std::string> out;
  out.reserve(v->AsArray()->size());
  for (const GgufValue& e : *v->AsArray()) out.push_back(*e.AsString());
  return out;
}

absl::StatusOr<std::vector<int64_t>> GgufFile::GetInts(absl::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return absl::NotFoundError(absl::StrCat(Quote(path_), ": no metadata '", key, "'"));
  const auto* a = v->AsArray();
  if (a == nullptr || ScalarBytes(v->element_type) == 0 || v->element_type == GgufValue::kF32 ||
      v->element_type == GgufValue::kF64 || v->element_type == GgufValue::kBool) {
    return WrongType(path_, key, *v, "an array of integers");
  }
  DT_RETURN_IF_ERROR(Kept(path_, key, *v));
  std::vector<int64_t> out;
  out.reserve(a->size());
  for (const GgufValue& e : *a) {
    std::optional<int64_t> i = e.AsInt();
    if (!i) return WrongType(path_, key, e, "an array of integers that fit 64 bits");
    out.push_back(*i);
  }
  return out;
}

// Note [Blocks are read, not mapped]
// A GGUF piece is always a copy (blocks kept as they are, or dequantized), so the file is read
// with pread, never mapped: a quantized piece straight into its tensor (one read per run of whole
// rows, or per row and column range), a dequantized one through a buffer of its row's blocks.
// The file's pages never enter this process's RSS — a mapping faults in its neighbours too
// (fault-around), about 1 MB per small tensor read here, which unmapping the tensor's own pages
// does not release — so a rank holds its pieces and nothing else (the demo's peak-RSS target,
// bench_llama).
absl::StatusOr<Tensor> GgufFile::ReadBlocks(const GgufTensorInfo& t, absl::Span<const int64_t> rows,
                                            const RangeList& cols, DType dtype,
                                            ReadStats* stats) const {
  const GgmlType& type = *t.type;
  if (type.dtype != dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        Quote(path_), ": tensor '", t.name, "' is ", t.Describe(), "; it cannot be read as ",
        DTypeName(dtype), " (quantized tensors are kept in their own type, or dequantized)"));
  }
  for (const IndexRange& c : cols) {
    if (c.start % type.block != 0 || c.stop % type.block != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          Quote(path_), ": tensor '", t.name, "' ", t.Describe(), ": columns [", c.start, ", ",
          c.stop, ") are not whole ", type.block, "-element blocks, so they cannot stay ",
          type.name));
    }
  }
  const int64_t out_cols = RangesSize(cols);
  DT_ASSIGN_OR_RETURN(Tensor piece, Tensor::Empty({static_cast<int64_t>(rows.size()), out_cols}, dtype));
  const int64_t row_bytes = t.shape.back() / type.block * type.block_bytes;
  const int64_t base = data_offset_ + t.offset;
  char* out = static_cast<char*>(piece.raw_data());
  const bool whole_rows = cols.size() == 1 && cols[0].start == 0 && cols[0].stop == t.shape.back();
  int64_t copied = 0;
  for (size_t i = 0; i < rows.size();) {
    if (whole_rows) {  // a run of consecutive rows in one read
      size_t j = i + 1;
      while (j < rows.size() && rows[j] == rows[j - 1] + 1) ++j;
      const int64_t bytes = static_cast<int64_t>(j - i) * row_bytes;
      DT_RETURN_IF_ERROR(PreadAll(file_->fd, out, bytes, base + rows[i] * row_bytes, Quote(path_)));
      out += bytes;
      copied += bytes;
      i = j;
      continue;
    }
    for (const IndexRange& c : cols) {
      const int64_t bytes = c.size() / type.block * type.block_bytes;
      DT_RETURN_IF_ERROR(PreadAll(file_->fd, out, bytes,
                                  base + rows[i] * row_bytes + c.start / type.block * type.block_bytes,
                                  Quote(path_)));
      out += bytes;
      copied += bytes;
    }
    ++i;
  }
  AccountRead(stats, 0, copied, 0);
  return piece;
}

absl::StatusOr<Tensor> GgufFile::ReadRanges(absl::string_view name, const DimRanges& ranges,
                                            const ReadOptions& options, ReadStats* stats) const {
  const GgufTensorInfo* t = FindTensor(name);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat(Quote(path_), ": no tensor '", name, "'"));
  DT_RETURN_IF_ERROR(CheckRanges(Quote(path_), t->name, t->Describe(), t->shape, ranges));
  // The row indices of the leading dims' ranges, in row-major order.
  std::vector<int64_t> rows = {0};
  for (size_t d = 0; d + 1 < t->shape.size(); ++d) {
    std::vector<int64_t> next;
    for (int64_t base : rows) {
      for (const IndexRange& r : ranges[d]) {
        for (int64_t i = r.start; i < r.stop; ++i) next.push_back(base * t->shape[d] + i);
      }
    }
    rows = std::move(next);
  }
  DT_ASSIGN_OR_RETURN(Tensor piece, ReadRows(name, rows, ranges.back(), options, stats));
  Shape out_shape;
  for (const RangeList& r : ranges) out_shape.push_back(RangesSize(r));
  return piece.Reshape(out_shape);
}

absl::StatusOr<Tensor> GgufFile::ReadRows(absl::string_view name, absl::Span<const int64_t> rows,
                                          const RangeList& cols, const ReadOptions& options,
                                          ReadStats* stats) const {
  const GgufTensorInfo* t = FindTensor(name);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat(Quote(path_), ": no tensor '", name, "'"));
  const GgmlType& type = *t->type;
  if (!type.dequantizable()) {
    return absl::UnimplementedError(absl::StrCat(
        Quote(path_), ": tensor '", t->name, "' is ", type.name,
        ", which dtensor does not dequantize (supported: ", DequantizableGgmlTypes(), ")"));
  }
  const int64_t width = t->shape.back();
  const int64_t n_rows = Numel(t->shape) / width;
  DT_RETURN_IF_ERROR(CheckRanges(Quote(path_), t->name, t->Describe(), {width}, {cols}));
  for (int64_t r : rows) {
    if (r < 0 || r >= n_rows) {
      return absl::InvalidArgumentError(absl::StrCat(Quote(path_), ": tensor '", t->name, "' ",
                                                     t->Describe(), ": row ", r,
                                                     " is outside [0, ", n_rows, ")"));
    }
  }
  if (options.dtype && IsQuantized(*options.dtype)) return ReadBlocks(*t, rows, cols, *options.dtype, stats);
  const int64_t out_cols = RangesSize(cols);
  DT_ASSIGN_OR_RETURN(Tensor piece,
                      Tensor::Empty({static_cast<int64_t>(rows.size()), out_cols}, DType::kF32));
  const int64_t row_bytes = width / type.block * type.block_bytes;
  const int64_t base = data_offset_ + t->offset;
  float* out = piece.data<float>();
  std::vector<uint8_t> blocks;
  std::vector<float> scratch;
  int64_t copied = 0;
  // Note [Blocks are read, not mapped]: each row's covering blocks are read, then dequantized.
  for (int64_t r : rows) {
    for (const IndexRange& c : cols) {
      const int64_t b0 = c.start / type.block, b1 = (c.stop + type.block - 1) / type.block;
      const int64_t bytes = (b1 - b0) * type.block_bytes;
      blocks.resize(static_cast<size_t>(bytes));
      DT_RETURN_IF_ERROR(PreadAll(file_->fd, blocks.data(), bytes,
                                  base + r * row_bytes + b0 * type.block_bytes, Quote(path_)));
      copied += bytes;
      if (c.start % type.block == 0 && c.stop % type.block == 0) {
        Dequantize(type, blocks.data(), b1 - b0, out);
      } else {
        scratch.resize(static_cast<size_t>((b1 - b0) * type.block));
        Dequantize(type, blocks.data(), b1 - b0, scratch.data());
        std::memcpy(out, scratch.data() + (c.start - b0 * type.block), c.size() * sizeof(float));
      }
      out += c.size();
    }
  }
  int64_t converted = type.id == 0 ? 0 : piece.nbytes();
  if (options.dtype && *options.dtype != DType::kF32) {
    DT_ASSIGN_OR_RETURN(piece, ops::Cast(piece, *options.dtype));
    converted = piece.nbytes();
  }
  AccountRead(stats, 0, copied, converted);
  return piece;
}

}  // namespace dt::loaders
