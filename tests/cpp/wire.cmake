# src/server's Responses and Messages wire formats: request parsing into chat messages, the
# response store, and the renderers' events (no engine, no HTTP).
if(TARGET torchtpu_server)
  add_executable(wire_test ${CMAKE_CURRENT_LIST_DIR}/wire_test.cpp)
  target_link_libraries(wire_test PRIVATE torchtpu_server GTest::gtest_main)
  add_test(NAME wire_test COMMAND wire_test)
  set_tests_properties(wire_test PROPERTIES LABELS server)
endif()
