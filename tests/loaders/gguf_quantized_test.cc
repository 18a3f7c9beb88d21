// Quantized reads (Note [Quantized dtypes] in core/quant.h): a GGUF tensor read as its own
// quantized dtype is its blocks, byte for byte, for every rank of random meshes and placements
// whose column shards are whole blocks; dequantized, each piece is exactly that rank's slice of the
// whole dequantized tensor, and the loader counts exactly the blocks kept. Shards that are not
// whole blocks are refused, naming the tensor, the block size and the mesh, before any read.
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dtensor/core/ranges.h"
#include "dtensor/loaders/checkpoint.h"
#include "dtensor/loaders/gguf.h"
#include "dtensor/loaders/gguf_llama.h"
#include "gtest/gtest.h"
#include "rapidcheck/gtest.h"
#include "dtensor/tests/test_util.h"

namespace dt::loaders {
namespace {

using dt::testing::Contains;

const std::string kDir = std::string(DT_FIXTURES_DIR) + "/gguf";

const Checkpoint& Tiny() {
  static const Checkpoint c = [] {
    return Checkpoint::Open(kDir + "/llama-tiny.gguf").value();
  }();
  return c;
}

std::shared_ptr<const GgufFile> QuantsFile() {
  static const auto f = GgufFile::Open(kDir + "/quants.gguf").value();
  return f;
}

// Random 1- or 2-D meshes and placements of a [4, 512] tensor of every quantized type, every rank.
RC_GTEST_PROP(GgufQuantized, ShardsAreTheirBlocks, ()) {
  static const std::vector<std::string> kTypes = {"Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
                                                 "Q4_K", "Q5_K", "Q6_K", "Q2_K", "Q3_K",
                                                 "IQ4_NL", "IQ4_XS"};
  const std::string name = absl::StrCat("t.", *rc::gen::elementOf(kTypes));
  const GgufTensorInfo* t = QuantsFile()->FindTensor(name);
  const DType q = *t->type->dtype;
  const Tensor whole = QuantsFile()->ReadRanges(name, FullRanges(t->shape)).value();
  const int nd = *rc::gen::inRange(1, 3);
  std::vector<int64_t> mesh_shape;
  Placements placements;
  for (int i = 0; i < nd; ++i) {
    mesh_shape.push_back(*rc::gen::inRange<int64_t>(1, 5));
    placements.push_back(*rc::gen::element(Placement::Replicate(), Placement::Shard(0),
                                           Placement::Shard(1)));
  }
  int64_t size = 1;
  for (int64_t s : mesh_shape) size *= s;
  for (int r = 0; r < size; ++r) {
    const DeviceMesh mesh = DeviceMesh::Abstract(mesh_shape, {}, r).value();
    const DTensorSpec spec = DTensorSpec::Create(mesh, placements, t->shape, q).value();
    ReadOptions o;
    o.dtype = q;
    ReadStats stats;
    const absl::Status fit = QuantizedShardsFit(name, spec);
    bool whole_blocks = true;
    const DimRanges ranges = spec.Ranges();
    for (const IndexRange& c : ranges[1]) {
      whole_blocks &= c.start % DTypeBlock(q) == 0 && c.stop % DTypeBlock(q) == 0;
    }
    absl::StatusOr<Tensor> piece = QuantsFile()->ReadRanges(name, spec.Ranges(), o, &stats);
    if (!whole_blocks) {
      RC_ASSERT(!piece.ok());
      RC_ASSERT(Contains(piece.status(), "blocks"));
    }
    if (!fit.ok()) {
      RC_ASSERT(Contains(fit, name));
      RC_ASSERT(Contains(fit, absl::StrCat(DTypeBlock(q), "-element")));
      continue;
    }
    RC_ASSERT(piece.ok());
    RC_ASSERT(piece->dtype() == q);
    RC_ASSERT(piece->shape() == spec.LocalShape());
    RC_ASSERT(stats.bytes_copied == piece->nbytes());
    const Tensor want = SliceRanges(whole, spec.Ranges()).value();
    RC_ASSERT(Equal(piece->To(DType::kF32).value(), want));
  }
}

// The types of issue 47 at tp 1, 2 and 3: rows split (2, 2, 0 at tp 3: an empty piece) and columns
// split (one 256-element super-block or eight 32-blocks a rank at tp 2; at tp 3 the 171-column
// shards are not whole blocks and are refused, naming the block size and the mesh). Each kept
// piece is exactly its rank's blocks, and reads exactly those.
TEST(GgufQuantized, NewTypesShardByBlocksAtTp1To3) {
  for (const std::string type : {"Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS"}) {
    const std::string name = "t." + type;
    const GgufTensorInfo* t = QuantsFile()->FindTensor(name);
    ASSERT_NE(t, nullptr) << name;
    const DType q = *t->type->dtype;
    const Tensor whole = QuantsFile()->ReadRanges(name, FullRanges(t->shape)).value();
    for (int tp = 1; tp <= 3; ++tp) {
      for (const int dim : {0, 1}) {
        SCOPED_TRACE(absl::StrCat(type, " tp=", tp, " S(", dim, ")"));
        const int64_t cols = dim == 1 ? (512 + tp - 1) / tp : 512;
        const bool whole_blocks = cols % DTypeBlock(q) == 0;
        for (int r = 0; r < tp; ++r) {
          const DeviceMesh mesh = DeviceMesh::Abstract({tp}, {"tp"}, r).value();
          const DTensorSpec spec =
              DTensorSpec::Create(mesh, {Placement::Shard(dim)}, t->shape, q).value();
          const absl::Status fit = QuantizedShardsFit(name, spec);
          if (!whole_blocks) {
            EXPECT_TRUE(Contains(fit, absl::StrCat(DTypeBlock(q), "-element ", DTypeName(q),
                                                   " blocks")))
                << fit;
            EXPECT_TRUE(Contains(fit, "tp=3")) << fit;
            continue;
          }
          ASSERT_TRUE(fit.ok()) << fit;
          ReadOptions o;
          o.dtype = q;
          ReadStats stats;
          const Tensor piece = QuantsFile()->ReadRanges(name, spec.Ranges(), o, &stats).value();
          EXPECT_EQ(piece.dtype(), q);
          EXPECT_EQ(piece.shape(), spec.LocalShape());
          EXPECT_EQ(stats.bytes_copied, DTypeBytes(q, piece.numel()));
          EXPECT_TRUE(
              Equal(piece.To(DType::kF32).value(), SliceRanges(whole, spec.Ranges()).value()));
        }
      }
    }
  }
}

// The Llama names of llama-tiny.gguf: q_proj's rows come in Hugging Face's order (Note [GGUF Q/K
// row order]) when kept as blocks too, and a Q4_0 table is refused as q8_0.
TEST(GgufQuantized, CheckpointKeepsRotaryRowOrder) {
  const std::string name = "model.layers.0.self_attn.q_proj.weight";
  const TensorInfo* info = Tiny().Info(name).value();
  ASSERT_EQ(info->dtype, DType::kQ4_0);
  const Tensor whole = Tiny().Read(name).value();
  for (int r = 0; r < 2; ++r) {
    const DeviceMesh mesh = DeviceMesh::Abstract({2}, {"tp"}, r).value();
    const DTensorSpec spec =
        DTensorSpec::Create(mesh, {Placement::Shard(0)}, info->shape, DType::kQ4_0).value();
    ReadStats stats;
    const Tensor piece = Tiny().ReadLocal(name, spec, {}, &stats).value();
    EXPECT_EQ(stats.bytes_copied, 128 * 8 * 18);
    EXPECT_TRUE(Equal(piece.To(DType::kF32).value(), SliceRanges(whole, spec.Ranges()).value()));
  }
  const DeviceMesh mesh = DeviceMesh::Abstract({1}, {"tp"}).value();
  const DTensorSpec q8 =
      DTensorSpec::Create(mesh, {Placement::Replicate()}, info->shape, DType::kQ8_0).value();
  EXPECT_TRUE(Contains(Tiny().ReadLocal(name, q8).status(), "cannot be read as q8_0"));
  // Columns split at tp = 16: 16 per rank, half a block.
  const DeviceMesh m16 = DeviceMesh::Abstract({16}, {"tp"}).value();
  const DTensorSpec cols =
      DTensorSpec::Create(m16, {Placement::Shard(1)}, info->shape, DType::kQ4_0).value();
  const absl::Status s = Tiny().ReadLocal(name, cols).status();
  EXPECT_TRUE(Contains(s, name));
  EXPECT_TRUE(Contains(s, "32-element q4_0 blocks"));
  EXPECT_TRUE(Contains(s, "tp=16"));
}

// A reader of weights does not keep the vocabulary's elements (GgufOpenOptions): the arrays keep
// their length, the config is the same, and asking for the elements says why they are absent.
TEST(GgufQuantized, WeightsReadersSkipTheVocabulary) {
  const std::string path = kDir + "/llama-tiny.gguf";
  GgufOpenOptions o;
  o.tokenizer_arrays = false;
  const auto lean = GgufFile::Open(path, o).value();
  const auto full = GgufFile::Open(path).value();
  const GgufValue* tokens = lean->Find("tokenizer.ggml.tokens");
  ASSERT_NE(tokens, nullptr);
  EXPECT_EQ(tokens->ArrayLength(), full->Find("tokenizer.ggml.tokens")->ArrayLength());
  EXPECT_GT(tokens->ArrayLength(), 0);
  EXPECT_TRUE(Contains(lean->GetStrings("tokenizer.ggml.tokens").status(), "was not kept"));
  EXPECT_EQ(LlamaConfigFromGguf(*lean).value().vocab_size, LlamaConfigFromGguf(*full).value().vocab_size);
}

}  // namespace
}  // namespace dt::loaders
