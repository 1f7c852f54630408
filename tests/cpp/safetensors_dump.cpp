// Test tool: `safetensors_dump FILE` prints what our reader sees as JSON (metadata; per tensor
// name, dtype, shape, data address modulo 8, bytes in hex); `safetensors_dump FILE --copy OUT`
// rewrites FILE through write_safetensors. Errors go to stderr with exit status 1.
#include <cstdio>
#include <exception>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "io/safetensors.h"

int main(int argc, char** argv) {
  using namespace torchtpu;
  if (argc != 2 && !(argc == 4 && std::string(argv[2]) == "--copy")) {
    std::cerr << "usage: safetensors_dump FILE [--copy OUT]\n";
    return 2;
  }
  try {
    SafetensorsFile file(argv[1]);
    if (argc == 4) {
      std::vector<TensorToWrite> tensors;
      for (const auto& [name, t] : file.tensors()) {
        tensors.push_back(
            {name, t.dtype, t.shape, std::vector<uint8_t>(t.data, t.data + t.nbytes)});
      }
      write_safetensors(argv[3], tensors, file.metadata());
      return 0;
    }
    nlohmann::json out;
    out["metadata"] = file.metadata();
    out["tensors"] = nlohmann::json::array();
    static const char* kHex = "0123456789abcdef";
    for (const auto& [name, t] : file.tensors()) {
      std::string hex;
      for (size_t i = 0; i < t.nbytes; ++i) {
        hex += kHex[t.data[i] >> 4];
        hex += kHex[t.data[i] & 15];
      }
      out["tensors"].push_back({{"name", name},
                                {"dtype", dtype_name(t.dtype)},
                                {"shape", t.shape},
                                {"numel", t.numel()},
                                {"address_mod_8", reinterpret_cast<uintptr_t>(t.data) % 8},
                                {"hex", hex}});
    }
    std::cout << out.dump() << "\n";
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
  return 0;
}
