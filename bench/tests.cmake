# verbs-perf's own correctness on a device: write_bw, read_bw and send_bw as a server and a client
# with --verify (the data is checked after each run). No timing is asserted. Skips (77) without
# an RDMA device.
add_test(NAME bench.verbs_perf_verify
         COMMAND ${CMAKE_CURRENT_LIST_DIR}/verbs-perf/verify-pair.sh $<TARGET_FILE:verbs-perf>)
set_tests_properties(bench.verbs_perf_verify PROPERTIES LABELS device TIMEOUT 600 SKIP_RETURN_CODE 77)

# bench/compare refuses an --out it cannot write before it runs anything (it used to find out
# after a whole run); outside the repository when the run would go to the SoftRoCE VM, whose
# only writable share is the repository. Host tests: no device, no perftest needed.
add_test(NAME bench.compare_out_unwritable
         COMMAND ${CMAKE_CURRENT_LIST_DIR}/compare --inner --perf $<TARGET_FILE:verbs-perf> --out /proc/verbs-compare)
set_tests_properties(bench.compare_out_unwritable PROPERTIES LABELS host TIMEOUT 60
                     PASS_REGULAR_EXPRESSION "compare: --out /proc/verbs-compare: cannot write there")
add_test(NAME bench.compare_out_outside_repo_for_vm
         COMMAND ${CMAKE_CURRENT_LIST_DIR}/compare --perf $<TARGET_FILE:verbs-perf> --out /proc/verbs-compare)
set_tests_properties(bench.compare_out_outside_repo_for_vm PROPERTIES LABELS host TIMEOUT 60
                     PASS_REGULAR_EXPRESSION "compare: --out /proc/verbs-compare: (the run goes to the SoftRoCE VM, which can write only inside the repository|cannot write there)")
