// loaders/gguf: dequantization of every supported ggml type bit-exact against gguf-py
// (tests/fixtures/gguf/quants_expected.safetensors), metadata of every value type against
// gguf.GGUFReader, sharded reads (random row and column ranges: the values of the whole read, and
// only the covering blocks counted), every truncation of a real file and hand-written hostile
// headers (always a clean error naming the file), Llama config and names from GGUF.
#include "dtensor/loaders/gguf.h"

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dtensor/core/process_stats.h"
#include "dtensor/core/quant.h"
#include "dtensor/loaders/checkpoint.h"
#include "dtensor/loaders/gguf_llama.h"
#include "dtensor/loaders/hf_config.h"
#include "dtensor/loaders/safetensors.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "rapidcheck/gtest.h"
#include "dtensor/tests/loaders/unreadable_file.h"
#include "dtensor/tests/test_util.h"

namespace dt::loaders {
namespace {

namespace fs = std::filesystem;
using dt::testing::Contains;

const std::string kDir = std::string(DT_FIXTURES_DIR) + "/gguf";

std::string TempPath(absl::string_view name) {
  static const dt::testing::ScratchDir dir("gguf");
  return (fs::path(dir.path) / std::string(name)).string();
}

using dt::testing::ReadFileBytes;
// `bytes` as the scratch file `name`; its path.
std::string WriteBytes(absl::string_view name, const std::string& bytes) {
  const std::string path = TempPath(name);
  dt::testing::WriteFileBytes(path, bytes);
  return path;
}

std::shared_ptr<const GgufFile> Quants() {
  static const auto f = GgufFile::Open(kDir + "/quants.gguf").value();
  return f;
}

// ---- dequantization ------------------------------------------------------------------------------

TEST(Gguf, DequantizesEveryTypeBitExactlyAsGgufPy) {
  auto expected = SafetensorsFile::Open(kDir + "/quants_expected.safetensors").value();
  std::set<std::string> seen;
  for (const TensorInfo& e : expected->tensors()) {
    SCOPED_TRACE(e.name);
    const GgufTensorInfo* t = Quants()->FindTensor(e.name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->shape, e.shape);
    seen.insert(t->type->name);
    Tensor want = expected->Read(e.name).value();
    ReadStats stats;
    Tensor got = Quants()->ReadRanges(e.name, FullRanges(t->shape), {}, &stats).value();
    ASSERT_EQ(got.shape(), want.shape());
    ASSERT_EQ(got.dtype(), DType::kF32);
    EXPECT_EQ(std::memcmp(got.raw_data(), want.raw_data(), want.nbytes()), 0);
    EXPECT_EQ(stats.bytes_copied, t->nbytes);
  }
  EXPECT_EQ(seen, (std::set<std::string>{"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0",
                                         "Q5_1", "Q4_K", "Q5_K", "Q6_K", "Q2_K", "Q3_K", "IQ4_NL",
                                         "IQ4_XS"}));
}

TEST(Gguf, ReadsIntoBf16) {
  Tensor f32 = Quants()->ReadRanges("t.Q4_K", FullRanges(Shape{4, 512})).value();
  ReadOptions o;
  o.dtype = DType::kBF16;
  Tensor bf = Quants()->ReadRanges("t.Q4_K", FullRanges(Shape{4, 512}), o).value();
  EXPECT_EQ(bf.dtype(), DType::kBF16);
  const float* a = f32.data<float>();
  const BFloat16* b = bf.data<BFloat16>();
  for (int64_t i = 0; i < f32.numel(); ++i) ASSERT_EQ(float(b[i]), float(BFloat16(a[i])));
}

// Random row and column ranges of every type read what the whole read holds there, and count
// exactly the quant blocks that cover the wanted columns.
RC_GTEST_PROP(Gguf, ShardedReadsReadTheirBlocks, ()) {
  static const std::vector<std::string> kTypes = {"F32",  "F16",  "BF16", "Q8_0", "Q4_0",
                                                 "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K",
                                                 "Q6_K", "Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS"};
  const std::string name = absl::StrCat("t.", *rc::gen::elementOf(kTypes));
  const GgufTensorInfo* t = Quants()->FindTensor(name);
  const Tensor whole = Quants()->ReadRanges(name, FullRanges(t->shape)).value();
  auto ranges_of = [](int64_t n) {
    const int64_t a = *rc::gen::inRange<int64_t>(0, n);
    const int64_t b = *rc::gen::inRange<int64_t>(a + 1, n + 1);
    RangeList l = {{a, b}};
    if (b + 1 < n && *rc::gen::arbitrary<bool>()) {
      const int64_t c = *rc::gen::inRange<int64_t>(b + 1, n);
      l.push_back({c, *rc::gen::inRange<int64_t>(c + 1, n + 1)});
    }
    return l;
  };
  const DimRanges ranges = {ranges_of(t->shape[0]), ranges_of(t->shape[1])};
  ReadStats stats;
  const Tensor piece = Quants()->ReadRanges(name, ranges, {}, &stats).value();
  RC_ASSERT(piece.shape() == (Shape{RangesSize(ranges[0]), RangesSize(ranges[1])}));
  const float* w = whole.data<float>();
  const float* p = piece.data<float>();
  int64_t blocks = 0;
  for (const IndexRange& c : ranges[1]) {
    blocks += (c.stop + t->type->block - 1) / t->type->block - c.start / t->type->block;
  }
  int64_t k = 0;
  for (const IndexRange& r : ranges[0]) {
    for (int64_t i = r.start; i < r.stop; ++i) {
      for (const IndexRange& c : ranges[1]) {
        for (int64_t j = c.start; j < c.stop; ++j) RC_ASSERT(p[k++] == w[i * t->shape[1] + j]);
      }
    }
  }
  RC_ASSERT(stats.bytes_copied == RangesSize(ranges[0]) * blocks * t->type->block_bytes);
}

TEST(Gguf, ThreeDimensionalTensorAndRowOrder) {
  auto expected = SafetensorsFile::Open(kDir + "/quants_expected.safetensors").value();
  const Tensor cube = expected->Read("t.cube").value();
  ASSERT_EQ(cube.shape(), (Shape{2, 3, 5}));
  const Tensor piece = Quants()->ReadRanges("t.cube", {{{1, 2}}, {{0, 1}, {2, 3}}, {{1, 4}}}).value();
  ASSERT_EQ(piece.shape(), (Shape{1, 2, 3}));
  const float* c = cube.data<float>();
  const float* p = piece.data<float>();
  for (int j = 0; j < 3; ++j) {
    EXPECT_EQ(p[j], c[15 + 0 * 5 + 1 + j]);
    EXPECT_EQ(p[3 + j], c[15 + 2 * 5 + 1 + j]);
  }
  // Rows in any order, repeated.
  const Tensor rows = Quants()->ReadRows("t.Q8_0", std::vector<int64_t>{3, 0, 3}, {{32, 64}}).value();
  const Tensor whole = Quants()->ReadRanges("t.Q8_0", FullRanges(Shape{4, 512})).value();
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(rows.data<float>()[j], whole.data<float>()[3 * 512 + 32 + j]);
    EXPECT_EQ(rows.data<float>()[32 + j], whole.data<float>()[32 + j]);
  }
  EXPECT_TRUE(Contains(Quants()->ReadRows("t.Q8_0", std::vector<int64_t>{4}, {{0, 1}}).status(),
                       "row 4 is outside [0, 4)"));
  EXPECT_TRUE(Contains(Quants()->ReadRanges("t.Q8_0", {{{0, 5}}, {{0, 1}}}).status(),
                       "must be ascending, disjoint, non-empty and inside [0, 4)"));
}

// ---- metadata ------------------------------------------------------------------------------------

TEST(Gguf, MetadataOfEveryTypeAsGgufPyReadsIt) {
  const nlohmann::json want = nlohmann::json::parse(ReadFileBytes(kDir + "/metadata.json"));
  const GgufFile& f = *Quants();
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32);
  const std::pair<const char*, GgufValue::Type> types[] = {
      {"test.u8", GgufValue::kU8},   {"test.i8", GgufValue::kI8},   {"test.u16", GgufValue::kU16},
      {"test.i16", GgufValue::kI16}, {"test.u32", GgufValue::kU32}, {"test.i32", GgufValue::kI32},
      {"test.u64", GgufValue::kU64}, {"test.i64", GgufValue::kI64}};
  for (const auto& [key, type] : types) {
    SCOPED_TRACE(key);
    const GgufValue* v = f.Find(key);
    ASSERT_NE(v, nullptr);
    EXPECT_EQ(v->type, type);
    if (type == GgufValue::kU64) {
      EXPECT_EQ(std::get<uint64_t>(v->value), want[key].get<uint64_t>());
      EXPECT_FALSE(v->AsInt().has_value());  // 1.8e19 does not fit int64
    } else {
      EXPECT_EQ(*v->AsInt(), want[key].get<int64_t>());
    }
  }
  EXPECT_EQ(*f.GetOptionalDouble("test.f32").value(), want["test.f32"].get<double>());
  EXPECT_EQ(*f.GetOptionalDouble("test.f64").value(), want["test.f64"].get<double>());
  EXPECT_EQ(std::get<bool>(f.Find("test.bool")->value), true);
  EXPECT_EQ(f.GetString("test.string").value(), want["test.string"].get<std::string>());
  EXPECT_EQ(f.GetInts("test.array_i32").value(), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(f.GetStrings("test.array_str").value(), (std::vector<std::string>{"a", "bc", ""}));
  const GgufValue* nested = f.Find("test.array_nested");
  ASSERT_NE(nested, nullptr);
  ASSERT_NE(nested->AsArray(), nullptr);
  EXPECT_EQ(nested->AsArray()->element_type, GgufValue::kArray);
  ASSERT_EQ(nested->AsArray()->size, 2);
  EXPECT_EQ(nested->AsArray()->Element(1).ToString(), "[3]");
  EXPECT_EQ(f.Find("test.array_str")->ToString(), "[\"a\", \"bc\", \"\"]");
  // Typed accessors name the key.
  EXPECT_TRUE(Contains(f.GetInt("nope").status(), "no metadata 'nope'"));
  EXPECT_TRUE(Contains(f.GetInt("test.string").status(), "'test.string' must be an integer, got string"));
  EXPECT_TRUE(Contains(f.GetStrings("test.array_i32").status(), "must be an array of strings"));
}

// ---- hostile files -------------------------------------------------------------------------------

TEST(Gguf, EveryTruncationIsACleanError) {
  const std::string bytes = ReadFileBytes(kDir + "/quants.gguf");
  const int64_t data = Quants()->data_offset();
  for (int64_t n = 0; n < static_cast<int64_t>(bytes.size()); n += n < data + 64 ? 1 : 61) {
    const std::string path = WriteBytes("trunc.gguf", bytes.substr(0, n));
    absl::Status s = GgufFile::Open(path).status();
    ASSERT_FALSE(s.ok()) << n;
    ASSERT_TRUE(Contains(s, "gguf '")) << n;
  }
}

// Random byte flips in the header: Open either succeeds or fails cleanly, and a file it accepts
// reads every tensor without faulting.
RC_GTEST_PROP(Gguf, MutatedHeadersNeverCrash, ()) {
  static const std::string bytes = ReadFileBytes(kDir + "/quants.gguf");
  std::string m = bytes;
  const int flips = *rc::gen::inRange(1, 8);
  for (int i = 0; i < flips; ++i) {
    const size_t at = *rc::gen::inRange<size_t>(0, static_cast<size_t>(Quants()->data_offset()));
    m[at] = static_cast<char>(*rc::gen::arbitrary<uint8_t>());
  }
  const std::string path = WriteBytes(absl::StrCat("mut_", ::getpid(), ".gguf"), m);
  auto f = GgufFile::Open(path);
  if (!f.ok()) {
    RC_ASSERT(Contains(f.status(), "gguf '"));
    return;
  }
  for (const GgufTensorInfo& t : (*f)->tensors()) {
    if (t.type->dequantizable() && Numel(t.shape) <= (1 << 22)) {
      (void)(*f)->ReadRanges(t.name, FullRanges(t.shape));
    }
  }
}

// A hand-written GGUF: the header fields in order, then padding and data.
struct Writer {
  std::string b = "GGUF";
  template <typename T>
  Writer& Put(T v) {
    b.append(reinterpret_cast<const char*>(&v), sizeof(T));
    return *this;
  }
  Writer& Str(const std::string& s) {
    Put<uint64_t>(s.size());
    b += s;
    return *this;
  }
  Writer& Header(uint64_t tensors, uint64_t kvs, uint32_t version = 3) {
    return Put(version).Put(tensors).Put(kvs);
  }
  // One tensor info: 2 dims ne = {ne0, ne1}.
  Writer& Info(const std::string& name, uint64_t ne0, uint64_t ne1, uint32_t type, uint64_t offset) {
    Str(name).Put<uint32_t>(2).Put(ne0).Put(ne1).Put(type).Put(offset);
    return *this;
  }
  Writer& Pad(size_t to = 32) {
    while (b.size() % to != 0) b += '\0';
    return *this;
  }
  Writer& Data(size_t n) {
    b += std::string(n, '\x11');
    return *this;
  }
  Writer& Raw(const std::string& bytes) {
    b += bytes;
    return *this;
  }
  // A metadata entry of one value: "key", type, value.
  template <typename T>
  Writer& Kv(const std::string& key, uint32_t type, T v) {
    Str(key).Put<uint32_t>(type);
    if constexpr (std::is_same_v<T, std::string>) {
      return Str(v);
    } else {
      return Put(v);
    }
  }
  absl::Status Open() const { return GgufFile::Open(WriteBytes("hand.gguf", b)).status(); }
};

TEST(Gguf, HostileHeadersGetNamedErrors) {
  EXPECT_TRUE(Contains(Writer{"GGML"}.Header(0, 0).Open(), "is not a GGUF file"));
  EXPECT_TRUE(Contains(Writer().Header(0, 0, 1).Open(), "version 1 is not supported"));
  EXPECT_TRUE(Contains(Writer().Header(0, 0, 0x03000000).Open(), "a big-endian file?"));
  EXPECT_TRUE(Contains(Writer().Header(1ull << 60, 0).Open(), "tensor count 1152921504606846976 runs past"));
  EXPECT_TRUE(Contains(Writer().Header(0, 1ull << 62).Open(), "metadata count"));
  // A string length past the end, before anything is allocated.
  EXPECT_TRUE(Contains(Writer().Header(0, 1).Put<uint64_t>(1ull << 62).Data(64).Open(),
                       "string length 4611686018427387904 runs past the end"));
  EXPECT_TRUE(Contains(Writer().Header(0, 1).Str("k").Put<uint32_t>(13).Open(),
                       "metadata 'k': unknown value type 13"));
  EXPECT_TRUE(Contains(Writer().Header(0, 1).Str("k").Put<uint32_t>(9).Put<uint32_t>(4).Put<uint64_t>(1ull << 40).Open(),
                       "metadata 'k': array of 1099511627776 u32 runs past the end"));
  EXPECT_TRUE(Contains(Writer().Header(0, 1).Str("k").Put<uint32_t>(7).Put<uint8_t>(2).Open(),
                       "bool value 2 is not 0 or 1"));
  {
    Writer w;
    w.Header(0, 1).Str("k").Put<uint32_t>(9);
    for (int i = 0; i < 10; ++i) w.Put<uint32_t>(9).Put<uint64_t>(1);
    w.Put<uint32_t>(4).Put<uint64_t>(1).Put<uint32_t>(7);
    EXPECT_TRUE(Contains(w.Open(), "arrays nested deeper than 8"));
  }
  EXPECT_TRUE(Contains(Writer().Header(0, 2).Str("k").Put<uint32_t>(4).Put<uint32_t>(1)
                           .Str("k").Put<uint32_t>(4).Put<uint32_t>(2).Open(),
                       "duplicate metadata key 'k'"));
  EXPECT_TRUE(Contains(Writer().Header(0, 1).Str("general.alignment").Put<uint32_t>(4).Put<uint32_t>(3).Open(),
                       "general.alignment 3 must be a power of two"));
  // Tensor infos.
  EXPECT_TRUE(Contains(Writer().Header(1, 0).Str("w").Put<uint32_t>(5).Data(64).Open(),
                       "tensor 'w': 5 dims (1 to 4)"));
  EXPECT_TRUE(Contains(Writer().Header(1, 0).Info("w", 0, 4, 0, 0).Data(64).Open(),
                       "tensor 'w': dim 0 of 0 (dims must be >= 1)"));
  EXPECT_TRUE(Contains(Writer().Header(1, 0).Info("w", 1ull << 40, 1ull << 40, 0, 0).Data(64).Open(),
                       "tensor 'w': ne [1099511627776, 1099511627776] hold more than 2^64 elements"));
  // Not an overflow of anything: the cap on a tensor's elements.
  EXPECT_TRUE(Contains(Writer().Header(1, 0).Info("w", 1ull << 30, 1ull << 29, 0, 0).Data(64).Open(),
                       "tensor 'w': ne [1073741824, 536870912] hold 576460752303423488 elements, "
                       "more than a tensor may have (144115188075855871)"));
  EXPECT_TRUE(Contains(Writer().Header(1, 0).Info("w", 1ull << 40, 1ull << 40, 0, 0).Data(64).Open(),
                       "more than a tensor may have"));
  EXPECT_TRUE(Contains(Writer().Header(1, 0).Info("w", 4, 4, 99, 0).Data(64).Open(),
                       "tensor 'w': unknown ggml type 99"));
  EXPECT_TRUE(Contains(Writer().Header(1, 0).Info("w", 100, 1, 12, 0).Data(64).Open(),
                       "tensor 'w': Q4_K rows of 100 elements are not whole 256-element blocks"));
  EXPECT_TRUE(Contains(Writer().Header(1, 0).Info("w", 4, 1, 0, 4).Pad().Data(64).Open(),
                       "tensor 'w': offset 4 is not a multiple of the 32-byte alignment"));
  // 2^63 is a multiple of 32: what is wrong is where it points.
  EXPECT_TRUE(Contains(Writer().Header(1, 0).Info("w", 4, 1, 0, 1ull << 63).Pad().Data(64).Open(),
                       "tensor 'w': offset 9223372036854775808 is past the end of the file (160 bytes)"));
  EXPECT_TRUE(Contains(Writer().Header(1, 0).Info("w", 4, 4, 0, 0).Pad().Data(63).Open(),
                       "tensor 'w' F32[4, 4]: data [0, 64) runs past the end of the data section (63 bytes)"));
  EXPECT_TRUE(Contains(Writer().Header(2, 0).Info("a", 16, 1, 0, 0).Info("b", 16, 1, 0, 32).Pad().Data(128).Open(),
                       "tensor 'b': data [32, 96) overlaps tensor 'a' [0, 64)"));
  EXPECT_TRUE(Contains(Writer().Header(2, 0).Info("a", 8, 1, 0, 0).Info("a", 8, 1, 0, 32).Pad().Data(64).Open(),
                       "duplicate tensor 'a'"));
  // An empty array (gguf-py does not write one) is a value like any other.
  Writer empty;
  empty.Header(0, 1).Str("k").Put<uint32_t>(9).Put<uint32_t>(4).Put<uint64_t>(0);
  EXPECT_EQ(GgufFile::Open(WriteBytes("empty.gguf", empty.b)).value()->GetInts("k").value().size(), 0u);
  // A type dtensor knows but does not read: listed, and its read names the file, the tensor, its
  // type and every type dtensor reads, as its own or dequantized.
  Writer iq;
  iq.Header(1, 0).Info("w", 256, 1, 19, 0).Pad().Data(64);
  const std::string iq_path = WriteBytes("iq.gguf", iq.b);
  auto f = GgufFile::Open(iq_path).value();
  for (const ReadOptions& o : {ReadOptions(), ReadOptions{.dtype = DType::kBF16}}) {
    EXPECT_TRUE(Contains(f->ReadRanges("w", FullRanges(Shape{1, 256}), o).status(),
                         absl::StrCat("'", iq_path, "': tensor 'w' is IQ1_S, a type dtensor does not "
                                      "read (supported: F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, "
                                      "Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, BF16)")));
  }
  EXPECT_EQ(f->ReadRanges("w", FullRanges(Shape{1, 256})).status().code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_TRUE(Contains(GgufFile::Open(TempPath("missing.gguf")).status(), "cannot open"));
  EXPECT_EQ(GgufFile::Open(TempPath("missing.gguf")).status().code(), absl::StatusCode::kNotFound);
}

// ---- files that cannot be read, and what they should have been ----------------------------------

TEST(GgufFiles, EmptyAndTruncatedFilesSaySoAsGguf) {
  for (const std::string& bytes : {std::string(), std::string("GGU")}) {
    SCOPED_TRACE(bytes.size());
    const std::string path = WriteBytes("short.gguf", bytes);
    const std::string want = bytes.empty() ? "is empty (0 bytes); expected a GGUF file"
                                           : "is 3 bytes, too short for a GGUF file";
    EXPECT_TRUE(Contains(GgufFile::Open(path).status(), want));
    // Named .gguf: read as the GGUF it should be, not as safetensors or config.json.
    EXPECT_TRUE(Contains(Checkpoint::Open(path).status(), want));
    EXPECT_TRUE(Contains(LoadDecoderConfig(path).status(), want));
  }
}

TEST(GgufFiles, UnreadableFileIsPermissionDeniedNotNotFound) {
  const std::string bytes = ReadFileBytes(kDir + "/llama-tiny.gguf");
  dt::testing::ExpectPermissionDenied(WriteBytes("locked.gguf", bytes),
                                      [](const std::string& p) { return GgufFile::Open(p).status(); });
  dt::testing::ExpectPermissionDenied(WriteBytes("locked2.gguf", bytes),
                                      [](const std::string& p) { return Checkpoint::Open(p).status(); });
}

// ---- non-finite weights (Note [Non-finite weights]) -----------------------------------------------

// A GGUF holding one tensor 'w' of ggml type `type`, ne = {ne0, ne1}, of these bytes.
std::string OneTensor(absl::string_view name, uint32_t type, uint64_t ne0, uint64_t ne1,
                      const std::string& bytes) {
  Writer w;
  w.Header(1, 0).Info("w", ne0, ne1, type, 0).Pad().Raw(bytes);
  return WriteBytes(name, w.b);
}

std::string Bytes(const Tensor& t) {
  return std::string(static_cast<const char*>(t.raw_data()), static_cast<size_t>(t.nbytes()));
}

TEST(GgufFinite, EveryScaleOfEveryQuantTypeIsChecked) {
  struct Case {
    uint32_t ggml;
    DType dtype;
    std::vector<std::pair<int, const char*>> scales;  // byte offset in the block, name
  } cases[] = {
      {8, DType::kQ8_0, {{0, "d"}}},  {2, DType::kQ4_0, {{0, "d"}}},
      {3, DType::kQ4_1, {{0, "d"}, {2, "m"}}},  {6, DType::kQ5_0, {{0, "d"}}},
      {7, DType::kQ5_1, {{0, "d"}, {2, "m"}}},  {12, DType::kQ4_K, {{0, "d"}, {2, "dmin"}}},
      {13, DType::kQ5_K, {{0, "d"}, {2, "dmin"}}},  {14, DType::kQ6_K, {{208, "d"}}},
      {10, DType::kQ2_K, {{80, "d"}, {82, "dmin"}}},  {11, DType::kQ3_K, {{108, "d"}}},
      {20, DType::kIQ4_NL, {{0, "d"}}},  {23, DType::kIQ4_XS, {{0, "d"}}},
  };
  uint64_t seed = 1;
  for (const Case& c : cases) {
    const int64_t block = DTypeBlock(c.dtype), bytes = DTypeBlockBytes(c.dtype);
    for (const auto& [offset, field] : c.scales) {
      for (const auto& [half, text] : std::vector<std::pair<uint16_t, const char*>>{
               {0x7E00, "nan"}, {0x7C00, "inf"}, {0xFC00, "-inf"}}) {
        SCOPED_TRACE(absl::StrCat(DTypeName(c.dtype), " ", field, " ", text));
        // Three rows of two blocks; the second block of the last row is broken.
        std::string raw = Bytes(RandomQuantized(c.dtype, {3, 2 * block}, seed++).value());
        std::memcpy(raw.data() + 5 * bytes + offset, &half, 2);
        const std::string path = OneTensor("scale.gguf", c.ggml, 2 * block, 3, raw);
        auto f = GgufFile::Open(path).value();
        const std::string want = absl::StrCat(
            "tensor 'w' ", f->FindTensor("w")->type->name, "[3, ", 2 * block,
            "]: the block of elements [2, ", block, ":", 2 * block, "] has scale ", field, " = ",
            text, ", which makes every value of the block NaN or infinite");
        EXPECT_TRUE(Contains(f->ReadRanges("w", FullRanges(Shape{3, 2 * block})).status(), want));
        ReadOptions kept;
        kept.dtype = c.dtype;
        EXPECT_TRUE(Contains(f->ReadRanges("w", FullRanges(Shape{3, 2 * block}), kept).status(), want));
        EXPECT_TRUE(Contains(f->ReadRanges("w", {{{2, 3}}, {{block, block + 1}}}).status(), want));
        // A rank whose piece does not hold the block reads it: its scales are finite.
        EXPECT_TRUE(f->ReadRanges("w", {{{0, 2}}, {{0, 2 * block}}}).ok());
        EXPECT_TRUE(f->ReadRanges("w", {{{0, 3}}, {{0, block}}}, kept).ok());
      }
    }
  }
}

TEST(GgufFinite, FloatElementsAreChecked) {
  // F32, F16 and BF16 [3, 8] of ones, element [1, 5] NaN or infinite.
  struct Case {
    uint32_t ggml;
    int width;
    uint32_t one, nan, inf;
  } cases[] = {{0, 4, 0x3F800000, 0x7FC00000, 0x7F800000},
               {1, 2, 0x3C00, 0x7E00, 0x7C00},
               {30, 2, 0x3F80, 0x7FC0, 0x7F80}};
  for (const Case& c : cases) {
    for (const auto& [bad, text] : {std::pair<uint32_t, const char*>{c.nan, "nan"}, {c.inf, "inf"}}) {
      std::string raw;
      for (int i = 0; i < 24; ++i) {
        const uint32_t v = i == 8 + 5 ? bad : c.one;
        raw.append(reinterpret_cast<const char*>(&v), c.width);
      }
      auto f = GgufFile::Open(OneTensor("float.gguf", c.ggml, 8, 3, raw)).value();
      const std::string want = absl::StrCat("tensor 'w' ", f->FindTensor("w")->type->name,
                                            "[3, 8]: element [1, 5] is ", text, "; weights must be finite");
      EXPECT_TRUE(Contains(f->ReadRanges("w", FullRanges(Shape{3, 8})).status(), want));
      EXPECT_TRUE(f->ReadRanges("w", {{{0, 3}}, {{0, 5}, {6, 8}}}).ok());
    }
  }
}

// Q4_0 and Q4_K take the same bytes per element (18 / 32 = 144 / 256), so Q4_0 blocks under a
// Q4_K label pass every size check, and Q4_K then reads dmin from two bytes of 4-bit values:
// infinite or NaN for 1 byte value in 32 where the values are uniform. Refused when one of the
// blocks read has such a byte (here 512 blocks), never when none has (docs/limits.md).
TEST(GgufFinite, Q4_0BytesLabelledQ4_KAreCaughtByTheirScales) {
  const std::string raw = Bytes(RandomQuantized(DType::kQ4_0, {64, 2048}, 45).value());
  auto honest = GgufFile::Open(OneTensor("q4_0.gguf", 2, 2048, 64, raw)).value();
  EXPECT_TRUE(honest->ReadRanges("w", FullRanges(Shape{64, 2048})).ok());
  auto relabelled = GgufFile::Open(OneTensor("q4_0-as-q4_k.gguf", 12, 2048, 64, raw)).value();
  EXPECT_TRUE(Contains(relabelled->ReadRanges("w", FullRanges(Shape{64, 2048})).status(),
                       "tensor 'w' Q4_K[64, 2048]: the block of elements ["));
}

// ---- metadata in memory (Note [Compact metadata]) -------------------------------------------------

// The file: a 7.9M-element u8 array (it cost 440 MB when every element was a value), with
// a million 3-byte strings beside it; opened with and without the tokenizer arrays, the way
// `dtensor inspect`, generate and every rank open it. The process's peak RSS grows by at most
// twice the metadata's bytes and a few MB.
TEST(GgufMemory, MetadataTakesAboutItsBytes) {
  const int64_t n = 7'900'000, m = 1'000'000;
  std::string path;
  {
    Writer w;
    w.Header(0, 2).Str("big.u8").Put<uint32_t>(9).Put<uint32_t>(0).Put<uint64_t>(n);
    w.Raw(std::string(n, '\x05'));
    w.Str("big.strings").Put<uint32_t>(9).Put<uint32_t>(8).Put<uint64_t>(m);
    for (int64_t i = 0; i < m; ++i) w.Put<uint64_t>(3).Raw(i == m - 1 ? "end" : "abc");
    path = WriteBytes("big-metadata.gguf", w.b);
  }
  const int64_t file_bytes = static_cast<int64_t>(fs::file_size(path));
  for (bool tokenizer_arrays : {true, false}) {
    ASSERT_TRUE(ResetPeakResidentBytes());
    const int64_t before = ResidentBytes();
    ASSERT_GT(before, 0);
    GgufOpenOptions o;
    o.tokenizer_arrays = tokenizer_arrays;
    auto f = GgufFile::Open(path, o).value();
    const int64_t grew = PeakResidentBytes() - before;
    EXPECT_LE(grew, 2 * file_bytes + (8 << 20)) << "file " << file_bytes << " bytes";
    const GgufArray* u8 = f->Find("big.u8")->AsArray();
    ASSERT_EQ(u8->size, n);
    EXPECT_EQ(u8->Element(n - 1).AsInt(), 5);
    EXPECT_EQ(f->Find("big.strings")->AsArray()->StringAt(m - 1), "end");
    EXPECT_EQ(f->GetStrings("big.strings").value().size(), static_cast<size_t>(m));
  }
}

TEST(GgufMemory, WhatCostsAValueOfItsOwnIsCapped) {
  Writer keys;
  keys.Header(0, 70000).Data(70000 * 13);
  EXPECT_TRUE(Contains(keys.Open(), "metadata count 70000: more than the 65536 keys"));
  Writer nested;
  nested.Header(0, 1).Str("k").Put<uint32_t>(9).Put<uint32_t>(9).Put<uint64_t>(70000);
  for (int i = 0; i < 70000; ++i) nested.Put<uint32_t>(0).Put<uint64_t>(0);
  EXPECT_TRUE(Contains(nested.Open(), "metadata 'k': 70000 arrays inside an array: more than 65536"));
}

// ---- Llama from GGUF -----------------------------------------------------------------------------

TEST(GgufLlama, ConfigFromMetadata) {
  auto f = GgufFile::Open(kDir + "/llama-tiny.gguf").value();
  LlamaConfig c = LlamaConfigFromGguf(*f).value();
  EXPECT_EQ(c.hidden_size, 256);
  EXPECT_EQ(c.num_hidden_layers, 2);
  EXPECT_EQ(c.num_attention_heads, 8);
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_EQ(c.intermediate_size, 512);
  EXPECT_EQ(c.rope_theta, 100000.0);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.vocab_size, 414);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(LoadLlamaConfig(kDir + "/llama-tiny.gguf").value(), c);
}

TEST(GgufLlama, NamesAndRotaryRowOrder) {
  auto f = GgufFile::Open(kDir + "/llama-tiny.gguf").value();
  std::vector<GgufTensorName> names = LlamaGgufTensorNames(*f).value();
  std::map<std::string, GgufTensorName> by_hf;
  for (const GgufTensorName& n : names) by_hf[n.hf_name] = n;
  EXPECT_EQ(by_hf["model.embed_tokens.weight"].gguf_name, "token_embd.weight");
  EXPECT_EQ(by_hf["lm_head.weight"].gguf_name, "output.weight");
  EXPECT_EQ(by_hf["model.layers.1.self_attn.o_proj.weight"].gguf_name, "blk.1.attn_output.weight");
  EXPECT_EQ(by_hf["model.layers.0.post_attention_layernorm.weight"].gguf_name, "blk.0.ffn_norm.weight");
  EXPECT_EQ(by_hf["model.layers.0.self_attn.q_proj.weight"].permute_heads, 8);
  EXPECT_EQ(by_hf["model.layers.0.self_attn.k_proj.weight"].permute_heads, 4);
  EXPECT_EQ(by_hf["model.layers.0.self_attn.v_proj.weight"].permute_heads, 0);
  EXPECT_EQ(names.size(), 2u + 1u + 2u * 9u);
  // The row map is a bijection that keeps each head's rows in the head.
  std::set<int64_t> rows;
  for (int64_t r = 0; r < 256; ++r) {
    const int64_t g = GgufRotaryRow(r, 256, 8);
    EXPECT_EQ(g / 32, r / 32);
    rows.insert(g);
  }
  EXPECT_EQ(rows.size(), 256u);
  EXPECT_EQ(GgufRotaryRow(1, 256, 8), 2);    // HF row 1 (first half, i=1) is GGUF row 2
  EXPECT_EQ(GgufRotaryRow(16, 256, 8), 1);   // HF row 16 (second half, i=0) is GGUF row 1
}

TEST(GgufLlama, CheckpointReadsHfNamesAndCountsBlocks) {
  Checkpoint c = Checkpoint::Open(kDir + "/llama-tiny.gguf").value();
  ASSERT_NE(c.gguf(), nullptr);
  const TensorInfo* q = c.Info("model.layers.0.self_attn.q_proj.weight").value();
  EXPECT_EQ(q->dtype_name, "Q4_0");
  EXPECT_EQ(q->shape, (Shape{256, 256}));
  // A colwise shard of heads 2..3 is the whole read's rows 64..127.
  const Tensor whole = c.Read(q->name).value();
  ReadStats stats;
  const Tensor rows = c.ReadRanges(q->name, {{{64, 128}}, {{0, 256}}}, {}, &stats).value();
  EXPECT_EQ(std::memcmp(rows.raw_data(), whole.data<float>() + 64 * 256, rows.nbytes()), 0);
  EXPECT_EQ(stats.bytes_copied, 64 * (256 / 32) * 18);  // 64 rows of 8 Q4_0 blocks
  // Rowwise: columns 128..255 of o_proj read half of each row's blocks.
  stats = {};
  (void)c.ReadRanges("model.layers.0.self_attn.o_proj.weight", {{{0, 256}}, {{128, 256}}}, {}, &stats).value();
  EXPECT_EQ(stats.bytes_copied, 256 * 4 * 24);  // Q5_1: 4 of 8 blocks per row
}

// A llama GGUF header of the required keys (hidden 8, 2 heads) and `extra` keys after them.
absl::StatusOr<DecoderConfig> LlamaWith(const std::function<void(Writer&)>& extra, int extra_keys,
                                        uint32_t hidden = 8, uint32_t heads = 2) {
  Writer w;
  w.Header(0, 6 + extra_keys)
      .Kv("general.architecture", 8, std::string("llama"))
      .Kv("llama.vocab_size", 4, uint32_t{32})
      .Kv("llama.block_count", 4, uint32_t{1})
      .Kv("llama.embedding_length", 4, hidden)
      .Kv("llama.feed_forward_length", 4, uint32_t{16})
      .Kv("llama.attention.head_count", 4, heads);
  extra(w);
  auto f = GgufFile::Open(WriteBytes("hyper.gguf", w.b));
  if (!f.ok()) return f.status();
  return DecoderConfigFromGguf(**f);
}

TEST(GgufLlama, FloatHyperparametersMustBeFiniteAndPositive) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  auto with = [](const std::string& key, float v) {
    return LlamaWith([&](Writer& w) { w.Kv(key, 6, v); }, 1);
  };
  EXPECT_TRUE(Contains(with("llama.rope.freq_base", inf).status(),
                       "metadata 'llama.rope.freq_base' is inf; it must be a finite number > 0"));
  EXPECT_TRUE(Contains(with("llama.rope.freq_base", -1).status(),
                       "metadata 'llama.rope.freq_base' is -1; it must be a finite number > 0"));
  EXPECT_TRUE(Contains(with("llama.attention.layer_norm_rms_epsilon", nan).status(),
                       "metadata 'llama.attention.layer_norm_rms_epsilon' is nan"));
  EXPECT_TRUE(Contains(with("llama.attention.layer_norm_rms_epsilon", 0).status(),
                       "metadata 'llama.attention.layer_norm_rms_epsilon' is 0"));
  EXPECT_EQ(with("llama.rope.freq_base", 500000).value().rope_theta, 500000);
  for (float factor : {inf, nan, 0.5f}) {
    absl::StatusOr<DecoderConfig> c = LlamaWith(
        [&](Writer& w) {
          w.Kv("llama.rope.scaling.type", 8, std::string("linear")).Kv("llama.rope.scaling.factor", 6, factor);
        },
        2);
    EXPECT_TRUE(Contains(c.status(), absl::StrCat("linear rope scaling needs a finite "
                                                  "llama.rope.scaling.factor >= 1, got ", factor)));
  }
}

