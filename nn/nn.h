#pragma once
// The nn layer in one include: modules, layers, tensor-parallel styles, the style registry and
// plans. See docs/nn.md.

#include "nn/attention.h"
#include "nn/init.h"
#include "nn/linear.h"
#include "nn/log.h"
#include "nn/mlp.h"
#include "nn/module.h"
#include "nn/norm.h"
#include "nn/parameter.h"
#include "nn/plan.h"
#include "nn/style.h"
#include "nn/style_registry.h"
#include "nn/styles.h"
#include "nn/value.h"
#include "nn/vops.h"
