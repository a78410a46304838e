# Cross-host tests (label wire; not "twohost": ctest -L takes a regular expression, and
# `ctest -L host` would pick that up): the two hosts of scripts/rxe-pair, joined by one emulated
# Ethernet link, run a case on host b with its peer on host a (tests/twohost/run.sh). They run on
# this machine, not inside a VM, one at a time (a pair takes both CPUs); scripts/test runs them
# with `ctest -L wire`. Included from tests/CMakeLists.txt with the examples and bench built.
#
# Every case that leaves the wire and both hosts as it found them (the examples, the tour, rping,
# verbs-perf, compare, the faults, the rails, the guide's host A / host B commands) shares one
# pair, booted once by the fixture twohost_pair (tests/twohost/shared-pair): a boot of a pair
# took about 25-35 s of each such test. A fault that powers host a off boots it again before it
# ends; one that changes its MTU sets it back. Only the guide's scripts/rxe-pair commands boot
# pairs of their own.
set(verbs_twohost_run ${CMAKE_CURRENT_LIST_DIR}/run.sh)
set(verbs_twohost_state ${PROJECT_BINARY_DIR}/twohost-pair)
set(verbs_twohost_shared ${verbs_twohost_run} --shared ${verbs_twohost_state})
add_test(NAME twohost.pair_up COMMAND ${CMAKE_CURRENT_LIST_DIR}/shared-pair up ${verbs_twohost_state})
add_test(NAME twohost.pair_down COMMAND ${CMAKE_CURRENT_LIST_DIR}/shared-pair down ${verbs_twohost_state})
set_tests_properties(twohost.pair_up PROPERTIES FIXTURES_SETUP twohost_pair)
set_tests_properties(twohost.pair_down PROPERTIES FIXTURES_CLEANUP twohost_pair)
set(verbs_twohost_shared_tests)
# Traffic with every byte checked, for the faults (tests/twohost/wire_peer.cpp).
add_executable(wire_peer ${CMAKE_CURRENT_LIST_DIR}/wire_peer.cpp)
target_link_libraries(wire_peer PRIVATE verbs::verbs verbs_warnings)

# Every example pair, the server on host a and the clients on host b. Not the echo servers' 53
# clients: across the wire, with both guests sharing this machine's two CPUs, their default
# transport options (7 tries of 67 ms) did not outlast the emulation's stalls (once in two
# runs, 30 of 50 clients ended with RETRY_EXC_ERR); they run on one host (example.echo_*).
set(verbs_twohost_example_cases ${verbs_example_cases})
list(FILTER verbs_twohost_example_cases EXCLUDE REGEX "^echo_")
foreach(case IN LISTS verbs_twohost_example_cases)
  list(APPEND verbs_twohost_shared_tests twohost.example.${case})
  add_test(NAME twohost.example.${case}
           COMMAND ${verbs_twohost_shared} -- ${PROJECT_SOURCE_DIR}/tests/examples/run.sh ${case} $<TARGET_FILE_DIR:write_pingpong>)
endforeach()
# The README's tour and the expose program (docs/connections.md) across the wire.
add_test(NAME twohost.readme_tour
         COMMAND ${verbs_twohost_shared} -- ${PROJECT_SOURCE_DIR}/tests/tour/readme.sh tour $<TARGET_FILE:readme_tour>)
add_test(NAME twohost.readme_expose
         COMMAND ${verbs_twohost_shared} -- ${PROJECT_SOURCE_DIR}/tests/tour/readme.sh expose $<TARGET_FILE:readme_expose>)
# rping interop, ours and rdma-core's, each as the server on host a.
foreach(pair "ours;debian" "debian;ours" "ours;ours")
  list(GET pair 0 server)
  list(GET pair 1 client)
  list(APPEND verbs_twohost_shared_tests twohost.rping.${server}_server_${client}_client)
  add_test(NAME twohost.rping.${server}_server_${client}_client
           COMMAND ${verbs_twohost_shared} -- ${PROJECT_SOURCE_DIR}/tests/rping/interop.sh $<TARGET_FILE:rping> ${server} ${client})
endforeach()
# verbs-perf --verify: write, read, send and atomics, the servers on host a.
add_test(NAME twohost.verbs_perf_verify
         COMMAND ${verbs_twohost_shared} -- ${PROJECT_SOURCE_DIR}/bench/verbs-perf/verify-pair.sh $<TARGET_FILE:verbs-perf>)

# bench/compare --serve (host a) and --connect (host b), end to end, a short run. Host b leads;
# host a needs only the device.
add_test(NAME twohost.compare
         COMMAND ${verbs_twohost_shared} -- ${CMAKE_CURRENT_LIST_DIR}/compare.sh --serve-on-a $<TARGET_FILE:verbs-perf> ${PROJECT_BINARY_DIR}/twohost-compare
                    --device rxe0 --pairs 1 --sweep-pairs 0 --qp-pairs 1 --qp-counts 1,8,64 --scale 50)

