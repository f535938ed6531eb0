#include "dist/process_group/init_process_group.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "core/trace.h"
#include "debug/flight_recorder.h"
#include "dist/process_group/debug_process_group.h"
#include "store/launch_env.h"
#include "store/net_address.h"
#include "store/prefix_store.h"
#include "store/rendezvous.h"

namespace gw::dist {

namespace {
// The process's default group, like the agent of init_rpc: what the free functions act on.
struct Default {
  std::mutex mu;
  std::shared_ptr<ProcessGroup> group;
  std::shared_ptr<store::Store> store;
  int groups_made = 0;  // names each new_group's part of the store
  std::string address;  // where the default group's Gloo pairs listen; new_group's too
};
Default& state() {
  static Default d;
  return d;
}

void check_backend(const std::string& backend) {
  std::string choices = "CPU: \"gloo\"";
  bool known = backend == "gloo";
#ifdef GW_HAVE_MPI
  known = known || backend == "mpi";
  choices += ", \"mpi\"";
#else
  choices += " (this build has no MPI)";
#endif
#ifdef GW_HAVE_NCCL
  known = known || backend == "nccl";
  choices += "; CUDA: \"nccl\"";
#else
  choices += "; this build has no NCCL";
#endif
  GW_CHECK(known, InvalidArgumentError, "[init_process_group] backend '", backend,
           "' is not available (", choices, ")");
  GW_CHECK(!is_initialized(), StateError,
           "[init_process_group] the default process group exists already");
  distributed_debug_level();  // a bad GW_DISTRIBUTED_DEBUG fails here, before connecting
}

// The group `name` over `store`; with GW_DISTRIBUTED_DEBUG=DETAIL, checked (debug_process_group.h).
std::shared_ptr<ProcessGroup> make_group([[maybe_unused]] const std::string& backend,
                                         const std::string& name,
                                         std::shared_ptr<store::Store> store, int rank, int size,
                                         Milliseconds timeout, const std::string& address) {
  std::shared_ptr<ProcessGroup> group;
#ifdef GW_HAVE_NCCL
  if (backend == "nccl")
    group = std::make_shared<ProcessGroupNCCL>(store, rank, size,
                                               NcclOptions{.timeout = timeout, .group_name = name});
#endif
  if (!group)
    group = std::make_shared<ProcessGroupGloo>(
        store, rank, size,
        GlooOptions{.timeout = timeout, .hostname = address, .group_name = name});
  if (distributed_debug_level() == DebugLevel::kDetail)
    group = std::make_shared<DebugProcessGroup>(
        std::move(group), std::make_shared<store::PrefixStore>("gw_debug", std::move(store)),
        timeout);
  return group;
}
// GW_GLOO_HOSTNAME chose Gloo's address before GW_SOCKET_IFNAME: a job still setting it must
// not silently get another address.
void check_no_gloo_hostname() {
  const char* old = std::getenv("GW_GLOO_HOSTNAME");
  GW_CHECK(old == nullptr || *old == '\0', InvalidArgumentError,
           "[init_process_group] GW_GLOO_HOSTNAME (", old,
           ") is no longer read: Gloo listens on the address that routes to the master; set "
           "GW_SOCKET_IFNAME to name the interface instead");
}

// Makes `group` the default group; `store` and `address` are new_group's.
std::shared_ptr<ProcessGroup> install(std::shared_ptr<ProcessGroup> group,
                                      std::shared_ptr<store::Store> store,
                                      const std::string& address) {
  auto& s = state();
  std::lock_guard lock(s.mu);
  GW_CHECK(!s.group, StateError, "[init_process_group] the default process group exists already");
  s.store = std::move(store);
  s.group = group;
  s.groups_made = 0;
  s.address = address;
  return group;
}

// Makes the default group over `store`, its pairs listening on `address`.
std::shared_ptr<ProcessGroup> start(const std::string& backend, std::shared_ptr<store::Store> store,
                                    int rank, int world_size, Milliseconds timeout,
                                    const std::string& address) {
  // Connecting takes as long as the slowest rank: not under the lock.
  debug::set_identity(rank, "");
  trace::set_process(rank, "");
  auto group =
      make_group(backend, "default_pg", std::make_shared<store::PrefixStore>("default_pg", store),
                 rank, world_size, timeout, address);
  return install(std::move(group), std::move(store), address);
}

// The default group over MPI: MPI knows the ranks, no store or rendezvous is needed. A rank and
// world size given (>= 0) must be MPI's.
std::shared_ptr<ProcessGroup> start_mpi([[maybe_unused]] int rank, [[maybe_unused]] int world_size,
                                        [[maybe_unused]] Milliseconds timeout) {
#ifdef GW_HAVE_MPI
  auto group =
      std::make_shared<ProcessGroupMPI>(MpiOptions{.timeout = timeout, .group_name = "default_pg"});
  GW_CHECK(rank < 0 || (rank == group->rank() && world_size == group->size()), InvalidArgumentError,
           "[init_process_group] rank ", rank, " of ", world_size,
           " was given, but MPI says this is rank ", group->rank(), " of ", group->size());
  if (distributed_debug_level() == DebugLevel::kDetail)
    std::fprintf(stderr,
                 "[init_process_group] GW_DISTRIBUTED_DEBUG=DETAIL compares collectives through "
                 "a store, which the mpi backend has none of: not checked\n");
  debug::set_identity(group->rank(), "");
  trace::set_process(group->rank(), "");
  return install(std::move(group), nullptr, "");
#else
  throw StateError("[init_process_group] this build has no MPI");
#endif
}

}  // namespace

#ifndef GW_HAVE_NCCL
bool nccl_available(std::string* why) {
  if (why) *why = "this build has no NCCL (the nccl feature found no CUDA toolkit or NCCL)";
  return false;
}
#endif
#ifndef GW_HAVE_MPI
bool mpi_available(std::string* why) {
  if (why) *why = "this build has no MPI (the mpi feature found no OpenMPI: libopenmpi-dev)";
  return false;
}
#endif

std::shared_ptr<ProcessGroup> init_process_group(const std::string& backend,
                                                 const std::string& init_method, int rank,
                                                 int world_size, Milliseconds timeout) {
  check_backend(backend);
  if (backend == "mpi") return start_mpi(rank, world_size, timeout);
  check_no_gloo_hostname();
  const std::string address = store::address_toward_master(init_method, "init_process_group");
  return start(backend, store::rendezvous(init_method, rank, world_size), rank, world_size, timeout,
               address);
}

std::shared_ptr<ProcessGroup> init_process_group(const std::string& backend, Milliseconds timeout) {
  if (backend == "mpi") {
    check_backend(backend);
    return start_mpi(-1, -1, timeout);
  }
  const store::LaunchEnv env = store::detect_launch_env();
  return init_process_group(backend, env.init_method(), env.rank, env.world_size, timeout);
}

std::shared_ptr<ProcessGroup> init_process_group(const std::string& backend,
                                                 std::shared_ptr<store::Store> store, int rank,
                                                 int world_size, Milliseconds timeout) {
  check_backend(backend);
  if (backend == "mpi") return start_mpi(rank, world_size, timeout);
  check_no_gloo_hostname();
  return start(backend, std::move(store), rank, world_size, timeout,
               store::default_address("init_process_group"));
}

std::shared_ptr<ProcessGroup> default_process_group() {
  auto& s = state();
  std::lock_guard lock(s.mu);
  GW_CHECK(s.group, StateError,
           "[process_group] the default process group is not initialized: call "
           "init_process_group first");
  return s.group;
}

void monitored_barrier(Milliseconds timeout) {
  default_process_group()->monitored_barrier(timeout);
}

bool is_initialized() {
  auto& s = state();
  std::lock_guard lock(s.mu);
  return s.group != nullptr;
}

void destroy_process_group() {
  auto& s = state();
  std::lock_guard lock(s.mu);
  s.group.reset();
  s.store.reset();
}

namespace {
template <typename T>
std::string joined(const std::vector<T>& items, const char* between) {
  std::string out;
  for (const T& item : items) out += (out.empty() ? "" : between) + gw::detail::str(item);
  return out;
}
}  // namespace

DeviceMesh init_device_mesh(std::vector<int> shape, std::vector<std::string> names,
                            Milliseconds timeout) {
  auto world = default_process_group();
  int product = 1;
  for (int n : shape) product *= n;
  GW_CHECK(!shape.empty() && shape.size() == names.size() && product == world->size() &&
               *std::min_element(shape.begin(), shape.end()) >= 1,
           InvalidArgumentError, "[init_device_mesh] a mesh of ", shape.size(), " dims (",
           joined(shape, " x "), ") named ", names.size(), " times for ", world->size(),
           " ranks: give one name per dim, and dims whose product is the world size");
  for (size_t d = 0; d < names.size(); ++d)
    for (size_t e = d + 1; e < names.size(); ++e)
      GW_CHECK(names[d] != names[e], InvalidArgumentError, "[init_device_mesh] the dim name \"",
               names[d], "\" is given twice");
  DeviceMesh mesh;
  mesh.shape_ = std::move(shape);
  mesh.names_ = std::move(names);
  const size_t dims = mesh.shape_.size();
  // Row-major: the last dim's stride is 1.
  std::vector<int> stride(dims, 1);
  for (size_t d = dims - 1; d > 0; --d) stride[d - 1] = stride[d] * mesh.shape_[d];
  for (size_t d = 0; d < dims; ++d)
    mesh.coordinates_.push_back(world->rank() / stride[d] % mesh.shape_[d]);
  // Every rank makes every group, in one order: dim by dim, each line of ranks along it by its
  // first rank.
  for (size_t d = 0; d < dims; ++d) {
    std::shared_ptr<ProcessGroup> mine;
    for (int first = 0; first < world->size(); ++first) {
      if (first / stride[d] % mesh.shape_[d] != 0) continue;  // not the start of a line
      std::vector<int> line;
      for (int i = 0; i < mesh.shape_[d]; ++i) line.push_back(first + i * stride[d]);
      if (auto g = new_group(line, timeout)) mine = std::move(g);
    }
    mesh.groups_.push_back(std::move(mine));
  }
  return mesh;
}

size_t DeviceMesh::dim(const std::string& name) const {
  auto it = std::find(names_.begin(), names_.end(), name);
  GW_CHECK(it != names_.end(), InvalidArgumentError, "[DeviceMesh] no dim named \"", name,
           "\" (the mesh's: ", joined(names_, ", "), ")");
  return static_cast<size_t>(it - names_.begin());
}

std::shared_ptr<ProcessGroup> DeviceMesh::group(const std::string& name) const {
  return groups_[dim(name)];
}

int DeviceMesh::coordinate(const std::string& name) const { return coordinates_[dim(name)]; }

std::shared_ptr<ProcessGroup> new_group(std::vector<int> ranks, Milliseconds timeout) {
  auto world = default_process_group();
  std::sort(ranks.begin(), ranks.end());
  GW_CHECK(!ranks.empty(), InvalidArgumentError, "[new_group] no ranks given");
  auto dup = std::adjacent_find(ranks.begin(), ranks.end());
  GW_CHECK(dup == ranks.end(), InvalidArgumentError, "[new_group] rank ", *dup, " is listed twice");
  GW_CHECK(ranks.front() >= 0 && ranks.back() < world->size(), InvalidArgumentError,
           "[new_group] rank ", ranks.front() < 0 ? ranks.front() : ranks.back(),
           " is outside [0, ", world->size(), ")");
  std::shared_ptr<store::Store> store;
  std::string address;
  int index;
  {
    auto& s = state();
    std::lock_guard lock(s.mu);
    store = s.store;
    address = s.address;
    index = s.groups_made++;
  }
  const std::string name = "group" + std::to_string(index);
#ifdef GW_HAVE_MPI
  if (auto mpi = std::dynamic_pointer_cast<ProcessGroupMPI>(world))
    return mpi->subgroup(ranks, {.timeout = timeout, .group_name = name});
#endif
  auto me = std::find(ranks.begin(), ranks.end(), world->rank());
  if (me == ranks.end()) return nullptr;
  return make_group(world->backend(), name, std::make_shared<store::PrefixStore>(name, store),
                    static_cast<int>(me - ranks.begin()), static_cast<int>(ranks.size()), timeout,
                    address);
}

}  // namespace gw::dist
