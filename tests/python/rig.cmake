# The Cloud TPU rig, offline: a stand-in gcloud, the startup script run with its cloud parts
# replaced. rig_boot installs the pinned torch/torch_tpu into a fresh venv from the wheelhouse
# setup.sh fills from PyPI (.cache/wheels; the test downloads what torch's wheels lack) and builds
# the module from the script's own tarball (several GB of wheels unpacked, 3-4 minutes here).
add_test(NAME rig
         COMMAND ${Python3_EXECUTABLE} -m pytest -q -p no:cacheprovider -m "not slow"
                 ${CMAKE_CURRENT_SOURCE_DIR}/python/test_rig.py)
add_test(NAME rig_boot
         COMMAND ${Python3_EXECUTABLE} -m pytest -q -s -p no:cacheprovider -m slow
                 ${CMAKE_CURRENT_SOURCE_DIR}/python/test_rig.py)
# rig_boot and py_parity_e2b each fill about 10 GB of scratch disk: the lock keeps them apart.
set_tests_properties(rig_boot PROPERTIES LABELS slow TIMEOUT 2400 RESOURCE_LOCK scratch_disk)
