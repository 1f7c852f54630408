# src/ops: torchtpu::int4_linear against float64 and at::linear references, run with the CPU's
# best kernels, with AVX-512 alone (TORCHTPU_CPU_ISA=avx512: no AMX even where the CPU has it), with
# AVX2 alone (TORCHTPU_CPU_ISA=avx2: the tier of CPUs without AVX-512) and with the portable ones
# (TORCHTPU_CPU_ISA=portable). A tier the CPU lacks runs the best one below it.
if(TORCHTPU_GTESTS AND TARGET torchtpu_ops)
  add_executable(ops_test ${CMAKE_CURRENT_LIST_DIR}/ops_test.cpp)
  target_link_libraries(ops_test PRIVATE torchtpu_ops GTest::gtest_main)
  torchtpu_precompile_aten(ops_test)
  torchtpu_gtest_suites(ops_test TEST_PREFIX "ops.")
  torchtpu_gtest_suites(ops_test TEST_PREFIX "ops_avx512." ENVIRONMENT "TORCHTPU_CPU_ISA=avx512")
  torchtpu_gtest_suites(ops_test TEST_PREFIX "ops_avx2." ENVIRONMENT "TORCHTPU_CPU_ISA=avx2")
  torchtpu_gtest_suites(ops_test TEST_PREFIX "ops_portable." ENVIRONMENT "TORCHTPU_CPU_ISA=portable")
endif()
