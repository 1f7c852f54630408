# Downloads against a fake Hub on loopback, and the cache shared with huggingface_hub.
add_test(NAME hub_python
         COMMAND ${TORCHTPU_VENV_PYTHON} -m pytest -q -p no:cacheprovider
                 ${CMAKE_CURRENT_LIST_DIR}/test_hub.py
         WORKING_DIRECTORY ${CMAKE_CURRENT_LIST_DIR})
set_tests_properties(hub_python PROPERTIES
                     ENVIRONMENT "HUB_DOWNLOAD_TOOL=$<TARGET_FILE:hub_download_tool>"
                     LABELS hub TIMEOUT 600)
