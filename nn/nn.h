// gradwire nn — everything: Module, the layers, functional and init. See nn/module.h for the
// mental model and an example.
#pragma once

#include "nn/activation.h"
#include "nn/attention.h"
#include "nn/container.h"
#include "nn/conv.h"
#include "nn/dropout.h"
#include "nn/embedding.h"
#include "nn/flatten.h"
#include "nn/functional.h"
#include "nn/init.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "nn/normalization.h"
#include "nn/pooling.h"
#include "nn/transformer.h"
