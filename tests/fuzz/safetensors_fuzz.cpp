// libFuzzer harness: arbitrary bytes as a whole safetensors file. The reader either returns a
// table whose every view lies inside the image, or throws FormatError.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "common/errors.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const torchtpu::SafetensorsTable table = torchtpu::parse_safetensors(data, size, "fuzz");
    for (const auto& [name, view] : table.tensors) {
      // A view outside the image would be read by the loader later: that is a finding.
      if (view.data < data || view.nbytes > size || view.data + view.nbytes > data + size) {
        std::abort();
      }
    }
  } catch (const torchtpu::FormatError&) {
  }
  return 0;
}
