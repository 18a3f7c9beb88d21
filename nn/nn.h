#pragma once
// The nn layer in one include: modules, layers, tensor-parallel styles, the style registry and
// plans, with the ops the layers are written with (ops/ops.h). See docs/nn.md.

#include "dtensor/nn/attention.h"
#include "dtensor/nn/check.h"
#include "dtensor/nn/expert_parallel.h"
#include "dtensor/nn/init.h"
#include "dtensor/nn/latent_attention.h"
#include "dtensor/nn/linear.h"
#include "dtensor/nn/log.h"
#include "dtensor/nn/mlp.h"
#include "dtensor/nn/module.h"
#include "dtensor/nn/moe.h"
#include "dtensor/nn/norm.h"
#include "dtensor/nn/parameter.h"
#include "dtensor/nn/plan.h"
#include "dtensor/nn/position.h"
#include "dtensor/nn/style.h"
#include "dtensor/nn/style_registry.h"
#include "dtensor/nn/styles.h"
#include "dtensor/ops/ops.h"  // dt::Value and every op (dt::ops)
