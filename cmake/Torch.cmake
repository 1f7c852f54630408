# Finds the libtorch of the Python environment we build against: its CMake prefix, C++ ABI and
# version come from that interpreter, so the build always matches the torch that will load us.
find_package(Python3 REQUIRED COMPONENTS Interpreter)
execute_process(
  COMMAND "${Python3_EXECUTABLE}" -c
    "import torch; print(torch.utils.cmake_prefix_path); print(int(torch._C._GLIBCXX_USE_CXX11_ABI)); print(torch.__version__)"
  OUTPUT_VARIABLE _torch_info OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _torch_rc)
if(NOT _torch_rc EQUAL 0)
  message(FATAL_ERROR "torch is not importable from ${Python3_EXECUTABLE}; run scripts/setup.sh first (pip install: use --no-build-isolation, so the build sees the installed torch)")
endif()
string(REPLACE "\n" ";" _torch_info "${_torch_info}")
list(GET _torch_info 0 TORCH_CMAKE_PREFIX)
list(GET _torch_info 1 TORCH_CXX11_ABI)
list(GET _torch_info 2 TORCHTPU_TORCH_VERSION)
list(APPEND CMAKE_PREFIX_PATH "${TORCH_CMAKE_PREFIX}")

# PyPI's Linux torch is a CUDA build whose CMake config insists on a CUDA toolkit (nvcc). We only
# link against its libraries, which the wheel ships, so where no toolkit is installed we satisfy
# the config's include guard with an empty cudart target instead of requiring one.
find_package(CUDAToolkit QUIET)
if(NOT CUDAToolkit_FOUND AND NOT TARGET torch::cudart)
  add_library(torch::cudart INTERFACE IMPORTED)
endif()
find_package(Torch REQUIRED)
add_compile_definitions(_GLIBCXX_USE_CXX11_ABI=${TORCH_CXX11_ABI})
message(STATUS "torchtpu-cpp: torch ${TORCHTPU_TORCH_VERSION} at ${TORCH_CMAKE_PREFIX} (cxx11 abi ${TORCH_CXX11_ABI})")

# Parsing <ATen/ATen.h> is most of the compile of a unit that includes it (about 15 of 20 s on a
# 2-core CI machine, and the sanitized build pays it again), so the targets made of such units
# share one precompiled copy: torchtpu_precompile_aten(target ...). GCC takes a precompiled header
# only where its code model (-fPIC for libraries, -fPIE for executables) and the macros it saw
# still hold (-fopenmp defines _OPENMP: src/ops makes its own); elsewhere it warns and parses the
# header as before. A copy is built only for a target that reuses it (REUSE_FROM depends on it):
# the Python-only build has no executable to precompile for.
foreach(_model pic pie)
  add_library(torchtpu_aten_${_model} OBJECT EXCLUDE_FROM_ALL ${CMAKE_CURRENT_LIST_DIR}/aten_pch.cpp)
  target_link_libraries(torchtpu_aten_${_model} PRIVATE ${TORCH_LIBRARIES})
  target_precompile_headers(torchtpu_aten_${_model} PRIVATE <ATen/ATen.h>)
endforeach()
set_target_properties(torchtpu_aten_pie PROPERTIES POSITION_INDEPENDENT_CODE OFF)
target_compile_options(torchtpu_aten_pie PRIVATE ${CMAKE_CXX_COMPILE_OPTIONS_PIE})
function(torchtpu_precompile_aten)
  foreach(target ${ARGN})
    get_target_property(_type ${target} TYPE)
    if(_type STREQUAL "EXECUTABLE")
      target_precompile_headers(${target} REUSE_FROM torchtpu_aten_pie)
    else()
      target_precompile_headers(${target} REUSE_FROM torchtpu_aten_pic)
    endif()
  endforeach()
endfunction()
