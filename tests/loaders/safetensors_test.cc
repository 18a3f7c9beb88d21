// loaders/safetensors: round trips, every validation error, hostile files (mutated and truncated:
// always a clean error, never a crash), rank-sliced reads against an independent gather over
// random meshes and placements (bytes read == bytes of the piece), multi-file checkpoints.
#include "dtensor/loaders/safetensors.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dtensor/core/status.h"
#include "dtensor/dtensor/spec.h"
#include "dtensor/loaders/checkpoint.h"
#include "dtensor/loaders/safetensors_writer.h"
#include "gtest/gtest.h"
#include "rapidcheck/gtest.h"
#include "dtensor/tests/loaders/unreadable_file.h"
#include "dtensor/tests/test_util.h"

namespace dt::loaders {
namespace {

namespace fs = std::filesystem;

std::string TempPath(absl::string_view name) {
  static const dt::testing::ScratchDir dir("safetensors");
  return (fs::path(dir.path) / std::string(name)).string();
}

using dt::testing::ReadFileBytes;
using dt::testing::WriteFileBytes;

// A file with a hand-written header and `data_size` data bytes.
std::string RawFile(const std::string& name, const std::string& header, int64_t data_size,
                    std::optional<uint64_t> length = std::nullopt) {
  std::string bytes(8, '\0');
  const uint64_t n = length.value_or(header.size());
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(n >> (8 * i));
  bytes += header;
  bytes += std::string(static_cast<size_t>(data_size), '\x01');
  const std::string path = TempPath(name);
  WriteFileBytes(path, bytes);
  return path;
}

Tensor Iota(IntSpan shape, DType dtype) {
  Tensor t = Tensor::Arange(0, static_cast<double>(Numel(shape))).value().View(shape).value();
  return t.To(dtype).value();
}

absl::Status OpenStatus(const std::string& path) { return SafetensorsFile::Open(path).status(); }

using dt::testing::Contains;

TEST(Safetensors, RoundTripEveryDType) {
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (DType d : kAllDTypes) {
    tensors.emplace_back(absl::StrCat("t.", DTypeName(d)), Iota({3, 5}, d));
  }
  tensors.emplace_back("scalar", Iota({}, DType::kF32));
  tensors.emplace_back("empty", Iota({0, 4}, DType::kF32));
  const std::string path = TempPath("roundtrip.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, tensors, {{"format", "pt"}}).ok());
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->metadata().at("format"), "pt");
  EXPECT_EQ((*f)->data_offset() % 8, 0);
  for (const auto& [name, t] : tensors) {
    ReadStats stats;
    auto got = (*f)->Read(name, {}, &stats);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(Equal(*got, t)) << name;
    EXPECT_EQ(stats.bytes_read(), t.nbytes());
  }
}

TEST(Safetensors, WholeTensorAndRowShardsAreZeroCopyViews) {
  const std::string path = TempPath("views.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"w", Iota({8, 6}, DType::kF32)}}).ok());
  auto f = SafetensorsFile::Open(path).value();
  ReadStats stats;
  Tensor whole = f->Read("w", {}, &stats).value();
  EXPECT_EQ(whole.storage().kind(), Storage::Kind::kMmap);
  EXPECT_TRUE(whole.read_only());
  Tensor rows = f->ReadRanges("w", {{{2, 5}}, {{0, 6}}}, {}, &stats).value();
  EXPECT_TRUE(rows.read_only());
  EXPECT_EQ(stats.bytes_viewed, 8 * 6 * 4 + 3 * 6 * 4);
  EXPECT_EQ(stats.bytes_copied, 0);
  EXPECT_EQ(rows.ToVector<float>()[0], 12.0f);
  // Columns are strided: copied, and only the piece.
  Tensor cols = f->ReadRanges("w", {{{0, 8}}, {{1, 3}}}, {}, &stats).value();
  EXPECT_FALSE(cols.read_only());
  EXPECT_EQ(stats.bytes_copied, 8 * 2 * 4);
  EXPECT_EQ(cols.ToVector<float>()[2], 7.0f);
  // zero_copy off copies; a dtype conversion produces a fresh tensor.
  ReadStats s2;
  ReadOptions o;
  o.zero_copy = false;
  o.dtype = DType::kBF16;
  Tensor conv = f->ReadRanges("w", {{{0, 1}}, {{0, 6}}}, o, &s2).value();
  EXPECT_EQ(conv.dtype(), DType::kBF16);
  EXPECT_EQ(s2.bytes_copied, 24);
  EXPECT_EQ(s2.bytes_converted, 12);
}

// The format allows any header length, so a tensor's bytes may start at any address: every read
// (views, copies of strided pieces, conversions to every dtype) must not assume alignment (Note
// [Unaligned host elements] in core/tensor.cc; the sanitizer build makes a misaligned typed load
// an error).
TEST(Safetensors, OddDataOffsetReadsAndConvertsEveryDType) {
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (DType d : kAllDTypes) tensors.emplace_back(absl::StrCat("t.", DTypeName(d)), Iota({5, 7}, d));
  const std::string aligned_path = TempPath("aligned.safetensors");
  ASSERT_TRUE(WriteSafetensors(aligned_path, tensors).ok());
  // Rewrite the header with trailing spaces so that the data starts at 8 + n with n odd.
  const std::string bytes = ReadFileBytes(aligned_path);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[i])) << (8 * i);
  std::string header = bytes.substr(8, n);
  while (!header.empty() && header.back() == ' ') header.pop_back();
  if (header.size() % 2 == 0) header += ' ';
  const std::string odd_path = RawFile("odd.safetensors", header, 0);
  WriteFileBytes(odd_path, ReadFileBytes(odd_path) + bytes.substr(8 + n));
  auto aligned = SafetensorsFile::Open(aligned_path).value();
  auto odd = SafetensorsFile::Open(odd_path);
  ASSERT_TRUE(odd.ok()) << odd.status();
  ASSERT_EQ((*odd)->data_offset() % 2, 1);
  const std::vector<DimRanges> pieces = {
      FullRanges(Shape{5, 7}),
      {{{1, 4}}, {{0, 7}}},            // whole rows: one run
      {{{0, 5}}, {{3, 4}}},            // one column: a strided copy
      {{{0, 2}, {3, 5}}, {{1, 3}, {4, 6}}}};  // runs in both dims
  for (const auto& [name, t] : tensors) {
    for (const DimRanges& ranges : pieces) {
      for (bool zero_copy : {true, false}) {
        for (DType to : kAllDTypes) {
          ReadOptions o;
          o.zero_copy = zero_copy;
          o.dtype = to;
          auto got = (*odd)->ReadRanges(name, ranges, o);
          ASSERT_TRUE(got.ok()) << name << ": " << got.status();
          const Tensor want = aligned->ReadRanges(name, ranges, o).value();
          EXPECT_TRUE(Equal(*got, want)) << name << " as " << DTypeName(to);
        }
      }
    }
    ReadOptions keep;
    EXPECT_TRUE(Equal((*odd)->Read(name, keep).value(), t)) << name;
  }
}

// A BOOL byte other than 0 or 1 (found by safetensors_fuzz) is refused, whichever way the piece is
// read: loading it as a bool would be undefined behaviour, and any kernel after it garbage.
TEST(Safetensors, BoolBytesOtherThanZeroOrOneAreRefused) {
  const std::string header = R"({"b":{"dtype":"BOOL","shape":[2,2],"data_offsets":[0,4]}})";
  const std::string path = RawFile("bool.safetensors", header, 0);
  WriteFileBytes(path, ReadFileBytes(path) + std::string("\x00\x01\x01\x73", 4));
  auto f = SafetensorsFile::Open(path).value();
  for (bool zero_copy : {true, false}) {
    ReadOptions o;
    o.zero_copy = zero_copy;
    const absl::Status s = f->Read("b", o).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(Contains(s, "tensor 'b' BOOL[2, 2]: byte 115 at element 3 of the piece read is neither 0 nor 1")) << s;
  }
  // A strided piece (column 1) holding it: refused too (the copy moves bytes, the check sees them).
  EXPECT_TRUE(Contains(f->ReadRanges("b", {{{0, 2}}, {{1, 2}}}).status(), "byte 115 at element 1"));
  // The first row is valid and reads.
  Tensor row = f->ReadRanges("b", {{{0, 1}}, {{0, 2}}}).value();
  EXPECT_EQ(row.ToVector<float>(), (std::vector<float>{0, 1}));
}

// Note [Non-finite weights]: a NaN or an infinity in an f32, f16 or bf16 tensor is refused by
// every read whose piece holds it (views and copies alike), naming its place in the whole tensor;
// a piece without it reads.
TEST(Safetensors, NonFiniteElementsAreRefusedWherePiecesHoldThem) {
  const float nan = std::nanf(""), inf = std::numeric_limits<float>::infinity();
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (const auto& [bad, text] : {std::pair<float, const char*>{nan, "nan"}, {inf, "inf"}, {-inf, "-inf"}}) {
      SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " ", text));
      std::vector<float> v(4 * 6, 0.5f);
      v[2 * 6 + 3] = bad;  // element [2, 3]
      Tensor t = Tensor::FromVector({4, 6}, v).value().To(dtype).value();
      const std::string path = TempPath("nonfinite.safetensors");
      ASSERT_TRUE(WriteSafetensors(path, {{"w", t}}).ok());
      auto f = SafetensorsFile::Open(path).value();
      const std::string want = absl::StrCat("tensor 'w' ", SafetensorsDTypeName(dtype),
                                            "[4, 6]: element [2, 3] is ", text, "; weights must be finite");
      for (bool zero_copy : {true, false}) {
        ReadOptions o;
        o.zero_copy = zero_copy;
        EXPECT_TRUE(Contains(f->Read("w", o).status(), want));
        EXPECT_TRUE(Contains(f->ReadRanges("w", {{{2, 4}}, {{0, 6}}}, o).status(), want));  // rows
      }
      EXPECT_TRUE(Contains(f->ReadRanges("w", {{{0, 4}}, {{1, 2}, {3, 5}}}).status(), want));  // columns
      EXPECT_TRUE(f->ReadRanges("w", {{{0, 2}}, {{0, 6}}}).ok());
      EXPECT_TRUE(f->ReadRanges("w", {{{0, 4}}, {{0, 3}, {4, 6}}}).ok());
    }
  }
}