TEST(GgufLlama, HeadDimWithoutKeyLengthNeedsDivisibleHeads) {
  EXPECT_TRUE(Contains(LlamaWith([](Writer&) {}, 0, 10, 3).status(),
                       "llama.embedding_length 10 is not a multiple of llama.attention.head_count "
                       "3, and there is no llama.attention.key_length to give the head dim"));
  absl::StatusOr<DecoderConfig> c =
      LlamaWith([](Writer& w) { w.Kv("llama.attention.key_length", 4, uint32_t{4}); }, 1, 10, 3);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 4);
}

TEST(GgufLlama, RefusesWhatItDoesNotImplement) {
  Writer w;
  w.Header(0, 2).Str("general.architecture").Put<uint32_t>(8).Str("qwen2")
      .Str("x").Put<uint32_t>(4).Put<uint32_t>(1);
  auto f = GgufFile::Open(WriteBytes("arch.gguf", w.b)).value();
  EXPECT_TRUE(Contains(LlamaConfigFromGguf(*f).status(), "architecture 'qwen2' is not supported"));
  Writer u;
  u.Header(0, 2).Str("general.architecture").Put<uint32_t>(8).Str("llama")
      .Str("llama.attention.sliding_window").Put<uint32_t>(4).Put<uint32_t>(4096);
  f = GgufFile::Open(WriteBytes("unknown.gguf", u.b)).value();
  EXPECT_TRUE(Contains(LlamaConfigFromGguf(*f).status(),
                       "metadata 'llama.attention.sliding_window' (4096) is not supported"));
  Writer m;
  m.Header(0, 1).Str("general.architecture").Put<uint32_t>(8).Str("llama");
  f = GgufFile::Open(WriteBytes("nokeys.gguf", m.b)).value();
  EXPECT_TRUE(Contains(LlamaConfigFromGguf(*f).status(), "no metadata 'llama.block_count'"));
}

