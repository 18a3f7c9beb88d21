// The kernel tuner: per-CPU choices measured on the machine that runs them.
//
// Note [Tuner]
// A kernel constant that is best on one CPU can be the worst on another: the quantized dot's
// non-temporal prefetch gained 2.5-5 % of decode on the AMD EPYC Zen 4 VMs it was tuned on and
// halved it on an Intel Xeon (Sapphire Rapids or later), where asking for L1 ran 2x faster (Note
// [Quantized dot prefetch]); oneDNN's AMX kernels run bf16 7x faster than ours on that Xeon and do
// not exist on the EPYC (Note [GEMM dispatch]). So every such choice is a Knob: a few candidates
// and a Trial that runs them on work shaped like the real one (for decode kernels, weights twice
// the last-level cache, so every run reads memory as a decode step does). Pick(knob) decides once
// per process, in this order:
//   1. a test's or bench's override (ForceForTesting);
//   2. DT_TUNE=knob=candidate[,knob=candidate...]: a malformed value is an error of every product
//      that asks, naming the variable and what is accepted;
//   3. the knob's rule, where what the CPU is settles it (bf16 GEMM on AMX: oneDNN);
//   4. the cache file (CachePath()): a line per knob with each candidate's best figure, under a
//      key of the CPU (vendor, family, model, stepping, brand, features), the libraries and what
//      they run on, and our kernels' instruction sets. A line whose candidates or unit differ from
//      the knob's (the code changed) or that does not parse is measured again; another key makes
//      the whole file foreign;
//   5. otherwise a measurement now: every candidate `rounds` times, interleaved (forward and
//      backward turns, so that a slow phase of the machine falls on all of them), each candidate's
//      fastest run kept (other processes only ever slow a run down), and the fastest candidate
//      wins (candidate 0 within keep_first). A measurement taken while the load average was at or
//      above the cores is marked busy: it is used, and measured again by the first process that
//      finds the machine quiet (the load under half the cores). A measurement holds an flock on the
//      cache file's lock
//      so that the ranks of one job starting together measure one at a time and the others read
//      its figures (at most kLockWait; then they measure anyway), and is written to the file
//      whole (a temporary file renamed), merged with the other knobs' lines. A failed trial leaves
//      candidate 0.
// No knob's choice changes a result beyond rounding: candidates differ in speed only (a prefetch
// hint, a backend computing the same product), which is why they can be picked by the clock.
// `dtensor calibrate` prints every knob's choice and figures (--again measures them again).

#include "dtensor/ops/local/cpu/tuner.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "dtensor/core/env.h"
#include "dtensor/core/status.h"