TEST(Safetensors, UnreadableFileIsPermissionDeniedNotNotFound) {
  const std::string path = TempPath("locked.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"w", Iota({2}, DType::kF32)}}).ok());
  dt::testing::ExpectPermissionDenied(path, [](const std::string& p) { return SafetensorsFile::Open(p).status(); });
}

// ---- validation: one case per error class --------------------------------------------------------

TEST(Safetensors, RejectsTruncatedAndAbsurdHeaders) {
  WriteFileBytes(TempPath("short.safetensors"), "abc");
  EXPECT_TRUE(Contains(OpenStatus(TempPath("short.safetensors")),
                       "is 3 bytes, too short for a safetensors file (it starts with an 8-byte "
                       "header length)"));
  WriteFileBytes(TempPath("empty.safetensors"), "");
  EXPECT_TRUE(Contains(OpenStatus(TempPath("empty.safetensors")),
                       "is empty (0 bytes); expected a safetensors file"));
  EXPECT_TRUE(Contains(Checkpoint::Open(TempPath("empty.safetensors")).status(),
                       "is empty (0 bytes); expected a safetensors file"));
  EXPECT_TRUE(Contains(OpenStatus(RawFile("past.safetensors", "{}", 0, 9999)),
                       "header length 9999 runs past the end of the file"));
  EXPECT_TRUE(
      Contains(OpenStatus(RawFile("huge.safetensors", "{}", 0, 1ull << 40)), "absurdly large"));
  EXPECT_TRUE(Contains(OpenStatus(RawFile("huge2.safetensors", "{}", 0, ~0ull)), "absurdly large"));
  EXPECT_EQ(OpenStatus(TempPath("missing.safetensors")).code(), absl::StatusCode::kNotFound);
  // The message names the file.
  EXPECT_TRUE(Contains(OpenStatus(TempPath("short.safetensors")), "short.safetensors"));
}

TEST(Safetensors, RejectsMalformedHeaders) {
  struct Case {
    const char* header;
    int64_t data;
    const char* error;
  } cases[] = {
      {"{not json", 0, "not valid JSON"},
      {"[1, 2]", 0, "must be a JSON object"},
      {R"({"a": 5})", 0, "tensor 'a': entry must be an object"},
      {R"({"a": {"shape": [1], "data_offsets": [0, 4]}})", 4, "missing \"dtype\""},
      {R"({"a": {"dtype": "F33", "shape": [1], "data_offsets": [0, 4]}})", 4,
       "tensor 'a': unknown dtype 'F33'"},
      {R"({"a": {"dtype": "F32", "shape": [2, -1], "data_offsets": [0, 4]}})", 4,
       "tensor 'a': shape [2, -1]: dims must be integers >= 0"},
      {R"({"a": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})", 4,
       "dims must be integers >= 0"},
      {R"({"a": {"dtype": "F32", "shape": "x", "data_offsets": [0, 4]}})", 4, "missing \"shape\""},
      {R"({"a": {"dtype": "F32", "shape": [4294967296, 4294967296, 16], "data_offsets": [0, 4]}})",
       4, "shape [4294967296, 4294967296, 16] has more than 2^64 elements"},
      {R"({"a": {"dtype": "F64", "shape": [1152921504606846976], "data_offsets": [0, 4]}})", 4,
       "F64[1152921504606846976]: 1152921504606846976 elements take more than 2^63 bytes"},
      {R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 10]}})", 10,
       "data_offsets [0, 10] hold 10 bytes, but F32[3] needs 12"},
      {R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}})", 4,
       "0 <= begin <= end"},
      {R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})", 4, "missing \"data_offsets\""},
      {R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}})", 4, "0 <= begin <= end"},
      {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 4,
       "run past the end of the data section (4 bytes)"},
      {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
           "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
       12, "tensor 'b': data_offsets [4, 12] overlap tensor 'a' [0, 8]"},
      {R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", 8, "leave a gap"},
      {R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 8,
       "cover 4 bytes of a data section of 8"},
      {R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
           "a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
       8, "duplicate tensor 'a'"},
      {R"({"__metadata__": {"k": 1}})", 0, "__metadata__ 'k' must be a string"},
      {R"({"": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 4, "empty name"},
      {R"({"a": {"dtype": "F4", "shape": [3], "data_offsets": [0, 2]}})", 2,
       "not a whole number of bytes"},
  };
  int i = 0;
  for (const Case& c : cases) {
    const std::string path = RawFile(absl::StrCat("bad", i++, ".safetensors"), c.header, c.data);
    EXPECT_TRUE(Contains(OpenStatus(path), c.error)) << c.header;
    EXPECT_TRUE(Contains(OpenStatus(path), path)) << c.header;
  }
}

