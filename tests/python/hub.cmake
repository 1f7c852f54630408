# Downloads against a fake Hub on loopback, and the cache shared with huggingface_hub. The
# `torchtpu-cpp download` test is a suite of its own, since it needs the whole CLI built.
add_test(NAME hub_python
         COMMAND ${TORCHTPU_VENV_PYTHON} -m pytest -q -p no:cacheprovider -k "not test_cli_"
                 ${CMAKE_CURRENT_LIST_DIR}/test_hub.py
         WORKING_DIRECTORY ${CMAKE_CURRENT_LIST_DIR})
set_tests_properties(hub_python PROPERTIES
                     ENVIRONMENT "HUB_DOWNLOAD_TOOL=$<TARGET_FILE:hub_download_tool>"
                     LABELS hub TIMEOUT 600)
if(TARGET torchtpu-cpp)
  add_test(NAME hub_cli
           COMMAND ${TORCHTPU_VENV_PYTHON} -m pytest -q -p no:cacheprovider -k test_cli_
                   ${CMAKE_CURRENT_LIST_DIR}/test_hub.py
           WORKING_DIRECTORY ${CMAKE_CURRENT_LIST_DIR})
  set_tests_properties(hub_cli PROPERTIES ENVIRONMENT "TORCHTPU_CLI=$<TARGET_FILE:torchtpu-cpp>"
                                          LABELS hub TIMEOUT 300)
endif()