namespace dt::ops::cpu::tune {

namespace {

constexpr const char* kCacheHeader =
    "# dtensor kernel tuning: each knob's candidates measured on this machine, the best run of each "
    "(Note [Tuner], ops/local/cpu/tuner.cc). Delete this file to measure again.";
constexpr auto kLockWait = std::chrono::seconds(60);

// One knob's line of the cache file.
struct Line {
  std::string unit;
  int threads = 0;
  bool busy = false;  // measured while the machine was busy (MachineBusy)
  std::vector<std::string> candidates;
  std::vector<double> figures;
};

struct State {
  // Guards everything below; never held while a trial runs (Note [Picks during a measurement]).
  // Recursive for a rule or an override that asks for another knob on the way.
  std::recursive_mutex mu;
  int measuring = 0;  // measurements running in this process
  bool env_read = false;
  absl::Status env_status;
  std::map<const Knob*, int> env;  // DT_TUNE's choices
  std::map<const Knob*, Choice> choices;
};

State& GetState() {
  static State* state = new State;  // reachable until exit; never torn down under a caller
  return *state;
}

// Reads DT_TUNE once (st.mu held).
void ReadEnv(State& st) {
  if (st.env_read) return;
  st.env_read = true;
  st.env.clear();
  absl::StatusOr<std::optional<std::string>> text = env::Text("DT_TUNE");
  if (!text.ok()) {
    st.env_status = text.status();
    return;
  }
  auto parsed = ParseTuneEnv(text->has_value() ? (*text)->c_str() : nullptr);
  st.env_status = parsed.status();
  if (parsed.ok()) {
    for (const auto& [knob, index] : *parsed) st.env[knob] = index;
  }
}

std::string Figures(const Knob& knob, const std::vector<double>& figures, int threads) {
  std::string s = absl::StrCat("(", knob.unit, ", ", threads, threads == 1 ? " thread):" : " threads):");
  for (size_t i = 0; i < knob.candidates.size(); ++i) {
    absl::StrAppend(&s, " ", knob.candidates[i], " ",
                    figures[i] > 0 ? absl::StrFormat("%.1f", figures[i]) : std::string("-"));
  }
  return s;
}

// The candidate the figures choose: the fastest, candidate 0 within keep_first; -1 when none ran.
int FromFigures(const Knob& knob, const std::vector<double>& figures) {
  int best = -1;
  for (size_t i = 0; i < figures.size(); ++i) {
    if (figures[i] > 0 && (best < 0 || figures[i] > figures[best])) best = static_cast<int>(i);
  }
  if (best > 0 && figures[0] > 0 && figures[0] * knob.keep_first >= figures[best]) best = 0;
  return best;
}

// The 1-minute load average against the online cores: a measurement taken while other work ran
// (a build, a test suite, other ranks) says little, so its line is marked busy, used, and measured
// again by the first process that finds the machine quiet (below half its cores).
std::atomic<double> load_for_testing{-1};

double LoadPerCore() {
  if (const double l = load_for_testing.load(std::memory_order_relaxed); l >= 0) return l;
  double load = 0;
  std::ifstream in("/proc/loadavg");
  if (!(in >> load)) return 0;
  const long cores = ::sysconf(_SC_NPROCESSORS_ONLN);
  return load / static_cast<double>(cores > 0 ? cores : 1);
}
bool MachineBusy() { return LoadPerCore() >= 1.0; }
bool MachineQuiet() { return LoadPerCore() < 0.5; }

// ---- the cache file ----------------------------------------------------------------------------

// The lines of the cache file when it carries this machine's key (else none). A line that does not
// parse is dropped, so that the next write leaves it out.
std::map<std::string, Line> ReadCache(const std::string& path) {
  std::map<std::string, Line> lines;
  if (path.empty()) return lines;
  std::ifstream in(path);
  std::string header, key;
  if (!std::getline(in, header) || !std::getline(in, key) || key != "key " + CacheKey()) return lines;
  std::string text;
  while (std::getline(in, text)) {
    const std::vector<std::string> f = absl::StrSplit(text, ' ', absl::SkipEmpty());
    // name unit threads N quiet|busy (candidate figure)...
    if (f.size() < 7 || f.size() % 2 != 1 || f[2] != "threads" || (f[4] != "quiet" && f[4] != "busy")) continue;
    Line line;
    line.unit = f[1];
    line.busy = f[4] == "busy";
    bool ok = absl::SimpleAtoi(f[3], &line.threads) && line.threads >= 1;
    bool any = false;
    for (size_t i = 5; ok && i < f.size(); i += 2) {
      double g = 0;
      ok = absl::SimpleAtod(f[i + 1], &g) && g >= 0 && g < 1e12;
      line.candidates.push_back(f[i]);
      line.figures.push_back(g);
      any |= g > 0;
    }
    if (ok && any) lines[f[0]] = std::move(line);
  }
  return lines;
}

void WriteCache(const std::string& path, const std::map<std::string, Line>& lines) {
  if (path.empty()) return;
  const std::string dir = path.substr(0, path.rfind('/'));
  // mkdir -p of the cache directory (its parent, $HOME/.cache, may not exist either).
  for (size_t at = 1; at != std::string::npos;) {
    at = dir.find('/', at + 1);
    ::mkdir(dir.substr(0, at).c_str(), 0755);
  }
  const std::string tmp = absl::StrCat(path, ".", ::getpid(), ".tmp");
  {
    std::ofstream out(tmp);
    out << kCacheHeader << "\nkey " << CacheKey() << "\n";
    for (const auto& [name, line] : lines) {
      out << name << " " << line.unit << " threads " << line.threads << (line.busy ? " busy" : " quiet");
      for (size_t i = 0; i < line.candidates.size(); ++i) {
        out << " " << line.candidates[i] << " " << absl::StrFormat("%.2f", line.figures[i]);
      }
      out << "\n";
    }
    if (!out) {
      std::remove(tmp.c_str());
      return;
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) std::remove(tmp.c_str());
}

// An exclusive flock on path + ".lock" for a measurement, waited for at most kLockWait; not held
// when the file cannot be made (no cache directory) or the wait ran out.
class FileLock {
 public:
  explicit FileLock(const std::string& path) {
    if (path.empty()) return;
    const std::string dir = path.substr(0, path.rfind('/'));
    for (size_t at = 1; at != std::string::npos;) {
      at = dir.find('/', at + 1);
      ::mkdir(dir.substr(0, at).c_str(), 0755);
    }
    fd_ = ::open((path + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) return;
    const auto deadline = std::chrono::steady_clock::now() + kLockWait;
    while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        ::close(fd_);
        fd_ = -1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  ~FileLock() {
    if (fd_ >= 0) ::close(fd_);  // closing releases the flock
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_ = -1;
};

// The cached line of `knob` when it still describes the knob's candidates.
std::optional<Line> CachedLine(const Knob& knob, const std::map<std::string, Line>& lines) {
  auto it = lines.find(knob.name);
  if (it == lines.end() || it->second.unit != knob.unit || it->second.candidates != knob.candidates) {
    return std::nullopt;
  }
  return it->second;
}

// ---- measuring -----------------------------------------------------------------------------------

absl::StatusOr<Line> Measure(const Knob& knob) {
  if (!knob.make_trial) return absl::FailedPreconditionError(absl::StrCat(knob.name, " has no trial"));
  DT_ASSIGN_OR_RETURN(std::unique_ptr<Trial> trial, knob.make_trial());
  const bool busy = MachineBusy();
  const size_t n = knob.candidates.size();
  std::vector<bool> runs(n, true);
  for (size_t i = 0; i < n; ++i) runs[i] = trial->Run(static_cast<int>(i)).ok();  // warm-up
  std::vector<double> best(n, 0);
  for (int r = 0; r < knob.rounds; ++r) {
    for (size_t t = 0; t < n; ++t) {
      const size_t i = r % 2 == 0 ? t : n - 1 - t;
      if (!runs[i]) continue;
      const auto start = std::chrono::steady_clock::now();
      if (!trial->Run(static_cast<int>(i)).ok()) {
        runs[i] = false;
        continue;
      }
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (best[i] == 0 || s < best[i]) best[i] = s;
    }
  }
  Line line;
  line.unit = knob.unit;
  line.threads = trial->Threads();
  line.busy = busy;
  line.candidates = knob.candidates;
  for (size_t i = 0; i < n; ++i) {
    line.figures.push_back(runs[i] && best[i] > 0 ? trial->Work() / best[i] / 1e9 : 0.0);
  }
  if (FromFigures(knob, line.figures) < 0) {
    return absl::InternalError(absl::StrCat(knob.name, ": no candidate ran"));
  }
  return line;
}

Choice FromLine(const Knob& knob, const Line& line, const char* how) {
  Choice c;
  c.index = FromFigures(knob, line.figures);
  c.figures = line.figures;
  c.threads = line.threads;
  c.why = absl::StrCat(how, line.busy ? " on a busy machine " : " ", Figures(knob, line.figures, line.threads));
  return c;
}

// Note [Picks during a measurement]
// A trial runs real kernels, whose code asks the tuner for other knobs, on the measuring thread and
// on oneTBB's workers alike. Were st.mu held through the trial, a worker's Pick would wait for it
// while the measuring thread waits for the worker: with an empty cache, `generate` on a bf16 model
// hung at 0 % CPU in the decode-attention knob's trial (a worker asked for gemm.skinny_prefetch).
// So a measurement runs with st.mu released, and while one runs, a Pick of a knob not decided yet
// gets that knob's first candidate for the call, neither kept nor measured (candidates differ in
// speed only); the knob is decided at its first Pick after the measurement, and no trial's timing
// includes another's.
class Measuring {
 public:
  Measuring(State& st, std::unique_lock<std::recursive_mutex>& lock) : st_(st), lock_(lock) {
    ++st_.measuring;
    lock_.unlock();
  }
  ~Measuring() {
    lock_.lock();
    --st_.measuring;
  }
  Measuring(const Measuring&) = delete;
  Measuring& operator=(const Measuring&) = delete;

 private:
  State& st_;
  std::unique_lock<std::recursive_mutex>& lock_;
};

// Measures `knob` (the cache file's lock held) and records it in the file; a failed measurement
// gives candidate 0, saying why.
Choice MeasureAndRecord(const Knob& knob, bool reuse_cached) {
  const std::string path = CachePath();
  FileLock lock(path);
  std::map<std::string, Line> lines = ReadCache(path);
  if (reuse_cached) {
    // Another process may have measured while this one waited for the lock.
    std::optional<Line> line = CachedLine(knob, lines);
    if (line && !(line->busy && MachineQuiet())) return FromLine(knob, *line, "cached");
  }
  absl::StatusOr<Line> line = Measure(knob);
  if (!line.ok()) {
    Choice c;
    c.why = absl::StrCat("measurement failed (", line.status().message(), "): ", knob.candidates[0]);
    c.figures.assign(knob.candidates.size(), 0.0);
    return c;
  }
  lines[knob.name] = *line;
  WriteCache(path, lines);
  return FromLine(knob, *line, "measured");
}

// The choice without an override (`lock` holds st.mu; released while measuring).
absl::StatusOr<Choice> Decide(State& st, std::unique_lock<std::recursive_mutex>& lock, const Knob& knob) {
  if (auto it = st.choices.find(&knob); it != st.choices.end()) return it->second;
  ReadEnv(st);
  DT_RETURN_IF_ERROR(st.env_status);
  Choice c;
  if (auto it = st.env.find(&knob); it != st.env.end()) {
    c.index = it->second;
    c.why = absl::StrCat("DT_TUNE=", knob.name, "=", knob.candidates[c.index]);
  } else if (std::optional<std::pair<int, std::string>> rule = knob.rule ? knob.rule() : std::nullopt) {
    c.index = rule->first;
    c.why = absl::StrCat("rule: ", rule->second);
  } else if (std::optional<Line> line = CachedLine(knob, ReadCache(CachePath()));
             line && !(line->busy && MachineQuiet())) {
    c = FromLine(knob, *line, "cached");
  } else if (st.measuring > 0) {  // Note [Picks during a measurement]: not kept
    c.why = absl::StrCat("first candidate while another knob is measured: ", knob.candidates[0]);
    c.figures.assign(knob.candidates.size(), 0.0);
    return c;
  } else {
    Measuring measuring(st, lock);
    c = MeasureAndRecord(knob, /*reuse_cached=*/true);
  }
  // Another thread may have decided it while st.mu was released: the first decision stands.
  if (auto it = st.choices.find(&knob); it != st.choices.end()) return it->second;
  if (c.figures.empty()) c.figures.assign(knob.candidates.size(), 0.0);
  st.choices[&knob] = c;
  knob.picked.store(c.index, std::memory_order_release);
  return c;
}

}  // namespace

namespace internal {

absl::StatusOr<int> Resolve(const Knob& knob) {
  State& st = GetState();
  std::unique_lock<std::recursive_mutex> lock(st.mu);
  DT_ASSIGN_OR_RETURN(const Choice c, Decide(st, lock, knob));
  return c.index;
}

}  // namespace internal

absl::StatusOr<Choice> Explain(const Knob& knob) {
  if (const int f = knob.forced.load(std::memory_order_relaxed); f >= 0) {
    Choice c;
    c.index = f;
    c.why = "forced by a test";
    c.figures.assign(knob.candidates.size(), 0.0);
    return c;
  }
  State& st = GetState();
  std::unique_lock<std::recursive_mutex> lock(st.mu);
  return Decide(st, lock, knob);
}

absl::StatusOr<Choice> MeasureNow(const Knob& knob) {
  State& st = GetState();
  std::unique_lock<std::recursive_mutex> lock(st.mu);
  absl::StatusOr<Line> line;
  {
    Measuring measuring(st, lock);
    line = Measure(knob);
  }
  DT_RETURN_IF_ERROR(line.status());
  return FromLine(knob, *line, "measured");
}

absl::StatusOr<Choice> Remeasure(const Knob& knob) {
  State& st = GetState();
  std::unique_lock<std::recursive_mutex> lock(st.mu);
  Choice c;
  {
    Measuring measuring(st, lock);
    c = MeasureAndRecord(knob, /*reuse_cached=*/false);
  }
  st.choices[&knob] = c;
  knob.picked.store(c.index, std::memory_order_release);
  return c;
}

std::string CachePath() {
  std::string dir;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x == '/') {
    dir = x;
  } else if (const char* h = std::getenv("HOME"); h != nullptr && *h == '/') {
    dir = absl::StrCat(h, "/.cache");
  } else {
    return "";
  }
  // FNV-1a of the key: one file per machine and library versions.
  uint64_t hash = 1469598103934665603ull;
  for (const char c : CacheKey()) hash = (hash ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return absl::StrFormat("%s/dtensor/tuning-%016x.txt", dir, hash);
}

absl::StatusOr<std::vector<std::pair<const Knob*, int>>> ParseTuneEnv(const char* value) {
  std::vector<std::pair<const Knob*, int>> out;
  if (value == nullptr || *value == '\0') return out;
  std::vector<std::string> names;
  for (const Knob* k : AllKnobs()) names.push_back(k->name);
  for (absl::string_view part : absl::StrSplit(value, ',')) {
    const std::vector<std::string> kv = absl::StrSplit(part, absl::MaxSplits('=', 1));
    const Knob* knob = nullptr;
    for (const Knob* k : AllKnobs()) {
      if (kv[0] == k->name) knob = k;
    }
    if (knob == nullptr || kv.size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "DT_TUNE='", value, "': '", part, "' is not knob=candidate with a knob of ", absl::StrJoin(names, ", "),
          " (dtensor calibrate lists them)"));
    }
    const auto it = std::find(knob->candidates.begin(), knob->candidates.end(), kv[1]);
    if (it == knob->candidates.end()) {
      return absl::InvalidArgumentError(absl::StrCat("DT_TUNE='", value, "': ", knob->name, " takes one of ",
                                                     absl::StrJoin(knob->candidates, ", "), ", not '",
                                                     kv[1], "'"));
    }
    out.emplace_back(knob, static_cast<int>(it - knob->candidates.begin()));
  }
  return out;
}

void SetLoadForTesting(std::optional<double> load_per_core) {
  load_for_testing.store(load_per_core.value_or(-1), std::memory_order_relaxed);
}

void ForceForTesting(const Knob& knob, std::optional<int> index) {
  knob.forced.store(index.has_value() ? *index : -1, std::memory_order_relaxed);
}

void ResetForTesting() {
  State& st = GetState();
  std::lock_guard<std::recursive_mutex> lock(st.mu);
  st.env_read = false;
  st.choices.clear();
  for (const Knob* k : AllKnobs()) k->picked.store(-1, std::memory_order_release);
}

// Note [Last-level cache]
// The last-level cache a core shares is what a trial must outgrow, and the kernel's sysfs says it:
// the largest level in /sys/devices/system/cpu/cpuN/cache/index*/ (size "32768K"). glibc's
// sysconf(_SC_LEVEL3_CACHE_SIZE) is computed from cpuid and on the AMD EPYC VM reports 320 MiB,
// the package's L3 over all its core complexes, where its cores share 32 MiB: trials eight times
// too large (2.7 GiB for `dtensor calibrate`). sysconf stays the fallback where sysfs has no
// cache entries (some containers).
int64_t LastLevelCacheBytes() {
  int64_t best_level = 0, bytes = 0;
  const int cpu = std::max(::sched_getcpu(), 0);
  for (int i = 0; i < 16; ++i) {
    const std::string dir = absl::StrCat("/sys/devices/system/cpu/cpu", cpu, "/cache/index", i, "/");
    std::ifstream level_file(dir + "level"), size_file(dir + "size");
    int64_t level = 0;
    std::string size;
    if (!(level_file >> level) || !(size_file >> size) || size.empty()) break;
    int64_t unit = 1;
    if (size.back() == 'K') unit = int64_t{1} << 10;
    if (size.back() == 'M') unit = int64_t{1} << 20;
    if (unit > 1) size.pop_back();
    int64_t value = 0;
    if (absl::SimpleAtoi(size, &value) && level >= best_level) best_level = level, bytes = value * unit;
  }
  if (bytes > 0) return bytes;
#if defined(_SC_LEVEL3_CACHE_SIZE)
  bytes = ::sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (bytes <= 0) bytes = ::sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
  return std::max<int64_t>(bytes, 0);
}

int64_t ColdBytes() {
  static const int64_t llc = LastLevelCacheBytes();
  return std::clamp<int64_t>(2 * llc, int64_t{64} << 20, int64_t{512} << 20);
}

}  // namespace dt::ops::cpu::tune