TEST(Safetensors, UnsupportedDTypesAreListedButNotRead) {
  const std::string path = RawFile(
      "f64.safetensors",
      R"({"d": {"dtype": "F64", "shape": [2], "data_offsets": [0, 16]},
          "f": {"dtype": "F8_E4M3", "shape": [4], "data_offsets": [16, 20]}})",
      20);
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  auto r = (*f)->Read("d");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_TRUE(Contains(r.status(), "tensor 'd' has dtype F64"));
  EXPECT_TRUE(Contains((*f)->Read("f").status(), "F8_E4M3"));
  EXPECT_EQ(DTypeFromSafetensors("I8").status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(DTypeFromSafetensors("Q4").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DTypeFromSafetensors("BF16").value(), DType::kBF16);
}

TEST(Safetensors, RejectsBadRanges) {
  const std::string path = TempPath("ranges.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"w", Iota({4, 4}, DType::kF32)}}).ok());
  auto f = SafetensorsFile::Open(path).value();
  EXPECT_TRUE(Contains(f->ReadRanges("w", {{{0, 4}}}).status(), "has 2 dims"));
  EXPECT_TRUE(Contains(f->ReadRanges("w", {{{0, 5}}, {{0, 4}}}).status(), "inside [0, 4)"));
  EXPECT_TRUE(Contains(f->ReadRanges("w", {{{2, 3}, {0, 1}}, {{0, 4}}}).status(), "ascending"));
  EXPECT_EQ(f->Read("nope").status().code(), absl::StatusCode::kNotFound);
}

// ---- hostile files: mutations never crash --------------------------------------------------------

// A valid file with a few random tensors.
std::string ValidFile(const std::string& name, int ntensors, uint64_t seed) {
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (int i = 0; i < ntensors; ++i) {
    const DType d = kAllDTypes[(seed + i) % std::size(kAllDTypes)];
    const int64_t rows = static_cast<int64_t>((seed >> (4 * i)) % 4), cols = 1 + i % 3;
    tensors.emplace_back(absl::StrCat("layer.", i, ".w"), Iota({rows, cols}, d));
  }
  const std::string path = TempPath(name);
  DT_CHECK_OK(WriteSafetensors(path, tensors, {{"format", "pt"}}));
  return path;
}

// Opens `path`; when that succeeds, every tensor must read back with its declared size.
void OpenAndReadAll(const std::string& path) {
  auto f = SafetensorsFile::Open(path);
  if (!f.ok()) {
    RC_ASSERT(!f.status().message().empty());
    RC_ASSERT(std::string(f.status().message()).find(path) != std::string::npos ||
              f.status().code() == absl::StatusCode::kNotFound);
    return;
  }
  for (const TensorInfo& t : (*f)->tensors()) {
    auto r = (*f)->Read(t.name);
    if (t.dtype) {
      // Mutated data may hold a NaN or a bool byte of 2: refused by name, as the tests above show.
      if (!r.ok()) {
        RC_ASSERT(r.status().code() == absl::StatusCode::kInvalidArgument);
        RC_ASSERT(std::string(r.status().message()).find(t.name) != std::string::npos);
        continue;
      }
      RC_ASSERT(r->nbytes() == t.nbytes());
    } else {
      RC_ASSERT(r.status().code() == absl::StatusCode::kUnimplemented);
    }
  }
}

RC_GTEST_PROP(SafetensorsFuzz, TruncatedFilesGiveCleanErrors, ()) {
  const std::string path = ValidFile("fuzz_base.safetensors", *rc::gen::inRange(1, 5),
                                     *rc::gen::arbitrary<uint32_t>());
  const std::string bytes = ReadFileBytes(path);
  const size_t keep = *rc::gen::inRange<size_t>(0, bytes.size());
  const std::string cut = TempPath("fuzz_cut.safetensors");
  WriteFileBytes(cut, bytes.substr(0, keep));
  auto f = SafetensorsFile::Open(cut);
  RC_ASSERT(!f.ok());  // every byte of a valid file matters: the data section is covered exactly
  RC_ASSERT(std::string(f.status().message()).find(cut) != std::string::npos);
}

RC_GTEST_PROP(SafetensorsFuzz, MutatedFilesNeverCrash, ()) {
  const std::string path = ValidFile("fuzz_base2.safetensors", *rc::gen::inRange(1, 5),
                                     *rc::gen::arbitrary<uint32_t>());
  std::string bytes = ReadFileBytes(path);
  const int mutations = *rc::gen::inRange(1, 6);
  for (int m = 0; m < mutations; ++m) {
    const int kind = *rc::gen::inRange(0, 6);
    if (bytes.empty()) break;
    const size_t at = *rc::gen::inRange<size_t>(0, bytes.size());
    switch (kind) {
      case 0:  // random byte
        bytes[at] = static_cast<char>(*rc::gen::arbitrary<uint8_t>());
        break;
      case 1:  // a digit in the header changes (sizes, offsets, shapes)
        for (size_t i = at; i < bytes.size(); ++i) {
          if (bytes[i] >= '0' && bytes[i] <= '9') {
            bytes[i] = static_cast<char>('0' + *rc::gen::inRange(0, 10));
            break;
          }
        }
        break;
      case 2:  // delete a span
        bytes.erase(at, *rc::gen::inRange<size_t>(1, 16));
        break;
      case 3:  // the header length
        for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(*rc::gen::arbitrary<uint8_t>());
        break;
      case 4:  // insert JSON punctuation / a minus sign
        bytes.insert(at, 1, "{}[],:\"-e0"[*rc::gen::inRange(0, 10)]);
        break;
      case 5:  // append garbage
        bytes += std::string(*rc::gen::inRange<size_t>(1, 32), '\x7f');
        break;
    }
  }
  const std::string mutated = TempPath("fuzz_mut.safetensors");
  WriteFileBytes(mutated, bytes);
  OpenAndReadAll(mutated);
}

// ---- rank-sliced reads ---------------------------------------------------------------------------

// Independent gather: the bytes of `full` (row-major, element size elt) at the cartesian product
// of `ranges`, by explicit index arithmetic.
std::string Gather(const std::string& full, IntSpan shape, int64_t elt, const DimRanges& ranges) {
  std::vector<std::vector<int64_t>> idx(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    for (const IndexRange& r : ranges[d]) {
      for (int64_t i = r.start; i < r.stop; ++i) idx[d].push_back(i);
    }
  }
  std::string out;
  std::vector<size_t> pos(shape.size(), 0);
  for (const auto& v : idx) {
    if (v.empty()) return out;
  }
  while (true) {
    int64_t flat = 0;
    for (size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + idx[d][pos[d]];
    out.append(full, static_cast<size_t>(flat * elt), static_cast<size_t>(elt));
    int d = static_cast<int>(shape.size()) - 1;
    while (d >= 0 && ++pos[d] == idx[d].size()) pos[d--] = 0;
    if (d < 0) break;
  }
  return out;
}

rc::Gen<Placement> GenPlacement(int ndim) {
  return rc::gen::exec([ndim] {
    const int kind = *rc::gen::inRange(0, 4);
    const int dim = *rc::gen::inRange(0, ndim);
    if (kind == 0) return Placement::Replicate();
    if (kind == 1) return Placement::Shard(dim);
    if (kind == 2) return Placement::StridedShard(dim, *rc::gen::inRange(2, 4));
    return Placement::Partial();
  });
}

RC_GTEST_PROP(SafetensorsSlices, EqualSlicingTheFullTensorAndReadOnlyThePiece, ()) {
  const int ndim = *rc::gen::inRange(1, 4);
  Shape shape;
  for (int d = 0; d < ndim; ++d) shape.push_back(*rc::gen::inRange<int64_t>(0, 10));
  const DType dtype = *rc::gen::element(DType::kF32, DType::kBF16, DType::kI64, DType::kU8);
  const int mdims = *rc::gen::inRange(1, 4);
  std::vector<int64_t> mesh_shape;
  for (int d = 0; d < mdims; ++d) mesh_shape.push_back(*rc::gen::inRange<int64_t>(1, 4));
  Placements placements;
  for (int d = 0; d < mdims; ++d) placements.push_back(*GenPlacement(ndim));
  auto mesh = DeviceMesh::Abstract(mesh_shape);
  RC_ASSERT(mesh.ok());
  auto spec = DTensorSpec::Create(*mesh, placements, shape, dtype);
  RC_PRE(spec.ok());  // e.g. a strided shard of a dim of zero blocks

  const std::string path = TempPath("slices.safetensors");
  Tensor full = Tensor::Randn(shape, 7, DType::kF32).value().To(dtype).value();
  RC_ASSERT(WriteSafetensors(path, {{"pad", Iota({3}, DType::kU8)}, {"w", full}}).ok());
  auto f = SafetensorsFile::Open(path).value();
  const std::string bytes = ReadFileBytes(path).substr(static_cast<size_t>(f->data_offset() + 3));
  const int64_t elt = DTypeSize(dtype);
  for (int64_t rank = 0; rank < mesh->Size(); ++rank) {
    const std::vector<int64_t> coord = mesh->CoordinateOf(static_cast<int>(rank)).value();
    const DimRanges ranges = spec->Ranges(coord);
    ReadStats stats;
    ReadOptions o;
    o.zero_copy = *rc::gen::arbitrary<bool>();
    auto piece = f->ReadRanges("w", ranges, o, &stats);
    RC_ASSERT(piece.ok());
    RC_ASSERT(piece->shape() == spec->LocalShape(coord));
    const std::string got(static_cast<const char*>(piece->raw_data()),
                          static_cast<size_t>(piece->nbytes()));
    RC_ASSERT(got == Gather(bytes, shape, elt, ranges));
    // Never more than the piece: no rank reads a full sharded tensor.
    RC_ASSERT(stats.bytes_read() == piece->nbytes());
    RC_ASSERT(stats.bytes_read() == Numel(spec->LocalShape(coord)) * elt);
  }
}

// ---- checkpoints ---------------------------------------------------------------------------------

TEST(Checkpoint, ShardedDirectoryWithIndex) {
  const std::string dir = TempPath("ckpt_sharded");
  fs::remove_all(dir);
  std::vector<std::pair<std::string, Tensor>> tensors = {
      {"a", Iota({16, 4}, DType::kF32)}, {"b", Iota({8}, DType::kBF16)},
      {"c", Iota({4, 4}, DType::kF32)}};
  ASSERT_TRUE(WriteCheckpoint(dir, tensors, /*max_file_bytes=*/100).ok());
  EXPECT_TRUE(fs::exists(fs::path(dir) / "model.safetensors.index.json"));
  auto c = Checkpoint::Open(dir);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->files().size(), 2u);  // a (256 bytes) | b + c
  EXPECT_EQ(c->names(), (std::vector<std::string>{"a", "b", "c"}));
  for (const auto& [name, t] : tensors) EXPECT_TRUE(Equal(c->Read(name).value(), t)) << name;
  auto mesh = DeviceMesh::Abstract({4}, {"tp"}, 2).value();
  auto spec = DTensorSpec::Create(mesh, {Placement::Shard(1)}, {16, 4}, DType::kBF16).value();
  ReadStats stats;
  Tensor piece = c->ReadLocal("a", spec, {}, &stats).value();
  EXPECT_EQ(piece.dtype(), DType::kBF16);
  EXPECT_EQ(piece.shape(), (Shape{16, 1}));
  EXPECT_EQ(piece.ToVector<float>()[1], 6.0f);
  EXPECT_EQ(stats.bytes_copied, 16 * 4);
  auto wrong = DTensorSpec::Create(mesh, {Placement::Replicate()}, {16, 8}, DType::kF32).value();
  EXPECT_TRUE(
      Contains(c->ReadLocal("a", wrong).status(), "tensor 'a': expected [16, 8], got [16, 4]"));
  EXPECT_EQ(c->Read("zzz").status().code(), absl::StatusCode::kNotFound);
}

// Note [Composite tensors]: a stacked [E, 2I, H] made of 2E per-expert [I, H] parts reads, for
// any spec on any mesh, exactly the slice of the assembled tensor, and only the parts' bytes that
// the piece holds.
RC_GTEST_PROP(CheckpointComposite, ReadsEqualSlicingTheAssembledTensor, ()) {
  const int64_t e = *rc::gen::inRange<int64_t>(1, 5), i = *rc::gen::inRange<int64_t>(1, 5),
                h = *rc::gen::inRange<int64_t>(1, 5);
  const Shape shape = {e, 2 * i, h};
  const int mdims = *rc::gen::inRange(1, 3);
  std::vector<int64_t> mesh_shape;
  Placements placements;
  for (int d = 0; d < mdims; ++d) {
    mesh_shape.push_back(*rc::gen::inRange<int64_t>(1, 4));
    placements.push_back(*GenPlacement(3));
  }
  auto mesh = DeviceMesh::Abstract(mesh_shape);
  RC_ASSERT(mesh.ok());
  auto spec = DTensorSpec::Create(*mesh, placements, shape, DType::kF32);
  RC_PRE(spec.ok());
  const std::string dir = TempPath("composite");
  fs::remove_all(dir);
  const Tensor full = Tensor::Randn(shape, 11).value();
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::vector<Checkpoint::Part> parts;
  for (int64_t x = 0; x < e; ++x) {
    for (int64_t half = 0; half < 2; ++half) {
      const std::string name = absl::StrCat("experts.", x, half == 0 ? ".w1" : ".w3");
      tensors.emplace_back(name, full.Select(0, x).value().Narrow(0, half * i, i).value());
      parts.push_back({name, {x, half * i, 0}, /*stacked=*/true});
    }
  }
  RC_ASSERT(WriteCheckpoint(dir, tensors).ok());
  auto c = Checkpoint::Open(dir);
  RC_ASSERT(c.ok());
  RC_ASSERT(c->AddComposite("gate_up", shape, parts).ok());
  RC_ASSERT(c->names() == std::vector<std::string>{"gate_up"});
  for (int64_t rank = 0; rank < mesh->Size(); ++rank) {
    const std::vector<int64_t> coord = mesh->CoordinateOf(static_cast<int>(rank)).value();
    const DimRanges ranges = spec->Ranges(coord);
    ReadStats stats;
    auto piece = c->ReadRanges("gate_up", ranges, {}, &stats);
    RC_ASSERT(piece.ok());
    RC_ASSERT(Equal(*piece, SliceRanges(full, ranges).value()));
    RC_ASSERT(stats.bytes_read() == piece->nbytes());
  }
}

TEST(CheckpointComposite, PartsThatDoNotTileAreRefusedByName) {
  const std::string dir = TempPath("composite_bad");
  fs::remove_all(dir);
  ASSERT_TRUE(WriteCheckpoint(dir, {{"a", Iota({2, 3}, DType::kF32)},
                                    {"b", Iota({2, 3}, DType::kF32)},
                                    {"h", Iota({2, 3}, DType::kBF16)}})
                  .ok());
  auto c = Checkpoint::Open(dir).value();
  using P = Checkpoint::Part;
  EXPECT_TRUE(Contains(c.AddComposite("x", {4, 3}, {P{"a", {0, 0}}, P{"b", {1, 0}}}),
                       "parts 'a' and 'b' overlap"));
  EXPECT_TRUE(Contains(c.AddComposite("x", {5, 3}, {P{"a", {0, 0}}, P{"b", {2, 0}}}),
                       "its parts cover 12 of 15 elements"));
  EXPECT_TRUE(Contains(c.AddComposite("x", {4, 3}, {P{"a", {0, 0}}, P{"b", {3, 0}}}),
                       "part 'b' F32[2, 3] at [3, 0] runs past dim 0"));
  EXPECT_TRUE(Contains(c.AddComposite("x", {4, 3}, {P{"a", {0, 0}}, P{"h", {2, 0}}}),
                       "part 'h' is BF16, not F32 like the first"));
  EXPECT_TRUE(Contains(c.AddComposite("x", {4, 3}, {P{"a", {0, 0}}, P{"zz", {2, 0}}}),
                       "part 'zz' is not in it"));
  // Stacked: the parts leave the listing.
  ASSERT_TRUE(c.AddComposite("x", {2, 2, 3}, {P{"a", {0, 0, 0}, true}, P{"b", {1, 0, 0}, true}})
                  .ok());
  EXPECT_EQ(c.names(), (std::vector<std::string>{"h", "x"}));
  EXPECT_TRUE(Equal(c.Read("x").value().Select(0, 1).value(), Iota({2, 3}, DType::kF32)));
  // Renamed: listed and read under the new name only.
  ASSERT_TRUE(c.Rename("h", "model.h").ok());
  EXPECT_TRUE(Equal(c.Read("model.h").value(), Iota({2, 3}, DType::kBF16)));
  EXPECT_EQ(c.Read("h").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(c.names(), (std::vector<std::string>{"model.h", "x"}));
}

TEST(Checkpoint, RejectsBadIndexes) {
  const std::string dir = TempPath("ckpt_bad");
  fs::remove_all(dir);
  fs::create_directories(dir);
  EXPECT_TRUE(Contains(Checkpoint::Open(dir).status(),
                       "has none of model.safetensors[.index.json], "
                       "diffusion_pytorch_model.safetensors[.index.json]"));
  ASSERT_TRUE(WriteSafetensors(dir + "/part.safetensors", {{"a", Iota({2}, DType::kF32)}}).ok());
  auto index = [&](const std::string& text) {
    WriteFileBytes(dir + "/model.safetensors.index.json", text);
    return Checkpoint::Open(dir).status();
  };
  EXPECT_TRUE(Contains(index("nope"), "not a JSON object"));
  EXPECT_TRUE(Contains(index(R"({"metadata": {}})"), "no \"weight_map\""));
  EXPECT_TRUE(
      Contains(index(R"({"weight_map": {"a": "../x.safetensors"}})"), "not a plain file name"));
  EXPECT_TRUE(Contains(index(R"({"weight_map": {"a": "/etc/passwd"}})"), "not a plain"));
  EXPECT_TRUE(Contains(index(R"({"weight_map": {"a": 3}})"), "must be a file name"));
  EXPECT_TRUE(
      Contains(index(R"({"weight_map": {"z": "part.safetensors"}})"), "does not contain it"));
  EXPECT_EQ(index(R"({"weight_map": {"a": "gone.safetensors"}})").code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(WriteSafetensors(dir + "/more.safetensors",
                               {{"a", Iota({2}, DType::kF32)}, {"b", Iota({2}, DType::kF32)}})
                  .ok());
  EXPECT_TRUE(Contains(index(R"({"weight_map": {"a": "part.safetensors",
                                                      "b": "more.safetensors"}})"),
                       "stored in both"));
  EXPECT_TRUE(index(R"({"weight_map": {"a": "part.safetensors"}})").ok());
}

}  // namespace
}  // namespace dt::loaders
