# Issue 29, WP1: the cost of small host ops grows as a + b*ceil(log2 W), not
# with W.  host_probe.cc reads tutti's own counters (comm/counters.h) around
# a check-only op (an all-reduce above TUTTI_MPI_FOLD_BYTES: its agreement
# check), a barrier and a 1 KiB all-reduce (folded into the check), and
# asserts messages, bytes and rounds per op against the closed forms at each
# rank count.  Oversubscribed (2 cores): counts only, never times.
tutti_add_test(NAME scale_host_ops SOURCES ${CMAKE_CURRENT_LIST_DIR}/host_probe.cc
  NP 2 4 8 16 32 LABELS scale TIMEOUT 120)
foreach(np 2 4 8 16 32)
  set_tests_properties(scale_host_ops_np${np} PROPERTIES PROCESSORS 2)
endforeach()
