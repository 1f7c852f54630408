# Bit-exactness of our int4 reader and quantize command against the compressed-tensors library.
if(TARGET quant_tool)
  add_test(NAME python_quant
           COMMAND ${Python3_EXECUTABLE} -m pytest -q ${CMAKE_CURRENT_LIST_DIR}/test_quant.py)
  set_tests_properties(python_quant PROPERTIES
                       ENVIRONMENT "TORCHTPU_QUANT_TOOL=$<TARGET_FILE:quant_tool>" TIMEOUT 600)
endif()
