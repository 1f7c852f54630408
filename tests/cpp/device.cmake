# The stand-in out-of-tree device (issue #20, tests/device): a shared library registering
# PrivateUse1 as "standin" when loaded (by the C++ suite through linking, by Python through
# ctypes), and the engine's suite on it.
if(TARGET torchtpu_engine)
  add_library(torchtpu_standin SHARED ${CMAKE_SOURCE_DIR}/tests/device/standin_device.cpp)
  target_link_libraries(torchtpu_standin PUBLIC ${TORCH_LIBRARIES})
  torchtpu_precompile_aten(torchtpu_standin)
  if(TORCHTPU_GTESTS)
    add_executable(device_test ${CMAKE_SOURCE_DIR}/tests/device/device_test.cpp)
    target_include_directories(device_test PRIVATE ${CMAKE_SOURCE_DIR}/tests/device
                                                 ${CMAKE_SOURCE_DIR}/tests/cpp)
    target_link_libraries(device_test PRIVATE torchtpu_engine torchtpu_standin GTest::gtest_main)
    torchtpu_precompile_aten(device_test)
    add_test(NAME device_test COMMAND device_test)
    set_tests_properties(device_test PROPERTIES LABELS device TIMEOUT 900
                         ENVIRONMENT "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
  endif()
endif()
