# src/server's Responses and Messages wire formats: request parsing into chat messages, the
# response store, and the renderers' events (no engine, no HTTP).
if(TORCHTPU_GTESTS AND TARGET torchtpu_server)
  add_executable(wire_test ${CMAKE_CURRENT_LIST_DIR}/wire_test.cpp)
  target_link_libraries(wire_test PRIVATE torchtpu_server GTest::gtest_main)
  add_test(NAME wire_test COMMAND wire_test)
  set_tests_properties(wire_test PROPERTIES LABELS server)
endif()

# Images and audio in requests (#19): each front end's parts, and load_media's checks.
if(TORCHTPU_GTESTS AND TARGET torchtpu_server)
  add_executable(media_parts_test ${CMAKE_CURRENT_LIST_DIR}/media_parts_test.cpp)
  target_link_libraries(media_parts_test PRIVATE torchtpu_server GTest::gtest_main)
  torchtpu_precompile_aten(media_parts_test)
  add_test(NAME media_parts_test COMMAND media_parts_test)
  set_tests_properties(media_parts_test PROPERTIES LABELS server)
endif()
