# The example programs run as a server and its clients (tests/examples/run.sh). The device
# cases skip (77) without an RDMA device; example.help needs none.
# Included from tests/CMakeLists.txt when the examples are built.
set(verbs_example_cases write_pingpong write_pingpong.mismatch write_pingpong.killed send_recv echo_epoll echo_threads read_remote atomic_counter srq_server
    datagram datagram.udaddy multicast multicast.mckey rail_mover)
if(VERBS_ASIO_COROUTINES)  # examples/CMakeLists.txt builds echo_asio and kv_asio then
  list(APPEND verbs_example_cases echo_asio kv_asio)
endif()
foreach(case IN LISTS verbs_example_cases)
  add_test(NAME example.${case}
           COMMAND ${CMAKE_CURRENT_LIST_DIR}/run.sh ${case} $<TARGET_FILE_DIR:write_pingpong>)
  set_tests_properties(example.${case} PROPERTIES LABELS device TIMEOUT 240 SKIP_RETURN_CODE 77)
  if(VERBS_SANITIZE)
    # Sanitized programs are slower: run.sh scales its time limits. The event-loop servers'
    # longest round gets a bound of its own, 6 s: a round takes up to 4 requests, each a QP, a
    # CQ and a region made under ASan in TCG (about 40 ms of CPU each, the rest of a 300-500 ms
    # round spent waiting for the guest's CPUs), and on a slow machine ASan's echo_epoll took
    # 2413 ms and, in CI, 3729 ms. Traced in the VM (a 3 s round, its kernel stacks sampled):
    # the loop waited in the kernel for the connection manager's own work (cm_destroy_id) and
    # for its mm lock in page faults, on two busy vCPUs; never on the network. 6 s stays below
    # what a loop blocked on a client would wait: the handshake's 10 s, the silent client's 12 s.
    set_tests_properties(example.${case} PROPERTIES ENVIRONMENT "VERBS_TEST_TIMEOUT_SCALE=2;VERBS_EXAMPLE_ROUND_BOUND_MS=6000")
  endif()
endforeach()
add_test(NAME example.help COMMAND ${CMAKE_CURRENT_LIST_DIR}/run.sh help $<TARGET_FILE_DIR:write_pingpong>)
set_tests_properties(example.help PROPERTIES LABELS host TIMEOUT 60)
