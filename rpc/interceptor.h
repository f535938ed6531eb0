// Where the layers that ride on RPC plug in: an Interceptor sees every request and response
// this worker sends and receives, and may rewrite it.
//
// The agent keeps an ordered list of them: the RRef protocol (RRefContext: RRefs in outgoing
// values become forks, forks in incoming values become RRefs) and, when the program links it,
// distributed autograd (AutogradHook: a message sent inside a context carries the context and
// its send function; the receiver attaches the recv function). Nothing else of the agent knows
// about either. For one message:
//
//   sending    outgoing() of each, in order    on the sending thread, before the call is
//                                              registered; a throw undoes the ones before
//   unsent     cancelled() of each, reversed    the message never left (connect failed, timed
//                                              out while queued, socket closed, shutdown)
//   receiving  incoming() of each, in order    one message at a time (the network thread, or a
//                                              shared-memory connection's), in arrival order,
//                                              before the message is routed; a throw fails the
//                                              request (or the call). CUDA tensors are placed on
//                                              their devices afterwards, off the network thread.
//
// A response to a call that timed out meanwhile is still received (kLateResponse) so that the
// RRefs it carries are released; nothing else should happen to it.
#pragma once

#include <cstdint>

#include "rpc/protocol.h"

namespace gw::rpc {

enum class Arrival { kRequest, kResponse, kLateResponse };

class Interceptor {
 public:
  virtual ~Interceptor() = default;
  // `m`, a request or a response, is about to go to worker `to`. `autograd_context` is the
  // distributed autograd context it belongs to (0: none): the caller's for requests that join
  // it (calls, remote(), to_here()), the request's for its response.
  virtual void outgoing(int to, Message& m, uint64_t autograd_context) = 0;
  // `m`, after outgoing(), could not be sent: undo what outgoing() did.
  virtual void cancelled(Message& m) = 0;
  // `m` arrived from worker `from` and is about to be handled.
  virtual void incoming(int from, Message& m, Arrival arrival) = 0;
};

}  // namespace gw::rpc
