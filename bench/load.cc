// bench_load: load-time sharding against load-whole-then-shard, as the diffusers guide measures
// it (FLUX.2 at tp=4: 12.5 s / 6.8 GB per rank sharded, 30.4 s / 64.1 GB load-then-shard).
//
//   bench_load [--quick] [--dir DIR]
//
// Writes a Llama-shaped bf16 checkpoint (about 1.8 GB; 320 MB with --quick) over several files
// with an index (make_tiny_llama, next to this binary), then loads it under dtrun (gloo) at
// tp = 1, 2, 4, each way, until every page of the rank's pieces is touched (ready to compute), cold (every file dropped from the page cache with
// posix_fadvise(DONTNEED) just before the launch) and warm. Each load runs in fresh processes, so
// VmHWM (/proc/self/status) is that load's peak. Per run, the slowest rank's wall time and the
// largest per-rank bytes read and peak RSS are shown, beside the rank's own share (its shard plus
// the replicated parameters, the bytes of its pieces after the load). Each launch runs with
// DT_TIMEOUT_MS=60000 (or the caller's), so that a launch stuck waiting for a rank ends with an
// error naming it.
//
// RESULT lines (tp=4): sharded cold load >= 2x faster than load-then-shard cold; sharded peak RSS
// <= 1.15 x own share + 64 MiB and >= 3x lower than load-then-shard's; sharded bytes read per rank
// within 1% of the own share.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/flags/flag.h"
#include "dtensor/bench/bench_util.h"
#include "dtensor/core/process_stats.h"
#include "dtensor/core/status.h"
#include "dtensor/mesh/world.h"
#include "dtensor/nn/models/llama.h"

