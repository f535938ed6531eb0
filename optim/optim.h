// Everything in optim: the Optimizer base (optim/optimizer.h, with the mental model and an
// example), SGD, Adam, AdamW, Adagrad, RMSprop, make_optimizer and the StepLR schedule.
#pragma once

#include "optim/adagrad.h"
#include "optim/adam.h"
#include "optim/adamw.h"
#include "optim/clip_grad.h"
#include "optim/factory.h"
#include "optim/grad_scaler.h"
#include "optim/lr_scheduler.h"
#include "optim/optimizer.h"
#include "optim/rmsprop.h"
#include "optim/sgd.h"
