#include "standin_device.h"

#include <ATen/EmptyTensor.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/alloc_cpu.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <sstream>

namespace torchtpu::standin {
namespace {

constexpr auto kType = c10::DeviceType::PrivateUse1;
const c10::Device kDevice(kType, 0);

std::atomic<int64_t> copies{0};
std::atomic<int64_t> scalars{0};
std::mutex record_mutex;
bool recording = false;
std::vector<std::string> record;

// Depth of device kernels on this thread: only the outermost call is the caller's op; the copies
// through the CPU that the fallback makes inside it are the stand-in's own business.
thread_local int depth = 0;

class Nested {
 public:
  Nested() : top_(depth++ == 0) {}
  ~Nested() { --depth; }
  Nested(const Nested&) = delete;
  Nested& operator=(const Nested&) = delete;
  bool top() const { return top_; }

 private:
  bool top_;
};

void describe(std::ostream& out, const c10::IValue& value) {
  if (value.isTensor()) {
    const auto& t = value.toTensor();
    if (!t.defined()) {
      out << "undefined";
      return;
    }
    out << t.scalar_type() << t.sizes() << (t.device().type() == kType ? "" : "@cpu");
  } else if (value.isList()) {
    out << "[";
    const auto list = value.toListRef();
    for (size_t i = 0; i < list.size(); ++i) {
      if (i) out << ", ";
      describe(out, list[i]);
    }
    out << "]";
  } else {
    out << value;
  }
}

void append(const std::string& line) {
  std::lock_guard<std::mutex> lock(record_mutex);
  if (recording) record.push_back(line);
}

void record_op(const std::string& name, const std::vector<c10::IValue>& args) {
  {
    std::lock_guard<std::mutex> lock(record_mutex);
    if (!recording) return;
  }
  std::ostringstream line;
  line << name << "(";
  for (size_t i = 0; i < args.size(); ++i) {
    if (i) line << ", ";
    describe(line, args[i]);
  }
  line << ")";
  append(line.str());
}

// The device's memory is host memory (the allocator below): a CPU tensor over the same bytes.
at::Tensor host_alias(const at::Tensor& t) {
  if (t.device().type() != kType) return t;
  return at::from_blob(t.data_ptr(), t.sizes(), t.strides(), t.options().device(at::kCPU));
}

class Allocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t bytes) override {
    void* data = bytes ? c10::alloc_cpu(bytes) : nullptr;
    return {data, data, &c10::free_cpu, kDevice};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &c10::free_cpu; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

Allocator allocator;

// One device, one default stream: enough for device guards and `.to(device)`.
class Guard final : public c10::impl::DeviceGuardImplInterface {
 public:
  c10::DeviceType type() const override { return kType; }
  c10::Device exchangeDevice(c10::Device) const override { return kDevice; }
  c10::Device getDevice() const override { return kDevice; }
  void setDevice(c10::Device device) const override {
    TORCH_CHECK(device.index() <= 0, kName, " has one device, got index ", device.index());
  }
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  c10::Stream getStream(c10::Device device) const override {
    return c10::Stream(c10::Stream::DEFAULT, device);
  }
  c10::Stream exchangeStream(c10::Stream) const override {
    return c10::Stream(c10::Stream::DEFAULT, kDevice);
  }
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, Guard);

class Hooks final : public at::PrivateUse1HooksInterface {
 public:
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  at::Device getDeviceFromPtr(void*) const override { return kDevice; }
};

Hooks hooks;

struct Registration {
  Registration() {
    c10::register_privateuse1_backend(kName);
    c10::SetAllocator(kType, &allocator);
    at::RegisterPrivateUse1HooksInterface(&hooks);
  }
};

Registration registration;

at::Tensor empty_memory_format(at::IntArrayRef size, std::optional<at::ScalarType> dtype,
                               std::optional<at::Layout>, std::optional<at::Device>,
                               std::optional<bool>, std::optional<at::MemoryFormat> memory_format) {
  Nested nested;
  if (nested.top()) record_op("aten::empty.memory_format", {size, dtype});
  return at::detail::empty_generic(size, &allocator,
                                   c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(at::IntArrayRef size, at::IntArrayRef stride,
                         std::optional<at::ScalarType> dtype, std::optional<at::Layout>,
                         std::optional<at::Device>, std::optional<bool>) {
  Nested nested;
  if (nested.top()) record_op("aten::empty_strided", {size, stride, dtype});
  return at::detail::empty_strided_generic(size, stride, &allocator,
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

at::Tensor as_strided(const at::Tensor& self, at::IntArrayRef size, at::IntArrayRef stride,
                      std::optional<int64_t> storage_offset) {
  Nested nested;
  if (nested.top()) record_op("aten::as_strided", {self, size, stride, storage_offset});
  return at::native::as_strided_tensorimpl(self, size, stride, storage_offset);
}

at::Tensor view(const at::Tensor& self, at::IntArrayRef size) {
  Nested nested;
  if (nested.top()) record_op("aten::view", {self, size});
  return at::native::view(self, size);
}

at::Tensor reshape_alias(const at::Tensor& self, at::IntArrayRef size, at::IntArrayRef stride) {
  Nested nested;
  if (nested.top()) record_op("aten::_reshape_alias", {self, size, stride});
  return at::native::_reshape_alias(self, size, stride);
}

// Grows the storage through the device's allocator (never shrinks it), keeping its bytes.
const at::Tensor& resize(const at::Tensor& self, at::IntArrayRef size,
                         std::optional<at::MemoryFormat> memory_format) {
  Nested nested;
  if (nested.top()) record_op("aten::resize_", {self, size});
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_sizes_contiguous(size);
  const auto needed =
      static_cast<size_t>((impl->storage_offset() + impl->numel()) * self.itemsize());
  auto* storage = impl->unsafe_storage().unsafeGetStorageImpl();
  if (needed > storage->nbytes()) {
    auto grown = allocator.allocate(needed);
    if (storage->nbytes()) std::memcpy(grown.get(), storage->data(), storage->nbytes());
    storage->set_data_ptr_noswap(std::move(grown));
    storage->set_nbytes(needed);
  }
  if (memory_format) impl->empty_tensor_restride(*memory_format);
  return self;
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  Nested nested;
  if (nested.top()) {
    record_op("aten::_copy_from", {self, dst, non_blocking});
    if (self.device().type() == kType && dst.device().type() == at::kCPU) ++copies;
  }
  if (self.numel() > 0) host_alias(dst).copy_(host_alias(self));
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  Nested nested;
  if (nested.top()) {
    record_op("aten::_copy_from_and_resize", {self, dst});
    if (self.device().type() == kType && dst.device().type() == at::kCPU) ++copies;
  }
  dst.resize_(self.sizes());
  if (self.numel() > 0) host_alias(dst).copy_(host_alias(self));
  return dst;
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  Nested nested;
  if (nested.top()) {
    record_op("aten::_local_scalar_dense", {self});
    ++scalars;
  }
  return at::_local_scalar_dense(host_alias(self));
}

void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  Nested nested;
  if (nested.top()) {
    const auto& schema = op.schema();
    const auto args = torch::jit::last(*stack, schema.arguments().size());
    std::string name = schema.name();
    if (!schema.overload_name().empty()) name += "." + schema.overload_name();
    record_op(name, std::vector<c10::IValue>(args.begin(), args.end()));
  }
  at::native::cpu_fallback(op, stack);
}

}  // namespace

HostReads host_reads() { return {copies.load(), scalars.load()}; }

void reset_host_reads() {
  copies = 0;
  scalars = 0;
}

void start_recording() {
  std::lock_guard<std::mutex> lock(record_mutex);
  record.clear();
  recording = true;
}

void mark() { append("|"); }

std::vector<std::string> stop_recording() {
  std::lock_guard<std::mutex> lock(record_mutex);
  recording = false;
  return std::exchange(record, {});
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", &empty_memory_format);
  m.impl("empty_strided", &empty_strided);
  m.impl("as_strided", &as_strided);
  m.impl("view", &view);
  m.impl("_reshape_alias", &reshape_alias);
  m.impl("resize_", &resize);
  m.impl("_copy_from", &copy_from);
  m.impl("_copy_from_and_resize", &copy_from_and_resize);
  m.impl("_local_scalar_dense", &local_scalar_dense);
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>());
}

}  // namespace torchtpu::standin
