// hub_download_tool ID REVISION [INCLUDE_GLOB]...: torchtpu::hub::download with Options from the
// environment, for the Python tests that drive it against a fake Hub. Prints the snapshot
// directory; on failure prints the error kind and message and exits non-zero.
#include <iostream>
#include <string>
#include <vector>

#include "common/errors.h"
#include "hub/hub.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: hub_download_tool ID REVISION [INCLUDE_GLOB]...\n";
    return 64;
  }
  std::vector<std::string> include(argv + 3, argv + argc);
  try {
    auto opts = torchtpu::hub::Options::from_env();
    std::cout << torchtpu::hub::download(argv[1], argv[2], opts, include) << std::endl;
    return 0;
  } catch (const torchtpu::NotFoundError& e) {
    std::cerr << "NotFoundError: " << e.what() << "\n";
    return 2;
  } catch (const torchtpu::ValueError& e) {
    std::cerr << "ValueError: " << e.what() << "\n";
    return 3;
  } catch (const torchtpu::FormatError& e) {
    std::cerr << "FormatError: " << e.what() << "\n";
    return 4;
  } catch (const torchtpu::UpstreamError& e) {
    std::cerr << "UpstreamError: " << e.what() << "\n";
    return 5;
  } catch (const std::exception& e) {
    std::cerr << "RuntimeError: " << e.what() << "\n";
    return 1;
  }
}