namespace {

namespace fs = std::filesystem;
using dt::bench::Verdict;

// One rank: load, then print "LOAD_ROW rank seconds bytes_read peak_rss own_bytes".
int Worker(const std::string& dir, bool whole) {
  auto world = dt::World::FromEnv();
  if (!world.ok()) {
    std::fprintf(stderr, "bench_load: %s\n", world.status().ToString().c_str());
    return 1;
  }
  dt::nn::LlamaLoadOptions o;
  o.load_whole = whole;
  // Load-then-shard holds the whole model in memory first, as the guide's baseline does: copies,
  // not lazy mmap views (with views, loading whole costs little more than sharded loading).
  o.zero_copy = !whole;
  o.unused_tensors = dt::nn::PlanCheck::kIgnore;
  // Every weight sharded, the embedding too (embedding_rowwise), as in FLUX.2's plan where nothing
  // big stays replicated: the figures measure the loading, not Llama's replicated vocab.
  o.shard_embedding = true;
  dt::nn::LlamaLoadReport report;
  const auto t0 = std::chrono::steady_clock::now();
  auto model = dt::nn::LlamaForCausalLM::FromPretrained(dir, *world, {}, o, &report);
  if (!model.ok()) {
    std::fprintf(stderr, "bench_load: %s\n", model.status().ToString().c_str());
    return 1;
  }
  // Ready to compute: every page of every piece touched (zero-copy views are mapped lazily, so an
  // untouched load would measure nothing), and the pieces' bytes are this rank's own share.
  int64_t own = 0;
  volatile unsigned char sink = 0;
  for (const auto& [name, p] : (*model)->NamedParameters()) {
    const dt::Tensor& t = p->value().ToLocal();
    const auto* bytes = static_cast<const unsigned char*>(t.raw_data());
    for (int64_t i = 0; i < t.nbytes(); i += 4096) sink = sink + bytes[i];
    own += t.nbytes();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("LOAD_ROW %d %.4f %lld %lld %lld\n", (*world)->rank(), seconds,
              static_cast<long long>(report.stats.bytes_read()),
              static_cast<long long>(dt::PeakResidentBytes()), static_cast<long long>(own));
  std::fflush(stdout);
  return 0;
}

void DropPageCache(const std::string& dir) {
  for (const auto& e : fs::directory_iterator(dir)) {
    const int fd = ::open(e.path().c_str(), O_RDONLY);
    if (fd < 0) continue;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

struct Row {
  double seconds = 0;     // slowest rank
  int64_t read = 0;       // largest per rank
  int64_t rss = 0;        // largest per rank
  int64_t own = 0;        // largest own share
};

// A launch that waits for a rank ends within kLaunchTimeoutMs with the rank's error, which names
// whom it waited for and what for (docs/mesh.md, "Every wait has a deadline"): issue 45's run was
// killed after 300 s without a word, the default collective timeout being 300 s too.
constexpr int kLaunchTimeoutMs = 60'000;

std::optional<Row> Launch(const std::string& bin, const std::string& dir, int tp, bool whole) {
  const char* timeout = std::getenv("DT_TIMEOUT_MS");
  const std::string cmd =
      absl::StrCat("DT_BACKEND=gloo DT_TIMEOUT_MS=", timeout != nullptr ? timeout : absl::StrCat(kLaunchTimeoutMs),
                   " '", bin, "/dtrun' --nproc-per-node ", tp, " '", bin, "/bench_load' --worker --dir '", dir, "'",
                   whole ? " --whole" : "", " 2>&1");
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return std::nullopt;
  Row row;
  int ranks = 0;
  std::string log;
  char line[4096];
  while (fgets(line, sizeof(line), p)) {
    int r;
    double s;
    long long read, rss, own;
    const char* at = std::strstr(line, "LOAD_ROW ");
    if (at && std::sscanf(at, "LOAD_ROW %d %lf %lld %lld %lld", &r, &s, &read, &rss, &own) == 5) {
      row.seconds = std::max(row.seconds, s);
      row.read = std::max<int64_t>(row.read, read);
      row.rss = std::max<int64_t>(row.rss, rss);
      row.own = std::max<int64_t>(row.own, own);
      ++ranks;
    } else {
      log += line;
    }
  }
  if (pclose(p) != 0 || ranks != tp) {
    std::fprintf(stderr, "bench_load: %s failed:\n%s", cmd.c_str(), log.c_str());
    return std::nullopt;
  }
  return row;
}

double MB(int64_t b) { return b / 1e6; }

}  // namespace

ABSL_FLAG(bool, worker, false, "run as one rank (what the driver launches under dtrun)");
ABSL_FLAG(bool, whole, false, "worker: load every weight whole, then shard (the baseline)");
ABSL_FLAG(std::string, dir, "", "where the random checkpoint is written (default: a temporary directory)");

int main(int argc, char** argv) {
  const bool quick = dt::bench::ParseBenchFlags(argc, argv, "usage: bench_load [--quick] [--dir DIR]\n"
                                                            "sharded loading vs loading whole then sharding");
  const bool worker = absl::GetFlag(FLAGS_worker), whole = absl::GetFlag(FLAGS_whole);
  std::string dir = absl::GetFlag(FLAGS_dir);
  if (worker) return Worker(dir, whole);

  auto self = dt::bench::SelfPath();
  if (!self.ok()) return 1;
  const std::string bin = self->substr(0, self->rfind('/'));
  if (dir.empty()) dir = (fs::temp_directory_path() / (quick ? "dt_bench_load_q" : "dt_bench_load")).string();
  // hidden 1024 x 8 layers (quick) or 2048 x 16: 160M / 890M parameters, bf16.
  const std::string sizes = quick ? "--hidden 1024 --layers 8 --heads 16 --kv-heads 8 --head-dim 64 "
                                    "--intermediate 2816 --vocab 32000 --max-file-mb 100"
                                  : "--hidden 2048 --layers 16 --heads 16 --kv-heads 8 --head-dim 128 "
                                    "--intermediate 5632 --vocab 32000 --max-file-mb 400";
  if (!fs::exists(fs::path(dir) / "config.json")) {
    std::printf("writing the checkpoint to %s ...\n", dir.c_str());
    std::fflush(stdout);
    const std::string make = absl::StrCat("'", bin, "/make_tiny_llama' --out '", dir,
                                          "' --dtype bf16 ", sizes, " >/dev/null");
    if (std::system(make.c_str()) != 0) {
      std::fprintf(stderr, "bench_load: %s failed\n", make.c_str());
      return 1;
    }
  }
  int64_t total = 0;
  for (const auto& e : fs::directory_iterator(dir)) total += e.file_size();
  std::printf("checkpoint %s: %.0f MB in %zu files; machine: %ld cores; gloo ranks under dtrun\n",
              dir.c_str(), MB(total),
              static_cast<size_t>(std::distance(fs::directory_iterator(dir), fs::directory_iterator())),
              sysconf(_SC_NPROCESSORS_ONLN));
  std::printf("%-4s %-16s %-5s %10s %14s %14s %14s\n", "tp", "how", "cache", "wall s",
              "read/rank MB", "peak RSS MB", "own share MB");
  std::map<std::string, Row> rows;
  for (int tp : {1, 2, 4}) {
    for (bool w : {false, true}) {
      for (bool cold : {true, false}) {
        if (cold) DropPageCache(dir);
        std::optional<Row> r = Launch(bin, dir, tp, w);
        if (!r) return 1;
        const char* how = w ? "load-then-shard" : "sharded";
        std::printf("%-4d %-16s %-5s %10.2f %14.1f %14.1f %14.1f\n", tp, how, cold ? "cold" : "warm",
                    r->seconds, MB(r->read), MB(r->rss), MB(r->own));
        std::fflush(stdout);
        rows[absl::StrCat(tp, how, cold ? "cold" : "warm")] = *r;
      }
    }
  }
  const Row& s = rows["4shardedcold"];
  const Row& lw = rows["4load-then-shardcold"];
  const double speedup = s.seconds > 0 ? lw.seconds / s.seconds : 0;
  const double rss_bound = 1.15 * s.own + 64.0 * (1 << 20);
  const double rss_ratio = s.rss > 0 ? double(lw.rss) / s.rss : 0;
  const double read_err = s.own > 0 ? std::abs(double(s.read) - s.own) / s.own : 1;
  std::printf("RESULT load_tp4_cold_speedup_vs_load_then_shard %.2f 2.0 %s\n", speedup,
              Verdict(speedup >= 2.0));
  std::printf("RESULT load_tp4_peak_rss_over_own_share_bound %.3f 1.0 %s\n", s.rss / rss_bound,
              Verdict(s.rss <= rss_bound));
  std::printf("RESULT load_tp4_peak_rss_load_then_shard_over_sharded %.2f 3.0 %s\n", rss_ratio,
              Verdict(rss_ratio >= 3.0));
  std::printf("RESULT load_tp4_bytes_read_vs_own_share_error %.4f 0.01 %s\n", read_err,
              Verdict(read_err <= 0.01));
  return 0;
}
