// The continuous-batching engine (nn/models/engine.h) on thread ranks: every request's tokens and
// finish equal CausalLM::Generate's for it alone (greedy and sampled, requests joining and leaving
// at different steps, prompts prefilled in chunks beside other sequences' decode steps) for every
// family fixture and MoE model at the tps they allow, expert parallel, and the quantized tiny GGUF;
// the batched forward's logits agree with the single-sequence forward's far within the fixtures'
// greedy margins (Note [Batching and rounding] in engine.cc); cancel frees pages; page exhaustion
// queues; the context ends a request; stop ids; a bad request fails alone; options and ranks.
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "dtensor/core/status.h"
#include "dtensor/mesh/world.h"
#include "dtensor/nn/models/causal_lm.h"
#include "dtensor/nn/models/engine.h"
#include "dtensor/tests/models/engine_util.h"
#include "dtensor/tests/models/llama_util.h"
#include "dtensor/tests/models/patched_fixtures.h"
#include "dtensor/tests/test_util.h"
#include "gtest/gtest.h"

namespace dt::nn::testing {
namespace {

using dt::testing::Contains;

struct Family {
  const char* fixture;  // under tests/fixtures
  int ranks;
  int64_t ep = 1;
  bool replicate_kv = false;
  bool quantized = false;  // a GGUF's blocks kept as they are
  std::optional<DType> kv_dtype = std::nullopt;  // the KV cache's and pages' (CausalLM::SetKVCacheDType)
};

absl::StatusOr<std::unique_ptr<CausalLM>> Load(World& w, const Family& f) {
  DistributedConfig dist;
  dist.ep_size = f.ep;
  CausalLMLoadOptions o;
  o.replicate_kv = f.replicate_kv;
  o.keep_quantized = f.quantized;
  o.kv_dtype = f.kv_dtype;
  o.unused_tensors = PlanCheck::kIgnore;
  return CausalLM::FromPretrained(FixtureDir(f.fixture), w.shared_from_this(), dist, o);
}

// The largest difference between the logits of a batched step (CausalLM::StepLogits: the prompts
// of the requests in one step, then one decode token of each) and those of each sequence's own
// forward (Logits), and the largest logit, over every rank's view (the same on every rank).
struct Deviation {
  double max_diff = 0, scale = 0;
};
absl::StatusOr<Deviation> BatchDeviation(CausalLM& model, const std::vector<TimedRequest>& requests) {
  const int64_t page = 4;
  BatchStep prefill, decode;
  std::vector<int64_t> next;  // each prompt's greedy token
  const int64_t seqs = static_cast<int64_t>(requests.size());
  int64_t max_pages = 0;
  for (const TimedRequest& r : requests) {
    max_pages = std::max<int64_t>(max_pages, (static_cast<int64_t>(r.request.prompt.size()) + page) / page);
  }
  Deviation dev;
  std::vector<std::vector<float>> alone_prefill, alone_decode;
  for (int64_t i = 0; i < seqs; ++i) {  // each alone: the prompt's last logits, then one decode step
    const std::vector<int64_t>& p = requests[i].request.prompt;
    model.ResetCache();
    DT_ASSIGN_OR_RETURN(Tensor ids, Tensor::FromVector<int64_t>({1, static_cast<int64_t>(p.size())}, p));
    DT_ASSIGN_OR_RETURN(Tensor a, model.Logits(ids, true));
    std::vector<float> v = a.ToVector<float>();
    next.push_back(std::max_element(v.begin(), v.end()) - v.begin());
    alone_prefill.push_back(std::move(v));
    DT_ASSIGN_OR_RETURN(ids, Tensor::FromVector<int64_t>({1, 1}, {next.back()}));
    DT_ASSIGN_OR_RETURN(a, model.Logits(ids, true));
    alone_decode.push_back(a.ToVector<float>());
  }
  std::vector<int32_t> pages(static_cast<size_t>(seqs * max_pages));
  for (size_t i = 0; i < pages.size(); ++i) pages[i] = static_cast<int32_t>(pages.size() - 1 - i);
  auto make = [&](BatchStep& s, bool is_decode) -> absl::Status {
    std::vector<int64_t> st = {0}, len, sl;
    for (int64_t i = 0; i < seqs; ++i) {
      const std::vector<int64_t>& p = requests[i].request.prompt;
      const int64_t n = static_cast<int64_t>(p.size());
      const int64_t from = is_decode ? n : 0, to = is_decode ? n + 1 : n;
      for (int64_t q = from; q < to; ++q) {
        s.ids.push_back(is_decode ? next[i] : p[q]);
        s.positions.push_back(q);
        sl.push_back(int64_t{pages[i * max_pages + q / page]} * page + q % page);
      }
      s.segments.push_back(to - from);
      st.push_back(st.back() + to - from);
      len.push_back(to);
      s.logit_rows.push_back(st.back() - 1);
    }
    s.paged.page_tokens = page;
    s.paged.pool_pages = seqs * max_pages;
    DT_ASSIGN_OR_RETURN(s.paged.query_starts, Tensor::FromVector<int64_t>({seqs + 1}, st));
    DT_ASSIGN_OR_RETURN(s.paged.kv_lengths, Tensor::FromVector<int64_t>({seqs}, len));
    DT_ASSIGN_OR_RETURN(s.paged.page_table, Tensor::FromVector<int32_t>({seqs, max_pages}, pages));
    DT_ASSIGN_OR_RETURN(s.paged.slots,
                        Tensor::FromVector<int64_t>({static_cast<int64_t>(sl.size())}, sl));
    return absl::OkStatus();
  };
  DT_RETURN_IF_ERROR(make(prefill, false));
  DT_RETURN_IF_ERROR(make(decode, true));
  for (const auto& [step, alone] : {std::pair{&prefill, &alone_prefill}, std::pair{&decode, &alone_decode}}) {
    DT_ASSIGN_OR_RETURN(Tensor logits, model.StepLogits(*step));
    const std::vector<float> v = logits.ToVector<float>();
    const int64_t vocab = model.config().vocab_size;
    for (int64_t i = 0; i < seqs; ++i) {
      for (int64_t j = 0; j < vocab; ++j) {
        const double want = (*alone)[i][j];
        dev.max_diff = std::max(dev.max_diff, std::abs(v[i * vocab + j] - want));
        dev.scale = std::max(dev.scale, std::abs(want));
      }
    }
  }
  model.ReleasePagedKV();
  return dev;
}

// How many times a fresh step's deviation a token's margin must exceed for the token to be claimed.
constexpr double kSafety = 10;

class EngineFamilies : public ::testing::TestWithParam<Family> {};

TEST_P(EngineFamilies, EachRequestAsAlone) {
  const Family f = GetParam();
  absl::Status s = World::RunThreads(f.ranks, [&](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(std::unique_ptr<CausalLM> model, Load(w, f));
    const std::vector<TimedRequest> requests = MixedRequests(model->config().vocab_size);
    std::vector<Outcome> alone;
    std::vector<Margins> margins;
    for (const TimedRequest& r : requests) {
      DT_ASSIGN_OR_RETURN(Outcome o, RunAlone(*model, r.request));
      DT_ASSIGN_OR_RETURN(Margins m, AloneMargins(*model, r.request));
      if (m.tokens != o.tokens) return absl::InternalError("AloneMargins is not Generate");
      alone.push_back(std::move(o));
      margins.push_back(std::move(m));
    }
    // Note [Batching and rounding]: the batched forward rounds differently from the forward of
    // one sequence, by `dev` on a fresh step's logits (bounded per dtype here); over a request the
    // difference carries into its KV pages and may grow a few times. A token is the alone run's
    // until the first step whose margin (DecisionMargin) the alone run holds by no more than
    // kSafety · dev; from there on nothing is claimed. With f32 weights no greedy step of these
    // requests is that close, so every greedy token is claimed (sampled steps may come closer:
    // these fixtures' random weights give near-even candidates).
    DT_ASSIGN_OR_RETURN(const Deviation dev, BatchDeviation(*model, requests));
    const DType dtype = model->dtype();
    // Quantized activations, and keys and values rounded to an f16 cache, turn the batched
    // forward's f32 differences into whole roundings now and then.
    const bool rounded = f.quantized || f.kv_dtype.has_value();
    const double bound = (dtype == DType::kBF16 ? 0.02 : rounded ? 1e-3 : 2e-5) *
                         std::max(1.0, dev.scale);
    if (dev.max_diff > bound) {
      return absl::InternalError(absl::StrCat("batched logits differ from alone by ",
                                              dev.max_diff, " (logits up to ", dev.scale,
                                              ", bound ", bound, ")"));
    }
    DT_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, MakeBatchingEngine(*model, SmallOptions()));
    RunLog log;
    DT_ASSIGN_OR_RETURN(std::vector<Outcome> got,
                        RunEngine(*engine, w.rank() == 0, requests, &log));
    if (w.rank() != 0) return absl::OkStatus();
    int64_t claimed = 0, total = 0, greedy_unclaimed = 0;
    for (size_t i = 0; i < requests.size(); ++i) {
      const std::vector<double>& m = margins[i].margin;
      const size_t sure = std::find_if(m.begin(), m.end(), [&](double x) {
                            return x <= kSafety * dev.max_diff;
                          }) - m.begin();
      claimed += static_cast<int64_t>(sure);
      total += static_cast<int64_t>(m.size());
      if (requests[i].request.sampling.greedy) greedy_unclaimed += static_cast<int64_t>(m.size() - sure);
      const bool whole = sure == m.size();
      if (whole ? !(got[i] == alone[i])
                : got[i].tokens.size() < sure ||
                      !std::equal(alone[i].tokens.begin(), alone[i].tokens.begin() + sure,
                                  got[i].tokens.begin())) {
        return absl::InternalError(absl::StrCat("request ", i, ": batched ", Describe(got[i]),
                                                ", alone ", Describe(alone[i]), "; the first ",
                                                sure, " tokens have margins above ",
                                                kSafety * dev.max_diff));
      }
    }
    if (dtype == DType::kF32 && !rounded && greedy_unclaimed > 0) {
      return absl::InternalError(absl::StrCat(
          greedy_unclaimed, " greedy tokens have margins within ", kSafety,
          " times the batched forward's deviation ", dev.max_diff,
          ": the fixture no longer shows that batching keeps tokens"));
    }
    const EngineStats st = engine->stats();
    if (log.max_running != 3 || st.kv_pages_used != 0 || st.running != 0 || st.waiting != 0) {
      return absl::InternalError(absl::StrCat("at most ", log.max_running, " running (want 3); ",
                                              st.kv_pages_used, " pages used at the end"));
    }
    double least = std::numeric_limits<double>::infinity();
    for (const Margins& m : margins) {
      for (double x : m.margin) least = std::min(least, x);
    }
    std::printf("%s tp=%d: %lld steps; batched logits within %.3g of alone (logits up to %.3g); "
                "the least margin %.3g; %lld of %lld tokens with margins above %g times the "
                "deviation\n",
                f.fixture, f.ranks, static_cast<long long>(log.steps), dev.max_diff, dev.scale,
                least, static_cast<long long>(claimed), static_cast<long long>(total), kSafety);
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << f.fixture << " on " << f.ranks << " ranks: " << s;
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, EngineFamilies,
    ::testing::Values(Family{"llama-tiny", 1}, Family{"llama-tiny", 2}, Family{"llama-tiny", 4},
                      Family{"llama-tiny-tied-bf16", 2}, Family{"zoo/mistral-tiny", 1},
                      Family{"zoo/mistral-tiny", 2},
                      Family{"zoo/mistral-tiny", 4},  // KV heads on 2 ranks each (unit_colwise)
                      Family{"moe/mixtral_kv2-tiny", 4, 4}, Family{"zoo/qwen2-tiny", 1},
                      Family{"zoo/qwen2-tiny", 3}, Family{"zoo/qwen2-tiny", 9, 1, true},
                      Family{"zoo/qwen3-tiny", 1}, Family{"zoo/qwen3-tiny", 4},
                      Family{"zoo/phi3-tiny", 1}, Family{"zoo/phi3-tiny", 2},
                      Family{"zoo/gemma-tiny", 2, 1, true}, Family{"zoo/olmo2-tiny", 2},
                      Family{"zoo/gemma2-tiny", 1}, Family{"zoo/gemma2-tiny", 2},
                      Family{"zoo/gemma3_text-tiny", 2},
                      Family{"moe/mixtral-tiny", 1}, Family{"moe/mixtral-tiny", 2},
                      Family{"moe/mixtral-tiny", 2, 2}, Family{"moe/qwen3_moe-tiny", 2},
                      Family{"moe/deepseek_v2-tiny", 1}, Family{"moe/deepseek_v2-tiny", 2},
                      Family{"moe/deepseek_v2_lite-tiny", 2}, Family{"moe/minicpm5_moe-tiny", 2},
                      // paged windows and sinks
                      Family{"moe/gpt_oss-tiny", 1}, Family{"moe/gpt_oss-tiny", 2},
                      Family{"moe/gpt_oss-tiny", 2, 2},
                      Family{"gguf/llama-tiny.gguf", 1, 1, false, true},
                      Family{"gguf/llama-tiny.gguf", 2, 1, false, true},
                      Family{"zoo/qwen2-tiny.gguf", 3, 1, false, true},
                      // f16 pages under f32 compute (Note [A KV cache of its own dtype])
                      Family{"llama-tiny", 2, 1, false, false, DType::kF16},
                      Family{"moe/deepseek_v2-tiny", 1, 1, false, false, DType::kF16}),
    [](const auto& info) {
      std::string name = absl::StrCat(
          info.param.fixture, "_tp", info.param.ranks,
          info.param.ep > 1 ? absl::StrCat("_ep", info.param.ep) : "",
          info.param.kv_dtype ? absl::StrCat("_kv_", DTypeName(*info.param.kv_dtype)) : "");
      for (char& c : name) {
        if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
      }
      return name;
    });

// The tiny Llama on `ranks` threads, `fn(model, world)` on each.
template <typename F>
absl::Status OnLlama(int ranks, F fn, const std::string& dir = FixtureDir("llama-tiny")) {
  return World::RunThreads(ranks, [&](World& w) -> absl::Status {
    DT_ASSIGN_OR_RETURN(std::unique_ptr<CausalLM> model,
                        CausalLM::FromPretrained(dir, w.shared_from_this(), DistributedConfig()));
    return fn(*model, w);
  });
}

TimedRequest Greedy(std::vector<int64_t> prompt, int64_t max_new, int64_t arrive = 0) {
  TimedRequest t;
  t.request.prompt = std::move(prompt);
  t.request.max_new_tokens = max_new;
  t.arrive = arrive;
  return t;
}

// A running request and a waiting one cancelled: each ends with kCancelled (no token), the running
// one's pages go back at that step, the others run on as alone, and the pool ends empty.
TEST(EngineTest, CancelFreesItsPages) {
  absl::Status s = OnLlama(2, [](CausalLM& model, World& w) -> absl::Status {
    const int64_t vocab = model.config().vocab_size;
    std::vector<TimedRequest> requests = {Greedy(Prompt(13, vocab, 1), 30), Greedy(Prompt(5, vocab, 2), 30),
                                          Greedy(Prompt(6, vocab, 3), 30), Greedy(Prompt(4, vocab, 4), 10)};
    requests[0].cancel_at = 8;   // running by then, holding 13 + 7 positions: 5 pages
    requests[3].cancel_at = 2;   // waiting (max_running 3)
    std::vector<Outcome> alone;
    for (const TimedRequest& r : requests) {
      DT_ASSIGN_OR_RETURN(Outcome o, RunAlone(model, r.request));
      alone.push_back(o);
    }
    DT_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, MakeBatchingEngine(model, SmallOptions()));
    RunLog log;
    DT_ASSIGN_OR_RETURN(std::vector<Outcome> got, RunEngine(*engine, w.rank() == 0, requests, &log));
    if (w.rank() != 0) return absl::OkStatus();
    EXPECT_EQ(got[0].finish, FinishReason::kCancelled);
    EXPECT_EQ(got[3].finish, FinishReason::kCancelled);
    EXPECT_TRUE(got[3].tokens.empty());
    // The cancelled one's tokens until then are alone's.
    EXPECT_FALSE(got[0].tokens.empty());
    EXPECT_TRUE(std::equal(got[0].tokens.begin(), got[0].tokens.end(), alone[0].tokens.begin()));
    EXPECT_EQ(got[1], alone[1]) << Describe(got[1]) << " vs " << Describe(alone[1]);
    EXPECT_EQ(got[2], alone[2]) << Describe(got[2]) << " vs " << Describe(alone[2]);
    // Step 8 gave back its 5 pages while the 2 others took at most one each.
    EXPECT_LT(log.per_step[8].kv_pages_used, log.per_step[7].kv_pages_used - 2);
    EXPECT_EQ(engine->stats().kv_pages_used, 0);
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
}

// A pool that holds one request at a time: the others wait (never fail) and run when it ends; a
// request larger than the pool is refused at Submit, naming the pages.
TEST(EngineTest, PageExhaustionQueues) {
  absl::Status s = OnLlama(1, [](CausalLM& model, World& w) -> absl::Status {
    const int64_t vocab = model.config().vocab_size;
    // prompt 8 + 9 new: 16 positions fed, 4 pages of 4.
    std::vector<TimedRequest> requests = {Greedy(Prompt(8, vocab, 5), 9), Greedy(Prompt(8, vocab, 6), 9),
                                          Greedy(Prompt(8, vocab, 7), 9), Greedy(Prompt(8, vocab, 8), 10)};
    EngineOptions o = SmallOptions();
    o.kv_pages = 5;
    DT_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, MakeBatchingEngine(model, o));
    RunLog log;
    DT_ASSIGN_OR_RETURN(std::vector<Outcome> got, RunEngine(*engine, w.rank() == 0, requests, &log));
    EXPECT_EQ(log.max_running, 1);
    EXPECT_LE(log.max_pages, 5);
    for (size_t i = 0; i < 3; ++i) {
      DT_ASSIGN_OR_RETURN(Outcome alone, RunAlone(model, requests[i].request));
      EXPECT_EQ(got[i], alone) << i << ": " << Describe(got[i]) << " vs " << Describe(alone);
    }
    // 8 + 10 - 1 = 17 positions: 5 pages, the whole pool: it fits.
    EXPECT_EQ(got[3].finish, FinishReason::kLength);
    requests = {Greedy(Prompt(8, vocab, 9), 14)};  // 21 positions: 6 pages
    DT_ASSIGN_OR_RETURN(engine, MakeBatchingEngine(model, o));
    absl::StatusOr<int64_t> refused = engine->Submit(requests[0].request);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(Contains(refused.status(), "max_new_tokens: 8 prompt tokens + 14 new ones need 6 KV "
                                           "pages of 4 positions, more than the pool's 5"))
        << refused.status();
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
}

// A context of 24 positions: a request that asks for more ends with kContext where Generate stops,
// with the same tokens.
TEST(EngineTest, TheContextEndsARequest) {
  static dt::testing::ScratchDir scratch("engine_context");
  const std::string dir = FixtureWithContext(scratch.path, "llama-tiny", "context24", 24);
  absl::Status s = OnLlama(
      2,
      [](CausalLM& model, World& w) -> absl::Status {
        const int64_t vocab = model.config().vocab_size;
        std::vector<TimedRequest> requests = {Greedy(Prompt(18, vocab, 10), 40),
                                              Greedy(Prompt(3, vocab, 11), 4)};
        DT_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                            MakeBatchingEngine(model, SmallOptions()));
        DT_ASSIGN_OR_RETURN(std::vector<Outcome> got, RunEngine(*engine, w.rank() == 0, requests));
        DT_ASSIGN_OR_RETURN(Outcome alone, RunAlone(model, requests[0].request));
        DT_ASSIGN_OR_RETURN(engine, MakeBatchingEngine(model, SmallOptions()));
        if (w.rank() == 0) {
          EXPECT_EQ(got[0].finish, FinishReason::kContext);
          EXPECT_EQ(got[0].tokens.size(), 6u);  // 18 + 6 = 24
          EXPECT_EQ(got[0], alone) << Describe(got[0]) << " vs " << Describe(alone);
          EXPECT_EQ(got[1].finish, FinishReason::kLength);
          // A prompt that fills the context is refused.
          EngineRequest full;
          full.prompt = Prompt(24, vocab, 12);
          EXPECT_TRUE(Contains(engine->Submit(full).status(),
                               "prompt: 24 tokens leave no room in the model's context of 24 "
                               "positions"));
          engine->Stop();
        }
        EXPECT_TRUE(absl::IsCancelled(engine->Step().status()));
        return absl::OkStatus();
      },
      dir);
  ASSERT_TRUE(s.ok()) << s;
}

// A stop id ends a request at the token (kStop, the token included), as Generate stops.
TEST(EngineTest, StopIds) {
  absl::Status s = OnLlama(1, [](CausalLM& model, World& w) -> absl::Status {
    const int64_t vocab = model.config().vocab_size;
    TimedRequest r = Greedy(Prompt(6, vocab, 13), 12);
    DT_ASSIGN_OR_RETURN(Outcome free, RunAlone(model, r.request));
    // The first token that does not appear before it, from the fourth on.
    size_t at = 3;
    while (at + 1 < free.tokens.size() &&
           std::find(free.tokens.begin(), free.tokens.begin() + at, free.tokens[at]) !=
           free.tokens.begin() + at) {
      ++at;
    }
    r.request.stop_ids = {vocab - 1, free.tokens[at]};
    TimedRequest other = Greedy(Prompt(9, vocab, 14), 12);
    DT_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, MakeBatchingEngine(model, SmallOptions()));
    DT_ASSIGN_OR_RETURN(std::vector<Outcome> got, RunEngine(*engine, w.rank() == 0, {r, other}));
    DT_ASSIGN_OR_RETURN(Outcome alone, RunAlone(model, r.request));
    EXPECT_EQ(got[0].finish, FinishReason::kStop);
    EXPECT_EQ(got[0].tokens, std::vector<int64_t>(free.tokens.begin(), free.tokens.begin() + at + 1));
    EXPECT_EQ(got[0], alone);
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
}

// Bad requests are refused at Submit naming the field, and a request whose logits go non-finite
// (a NaN in its prompt token's embedding row) fails alone with kError while the others run on as
// alone: at tp 2, where every rank must stay in step.
TEST(EngineTest, ABadRequestFailsAlone) {
  absl::Status s = OnLlama(2, [](CausalLM& model, World& w) -> absl::Status {
    const int64_t vocab = model.config().vocab_size;
    const int64_t hidden = model.config().hidden_size;
    std::vector<TimedRequest> requests = {Greedy(Prompt(5, vocab, 15), 8), Greedy(Prompt(7, vocab, 16), 8),
                                          Greedy(Prompt(4, vocab, 17), 8)};
    std::vector<Outcome> alone;
    for (const TimedRequest& r : requests) {
      DT_ASSIGN_OR_RETURN(Outcome o, RunAlone(model, r.request));
      alone.push_back(o);
    }
    // Token 0 (no Prompt holds it) gets a NaN embedding; request 1 holds it.
    DT_RETURN_IF_ERROR(PokeLoaded(model, "model.embed_tokens.weight", 0 * hidden + 3, NAN));
    requests[1].request.prompt[2] = 0;
    requests[1].arrive = 1;
    DT_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, MakeBatchingEngine(model, SmallOptions()));
    if (w.rank() == 0) {
      auto refused = [&](EngineRequest r, const std::string& message) {
        const absl::Status st = engine->Submit(std::move(r)).status();
        EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
        EXPECT_TRUE(Contains(st, message)) << st;
      };
      EngineRequest r = requests[0].request;
      r.prompt = {};
      refused(r, "prompt: empty");
      r.prompt = {1, vocab};
      refused(r, absl::StrCat("prompt: position 1: token id ", vocab, " is outside the vocab"));
      r.prompt = {-1};
      refused(r, "prompt: position 0: token id -1 is outside the vocab");
      r.prompt = {1};
      r.max_new_tokens = 0;
      refused(r, "max_new_tokens: must be >= 1, got 0");
      r.max_new_tokens = 4;
      r.sampling.greedy = false;
      r.sampling.temperature = 0;
      refused(r, "temperature must be finite and > 0");
    }
    DT_ASSIGN_OR_RETURN(std::vector<Outcome> got, RunEngine(*engine, w.rank() == 0, requests));
    if (w.rank() != 0) return absl::OkStatus();
    EXPECT_EQ(got[1].finish, FinishReason::kError);
    EXPECT_TRUE(absl::StrContains(got[1].error, "the logits are not finite")) << got[1].error;
    EXPECT_EQ(got[0], alone[0]) << Describe(got[0]) << " vs " << Describe(alone[0]);
    EXPECT_EQ(got[2], alone[2]) << Describe(got[2]) << " vs " << Describe(alone[2]);
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
}

// Options refused naming the field; Submit only on rank 0, not past max_waiting, not after Stop;
// after Stop every rank's Step says Cancelled.
TEST(EngineTest, OptionsRanksAndStop) {
  absl::Status s = OnLlama(2, [](CausalLM& model, World& w) -> absl::Status {
    auto refused = [&](EngineOptions o, const std::string& message) {
      const absl::Status st = MakeBatchingEngine(model, o).status();
      EXPECT_TRUE(Contains(st, message)) << st;
    };
    EngineOptions o;
    o.max_running = 0;
    refused(o, "EngineOptions::max_running must be >= 1, got 0");
    o = EngineOptions();
    o.step_tokens = 8;
    refused(o, "EngineOptions::step_tokens must be >= max_running (16), got 8");
    o = EngineOptions();
    o.page_tokens = 0;
    refused(o, "EngineOptions::page_tokens must be >= 1, got 0");
    o = SmallOptions();
    o.max_waiting = 1;
    DT_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, MakeBatchingEngine(model, o));
    EXPECT_EQ(engine->stats().kv_pages_total,
              3 * ((model.context_length() + 3) / 4));  // 3 full sequences of 4-position pages
    EngineRequest r;
    r.prompt = {1, 2, 3};
    r.max_new_tokens = 2;
    if (w.rank() != 0) {
      EXPECT_EQ(engine->Submit(r).status().code(), absl::StatusCode::kFailedPrecondition);
    } else {
      EXPECT_TRUE(engine->Submit(r).ok());
      EXPECT_EQ(engine->Submit(r).status().code(), absl::StatusCode::kResourceExhausted);
      engine->Stop();
      EXPECT_EQ(engine->Submit(r).status().code(), absl::StatusCode::kFailedPrecondition);
    }
    EXPECT_TRUE(absl::IsCancelled(engine->Step().status()));
    EXPECT_TRUE(absl::IsCancelled(engine->Step().status()));  // and from then on, alone
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace dt::nn::testing
