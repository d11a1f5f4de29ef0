# Checkpoint layout at scale: bytes written per save independent of W,
# files opened per rank at load bounded, commit messages per rank O(log W)
# (ckpt_scale.py runs ckpt_scale_probe at each rank count).
add_executable(ckpt_scale_probe ${CMAKE_CURRENT_LIST_DIR}/ckpt_scale_probe.cc)
target_link_libraries(ckpt_scale_probe PRIVATE tutti_static)
target_include_directories(ckpt_scale_probe PRIVATE ${PROJECT_SOURCE_DIR}/src)
add_test(NAME scale_ckpt
  COMMAND ${TUTTI_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/ckpt_scale.py
          $<TARGET_FILE:ckpt_scale_probe> ${TUTTI_MPIEXEC} 2 4 8 16)
set_tests_properties(scale_ckpt PROPERTIES
  TIMEOUT 400 LABELS "scale;checkpoint" ENVIRONMENT "${TUTTI_TEST_ENV}" PROCESSORS 2)
