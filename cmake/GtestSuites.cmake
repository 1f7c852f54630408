# One CTest entry per gtest suite (`Suite.*` in one process) rather than gtest_discover_tests' one
# per test. A sanitized executable that links libtorch takes about 1.5 s to start and to check
# for leaks at exit, whatever it runs: with a process per test, the 429 entries of the sanitized
# tree spent more time starting than testing. A failing suite's output names the failing tests.
#
# Included, it defines torchtpu_gtest_suites(); run as a script (-P) by an executable's post-build
# step, it lists the executable's suites into the file that CTest reads.
if(CMAKE_SCRIPT_MODE_FILE)
  execute_process(COMMAND "${TORCHTPU_GTEST_EXECUTABLE}" --gtest_list_tests
                  OUTPUT_VARIABLE _listing RESULT_VARIABLE _rc TIMEOUT 60)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "${TORCHTPU_GTEST_EXECUTABLE} --gtest_list_tests failed (${_rc})")
  endif()
  # Suites start a line and end with '.', optionally followed by a "  # TypeParam = ..." comment;
  # tests are indented; gtest_main's "Running main() from ..." has a space before any '.'.
  string(REPLACE "\n" ";" _lines "${_listing}")
  set(_suites)
  foreach(_line IN LISTS _lines)
    if(_line MATCHES "^([^ #][^ ]*)\\.( .*)?$")
      list(APPEND _suites "${CMAKE_MATCH_1}")
    endif()
  endforeach()
  if(NOT _suites)
    message(FATAL_ERROR "${TORCHTPU_GTEST_EXECUTABLE} lists no test suite")
  endif()
  file(WRITE "${TORCHTPU_GTEST_SUITES_FILE}" "set(_torchtpu_gtest_suites [==[${_suites}]==])\n")
  return()
endif()

set(_torchtpu_gtest_suites_script "${CMAKE_CURRENT_LIST_FILE}")

# torchtpu_gtest_suites(<target> [TEST_PREFIX <prefix>] [LABELS <label>...] [TIMEOUT <s>]
#                       [ENVIRONMENT <VAR=value>...])
# registers "<prefix><Suite>" for each suite of <target>, run as `<target> --gtest_filter=Suite.*`.
# A target may be registered several times (different prefixes and environments); it is listed
# once per build.
function(torchtpu_gtest_suites target)
  cmake_parse_arguments(arg "" "TEST_PREFIX;TIMEOUT" "LABELS;ENVIRONMENT" ${ARGN})
  set(_suites_file "${CMAKE_CURRENT_BINARY_DIR}/${target}_gtest_suites.cmake")
  get_target_property(_listed ${target} TORCHTPU_GTEST_SUITES_LISTED)
  if(NOT _listed)
    add_custom_command(TARGET ${target} POST_BUILD
      COMMAND ${CMAKE_COMMAND} "-DTORCHTPU_GTEST_EXECUTABLE=$<TARGET_FILE:${target}>"
              "-DTORCHTPU_GTEST_SUITES_FILE=${_suites_file}" -P "${_torchtpu_gtest_suites_script}"
      BYPRODUCTS "${_suites_file}" VERBATIM)
    set_target_properties(${target} PROPERTIES TORCHTPU_GTEST_SUITES_LISTED TRUE)
  endif()

  set(_properties "")
  if(arg_LABELS)
    string(APPEND _properties " LABELS [==[${arg_LABELS}]==]")
  endif()
  if(arg_TIMEOUT)
    string(APPEND _properties " TIMEOUT ${arg_TIMEOUT}")
  endif()
  if(arg_ENVIRONMENT)
    string(APPEND _properties " ENVIRONMENT [==[${arg_ENVIRONMENT}]==]")
  endif()
  set(_set_properties "")
  if(_properties)
    set(_set_properties
        "    set_tests_properties(\"${arg_TEST_PREFIX}\${_suite}\" PROPERTIES${_properties})\n")
  endif()
  set(_include_file "${CMAKE_CURRENT_BINARY_DIR}/${target}_${arg_TEST_PREFIX}include.cmake")
  # Until the executable is built its suites are unknown: one entry then says so and fails.
  file(GENERATE OUTPUT "${_include_file}" CONTENT "\
if(EXISTS [==[${_suites_file}]==])
  include([==[${_suites_file}]==])
  foreach(_suite IN LISTS _torchtpu_gtest_suites)
    add_test(\"${arg_TEST_PREFIX}\${_suite}\" [==[$<TARGET_FILE:${target}>]==]
             \"--gtest_filter=\${_suite}.*\")
${_set_properties}  endforeach()
else()
  add_test(\"${arg_TEST_PREFIX}${target}_NOT_BUILT\" [==[${target}_NOT_BUILT]==])
endif()
")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${_include_file}")
endfunction()
