#include "dtensor/loaders/gguf.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dtensor/core/quant.h"
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
  // Back to `pos` (at most the current position: a second pass over what was read).
  void Seek(int64_t pos) { pos_ = pos; }
  int64_t remaining() const { return size_ - pos_; }

  // Reads `n` bytes into `out` (skips them when `out` is null).
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
      if (dst != nullptr) {
        std::memcpy(dst, buf_.data() + at, take);
        dst += take;
      }
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
  int64_t nested_arrays = 0;     // arrays inside arrays so far (GgufFile::kMaxNestedArrays)
  bool tokenizer_arrays = true;  // GgufOpenOptions
};

absl::Status Invalid(const ParseState& s, absl::string_view msg) {
  return absl::InvalidArgumentError(absl::StrCat(Quote(*s.path), ": ", msg));
}

// The scalar of `type` (a number or a bool, ScalarBytes(type) bytes, valid) at `p`.
GgufValue ScalarValue(uint32_t type, const char* p) {
  GgufValue v;
  v.type = static_cast<GgufValue::Type>(type);
  auto get = [p](auto x) {
    std::memcpy(&x, p, sizeof(x));
    return x;
  };
  switch (type) {
    case GgufValue::kU8: v.value = uint64_t{get(uint8_t{})}; break;
    case GgufValue::kI8: v.value = int64_t{get(int8_t{})}; break;
    case GgufValue::kU16: v.value = uint64_t{get(uint16_t{})}; break;
    case GgufValue::kI16: v.value = int64_t{get(int16_t{})}; break;
    case GgufValue::kU32: v.value = uint64_t{get(uint32_t{})}; break;
    case GgufValue::kI32: v.value = int64_t{get(int32_t{})}; break;
    case GgufValue::kU64: v.value = get(uint64_t{}); break;
    case GgufValue::kI64: v.value = get(int64_t{}); break;
    case GgufValue::kF32: v.value = double{get(float{})}; break;
    case GgufValue::kF64: v.value = get(double{}); break;
    case GgufValue::kBool: v.value = get(uint8_t{}) == 1; break;
    default: DT_CHECK(false, "ScalarValue of type ", type);
  }
  return v;
}

// Bools must be 0 or 1: the first of `n` at `p` that is not, or -1.
int64_t BadBool(const char* p, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (static_cast<uint8_t>(p[i]) > 1) return i;
  }
  return -1;
}

