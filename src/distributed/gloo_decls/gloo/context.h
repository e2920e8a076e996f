#pragma once
// stub: ProcessGroupGloo::setTimeout (inline) calls gloo::Context::setTimeout,
// which libtorch_cpu.so exports. Declaration mirrors upstream gloo/context.h
// (unchanged 2017..2025) so the layout is right should anything touch it.
#include <chrono>
#include <cstddef>
#include <memory>
#include <gloo/transport/device.h>
namespace gloo {
class Context {
 public:
  Context(int rank, int size, int base = 2);
  virtual ~Context();
  const int rank;
  const int size;
  int base;
  std::shared_ptr<transport::Device>& getDevice();
  std::unique_ptr<transport::Pair>& getPair(int i);
  std::unique_ptr<transport::UnboundBuffer> createUnboundBuffer(void* ptr, size_t size);
  int nextSlot(int numToSkip = 1);
  void closeConnections();
  void setTimeout(std::chrono::milliseconds timeout);
  std::chrono::milliseconds getTimeout() const;
 protected:
  std::shared_ptr<transport::Device> device_;
  std::shared_ptr<transport::Context> transportContext_;
  int slot_;
  std::chrono::milliseconds timeout_;
};
} // namespace gloo
