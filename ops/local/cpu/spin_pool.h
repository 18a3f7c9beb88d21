// Parallel tasks for the short, frequent kernels of decode (Note [Spinning workers]).
#pragma once

#include <cstdint>

#include "absl/functional/function_ref.h"

namespace dt::ops::cpu {

// Runs fn(i) for every i in [0, n) on up to AvailableThreads() threads (the process's core budget),
// the caller among them, and returns when all have run. Tasks may run in any order and on any of those threads; fn must not throw. A
// call made while another caller's tasks are running (from a task, or from another thread: ranks
// of the threads backend) runs its tasks on the calling thread.
void ParallelTasks(int64_t n, absl::FunctionRef<void(int64_t)> fn);

}  // namespace dt::ops::cpu
