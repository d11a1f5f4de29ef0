# Issue 29, WP4: stall and timeout reports gathered through the status tree
# cost each process at most 2 x TUTTI_STATUS_FANOUT + 2 messages whatever
# the rank count (every waiting rank asking every peer cost W - 1 each), one
# gather in all, and nothing while no op stalls; report lines name ranks as
# ranges past TUTTI_REPORT_MAX_RANKS; a departure notice reaches every
# member once, at most fanout + 1 sends per process.  The tests are
# tests/comm/test_status_tree.cc's MPI cases, run at larger rank counts
# (fanout 8: one level below the root at np 8, two at np 16; fanout 2 at np
# 16: depth 3).  Oversubscribed (2 cores): counts only, never times; a
# long TUTTI_STATUS_GRACE_MS keeps a member that the loaded machine
# schedules late from being reported silent (which costs extra gathers).
set(_status_cases "StatusTreeMpi.EveryWaitingRank*:StatusTreeMpi.Nothing*:StatusTreeMpi.ADeparture*")
foreach(spec "8;8" "16;8" "16;2")
  list(GET spec 0 np)
  list(GET spec 1 fanout)
  add_test(NAME scale_status_np${np}_fanout${fanout}
    COMMAND ${PROJECT_SOURCE_DIR}/tests/common/launch.sh ${TUTTI_MPIEXEC} --oversubscribe --bind-to none -np ${np}
            $<TARGET_FILE:test_status_tree> --gtest_filter=${_status_cases})
  set_tests_properties(scale_status_np${np}_fanout${fanout} PROPERTIES TIMEOUT 120
    LABELS "scale;np${np}" PROCESSORS 2
    ENVIRONMENT "${TUTTI_TEST_ENV};TUTTI_STATUS_FANOUT=${fanout};TUTTI_STATUS_GRACE_MS=10000")
endforeach()
