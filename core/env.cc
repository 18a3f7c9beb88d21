#include "dtensor/core/env.h"

#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "dtensor/core/status.h"

namespace dt::env {
namespace {

const std::vector<Var>& Table() {
  static const std::vector<Var> vars = {
      {"DT_BACKEND", Kind::kChoice, 0, 0, "threads,gloo,shm,mpi,nccl",
       "mpi under mpirun, shm under any other launcher, threads with none",
       "the world's collective backend (WorldOptions::backend wins)"},
      {"DT_SHM", Kind::kFlag, 0, 0, "", "1",
       "0: shm becomes gloo (every group on TCP), whoever asked for shm"},
      {"DT_TIMEOUT_MS", Kind::kInt, 1, 86'400'000, "", "300000",
       "the timeout of every collective, group creation and store operation (WorldOptions::timeout wins)"},
      {"DT_VERIFY_COLLECTIVES", Kind::kFlag, 0, 0, "", "on for mpi, off for gloo and nccl; threads and shm always check",
       "1: before each collective all members check that they agree on kind, dtype, op, root and sizes"},
      {"DT_NUM_THREADS", Kind::kInt, 1, 4096, "", "the cores the process may use / the ranks on its node",
       "oneTBB compute threads of each process (WorldOptions::num_threads wins; Note [One core budget per node])"},
      {"DT_JOB_ID", Kind::kId, 0, 0, "", "dtrun's own, else the process id and the time",
       "names the job's shared-memory segments (/dev/shm/dtshm.<id>.*)"},
      {"DT_STORE_FD", Kind::kInt, 0, 1 << 20, "", "unset",
       "set by dtrun for rank 0: the store's listening socket (Note [dtrun holds the store's port])"},
      {"DT_SHM_AREA_KB", Kind::kInt, 64, 64 << 10, "", "512 up to 16 members, less beyond",
       "bytes of one member's area in a shm group's segment, in KiB"},
      {"DT_SHM_SPIN_US", Kind::kInt, 0, 1'000'000, "", "2",
       "microseconds a shm wait spins before it yields"},
      {"DT_SHM_YIELD_US", Kind::kInt, 0, 1'000'000, "", "500",
       "microseconds a shm wait yields before it sleeps on a futex"},
      {"DT_BUFFER_POOL_MB", Kind::kInt, 0, 1 << 20, "", "1024",
       "MiB of freed redistribution buffers kept for reuse (0: none)"},
      {"DT_QGEMM_PACKED_MB", Kind::kInt, 0, 1 << 20, "", "0",
       "MiB of weights' kept layouts for reuse: quantized weights' prefill panels and oneDNN's reordered read-only "
       "weights where the tuner's `gemm.*.dnnl_weights` says `prepacked` (Note [Kept weights] in "
       "ops/local/cpu/kept_weights.cc)"},
      {"DT_CUDA_MODULE_DIR", Kind::kText, 0, 0, "",
       "the program's directory, its ../lib, the build tree's lib/, the install libdir, the loader's path",
       "the only directory searched for libdtensor_cuda.so and libdtensor_nccl.so (Note [CUDA module])"},
      {"DT_TUNE", Kind::kText, 0, 0, "",
       "each kernel knob measured on this CPU at first use and cached (dtensor calibrate lists them)",
       "knob=candidate[,knob=candidate...]: forces CPU kernel choices (Note [Tuner] in ops/local/cpu/tuner.cc)"},
  };
  return vars;
}

const Var& Find(absl::string_view name) {
  for (const Var& v : Table()) {
    if (name == v.name) return v;
  }
  DT_CHECK(false, "environment variable ", name, " is not declared in core/env.cc");
  __builtin_unreachable();
}

std::optional<std::string> Raw(const Var& var) {
  const char* v = std::getenv(var.name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

absl::Status Bad(const Var& var, absl::string_view value) {
  return absl::InvalidArgumentError(absl::StrCat(var.name, "='", value, "': expected ", Accepted(var)));
}

// The value parsed by the table's rule: an integer for kInt and kFlag, the text otherwise.
absl::Status Validate(const Var& var, const std::string& text, int64_t* out) {
  switch (var.kind) {
    case Kind::kInt:
      if (!absl::SimpleAtoi(text, out) || *out < var.min || *out > var.max) return Bad(var, text);
      return absl::OkStatus();
    case Kind::kFlag:
      if (text != "0" && text != "1") return Bad(var, text);
      *out = text == "1";
      return absl::OkStatus();
    case Kind::kChoice:
      for (absl::string_view c : absl::StrSplit(var.choices, ',')) {
        if (c == text) return absl::OkStatus();
      }
      return Bad(var, text);
    case Kind::kId: {
      bool ok = !text.empty() && text.size() <= 64;
      for (char ch : text) ok = ok && (absl::ascii_isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_');
      return ok ? absl::OkStatus() : Bad(var, text);
    }
    case Kind::kText:
      return absl::OkStatus();
  }
  return absl::OkStatus();
}

template <typename T>
absl::StatusOr<std::optional<T>> Read(absl::string_view name, Kind kind) {
  const Var& var = Find(name);
  DT_CHECK(var.kind == kind || (kind == Kind::kText && var.kind != Kind::kInt && var.kind != Kind::kFlag), name,
           " is not read as declared in core/env.cc");
  std::optional<std::string> text = Raw(var);
  if (!text) return std::optional<T>();
  int64_t n = 0;
  DT_RETURN_IF_ERROR(Validate(var, *text, &n));
  if constexpr (std::is_same_v<T, std::string>) {
    return std::optional<T>(*text);
  } else {
    return std::optional<T>(static_cast<T>(n));
  }
}

}  // namespace

const std::vector<Var>& Vars() { return Table(); }

std::string Accepted(const Var& var) {
  switch (var.kind) {
    case Kind::kInt:
      return absl::StrCat("an integer in [", var.min, ", ", var.max, "]");
    case Kind::kFlag:
      return "0 or 1";
    case Kind::kChoice:
      return absl::StrCat("one of ", absl::StrJoin(absl::StrSplit(var.choices, ','), ", "));
    case Kind::kId:
      return "1-64 letters, digits, '-' or '_'";
    case Kind::kText:
      return "any text";
  }
  return "";
}

absl::StatusOr<std::optional<int64_t>> Int(absl::string_view name) { return Read<int64_t>(name, Kind::kInt); }
absl::StatusOr<std::optional<bool>> Flag(absl::string_view name) { return Read<bool>(name, Kind::kFlag); }
absl::StatusOr<std::optional<std::string>> Choice(absl::string_view name) {
  return Read<std::string>(name, Kind::kChoice);
}
absl::StatusOr<std::optional<std::string>> Text(absl::string_view name) { return Read<std::string>(name, Kind::kText); }

absl::Status CheckAll() {
  for (const Var& var : Table()) {
    if (std::optional<std::string> text = Raw(var)) {
      int64_t n = 0;
      DT_RETURN_IF_ERROR(Validate(var, *text, &n));
    }
  }
  return absl::OkStatus();
}

}  // namespace dt::env
