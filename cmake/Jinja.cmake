# The MiniJinja shim (src/text/jinja) built by cargo as a static library, exposed as the imported
# target `torchtpu_jinja`. Cargo's target dir lives in this build dir, so several build dirs build
# side by side; Cargo.lock pins the crates, fetched from crates.io on the first build.
include_guard(GLOBAL)

find_program(CARGO_EXECUTABLE cargo HINTS $ENV{CARGO_HOME}/bin $ENV{HOME}/.cargo/bin)
if(NOT CARGO_EXECUTABLE)
  message(FATAL_ERROR "cargo not found: the chat template engine (src/text/jinja) is Rust. "
                      "Install a Rust toolchain (rustup) or set CARGO_EXECUTABLE.")
endif()
# A rustup proxy finds rustc beside itself only when that directory is on PATH.
get_filename_component(_torchtpu_cargo_bin ${CARGO_EXECUTABLE} DIRECTORY)

get_filename_component(_torchtpu_jinja_dir ${CMAKE_CURRENT_LIST_DIR}/../src/text/jinja ABSOLUTE)
# The Rust libraries are the same in every build tree of a checkout (the sanitized and fuzzing
# builds instrument only C++), so the trees share cargo's target directories: cargo builds them
# once, and a second tree's build finds them up to date.
set(TORCHTPU_CARGO_TARGET_DIR ${CMAKE_SOURCE_DIR}/.cache/cargo
    CACHE PATH "Where cargo builds the Rust libraries (shared by the build trees)")
set(_torchtpu_jinja_target_dir ${TORCHTPU_CARGO_TARGET_DIR}/jinja)
set(_torchtpu_jinja_lib
    ${_torchtpu_jinja_target_dir}/release/${CMAKE_STATIC_LIBRARY_PREFIX}torchtpu_jinja${CMAKE_STATIC_LIBRARY_SUFFIX})
file(GLOB _torchtpu_jinja_sources CONFIGURE_DEPENDS ${_torchtpu_jinja_dir}/src/*.rs)

add_custom_command(
  OUTPUT ${_torchtpu_jinja_lib}
  COMMAND ${CMAKE_COMMAND} -E env "PATH=${_torchtpu_cargo_bin}:$ENV{PATH}"
          CARGO_TARGET_DIR=${_torchtpu_jinja_target_dir}
          ${CARGO_EXECUTABLE} build --release --locked --manifest-path ${_torchtpu_jinja_dir}/Cargo.toml
  DEPENDS ${_torchtpu_jinja_sources} ${_torchtpu_jinja_dir}/Cargo.toml
          ${_torchtpu_jinja_dir}/Cargo.lock
  COMMENT "cargo build: MiniJinja chat template engine"
  USES_TERMINAL
  VERBATIM)
add_custom_target(torchtpu_jinja_cargo DEPENDS ${_torchtpu_jinja_lib})

add_library(torchtpu_jinja STATIC IMPORTED GLOBAL)
set_target_properties(torchtpu_jinja PROPERTIES IMPORTED_LOCATION ${_torchtpu_jinja_lib})
add_dependencies(torchtpu_jinja torchtpu_jinja_cargo)
# What `cargo rustc -- --print native-static-libs` lists for a Rust staticlib on Linux.
target_link_libraries(torchtpu_jinja INTERFACE Threads::Threads ${CMAKE_DL_LIBS} m rt util)
