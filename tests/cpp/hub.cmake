# The Hub client: unit tests, and the small driver the Python tests run against a fake Hub.
add_executable(hub_download_tool ${CMAKE_CURRENT_LIST_DIR}/hub_download_tool.cpp)
target_link_libraries(hub_download_tool PRIVATE torchtpu_hub)

if(TORCHTPU_GTESTS)
  add_executable(hub_test ${CMAKE_CURRENT_LIST_DIR}/hub_test.cpp
                          ${CMAKE_SOURCE_DIR}/src/cli/download_command.cpp)
  target_link_libraries(hub_test PRIVATE torchtpu_hub GTest::gtest_main Threads::Threads)
  torchtpu_gtest_suites(hub_test TEST_PREFIX "hub." LABELS hub)
endif()
