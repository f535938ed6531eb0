#include "core/storage.h"

#include "core/backend.h"

namespace gw {

std::shared_ptr<Storage> Storage::allocate(size_t nbytes, Device device) {
  return backend_for(device.type, "allocate").allocate(nbytes, device);
}

std::shared_ptr<Storage> Storage::wrap(void* data, size_t nbytes, Device device,
                                       Deleter deleter) {
  return std::make_shared<Storage>(data, nbytes, device, deleter);
}

}  // namespace gw