// A Gemma 2 / 3 header (hidden 64, 4 / 2 heads of 16, `layers` layers) and `extra` keys after it.
absl::StatusOr<DecoderConfig> GemmaWith(const std::string& arch, uint32_t layers,
                                        const std::function<void(Writer&)>& extra, int extra_keys) {
  Writer w;
  w.Header(0, 8 + extra_keys)
      .Kv("general.architecture", 8, arch)
      .Kv(arch + ".vocab_size", 4, uint32_t{32})
      .Kv(arch + ".block_count", 4, layers)
      .Kv(arch + ".embedding_length", 4, uint32_t{64})
      .Kv(arch + ".feed_forward_length", 4, uint32_t{16})
      .Kv(arch + ".attention.head_count", 4, uint32_t{4})
      .Kv(arch + ".attention.head_count_kv", 4, uint32_t{2})
      .Kv(arch + ".attention.key_length", 4, uint32_t{8});
  extra(w);
  auto f = GgufFile::Open(WriteBytes("gemma.gguf", w.b));
  if (!f.ok()) return f.status();
  return DecoderConfigFromGguf(**f);
}

// Note [GGUF Gemma]: what llama.cpp assumes where the metadata says nothing, and the keys.
TEST(GgufGemma, DefaultsAreLlamaCpps) {
  const DecoderConfig g2 = GemmaWith("gemma2", 4, [](Writer&) {}, 0).value();
  EXPECT_EQ(g2.model_type, "gemma2");
  EXPECT_EQ(g2.hidden_act, "gelu_pytorch_tanh");
  EXPECT_EQ(g2.layer_windows, (std::vector<int64_t>{4096, 0, 4096, 0}));
  EXPECT_EQ(g2.attn_logit_softcapping, 50);
  EXPECT_EQ(g2.final_logit_softcapping, 30);
  EXPECT_EQ(g2.query_pre_attn_scalar, 8);  // head_dim, not hidden / heads
  EXPECT_EQ(g2.local_rope_theta, 0);
  const DecoderConfig g3 = GemmaWith("gemma3", 7, [](Writer&) {}, 0).value();
  EXPECT_EQ(g3.layer_windows, std::vector<int64_t>(7, 0));  // no window key: no sliding layers
  EXPECT_EQ(g3.attn_logit_softcapping, 0);
  EXPECT_EQ(g3.final_logit_softcapping, 0);
  EXPECT_EQ(g3.local_rope_theta, 10000);
  // The 27B layer counts scale by hidden / heads (llama.cpp's rule).
  EXPECT_EQ(GemmaWith("gemma2", 46, [](Writer&) {}, 0).value().query_pre_attn_scalar, 16);
  EXPECT_EQ(GemmaWith("gemma3", 62, [](Writer&) {}, 0).value().query_pre_attn_scalar, 16);
}