// Note [Compact metadata]
// A metadata array is held as its file holds it: numbers and bools as their bytes, strings back
// to back in one buffer with the offset where each ends (8 bytes, as the file's length field),
// so the metadata of a file takes at most about its bytes in memory, whatever it holds. Values
// were once one GgufValue each (56 bytes for a u8): a 9.3 MB file with a 7.9M-element u8 array
// cost 440 MB in every rank and in `dtensor inspect` (`GgufMemory.*` in tests/loaders/gguf_test.cc
// bounds it now). What still costs a value of its own is capped: keys (GgufFile::kMaxMetadataKeys)
// and arrays inside arrays (kMaxNestedArrays).
absl::StatusOr<GgufValue> ReadValue(ParseState& s, uint32_t type, const std::string& key,
                                    int depth) {
  const std::string field = absl::StrCat("metadata '", key, "'");
  HeaderReader& in = *s.in;
  if (const int64_t width = ScalarBytes(type); width > 0) {
    char x[8];
    DT_RETURN_IF_ERROR(in.Bytes(width, x, field));
    if (type == GgufValue::kBool && BadBool(x, 1) >= 0) {
      return Invalid(s, absl::StrCat(field, ": bool value ", int{static_cast<uint8_t>(x[0])},
                                     " is not 0 or 1"));
    }
    return ScalarValue(type, x);
  }
  GgufValue v;
  v.type = static_cast<GgufValue::Type>(type);
  if (type == GgufValue::kString) {
    DT_ASSIGN_OR_RETURN(std::string x, in.String(field));
    v.value = std::move(x);
    return v;
  }
  if (type != GgufValue::kArray) return Invalid(s, absl::StrCat(field, ": unknown value type ", type));
  if (depth >= GgufFile::kMaxNesting) {
    return Invalid(s, absl::StrCat(field, ": arrays nested deeper than ", GgufFile::kMaxNesting));
  }
  DT_ASSIGN_OR_RETURN(uint32_t et, in.Get<uint32_t>(field));
  if (et > GgufValue::kF64) return Invalid(s, absl::StrCat(field, ": unknown array element type ", et));
  DT_ASSIGN_OR_RETURN(uint64_t n, in.Get<uint64_t>(field));
  const uint64_t room = static_cast<uint64_t>(in.remaining()) / MinBytes(et);
  if (n > room) {
    return Invalid(s, absl::StrCat(field, ": array of ", n, " ", GgufTypeName(et),
                                   " runs past the end of the file"));
  }
  GgufArray a;
  a.element_type = et;
  a.size = static_cast<int64_t>(n);
  // Every element is read and validated; a tokenizer array's are dropped unless kept.
  a.kept = s.tokenizer_arrays || key.rfind("tokenizer.", 0) != 0;
  if (const int64_t width = ScalarBytes(et); width > 0) {
    if (a.kept || et == GgufValue::kBool) {
      a.bytes.resize(static_cast<size_t>(a.size * width));
      DT_RETURN_IF_ERROR(in.Bytes(a.size * width, a.bytes.data(), field));
    } else {
      DT_RETURN_IF_ERROR(in.Bytes(a.size * width, nullptr, field));
    }
    if (et == GgufValue::kBool) {
      if (const int64_t i = BadBool(a.bytes.data(), a.size); i >= 0) {
        return Invalid(s, absl::StrCat(field, ": element ", i, ": bool value ",
                                       int{static_cast<uint8_t>(a.bytes[i])}, " is not 0 or 1"));
      }
    }
  } else if (et == GgufValue::kString) {
    // Two passes, so that the buffer is allocated once at its size: the lengths, then the bytes.
    const int64_t start = in.pos();
    if (a.kept) a.ends.reserve(n);
    int64_t total = 0;
    for (uint64_t i = 0; i < n; ++i) {
      DT_ASSIGN_OR_RETURN(uint64_t len, in.Get<uint64_t>(field));
      if (len > static_cast<uint64_t>(in.remaining())) {
        return Invalid(s, absl::StrCat(field, ": element ", i, ": string length ", len,
                                       " runs past the end of the file"));
      }
      DT_RETURN_IF_ERROR(in.Bytes(static_cast<int64_t>(len), nullptr, field));
      total += static_cast<int64_t>(len);
      if (a.kept) a.ends.push_back(total);
    }
    if (a.kept) {
      const int64_t end = in.pos();
      in.Seek(start);
      a.bytes.resize(static_cast<size_t>(total));
      for (uint64_t i = 0; i < n; ++i) {
        const int64_t begin = i == 0 ? 0 : a.ends[i - 1];
        DT_RETURN_IF_ERROR(in.Bytes(8, nullptr, field));
        DT_RETURN_IF_ERROR(in.Bytes(a.ends[i] - begin, a.bytes.data() + begin, field));
      }
      DT_CHECK(in.pos() == end, "GGUF string array: second pass ended at ", in.pos(), ", not ", end);
    }
  } else {
    if (static_cast<int64_t>(n) > GgufFile::kMaxNestedArrays - s.nested_arrays) {
      return Invalid(s, absl::StrCat(field, ": ", n, " arrays inside an array: more than ",
                                     GgufFile::kMaxNestedArrays, " in all"));
    }
    s.nested_arrays += static_cast<int64_t>(n);
    if (a.kept) a.arrays.reserve(n);
    for (uint64_t i = 0; i < n; ++i) {
      DT_ASSIGN_OR_RETURN(GgufValue item, ReadValue(s, et, key, depth + 1));
      if (a.kept) a.arrays.push_back(std::move(item));
    }
  }
  v.value = std::move(a);
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

const GgufArray* GgufValue::AsArray() const { return std::get_if<GgufArray>(&value); }

int64_t GgufValue::ArrayLength() const {
  const GgufArray* a = AsArray();
  return a == nullptr ? 0 : a->size;
}

absl::string_view GgufArray::StringAt(int64_t i) const {
  const int64_t begin = i == 0 ? 0 : ends[i - 1];
  return absl::string_view(bytes).substr(begin, ends[i] - begin);
}

GgufValue GgufArray::Element(int64_t i) const {
  if (element_type == GgufValue::kArray) return arrays[i];
  if (element_type == GgufValue::kString) {
    GgufValue v;
    v.type = GgufValue::kString;
    v.value = std::string(StringAt(i));
    return v;
  }
  return ScalarValue(element_type, bytes.data() + i * ScalarBytes(element_type));
}

std::string GgufValue::ToString() const {
  if (const int64_t* i = std::get_if<int64_t>(&value)) return absl::StrCat(*i);
  if (const uint64_t* u = std::get_if<uint64_t>(&value)) return absl::StrCat(*u);
  if (const double* d = std::get_if<double>(&value)) return absl::StrCat(*d);
  if (const bool* b = std::get_if<bool>(&value)) return *b ? "true" : "false";
  if (const std::string* s = AsString()) {
    return absl::StrCat("\"", s->size() > 60 ? s->substr(0, 57) + "..." : *s, "\"");
  }
  const GgufArray& a = *AsArray();
  if (!a.kept) return absl::StrCat("[...(", a.size, ", not kept)]");
  std::vector<std::string> parts;
  for (int64_t i = 0; i < a.size && i < 4; ++i) parts.push_back(a.Element(i).ToString());
  if (a.size > 4) parts.push_back(absl::StrCat("...(", a.size, ")"));
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

  if (file.size < 4) {
    return TooShort(Quote(path), file.size, "a GGUF file", "its header takes at least 24 bytes");
  }
  char magic[4] = {};
  if (!in.Bytes(4, magic, "magic").ok() || std::memcmp(magic, "GGUF", 4) != 0) {
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
  if (n_kv > static_cast<uint64_t>(kMaxMetadataKeys)) {
    return Invalid(s, absl::StrCat("metadata count ", n_kv, ": more than the ", kMaxMetadataKeys,
                                   " keys read here (Note [Compact metadata])"));
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
    for (uint32_t d = 0; d < dims; ++d) {
      DT_ASSIGN_OR_RETURN(ne[d], in.Get<uint64_t>(field));
      if (ne[d] < 1) return Invalid(s, absl::StrCat(field, ": dim ", d, " of 0 (dims must be >= 1)"));
    }
    uint64_t numel = 1;
    bool wraps = false;
    for (uint32_t d = 0; d < dims; ++d) wraps |= __builtin_mul_overflow(numel, ne[d], &numel);
    if (wraps || numel > static_cast<uint64_t>(kMaxElements)) {
      return Invalid(s, absl::StrCat(field, ": ne [", absl::StrJoin(absl::MakeSpan(ne, dims), ", "),
                                     "] hold ", wraps ? "more than 2^64" : absl::StrCat(numel),
                                     " elements, more than a tensor may have (", kMaxElements, ")"));
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
    if (offset > static_cast<uint64_t>(file.size)) {
      return Invalid(s, absl::StrCat(field, ": offset ", offset, " is past the end of the file (",
                                     file.size, " bytes)"));
    }
    if (offset % static_cast<uint64_t>(f->alignment_) != 0) {
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

absl::Status Kept(const std::string& path, absl::string_view key, const GgufArray& a) {
  if (a.kept) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      Quote(path), ": metadata '", key, "' (", a.size, " values) was not kept: the file was "
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
  const GgufArray* a = v->AsArray();
  if (a == nullptr || a->element_type != GgufValue::kString) {
    return WrongType(path_, key, *v, "an array of strings");
  }
  DT_RETURN_IF_ERROR(Kept(path_, key, *a));
  std::vector<std::string> out;
  out.reserve(static_cast<size_t>(a->size));
  for (int64_t i = 0; i < a->size; ++i) out.emplace_back(a->StringAt(i));
  return out;
}

absl::StatusOr<std::vector<int64_t>> GgufFile::GetInts(absl::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return absl::NotFoundError(absl::StrCat(Quote(path_), ": no metadata '", key, "'"));
  const GgufArray* a = v->AsArray();
  if (a == nullptr || ScalarBytes(a->element_type) == 0 || a->element_type == GgufValue::kF32 ||
      a->element_type == GgufValue::kF64 || a->element_type == GgufValue::kBool) {
    return WrongType(path_, key, *v, "an array of integers");
  }
  DT_RETURN_IF_ERROR(Kept(path_, key, *a));
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(a->size));
  for (int64_t i = 0; i < a->size; ++i) {
    const GgufValue e = a->Element(i);
    std::optional<int64_t> x = e.AsInt();
    if (!x) return WrongType(path_, key, e, "an array of integers that fit 64 bits");
    out.push_back(*x);
  }
  return out;
}

namespace {

// Note [Non-finite weights] (loaders/read_util.h): `n` blocks of `t` just read to `p` (elements,
// for F32/F16/BF16), the first of them block `first` of row `row` of the tensor seen as a matrix
// [rows, ne0] (a run may go on into the next rows).
absl::Status CheckFinite(const std::string& path, const GgufTensorInfo& t, const void* p, int64_t n,
                         int64_t row, int64_t first) {
  const GgmlType& type = *t.type;
  const DType dtype = *type.dtype;
  int64_t bad = -1;
  std::string what;
  if (type.quantized()) {
    if (std::optional<NonFiniteScale> f = FindNonFiniteScale(dtype, p, n)) {
      bad = f->block;
      what = absl::StrCat("has scale ", f->field, " = ", f->value,
                          ", which makes every value of the block NaN or infinite (a corrupt file, "
                          "or bytes of another type under this one's label)");
    }
  } else if (std::optional<NonFinite> f = FindNonFinite(dtype, p, n)) {
    bad = f->index;
    what = absl::StrCat("is ", f->value, "; weights must be finite");
  }
  if (bad < 0) return absl::OkStatus();
  const int64_t per_row = t.shape.back() / type.block;
  int64_t r = row + (first + bad) / per_row;
  const int64_t col = (first + bad) % per_row * type.block;
  std::vector<int64_t> index(t.shape.size() - 1);  // the row's index in the leading dims
  for (size_t d = index.size(); d-- > 0;) {
    index[d] = r % t.shape[d];
    r /= t.shape[d];
  }
  const std::string cols = type.block == 1 ? absl::StrCat(col)
                                           : absl::StrCat(col, ":", col + type.block);
  const std::string where = absl::StrCat(index.empty() ? "" : absl::StrJoin(index, ", "),
                                         index.empty() ? "" : ", ", cols);
  return absl::InvalidArgumentError(absl::StrCat(
      Quote(path), ": tensor '", t.name, "' ", t.Describe(), ": ",
      type.block == 1 ? "element [" : "the block of elements [", where, "] ", what));
}

}  // namespace

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
      DT_RETURN_IF_ERROR(CheckFinite(path_, t, out, bytes / type.block_bytes, rows[i], 0));
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
      DT_RETURN_IF_ERROR(CheckFinite(path_, t, out, bytes / type.block_bytes, rows[i], c.start / type.block));
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
        ", a type dtensor does not read (supported: ", DequantizableGgmlTypes(), ")"));
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
      DT_RETURN_IF_ERROR(CheckFinite(path_, *t, blocks.data(), b1 - b0, r, b0));
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
