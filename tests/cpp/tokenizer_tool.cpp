// Drives the native tokenizer, detokenizer and output parser from another process, one JSON
// request per stdin line and one JSON answer per stdout line, so that tests written in Python
// can compare them with Hugging Face `tokenizers` in a single process for a whole corpus.
//   tokenizer_tool TOKENIZER_JSON   (or "-" for the parser alone)
//   {"op":"encode","text":S,"add_special_tokens":B}      -> {"ids":[...]}
//   {"op":"decode","ids":[...],"skip_special_tokens":B}  -> {"text":S}
//   {"op":"stream","ids":[...],"show_special_tokens":B}  -> {"pieces_hex":[...]} (bytes in hex)
//   {"op":"parse","text":S,"chunk":N}  ->
//   {"content","reasoning","tool_calls","cut_off","raw_unparsed"}
//   {"op":"time_encode","texts":[...]}  -> {"tokens":N,"seconds":S} (bench/tokenizer_bench.py)
// A failure answers {"error":MESSAGE}.
#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "text/detokenizer.h"
#include "text/output_parser.h"
#include "text/tokenizer.h"

namespace {

using nlohmann::json;
using torchtpu::Tokenizer;

std::string to_hex(const std::string& bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += kHex[c >> 4];
    out += kHex[c & 15];
  }
  return out;
}

json answer(const std::optional<Tokenizer>& tok, const json& req) {
  const std::string op = req.at("op");
  if (op == "parse") {
    torchtpu::OutputParser parser;
    const std::string text = req.at("text");
    const size_t chunk = req.value("chunk", size_t{0});
    json calls = json::array();
    std::string content, reasoning;
    auto take = [&](const torchtpu::OutputDelta& d) {
      content += d.content;
      reasoning += d.reasoning;
      for (const auto& c : d.tool_calls)
        calls.push_back({{"name", c.name}, {"arguments", c.arguments}});
    };
    if (chunk == 0) {
      take(parser.push(text));
    } else {
      for (size_t i = 0; i < text.size(); i += chunk) take(parser.push(text.substr(i, chunk)));
    }
    take(parser.finish());
    return {{"content", content},
            {"reasoning", reasoning},
            {"tool_calls", calls},
            {"cut_off", parser.cut_off_call()},
            {"raw_unparsed", parser.raw_unparsed()}};
  }
  if (!tok) throw std::invalid_argument("no tokenizer loaded");
  if (op == "encode") {
    return {{"ids", tok->encode(req.at("text").get<std::string>(),
                                req.value("add_special_tokens", false))}};
  }
  if (op == "decode") {
    return {{"text", tok->decode(req.at("ids").get<std::vector<int64_t>>(),
                                 req.value("skip_special_tokens", false))}};
  }
  if (op == "time_encode") {
    const auto texts = req.at("texts").get<std::vector<std::string>>();
    size_t tokens = 0;
    const auto start = std::chrono::steady_clock::now();
    for (const std::string& t : texts) tokens += tok->encode(t).size();
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    return {{"tokens", tokens}, {"seconds", elapsed.count()}};
  }
  if (op == "stream") {
    torchtpu::Detokenizer detok(*tok, req.value("show_special_tokens", true));
    json pieces = json::array();
    for (int64_t id : req.at("ids").get<std::vector<int64_t>>())
      pieces.push_back(to_hex(detok.push(id)));
    pieces.push_back(to_hex(detok.finish()));
    return {{"pieces_hex", pieces}};
  }
  throw std::invalid_argument("unknown op " + op);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: tokenizer_tool TOKENIZER_JSON|-\n";
    return 2;
  }
  std::optional<Tokenizer> tok;
  if (std::string(argv[1]) != "-") tok = Tokenizer::from_file(argv[1]);
  std::ios::sync_with_stdio(false);
  std::string line;
  while (std::getline(std::cin, line)) {
    json out;
    try {
      out = answer(tok, json::parse(line));
    } catch (const std::exception& e) {
      out = {{"error", e.what()}};
    }
    std::cout << out.dump(-1, ' ', false, json::error_handler_t::replace) << '\n' << std::flush;
  }
  return 0;
}
