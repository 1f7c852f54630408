// A stand-in out-of-tree device for tests: PrivateUse1 registered as "standin", with an
// allocator, a device guard, hooks, and a boxed fallback that runs every other ATen op through
// the CPU (at::native::cpu_fallback) while tensors stay on the device. The engine meets the
// dispatcher path TorchTPU gives it, and the device counts what a real accelerator pays for:
// host reads (device->host copies and scalar reads) and the sequence of ops each step runs.
// Loading the library registers the device; nothing here is part of the shipped module.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

namespace torchtpu::standin {

// The name the device answers to: at::Device("standin"), torch.device("standin").
inline constexpr const char* kName = "standin";

// Host reads made by the caller's code since the last reset (the fallback's own copies through
// the CPU are not the caller's and are not counted).
struct HostReads {
  int64_t copies = 0;   // device -> host copies: .cpu(), .to(kCPU), copy_ into a CPU tensor
  int64_t scalars = 0;  // scalar reads: .item(), _local_scalar_dense
  int64_t total() const { return copies + scalars; }
};

HostReads host_reads();
void reset_host_reads();

// While recording, every op the caller dispatches to the device is appended as one line:
// "name(arg, arg, ...)" with tensors as dtype[sizes] and other arguments by value. mark() appends
// the line "|" so a test can cut the record into steps.
void start_recording();
void mark();
std::vector<std::string> stop_recording();

}  // namespace torchtpu::standin
