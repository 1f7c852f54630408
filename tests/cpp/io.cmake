if(TORCHTPU_GTESTS)
  add_executable(io_test ${CMAKE_CURRENT_SOURCE_DIR}/cpp/io_test.cpp)
  target_link_libraries(io_test PRIVATE torchtpu_io GTest::gmock GTest::gtest_main)
  torchtpu_gtest_suites(io_test)
endif()

# Prints what our reader sees in a safetensors file, for the Python cross-check.
add_executable(safetensors_dump ${CMAKE_CURRENT_SOURCE_DIR}/cpp/safetensors_dump.cpp)
target_link_libraries(safetensors_dump PRIVATE torchtpu_io)

# Prints load_config(DIR) as JSON, for the cross-check against transformers.
add_executable(config_dump ${CMAKE_CURRENT_SOURCE_DIR}/cpp/config_dump.cpp)
target_link_libraries(config_dump PRIVATE torchtpu_io)
