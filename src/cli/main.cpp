// The torchtpu-cpp command: one subcommand per file, each registered here.
#include <c10/util/Exception.h>
#include <dlfcn.h>

#include <CLI/CLI.hpp>
#include <iostream>
#include <string>

#include "cli/bench_command.h"
#include "cli/commands.h"
#include "cli/download_command.h"
#include "cli/launch_command.h"
#include "cli/mcp_command.h"
#include "cli/proxy_command.h"
#include "cli/quantize_command.h"
#include "cli/serve_command.h"
#include "common/errors.h"

namespace {

// A backend shared library registers its device (PrivateUse1 under a name of its own) with the
// dispatcher when loaded; `--device NAME` then finds it. Kept loaded for the process's life.
void load_device_library(const std::string& path) {
  if (!dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL)) {
    throw torchtpu::ValueError("cannot load device library '" + path + "': " + dlerror());
  }
}

// What is wrong with the first word after the options before the command, when it names no
// command of `app`; empty otherwise.
std::string unknown_command(CLI::App& app, int argc, char** argv) {
  const auto commands = app.get_subcommands([](CLI::App*) { return true; });
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word == "--device-library") {
      ++i;  // its value
      continue;
    }
    if (word.starts_with("-")) return "";
    std::string names;
    for (const CLI::App* command : commands) {
      if (command->check_name(word)) return "";
      names += (names.empty() ? "" : ", ") + command->get_name();
    }
    return "unknown command '" + word + "'; the commands are " + names;
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"torchtpu-cpp: Gemma 4 in C++ over ATen (CPU, CUDA, TorchTPU)"};
  app.require_subcommand(1);
  // Given before the subcommand, and loaded before it runs: its --device may name the device a
  // library registers.
  app.add_option("--device-library", "Shared library of a device backend to load (repeatable)")
      ->each(load_device_library)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->type_name("PATH");
  torchtpu::cli::add_make_tiny_command(app);
  torchtpu::cli::add_generate_command(app);
  torchtpu::add_quantize_command(app);
  torchtpu::add_download_command(app);
  torchtpu::cli::add_serve_command(app);
  torchtpu::cli::add_bench_command(app);
  torchtpu::cli::add_mcp_command(app);
  torchtpu::cli::add_proxy_command(app);
  torchtpu::cli::add_launch_command(app);
  // CLI11 answers a misspelled command ("serv") with "A subcommand is required".
  if (const std::string unknown = unknown_command(app, argc, argv); !unknown.empty()) {
    std::cerr << "error: " << unknown << "\n";
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // Every usage error exits 2, as the checks after parsing do; CLI11 gives each kind of its
    // own a code (105 for a failed validator). --help exits 0.
    return app.exit(e) == 0 ? 0 : 2;
  } catch (const torchtpu::ValueError& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  } catch (const c10::ValueError& e) {
    std::cerr << "error: " << e.what_without_backtrace() << "\n";
    return 2;
  } catch (const c10::Error& e) {
    // torch's own failures (a device's driver, memory): the message without torch's backtrace.
    std::cerr << "error: " << e.what_without_backtrace() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