# The two-host commands of docs/connections.md as written (tests/twohost/readme.sh reads them as
# cmake/doc_snippets.cmake extracted them): the "host A / host B" block on the shared pair, and
# the scripts/rxe-pair block from this machine (each of its commands boots a pair).
add_test(NAME twohost.readme_two-hosts
         COMMAND ${verbs_twohost_shared} -- ${CMAKE_CURRENT_LIST_DIR}/readme.sh two-hosts ${PROJECT_BINARY_DIR})
add_test(NAME twohost.readme_rxe-pair
         COMMAND ${CMAKE_CURRENT_LIST_DIR}/readme.sh rxe-pair ${PROJECT_BINARY_DIR})
# The faults a network brings (tests/twohost/faults.sh): loss, delay, reordering, duplication,
# the link down, a host that loses power, connects that cannot succeed, and a soak.
# Not link_down_survives (faults.sh runs it by hand): on SoftRoCE (6.1.0-57) a QP that sends while
# its netdev is down fails at once with LOC_QP_OP_ERR (rxe cannot transmit), so the outage ends
# connections whatever the retry budget; in 2 of 3 flaps a 48 KiB RDMA read completed successfully
# with wrong data, as host b's kernel logged a WARNING in rxe_completer (rxe_comp.c:756); and after
# a flap, three times, rdma_cm on that host answered no new connection request (its QP 1 still in
# RTS). All three are rxe's; on a NIC the case is meaningful. The 12 s outage is therefore a cut wire (netem loss 100%), link_cut_fails.
# The cases that change only the wire (netem on eth0) share the pair: faults.sh takes its faults
# away on exit, whatever happened, and each case first checks that both hosts' eth0 have none. Those that
# power host a off or need another MTU boot pairs of their own.
foreach(case loss1 loss5 delay reorder duplicate link_cut_survives link_cut_fails connect_no_listener soak)
  list(APPEND verbs_twohost_shared_tests twohost.fault.${case})
  add_test(NAME twohost.fault.${case}
           COMMAND ${verbs_twohost_shared} -- ${CMAKE_CURRENT_LIST_DIR}/faults.sh ${case} $<TARGET_FILE:wire_peer> $<TARGET_FILE:verbs-info>)
endforeach()

# verbs::rails over both wires of the shared pair (tests/twohost/rails.sh): a striped transfer
# with every byte checked; one wire cut mid-transfer and back; both wires cut.
add_executable(rails_peer ${CMAKE_CURRENT_LIST_DIR}/rails_peer.cpp)
target_link_libraries(rails_peer PRIVATE verbs::verbs verbs_warnings)
foreach(case stripe cut_one cut_both)
  list(APPEND verbs_twohost_shared_tests twohost.rails.${case})
  add_test(NAME twohost.rails.${case}
           COMMAND ${verbs_twohost_shared} -- ${CMAKE_CURRENT_LIST_DIR}/rails.sh ${case} $<TARGET_FILE:rails_peer>)
endforeach()

# Last on the shared pair, the cases that power host a off (each boots it again before it ends)
# or change its MTU (host a's eth0 at 9000, RDMA MTU 4096, host b's at 1500: set back on exit).
foreach(case host_killed server_survives connect_down_host mtu_mismatch)
  list(APPEND verbs_twohost_shared_tests twohost.fault.${case})
  add_test(NAME twohost.fault.${case}
           COMMAND ${verbs_twohost_shared} -- ${CMAKE_CURRENT_LIST_DIR}/faults.sh ${case} $<TARGET_FILE:wire_peer> $<TARGET_FILE:verbs-info>)
endforeach()

get_property(verbs_twohost_tests DIRECTORY PROPERTY TESTS)
list(FILTER verbs_twohost_tests INCLUDE REGEX "^twohost\\.")
set_tests_properties(${verbs_twohost_tests} PROPERTIES LABELS wire TIMEOUT 900 RUN_SERIAL TRUE SKIP_RETURN_CODE 77)
list(APPEND verbs_twohost_shared_tests twohost.readme_tour twohost.readme_expose twohost.verbs_perf_verify twohost.compare
     twohost.readme_two-hosts)
set_tests_properties(${verbs_twohost_shared_tests} PROPERTIES FIXTURES_REQUIRED twohost_pair)
# A test that boots its own pair runs once the shared one is down: two pairs at once would be four
# guests on two CPUs. (DEPENDS orders only: they run even when pair_down failed or is not chosen.)
set(verbs_twohost_own_pairs ${verbs_twohost_tests})
list(REMOVE_ITEM verbs_twohost_own_pairs ${verbs_twohost_shared_tests} twohost.pair_up twohost.pair_down)
set_tests_properties(${verbs_twohost_own_pairs} PROPERTIES DEPENDS twohost.pair_down)
