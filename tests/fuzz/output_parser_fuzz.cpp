// libFuzzer harness: arbitrary model output through OutputParser, cut into pieces where the input
// says (a 0x00 byte ends a piece), then each <|tool_call> body alone through parse_tool_call.
// Whatever the input, no text is both content and reasoning twice over: the parts together never
// hold more bytes than went in, and the parser never throws.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "common/errors.h"
#include "text/output_parser.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  torchtpu::OutputParser parser;
  size_t out_bytes = 0;
  const auto count = [&](const torchtpu::OutputDelta& d) {
    out_bytes += d.content.size() + d.reasoning.size();
  };
  size_t begin = 0;
  while (begin <= input.size()) {
    const size_t end = std::min(input.find('\0', begin), input.size());
    count(parser.push(input.substr(begin, end - begin)));
    begin = end + 1;
  }
  count(parser.finish());
  if (out_bytes > input.size()) std::abort();

  try {
    torchtpu::parse_tool_call(input);
  } catch (const torchtpu::ValueError&) {
  }
  return 0;
}
