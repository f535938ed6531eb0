// gradwire RPC: everything a program needs to run functions on other workers.
// See rpc/api.h for the API and rpc/agent.h for the model behind it.
#pragma once

#include "core/future.h"
#include "rpc/agent.h"
#include "rpc/api.h"
#include "rpc/function_table.h"
#include "rpc/ivalue.h"
#include "rpc/rref.h"
