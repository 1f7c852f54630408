// Memory-mapped safetensors files, validated strictly: every way a file can be wrong is a
// FormatError naming the file, the tensor and what is wrong. Torch-free: tensors are byte views.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace torchtpu {

enum class Dtype { kBool, kU8, kI8, kI16, kU16, kF16, kBF16, kI32, kU32, kF32, kF64, kI64, kU64 };

// "BF16" -> kBF16; throws FormatError naming `where` for an unknown string.
Dtype parse_dtype(const std::string& s, const std::string& where);
const char* dtype_name(Dtype d);
size_t dtype_size(Dtype d);

// One tensor inside a mapped file. `data` may be unaligned; it stays valid while the file that
// owns the mapping lives.
struct TensorView {
  std::string name;
  std::string file;  // path of the file that holds it, for error messages
  Dtype dtype;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
  int64_t numel() const;
};

// A digest of tensors' names, dtypes, shapes and first and last 64 bytes, in the order given (by
// name, so that shards do not matter): weights that differ in layout, or in values training
// changes throughout, differ here; computing it touches a page or two per tensor.
uint64_t fingerprint(const std::vector<const TensorView*>& views);

// Drops the view's pages from this process's resident set once its bytes have been copied
// elsewhere (dequantized, converted, moved to a device). The mapping stays valid: a later read
// faults the pages back in from the page cache or the file. Pages shared with a neighbouring
// tensor go too and come back the same way.
void release_pages(const TensorView& view);

// A read-only mapping of one file (RAII). Pages are shared with the page cache.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// The header of a safetensors image (a whole file's bytes in memory), validated: header length
// inside the image, valid JSON, known dtypes, offsets inside the buffer, no overlap or gaps,
// bytes == numel x size. The views point into the image; `path` names it in every FormatError.
struct SafetensorsTable {
  std::map<std::string, TensorView> tensors;
  std::map<std::string, std::string> metadata;
};
SafetensorsTable parse_safetensors(const uint8_t* data, size_t size, const std::string& path);

// One .safetensors file, mapped, its header parsed and validated at open (parse_safetensors).
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  const std::string& path() const { return file_.path(); }
  const std::map<std::string, TensorView>& tensors() const { return table_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return table_.metadata; }

 private:
  MappedFile file_;
  SafetensorsTable table_;
};

// Writes a safetensors file for make-tiny, quantize and tests: header padded with spaces to a
// multiple of 8, tensors in the Rust writer's order (larger dtypes first, then by name) so each
// starts naturally aligned. Throws ValueError when bytes != numel x dtype size.
struct TensorToWrite {
  std::string name;
  Dtype dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

}  // namespace torchtpu
