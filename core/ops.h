// Everything in core: tensors and all their operations. See core/tensor.h for the mental
// model and an example.
#pragma once

#include "core/autocast.h"
#include "core/ops/conv.h"
#include "core/ops/creation.h"
#include "core/ops/elementwise.h"
#include "core/ops/index.h"
#include "core/ops/linalg.h"
#include "core/ops/random_ops.h"
#include "core/ops/reduce.h"
#include "core/ops/shape_ops.h"
#include "core/parallel.h"
#include "core/serialize.h"
#include "core/tensor.h"
