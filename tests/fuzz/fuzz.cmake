# libFuzzer harnesses (clang; configure with -DTORCHTPU_FUZZ=ON, scripts/test.sh does it in
# build-fuzz). Everything compiled in such a build carries the fuzzer's coverage instrumentation
# plus AddressSanitizer and UndefinedBehaviorSanitizer (top-level CMakeLists.txt); each harness links
# libFuzzer's main. CTest runs each harness for TORCHTPU_FUZZ_SECONDS on its checked-in seeds
# (tests/fuzz/corpus/NAME, regression inputs included) plus what earlier runs of this build tree
# found (fuzz-corpus/NAME). docs/RELIABILITY.md has the long runs.
set(TORCHTPU_FUZZ_SECONDS 5 CACHE STRING "Seconds each harness fuzzes in CTest")

set(_fuzz_dir ${CMAKE_CURRENT_LIST_DIR})
set(_fuzz_tokenizer ${CMAKE_SOURCE_DIR}/.cache/gemma4-test-tokenizer/tokenizer.json)

add_executable(safetensors_fuzz ${_fuzz_dir}/safetensors_fuzz.cpp)
target_link_libraries(safetensors_fuzz PRIVATE torchtpu_io)

add_executable(config_fuzz ${_fuzz_dir}/config_fuzz.cpp)
target_link_libraries(config_fuzz PRIVATE torchtpu_io torchtpu_text torchtpu_chat)

add_executable(tokenizer_fuzz ${_fuzz_dir}/tokenizer_fuzz.cpp)
add_executable(detokenizer_fuzz ${_fuzz_dir}/detokenizer_fuzz.cpp)
foreach(t tokenizer_fuzz detokenizer_fuzz)
  target_link_libraries(${t} PRIVATE torchtpu_text)
  target_compile_definitions(${t} PRIVATE TORCHTPU_FUZZ_DEFAULT_TOKENIZER="${_fuzz_tokenizer}")
endforeach()

add_executable(chat_template_fuzz ${_fuzz_dir}/chat_template_fuzz.cpp)
target_link_libraries(chat_template_fuzz PRIVATE torchtpu_chat)
target_compile_definitions(chat_template_fuzz PRIVATE
  TORCHTPU_FUZZ_CHAT_TEMPLATE="${CMAKE_SOURCE_DIR}/data/gemma4/chat_template.jinja")

add_executable(output_parser_fuzz ${_fuzz_dir}/output_parser_fuzz.cpp)
target_link_libraries(output_parser_fuzz PRIVATE torchtpu_text)

# The server's parsers are compiled in directly (openai.cpp with structured.cpp, which parses
# response_format, and media_parts.cpp, which parses content parts; ollama.cpp with wire.cpp, which
# renames its errors; mcp.cpp): torchtpu_server links the engine and libtorch, which they do not
# use.
add_executable(request_fuzz ${_fuzz_dir}/request_fuzz.cpp ${CMAKE_SOURCE_DIR}/src/server/openai.cpp
                            ${CMAKE_SOURCE_DIR}/src/server/structured.cpp
                            ${CMAKE_SOURCE_DIR}/src/server/media_parts.cpp
                            ${CMAKE_SOURCE_DIR}/src/server/ollama.cpp
                            ${CMAKE_SOURCE_DIR}/src/server/wire.cpp)
target_link_libraries(request_fuzz PRIVATE torchtpu_common nlohmann_json::nlohmann_json)

find_package(PkgConfig REQUIRED)
pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)
add_executable(mcp_fuzz ${_fuzz_dir}/mcp_fuzz.cpp ${CMAKE_SOURCE_DIR}/src/server/mcp.cpp
                        ${CMAKE_SOURCE_DIR}/src/server/connection.cpp
                        ${CMAKE_SOURCE_DIR}/src/server/openai.cpp
                        ${CMAKE_SOURCE_DIR}/src/server/structured.cpp
                        ${CMAKE_SOURCE_DIR}/src/server/media_parts.cpp)
target_link_libraries(mcp_fuzz PRIVATE torchtpu_common nlohmann_json::nlohmann_json
                                       PkgConfig::HTTPLIB Threads::Threads)

set(_fuzzers safetensors config tokenizer detokenizer chat_template output_parser request mcp)
add_custom_target(fuzzers)
foreach(name ${_fuzzers})
  target_link_options(${name}_fuzz PRIVATE -fsanitize=fuzzer)
  target_include_directories(${name}_fuzz PRIVATE ${_fuzz_dir})
  add_dependencies(fuzzers ${name}_fuzz)
  set(_found ${CMAKE_BINARY_DIR}/fuzz-corpus/${name})
  file(MAKE_DIRECTORY ${_found} ${CMAKE_BINARY_DIR}/fuzz-artifacts)
  add_test(NAME fuzz.${name}
           COMMAND ${name}_fuzz -max_total_time=${TORCHTPU_FUZZ_SECONDS} -timeout=10
                   -rss_limit_mb=4096 -print_final_stats=1
                   -artifact_prefix=${CMAKE_BINARY_DIR}/fuzz-artifacts/${name}-
                   ${_found} ${_fuzz_dir}/corpus/${name})
  set_tests_properties(fuzz.${name} PROPERTIES LABELS fuzz TIMEOUT 300)
endforeach()
