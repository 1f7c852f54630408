# llguidance (constrained decoding) through its C interface: the crate in src/grammar/llg, built by
# cargo as a static library and exposed as the imported target `torchtpu_llg`, with llguidance.h
# (copied from the pinned llguidance release) on its include path. Like cmake/Jinja.cmake, cargo's
# target dir lives in this build dir and Cargo.lock pins the crates.
include_guard(GLOBAL)
include(${CMAKE_CURRENT_LIST_DIR}/Jinja.cmake)  # CARGO_EXECUTABLE and _torchtpu_cargo_bin

get_filename_component(_torchtpu_llg_dir ${CMAKE_CURRENT_LIST_DIR}/../src/grammar/llg ABSOLUTE)
set(_torchtpu_llg_target_dir ${TORCHTPU_CARGO_TARGET_DIR}/llg)
set(_torchtpu_llg_lib
    ${_torchtpu_llg_target_dir}/release/${CMAKE_STATIC_LIBRARY_PREFIX}torchtpu_llg${CMAKE_STATIC_LIBRARY_SUFFIX})

add_custom_command(
  OUTPUT ${_torchtpu_llg_lib}
  COMMAND ${CMAKE_COMMAND} -E env "PATH=${_torchtpu_cargo_bin}:$ENV{PATH}"
          CARGO_TARGET_DIR=${_torchtpu_llg_target_dir}
          ${CARGO_EXECUTABLE} build --release --locked --manifest-path ${_torchtpu_llg_dir}/Cargo.toml
  DEPENDS ${_torchtpu_llg_dir}/src/lib.rs ${_torchtpu_llg_dir}/Cargo.toml
          ${_torchtpu_llg_dir}/Cargo.lock
  COMMENT "cargo build: llguidance (constrained decoding)"
  USES_TERMINAL
  VERBATIM)
add_custom_target(torchtpu_llg_cargo DEPENDS ${_torchtpu_llg_lib})

add_library(torchtpu_llg STATIC IMPORTED GLOBAL)
set_target_properties(torchtpu_llg PROPERTIES IMPORTED_LOCATION ${_torchtpu_llg_lib}
                                              INTERFACE_INCLUDE_DIRECTORIES ${_torchtpu_llg_dir})
add_dependencies(torchtpu_llg torchtpu_llg_cargo)
target_link_libraries(torchtpu_llg INTERFACE Threads::Threads ${CMAKE_DL_LIBS} m rt util)
