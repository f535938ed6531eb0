# The RPC protocol (version 7). Every frame on an RPC connection is
#   prefix (16 bytes: magic "GWR1", u32 header bytes, u64 payload bytes, little endian)
#   header (this Envelope as a Cap'n Proto flat array)
#   payload (the raw bytes of each tensor in `tensors` not shared by IPC handle, in order,
#            contiguous row-major)
# Tensor bytes never pass through Cap'n Proto: they are written from and read into tensor
# storage directly. Values refer to tensors by their index in `tensors`. Every message, the RRef
# protocol's and distributed autograd's included, is one variant of the envelope's body with
# named fields; a receiver dispatches on the variant, never on a name.
@0xd3b5f2a1c4e69b07;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("gw::rpc::wire");

struct TensorMeta {
  dtype @0 :UInt8;           # gw::DType
  sizes @1 :List(Int64);     # the payload holds numel * itemsize bytes for it
  requiresGrad @2 :Bool;
  device @3 :Int16 = -1;     # the receiver's CUDA device to place it on; -1: the CPU
  shared @4 :SharedCudaTensor; # on one host: the sender's device memory, and no payload bytes
}

struct SharedCudaTensor {    # core/ipc.h
  memory @0 :Data;           # cudaIpcMemHandle_t (64 bytes) of a snapshot of the tensor
  offset @1 :UInt64;         # of the tensor's first byte in that allocation
}

struct DevicePair {          # a CUDA device of the sender and the receiver's it maps to
  from @0 :Int16;
  to @1 :Int16;
}

struct Value {
  union {
    none @0 :Void;
    boolean @1 :Bool;
    int @2 :Int64;
    float @3 :Float64;
    text @4 :Text;
    tensor @5 :UInt32;       # index into Envelope.tensors
    list @6 :List(Value);    # vectors, tuples, pairs
    bytes @7 :Data;          # user types (gw::rpc::Serializer)
    rref @8 :RRefFork;       # a new reference to a value owned by `owner`
  }
}

struct Id {
  worker @0 :Int32;
  local @1 :Int64;
}

struct RRefFork {
  owner @0 :Int32;
  rrefId @1 :Id;
  forkId @2 :Id;
  parent @3 :Int32;          # the sender, which keeps the value alive until this is accepted
}

struct Handshake {
  protocolVersion @0 :UInt32;
  workerName @1 :Text;
  workerId @2 :Int32;
  deviceMap @3 :List(DevicePair);  # where the sender's CUDA tensors go on the receiver
  shm @4 :SharedMemory;            # a connection within one host (protocol.h SharedMemory)
  cudaIpcReleased @5 :List(UInt64); # leases whose shared CUDA tensors the receiver copied
}

struct SharedMemory {
  step @0 :UInt8;            # offer, accept, decline, switch
  host @1 :Text;
  pid @2 :Int32;
  fd @3 :Int32;
  ringBytes @4 :UInt64;
  token @5 :Data;
}

struct Failure {
  worker @0 :Text;           # where it was raised
  message @1 :Text;
  code @2 :UInt16;           # gw::ErrorCode
}

struct Response {
  union {
    value @0 :Value;
    error @1 :Failure;
  }
}

# A request or response sent inside a distributed autograd context.
struct AutogradInfo {
  contextId @0 :UInt64;
  messageId @1 :UInt64;      # the send function recorded for its tensors; 0: none
}

# --- requests: each is answered by one Response with the same envelope id --------------------

struct Call {                # run a function of the callee's function table
  function @0 :Text;
  args @1 :List(Value);
}

struct RRefCreate {          # remote(): run `function`; the callee owns the result
  rrefId @0 :Id;
  forkId @1 :Id;             # the caller's reference, registered before the function runs
  function @2 :Text;
  args @3 :List(Value);
}

struct RRefIds {             # one fork of one value
  rrefId @0 :Id;
  forkId @1 :Id;
}

struct AutogradGradients {   # the gradients of one send function, in one backward pass
  contextId @0 :UInt64;
  messageId @1 :UInt64;      # the send function
  passId @2 :UInt64;
  retainGraph @3 :Bool;
  grads @4 :List(Value);     # one per tensor the send function recorded: a tensor or none
  returned @5 :Bool;         # sent back to the worker that engaged the sender (engine.h)
  smart @6 :Bool;            # the pass runs in SMART mode
}

struct AutogradDiscover {    # SMART mode: send functions on the backward path of a pass
  contextId @0 :UInt64;
  passId @1 :UInt64;
  retainGraph @2 :Bool;
  messageIds @3 :List(UInt64);
  closed @4 :Bool;           # every send function not yet found is off the path
}

struct AutogradBackward {    # RRef::backward: run a backward pass from the value on its owner
  rref @0 :RRefFork;
  contextId @1 :UInt64;      # 0: local autograd on the owner
  retainGraph @2 :Bool;
}

struct Envelope {
  id @0 :UInt64;             # pairs a response with its request
  tensors @1 :List(TensorMeta);
  body :union {
    # The handshake stays the union's first member at ordinal 2, in every version, so that a
    # peer of another version reads its protocolVersion and is refused by name.
    handshake @2 :Handshake;
    call @3 :Call;
    response @4 :Response;
    rrefCreate @6 :RRefCreate;
    rrefFetch @7 :Id;        # to_here(): the value of the owned RRef with this id
    rrefFork @8 :RRefIds;    # a user passed the value on: the owner records the new fork
    rrefAccept @9 :Id;       # to the parent: the owner knows its child fork (this fork id)
    rrefDelete @10 :RRefIds; # a reference is gone
    autogradGradients @11 :AutogradGradients;
    autogradRelease @12 :List(UInt64);  # distributed autograd contexts that are over
    autogradBackward @13 :AutogradBackward;
    autogradDiscover @14 :AutogradDiscover;
  }
  autograd @5 :AutogradInfo; # absent outside a context
  cudaIpcLease @15 :UInt64;  # nonzero: tensors shared by IPC handle, kept until released
}
