// Weights' layouts kept per process under a budget.
//
// Note [Kept weights]
// Some products rearrange their weights before they multiply them: the quantized GEMM decodes a
// weight's blocks into panels (Note [Packed quantized weights] in qgemm.cc), oneDNN's matmul
// reorders a plain weight into the blocked layout its kernels read (Note [oneDNN weights layout]
// in gemm_dnnl.cc). Doing it on every call costs a pass over the weight per product; a process
// that runs the same weights again and again (a model) may instead keep each rearranged layout,
// made at its first product. Layouts come beside the weights, not instead of them (other paths,
// decode among them, read the original), so they cost memory, and only where the process asks:
// one budget of bytes for all kinds (SetBudget, or DT_QGEMM_PACKED_MB=<MiB> in the environment,
// `dtensor serve --packed-weights-mb`; 0, the default, keeps none). A layout that does not fit is
// made per call as before, so the budget bounds the memory and never refuses a product.
// Lifetime: an entry holds the weight's Storage and is keyed by its address (with whatever else the
// layout depends on), so the address cannot be reused by another weight while the entry lives; an
// entry whose weight only the cache still holds is dropped at the next miss. The weights must not
// change after their first product (each caller says which of its operands qualify). Making is
// thread-safe: the first caller makes the layout, concurrent ones wait for it (std::call_once).

#include "dtensor/ops/local/cpu/kept_weights.h"

#include <algorithm>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "dtensor/core/env.h"

namespace dt::ops::cpu::kept {

namespace {

struct Entry {
  Storage weight;  // keeps the address from being reused while the layout lives
  int64_t bytes = 0;
  Storage layout;  // undefined if making it failed
  std::once_flag made;
};

struct Kept {
  std::mutex mu;
  int64_t budget = -1;  // -1: not read from the environment yet
  int64_t held = 0;
  std::unordered_map<std::string, std::shared_ptr<Entry>> entries;

  // Under mu.
  int64_t Budget() {
    if (budget < 0) {
      // A bad value is an error of making a world (env::CheckAll); here it keeps nothing.
      absl::StatusOr<std::optional<int64_t>> mib = env::Int("DT_QGEMM_PACKED_MB");
      budget = mib.ok() ? mib->value_or(0) << 20 : 0;
    }
    return budget;
  }
};

Kept& State() {
  static Kept* kept = new Kept;  // reachable until exit; never torn down under a caller
  return *kept;
}

}  // namespace

Storage Layout(const Storage& weight, const std::string& key, int64_t bytes,
               absl::FunctionRef<bool(void* out)> make) {
  Kept& st = State();
  std::shared_ptr<Entry> entry;
  {
    std::lock_guard<std::mutex> lock(st.mu);
    if (st.Budget() == 0) return Storage();
    if (const auto it = st.entries.find(key); it != st.entries.end()) entry = it->second;
    if (entry == nullptr) {
      std::erase_if(st.entries, [&](const auto& kv) {
        if (kv.second->weight.use_count() > 1) return false;
        st.held -= kv.second->bytes;
        return true;
      });
      if (st.held + bytes > st.budget) return Storage();
      entry = std::make_shared<Entry>();
      entry->weight = weight;
      entry->bytes = bytes;
      st.held += bytes;
      st.entries.emplace(key, entry);
    }
  }
  std::call_once(entry->made, [&] {
    absl::StatusOr<Storage> buf = Storage::Allocate(entry->bytes, kCPU);
    if (buf.ok() && make(buf->data())) entry->layout = *std::move(buf);
  });
  return entry->layout;
}

bool Keeping() {
  Kept& st = State();
  std::lock_guard<std::mutex> lock(st.mu);
  return st.Budget() > 0;
}

void SetBudget(int64_t bytes) {
  Kept& st = State();
  std::lock_guard<std::mutex> lock(st.mu);
  st.budget = std::max<int64_t>(0, bytes);
  if (st.budget == 0) {  // layouts in use by a running product stay alive through their Storage
    st.entries.clear();
    st.held = 0;
  }
}

int64_t Bytes() {
  Kept& st = State();
  std::lock_guard<std::mutex> lock(st.mu);
  return st.held;
}

}  // namespace dt::ops::cpu::kept
