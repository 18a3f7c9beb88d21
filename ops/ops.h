#pragma once
// All of dt::ops, the one public op namespace: every op (Linear, Add, Silu, Softmax, Cat, ...) is an
// overload set over three kinds of argument, picked by the argument types:
//
//   Tensor    ops/local/ops.h     the local kernels on whole tensors (CPU or CUDA)
//   DTensor   ops/dtensor_ops.h   sharding propagation, redistribution, the local kernel per rank
//   Value     ops/value_ops.h     a DTensor or a local tensor (ops/value.h): what layers use
//
// An exact Tensor or DTensor argument picks its own overload; anything else that converts to Value
// (a Value, a Tensor mixed with a Value) picks the Value one. Everything under dt::ops::internal
// (call builders, rules, dispatch) is the machinery behind them and is never named by users.

#include "dtensor/ops/dtensor_ops.h"  // IWYU pragma: export
#include "dtensor/ops/local/ops.h"    // IWYU pragma: export
#include "dtensor/ops/value.h"        // IWYU pragma: export
#include "dtensor/ops/value_ops.h"    // IWYU pragma: export
