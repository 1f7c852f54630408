# The quant layer: gtest for validation and error messages, and quant_tool, the driver through
# which tests/python/test_quant.py compares us with the compressed-tensors library.
if(TARGET torchtpu_quant)
  add_executable(quant_tool ${CMAKE_CURRENT_LIST_DIR}/quant_tool.cpp
                            ${CMAKE_SOURCE_DIR}/src/cli/quantize_command.cpp)
  target_link_libraries(quant_tool PRIVATE torchtpu_quant)
  torchtpu_precompile_aten(quant_tool)

  if(TORCHTPU_GTESTS)
    add_executable(quant_test ${CMAKE_CURRENT_LIST_DIR}/quant_test.cpp)
    target_link_libraries(quant_test PRIVATE torchtpu_quant GTest::gtest_main)
    torchtpu_precompile_aten(quant_test)
    torchtpu_gtest_suites(quant_test)
  endif()
endif()
