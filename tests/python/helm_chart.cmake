# deploy/helm/torchtpu-cpp offline (issue #21): helm lint and template for each values file, the
# rendered core kinds through kubernetes-validate --strict, the custom resources through
# check-jsonschema. helm is the one scripts/setup.sh builds from the Go module proxy.
set(TORCHTPU_HELM ${CMAKE_SOURCE_DIR}/.cache/tools/helm-v3.22.0/helm)
add_test(NAME py_helm_chart
         COMMAND ${Python3_EXECUTABLE} -m pytest -q -p no:cacheprovider
                 ${CMAKE_CURRENT_LIST_DIR}/test_helm_chart.py)
set_tests_properties(py_helm_chart PROPERTIES ENVIRONMENT "TORCHTPU_HELM=${TORCHTPU_HELM}"
                     TIMEOUT 600 LABELS "python;deploy")
