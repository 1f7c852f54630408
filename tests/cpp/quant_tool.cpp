// Drives the quant layer from tests/python/test_quant.py, which checks it against the
// compressed-tensors library:
//   quant_tool dequant DIR OUT.safetensors MODULE... [--dtype bf16|f16|f32] [--rows 3,0,7]
//       writes MODULE = dequantize(read_packed(...)) and, with --rows, MODULE.rows =
//       dequantize_rows(...) of those rows.
//   quant_tool quantize-weight IN.safetensors TENSOR OUT.safetensors [--group G] [--asym]
//       [--scale-dtype f16]   writes weight_packed / weight_scale / [weight_zero_point].
//   quant_tool mismatch DIR   prints quantized_modules_mismatch(...).summary(DIR).
//   quant_tool quantize IN OUT ...   the CLI's quantize command.
#include <CLI/CLI.hpp>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cli/quantize_command.h"
#include "io/aten_view.h"
#include "io/checkpoint.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "quant/pack_quantized.h"
#include "quant/quantize.h"

namespace torchtpu {
namespace {

at::ScalarType parse_float_dtype(const std::string& s) {
  if (s == "bf16") return at::kBFloat16;
  if (s == "f16") return at::kHalf;
  if (s == "f32") return at::kFloat;
  throw ValueError("dtype must be bf16, f16 or f32, got " + s);
}

TensorToWrite to_write(const std::string& name, const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  Dtype d;
  switch (c.scalar_type()) {
    case at::kInt: d = Dtype::kI32; break;
    case at::kLong: d = Dtype::kI64; break;
    case at::kBFloat16: d = Dtype::kBF16; break;
    case at::kHalf: d = Dtype::kF16; break;
    case at::kFloat: d = Dtype::kF32; break;
    default: throw ValueError("unexpected dtype");
  }
  TensorToWrite w{name, d, c.sizes().vec(), {}};
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  w.bytes.assign(p, p + c.nbytes());
  return w;
}

void add_dequant(CLI::App& app) {
  struct Args {
    std::string dir, out, dtype = "f32", rows;
    std::vector<std::string> modules;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("dequant", "dequantize modules");
  cmd->add_option("DIR", a->dir)->required();
  cmd->add_option("OUT", a->out)->required();
  cmd->add_option("MODULES", a->modules)->required();
  cmd->add_option("--dtype", a->dtype);
  cmd->add_option("--rows", a->rows);
  cmd->callback([a] {
    const Checkpoint ckpt(a->dir);
    const ModelConfig config = load_config(a->dir);
    const QuantizationConfig* quant = config.quantization ? &*config.quantization : nullptr;
    const at::ScalarType dtype = parse_float_dtype(a->dtype);
    std::vector<int64_t> rows;
    std::stringstream ss(a->rows);
    for (std::string item; std::getline(ss, item, ',');) rows.push_back(std::stoll(item));
    std::vector<TensorToWrite> out;
    for (const std::string& module : a->modules) {
      const PackedInt4 w = read_packed(ckpt, module, quant);
      out.push_back(to_write(module, dequantize(w, dtype)));
      if (!rows.empty()) {
        out.push_back(
            to_write(module + ".rows", dequantize_rows(w, at::tensor(rows, at::kLong), dtype)));
      }
    }
    write_safetensors(a->out, out);
  });
}

void add_quantize_weight(CLI::App& app) {
  struct Args {
    std::string in, tensor, out, scale_dtype;
    int64_t group = 32;
    bool asym = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("quantize-weight", "quantize one tensor");
  cmd->add_option("IN", a->in)->required();
  cmd->add_option("TENSOR", a->tensor)->required();
  cmd->add_option("OUT", a->out)->required();
  cmd->add_option("--group", a->group);
  cmd->add_flag("--asym", a->asym);
  cmd->add_option("--scale-dtype", a->scale_dtype);
  cmd->callback([a] {
    const SafetensorsFile file(a->in);
    const auto it = file.tensors().find(a->tensor);
    if (it == file.tensors().end()) throw NotFoundError(a->in + " has no tensor " + a->tensor);
    QuantizeSpec spec{a->group, !a->asym, std::nullopt};
    if (!a->scale_dtype.empty()) spec.scale_dtype = parse_float_dtype(a->scale_dtype);
    const PackedInt4 w = quantize_weight(host_tensor(it->second), spec, a->tensor);
    std::vector<TensorToWrite> out{to_write("weight_packed", w.packed),
                                   to_write("weight_scale", w.scale)};
    if (w.zero_point.defined()) out.push_back(to_write("weight_zero_point", w.zero_point));
    write_safetensors(a->out, out);
  });
}

void add_mismatch(CLI::App& app) {
  auto dir = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand("mismatch", "config vs tensor names");
  cmd->add_option("DIR", *dir)->required();
  cmd->callback([dir] {
    const Checkpoint ckpt(*dir);
    const ModelConfig config = load_config(*dir);
    const QuantizationConfig* quant = config.quantization ? &*config.quantization : nullptr;
    std::cout << quantized_modules_mismatch(ckpt, quant).summary(*dir) << "\n";
  });
}

}  // namespace
}  // namespace torchtpu

int main(int argc, char** argv) {
  CLI::App app("quant layer test driver");
  app.require_subcommand(1);
  torchtpu::add_dequant(app);
  torchtpu::add_quantize_weight(app);
  torchtpu::add_mismatch(app);
  torchtpu::add_quantize_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
