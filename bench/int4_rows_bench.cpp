// The int4 operator alone at the row counts a Batch step gives it (issue #17): E2B's linear shapes
// with random packed weights, bf16 activations, in the CPU kernel's blocks, one intra-op thread by
// default. Per row count, after one untimed run, the best of RUNS timings of CALLS calls each, as
// microseconds per call, per row, and the call's time over the one-row call's, with the
// activations at BITS (16, or 8: the fast mode). With COPIES above 1, consecutive calls take
// consecutive copies of each weight, so that the weights come from DRAM as in a decode step rather
// than from the caches. Prints one JSON object; docs/BENCHMARKS.md has the numbers ("Several rows
// without AMX", "8-bit activations").
//
//   int4_rows_bench [RUNS=100] [CALLS=10] [THREADS=1] [BITS=16] [COPIES=1]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>
#include <vector>

#include "ops/int4_linear.h"
#include "quant/quantize.h"

using namespace torchtpu;

int main(int argc, char** argv) {
  const int runs = argc > 1 ? std::atoi(argv[1]) : 100;
  const int calls = argc > 2 ? std::atoi(argv[2]) : 10;
  at::set_num_threads(argc > 3 ? std::atoi(argv[3]) : 1);
  const int bits = argc > 4 ? std::atoi(argv[4]) : 16;
  const int copies = std::max(1, argc > 5 ? std::atoi(argv[5]) : 1);
  struct Shape {
    const char* name;
    int64_t in, out;
  };
  // 1536 x 1536 stays in L2 (the kernel's arithmetic alone); the MLP's up projection streams from
  // memory; the double-wide layers' down projection has twice its bytes over a k eight times
  // longer (8 rows' activations, 96 KiB, no longer fit L1).
  const std::vector<Shape> shapes = {{"1536x1536 (in L2)", 1536, 1536},
                                     {"gate/up 1536x6144", 1536, 6144},
                                     {"down 12288x1536", 12288, 1536}};
  nlohmann::json out = {{"isa", ops::int4_cpu_isa()},
                        {"threads", at::get_num_threads()},
                        {"activation_bits", bits},
                        {"runs", runs},
                        {"calls", calls},
                        {"copies", copies},
                        {"shapes", nlohmann::json::array()}};
  for (const auto& shape : shapes) {
    at::manual_seed(1);
    const auto dense = (at::randn({shape.out, shape.in}) * 0.05).to(at::kBFloat16);
    const auto packed = quantize_weight(dense, {32, true, at::kBFloat16}, "bench");
    // Each copy repacked, so each lies in huge pages as the engine's weights do.
    std::vector<ops::Int4Weight> ws;
    for (int i = 0; i < copies; ++i) {
      ws.push_back(ops::repack_for_cpu(packed));
      ws.back().activation_bits = bits;
    }
    int next = 0;
    auto call = [&](const at::Tensor& x) { ops::int4_linear(x, ws[next++ % copies]); };
    nlohmann::json rows = nlohmann::json::array();
    double one_row = 0;
    for (const int64_t m : {1, 2, 3, 4, 5, 6, 7, 8, 12, 16}) {
      const auto x = at::randn({m, shape.in}).to(at::kBFloat16);
      double best = 1e30;
      for (int c = 0; c < calls; ++c) call(x);
      for (int r = 0; r < runs; ++r) {
        const auto start = std::chrono::steady_clock::now();
        for (int c = 0; c < calls; ++c) call(x);
        const std::chrono::duration<double, std::micro> took =
            std::chrono::steady_clock::now() - start;
        best = std::min(best, took.count() / calls);
      }
      if (m == 1) one_row = best;
      rows.push_back({{"rows", m},
                      {"us_per_call", best},
                      {"us_per_row", best / m},
                      {"call_over_one_row", best / one_row}});
    }
    out["shapes"].push_back({{"shape", shape.name}, {"rows", rows}});
  }
  std::cout << out.dump(1) << "\n";
}