TEST(GgufGemma, SlidingLayersSoftCapsAndLocalRope) {
  auto window = [](Writer& w) { w.Kv("gemma3.attention.sliding_window", 4, uint32_t{512}); };
  const DecoderConfig six = GemmaWith("gemma3", 8, window, 1).value();
  EXPECT_EQ(six.layer_windows, (std::vector<int64_t>{512, 512, 512, 512, 512, 0, 512, 512}));
  auto pattern = [&](uint32_t n) {
    return GemmaWith("gemma3", 4, [&](Writer& w) {
      window(w);
      w.Kv("gemma3.attention.sliding_window_pattern", 4, n);
    }, 2);
  };
  EXPECT_EQ(pattern(2).value().layer_windows, (std::vector<int64_t>{512, 0, 512, 0}));
  EXPECT_EQ(pattern(0).value().layer_windows, std::vector<int64_t>(4, 512));  // 0: every layer
  EXPECT_EQ(pattern(1).value().layer_windows, std::vector<int64_t>(4, 0));
  auto bools = [&](std::vector<uint8_t> v, uint32_t type = 7) {
    return GemmaWith("gemma3", 4, [&](Writer& w) {
      window(w);
      w.Str("gemma3.attention.sliding_window_pattern").Put<uint32_t>(9).Put<uint32_t>(type)
          .Put<uint64_t>(v.size());
      for (uint8_t b : v) w.Put(b);
    }, 2);
  };
  EXPECT_EQ(bools({0, 1, 1, 0}).value().layer_windows, (std::vector<int64_t>{0, 512, 512, 0}));
  EXPECT_TRUE(Contains(bools({1, 1, 0}).status(),
                       "metadata 'gemma3.attention.sliding_window_pattern' must be an integer or 4 "
                       "bools (one per layer)"));
  EXPECT_TRUE(Contains(bools({1, 1, 0, 1}, 0).status(), "must be an integer or 4 bools"));
  const DecoderConfig keys = GemmaWith("gemma3", 2, [](Writer& w) {
    w.Kv("gemma3.rope.freq_base_swa", 6, 20000.0f).Kv("gemma3.final_logit_softcapping", 6, 30.0f);
  }, 2).value();
  EXPECT_EQ(keys.local_rope_theta, 20000);
  EXPECT_EQ(keys.final_logit_softcapping, 30);
  const DecoderConfig off = GemmaWith("gemma2", 2, [](Writer& w) {
    w.Kv("gemma2.attn_logit_softcapping", 6, 0.0f).Kv("gemma2.attention.sliding_window", 4,
                                                      uint32_t{0});
  }, 2).value();
  EXPECT_EQ(off.attn_logit_softcapping, 0);  // 0: no cap, as llama.cpp reads it
  EXPECT_EQ(off.layer_windows, std::vector<int64_t>(2, 0));
  EXPECT_TRUE(Contains(GemmaWith("gemma2", 2, [](Writer& w) {
    w.Kv("gemma2.final_logit_softcapping", 6, -1.0f);
  }, 1).status(), "metadata 'gemma2.final_logit_softcapping' is -1"));
  EXPECT_TRUE(Contains(GemmaWith("gemma3", 2, [](Writer& w) {
    w.Kv("gemma3.attention.sliding_window", 5, int32_t{-4});
  }, 1).status(), "metadata 'gemma3.attention.sliding_window' is -4; it must be >= 0"));
  // Gemma 2's layers all rotate with rope.freq_base (llama.cpp reads a swa base there, dtensor's
  // Gemma 2 has none): refused by name, as is a Gemma key on another architecture.
  EXPECT_TRUE(Contains(GemmaWith("gemma2", 2, [](Writer& w) {
    w.Kv("gemma2.rope.freq_base_swa", 6, 10000.0f);
  }, 1).status(), "metadata 'gemma2.rope.freq_base_swa' (10000) is not supported by dtensor's gemma2"));
  EXPECT_TRUE(Contains(GemmaWith("olmo2", 2, [](Writer& w) {
    w.Kv("olmo2.attention.sliding_window", 4, uint32_t{64});
  }, 1).status(), "metadata 'olmo2.attention.sliding_window' (64) is not supported"));
}

}  // namespace
}  // namespace dt::loaders
