// A safetensors file opened for reading parts of it.
//
// Mental model: opening reads and checks only the header (every name, dtype, shape and byte
// range, as load_safetensors does); read() then fetches one tensor, or a range of its elements
// in row-major order, with a positioned read of just those bytes. A job that reshards a
// checkpoint (dist/checkpoint/dist_checkpoint.h) reads from each rank's file only the ranges it
// needs, instead of every file whole.
//
//   gw::SafetensorsFile f("shard.safetensors");
//   const auto& info = f.tensors().at("fc.weight");        // dtype, shape
//   gw::Tensor part = gw::empty({100}, info.dtype);
//   f.read("fc.weight", /*offset=*/200, /*count=*/100, part.raw_data());   // elements 200..299
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "core/tensor.h"

namespace gw {

class SafetensorsFile {
 public:
  struct Info {
    DType dtype;
    Shape shape;
  };

  // Throws IoError naming the path when it cannot be opened or its header is not valid.
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, Info>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Elements [offset, offset + count) of tensor `name`, row-major, into `out` (count times the
  // dtype's size in bytes). Safe from several threads at once. IndexError for an unknown name
  // or a range outside the tensor; IoError when the file cannot be read (it changed under us).
  void read(const std::string& name, int64_t offset, int64_t count, void* out) const;
  // The whole tensor `name`, in a fresh CPU tensor.
  Tensor read(const std::string& name) const;

 private:
  const Info& info(const std::string& name) const;  // IndexError naming an unknown one

  std::string path_;
  int fd_ = -1;
  uint64_t data_start_ = 0;  // file offset of the data section
  std::map<std::string, Info> tensors_;
  std::map<std::string, uint64_t> begins_;  // of each tensor's bytes in the data section
  std::map<std::string, std::string> metadata_;
};

}  // namespace gw
