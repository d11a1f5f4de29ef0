# Issue 29, WP4: the data-parallel list and replica agreements cost a fixed
# number of small collectives and bytes that do not grow with W, agreeing or
# not (dp_probe.cc reads dp::agreement_cost()).  Oversubscribed: counts only.
tutti_add_test(NAME scale_dp_agreement SOURCES ${CMAKE_CURRENT_LIST_DIR}/dp_probe.cc
  NP 2 4 8 16 LABELS scale TIMEOUT 120)
foreach(np 2 4 8 16)
  set_tests_properties(scale_dp_agreement_np${np} PROPERTIES PROCESSORS 2)
endforeach()
