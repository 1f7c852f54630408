# `torchtpu-cpp serve` as a process: a checkpoint that fails to load ends it with the error, every
# time (20 runs, since the failure races the listener thread's start).
if(TARGET torchtpu-cpp)
  add_test(NAME shell_serve_load_failure
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/serve_load_failure.sh $<TARGET_FILE:torchtpu-cpp> 20)
  set_tests_properties(shell_serve_load_failure PROPERTIES TIMEOUT 900 LABELS server)
endif()
# The README's make-tiny, generate and quantize lines, as written (tests/shell/readme_commands.sh).
if(TARGET torchtpu-cpp)
  add_test(NAME shell_readme_commands
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/readme_commands.sh $<TARGET_FILE:torchtpu-cpp>
                   ${CMAKE_SOURCE_DIR})
  set_tests_properties(shell_readme_commands PROPERTIES TIMEOUT 600 LABELS cli)
endif()
