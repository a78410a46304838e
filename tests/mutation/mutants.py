"""Deliberate small breakages ("mutants") of the library's own code, each one a realistic bug of
a kind this code has had: a check before posting removed, an rdma_cm event not acknowledged, a
wrong access flag, a lost wakeup, a deadline ignored, a route not removed, a child not keeping its
parent alive, a status decoded wrongly, the cm MTU tag not applied, a private data limit off by
one, transport options not applied to the QP, a CQ not armed.

Each entry of MUTANTS:
  id     short kebab-case name
  file   path relative to the repository root (src/*.cpp or include/verbs/*.hpp only)
  from   text that occurs exactly once in that file
  to     what replaces it (still compiles, warning-free under -Wall -Wextra -Wconversion)
  suite  "host" (tests/host, stub providers and fakes) or "device" (tests/device, SoftRoCE)
  tests  a ctest -R regular expression naming the tests that should fail with the mutant
  why    what the bug is and which test notices
  expect (optional) "missed": no existing test catches it; `why` says what test is missing

Importing this module has no side effects; run it (python3 tests/mutation/mutants.py) to check
that every `from` occurs exactly once in its file.
"""

MUTANTS = [
    # ---------------------------------------------------------------- host (no device) ----
    {
        "id": "qp-sends-allowed-before-rts",
        "file": "src/queue_pair.cpp",
        "from": "const std::uint64_t ops = state >= IBV_QPS_RTS ? type_ops_ : 0;",
        "to": "const std::uint64_t ops = state >= IBV_QPS_INIT ? type_ops_ : 0;",
        "suite": "host",
        "tests": r"^QueuePairStub\.BeforeRtsEverySendIsBadQpStateWhateverElseIsWrong$",
        "why": "the QP state check before posting lets sends through in INIT and RTR; "
               "QueuePairStub.BeforeRtsEverySendIsBadQpStateWhateverElseIsWrong expects bad_qp_state and nothing posted",
    },
    {
        "id": "qp-inline-size-off-by-one",
        "file": "include/verbs/queue_pair.hpp",
        "from": "(!inline_data || total <= max_inline_) &&",
        "to": "(!inline_data || total <= max_inline_ + 1) &&",
        "suite": "host",
        "tests": r"^QueuePairStub\.InlineDataOverTheQpsInlineSizeIsRejected$",
        "why": "the inline size check before posting admits one byte over max_inline_data; "
               "QueuePairStub.InlineDataOverTheQpsInlineSizeIsRejected posts 65 bytes inline on a 64-byte QP",
    },
    {
        "id": "sendwr-remote-bounds-off-by-one",
        "file": "include/verbs/work_request.hpp",
        "from": "if (total_ > r.length) fail_(Errc::remote_too_small);",
        "to": "if (total_ > r.length + 1) fail_(Errc::remote_too_small);",
        "suite": "host",
        "tests": r"^SendWr\.(WriteLargerThanRemoteSliceIsRejected|ReadLargerThanRemoteSliceIsRejected)$",
        "why": "the remote bounds check of writes and reads lets one byte past the remote slice through; "
               "SendWr.WriteLargerThanRemoteSliceIsRejected (129 into 128) and ReadLargerThanRemoteSliceIsRejected",
    },
    {
        "id": "sendbatch-add-skips-the-checks",
        "file": "include/verbs/queue_pair.hpp",
        "from": "if (!qp_->passes_(qp_->batch_allowed_, w.key_, w.err_, r.num_sge, inl, w.total_)) [[unlikely]] {",
        "to": "if (false) [[unlikely]] {",
        "suite": "host",
        "tests": r"^SendBatchStub\.(ChecksAreQueuePairPostsChecks|UdRefusalsAreQueuePairPosts)$",
        "why": "SendBatch::add no longer makes QueuePair::post's checks (bounds, alignment, SGE count, UD address); "
               "SendBatchStub.ChecksAreQueuePairPostsChecks and UdRefusalsAreQueuePairPosts expect the batch refused",
    },
    {
        "id": "sendbatch-typed-calls-ignore-build-error",
        "file": "include/verbs/queue_pair.hpp",
        "from": "if (!qp_->passes_(qp_->batch_allowed_, key, static_cast<unsigned>(e), sge ? 1 : 0, o.inline_data, total))",
        "to": "if (!qp_->passes_(qp_->batch_allowed_, key, 0u, sge ? 1 : 0, o.inline_data, total))",
        "suite": "host",
        "tests": r"^SendBatchStub\.ChecksAreQueuePairPostsChecks$",
        "why": "SendBatch's typed calls (write, read, fetch_add...) drop their own check (remote too small, "
               "misaligned atomic) before admitting; SendBatchStub.ChecksAreQueuePairPostsChecks's typed refusals",
    },
    {
        "id": "qpoptions-grant-remote-rights-by-default",
        "file": "include/verbs/queue_pair.hpp",
        "from": "AccessFlags access = {};                    ///< remote operations the peer may perform",
        "to": "AccessFlags access = Access::remote_read | Access::remote_write;  ///< remote operations the peer may perform",
        "suite": "host",
        "tests": r"^Flags\.QpOptionsGrantNoRemoteAccessByDefault$",
        "why": "a default QpOptions grants the peer remote read and write; Flags.QpOptionsGrantNoRemoteAccessByDefault",
    },
    {
        "id": "mr-reg-drops-relaxed-ordering",
        "file": "src/memory_region.cpp",
        "from": "memory.size(),\n                                                   static_cast<int>(access.value()))",
        "to": "memory.size(),\n                                                   "
              "static_cast<int>(access.value() & ~unsigned{IBV_ACCESS_RELAXED_ORDERING}))",
        "suite": "host",
        "tests": r"^FakeRegistration\.ARelaxedOrderingRegionIsRegisteredWithTheFlag$",
        "why": "an access flag is dropped on the way to ibv_reg_mr (relaxed ordering, which rxe ignores); "
               "FakeRegistration.ARelaxedOrderingRegionIsRegisteredWithTheFlag reads the flags the fake saw",
    },
    {
        "id": "mr-does-not-keep-its-pd",
        "file": "src/memory_region.cpp",
        "from": "\"ibv_reg_mr\", where);\n  mr_ = std::shared_ptr<ibv_mr>(mr, Deleter{pd.shared_handle(), {}});",
        "to": "\"ibv_reg_mr\", where);\n  mr_ = std::shared_ptr<ibv_mr>(mr, Deleter{nullptr, {}});",
        "suite": "host",
        "tests": r"^FakeRegistration\.ReregOfThePdHoldsTheNewOneAndLetsGoOfTheOld$",
        "why": "a registered region does not keep its protection domain alive (the child lets its parent go); "
               "FakeRegistration.ReregOfThePdHoldsTheNewOneAndLetsGoOfTheOld expects the PD unreleased while the region lives",
    },
    {
        "id": "mr-rereg-while-a-window-holds-it",
        "file": "src/memory_region.cpp",
        "from": "if (mr_.use_count() > 1)",
        "to": "if (false)",
        "suite": "host",
        "tests": r"^FakeRegistration\.ReregIsRefusedWhileSomethingElseHoldsTheRegistration$",
        "why": "rereg no longer refuses (EBUSY) while a memory window or shared_handle() holds the registration; "
               "FakeRegistration.ReregIsRefusedWhileSomethingElseHoldsTheRegistration",
    },
    {
        "id": "cq-arm-and-poll-never-arms",
        "file": "src/completion_queue.cpp",
        "from": "if (const int rc = ibv_req_notify_cq(cq_.get(), solicited_only ? 1 : 0); rc != 0) {",
        "to": "if (const int rc = solicited_only ? 0 : 0; rc != 0) {",
        "suite": "host",
        "tests": r"^CompletionQueueArm\.ArmAndPollReturnsACompletionThatLandedWhileArming$",
        "why": "CQ arming skipped in arm_and_poll (no ibv_req_notify_cq); "
               "CompletionQueueArm.ArmAndPollReturnsACompletionThatLandedWhileArming counts the stub's armings "
               "(CompletionQueueArm.WaitingForeverWaits would hang, so it is left out)",
    },
    {
        "id": "cq-arm-and-poll-does-not-poll-again",
        "file": "src/completion_queue.cpp",
        "from": "  // A completion that landed between the caller's last poll and the arming raised no event.\n"
                "  return poll(out, ec);",
        "to": "  return out.first(0);",
        "suite": "host",
        "tests": r"^CompletionQueueArm\.ArmAndPollReturnsACompletionThatLandedWhileArming$",
        "why": "lost wakeup: arm_and_poll arms without polling again, so a completion that landed while arming "
               "is waited for forever; CompletionQueueArm.ArmAndPollReturnsACompletionThatLandedWhileArming "
               "(WaitDoesNotSleepOnACompletionThatLandedWhileArming takes 30 s and WaitingForeverWaits hangs: left out)",
    },
    {
        "id": "async-hub-route-not-removed",
        "file": "src/device.cpp",
        "from": "routes_.erase(qp);",
        "to": "(void)qp;",
        "suite": "host",
        "tests": r"^DeviceAsyncEvents\.AQpsRouteHearsItsEventsAndDeviceFatalOnly$",
        "why": "AsyncHub::remove_route leaves the QP's route behind; "
               "DeviceAsyncEvents.AQpsRouteHearsItsEventsAndDeviceFatalOnly delivers a QP_FATAL after removing it",
    },
    {
        "id": "async-hub-kept-event-no-wakeup",
        "file": "src/device.cpp",
        "from": "(void)!::write(kept_fd_, &one, sizeof one);",
        "to": "(void)one;",
        "suite": "host",
        "tests": r"^DeviceAsyncEvents\.KeptEventsMakeTheFdReadableUntilPolled$",
        "why": "lost wakeup: an async event kept for poll_async_events does not write the eventfd, so async_fd() "
               "stays silent; DeviceAsyncEvents.KeptEventsMakeTheFdReadableUntilPolled",
    },
    {
        "id": "async-wait-ends-at-a-signal",
        "file": "src/device.cpp",
        "from": "if (::poll(&p, 1, left) < 0 && errno != EINTR) detail::throw_errno(errno, \"poll(async_fd)\", "
                "SourceLocation::current());",
        "to": "if (::poll(&p, 1, left) < 0) return std::nullopt;",
        "suite": "host",
        "tests": r"^DeviceAdopt\.ASignalDoesNotEndTheWaitForAnAsyncEvent$",
        "why": "wait_async_event no longer honours its timeout: a signal (EINTR) ends the wait as if it timed out; "
               "DeviceAdopt.ASignalDoesNotEndTheWaitForAnAsyncEvent expects the full 400 ms",
    },
    {
        "id": "device-move-closes-context-before-hub",
        "file": "include/verbs/device.hpp",
        "from": "    hub_ = std::move(o.hub_);\n    ctx_ = std::move(o.ctx_);",
        "to": "    ctx_ = std::move(o.ctx_);\n    hub_ = std::move(o.hub_);",
        "suite": "host",
        "tests": r"^DeviceAdopt\.MoveAssignmentReleasesTheOldHubBeforeTheOldContext$",
        "why": "lifetime: Device's move assignment lets the old context close while its hub (registered by the "
               "context's address) lives; DeviceAdopt.MoveAssignmentReleasesTheOldHubBeforeTheOldContext",
    },
    {
        "id": "errc-out-of-bounds-maps-to-invalid-argument",
        "file": "src/error.cpp",
        "from": "      case Errc::remote_out_of_bounds:\n      case Errc::remote_too_small:\n",
        "to": "      case Errc::remote_too_small:\n",
        "suite": "host",
        "tests": r"^ErrorCode\.ErrcMapsToPortableConditions$",
        "why": "error mapping: Errc::remote_out_of_bounds falls to invalid_argument instead of result_out_of_range; "
               "ErrorCode.ErrcMapsToPortableConditions",
    },
    {
        "id": "rc-to-errno-keeps-negated-errno",
        "file": "include/verbs/error.hpp",
        "from": "  return -rc;\n}",
        "to": "  return rc;\n}",
        "suite": "host",
        "tests": r"^(RcToErrno\.CoversAllThreeConventions|QueuePairStub\.ProviderErrorIsReportedAsItsErrno"
                 r"|CompletionQueueAdopt\.ProviderFailureIsAnErrorCodeOrAnException)$",
        "why": "error mapping: a provider's negated errno (-EAGAIN) is returned as is, and a PostResult reads it as "
               "an Errc; RcToErrno.CoversAllThreeConventions, QueuePairStub.ProviderErrorIsReportedAsItsErrno, "
               "CompletionQueueAdopt.ProviderFailureIsAnErrorCodeOrAnException",
    },
    {
        "id": "async-event-qp-number-not-read",
        "file": "src/device.cpp",
        "from": "        ev.object_qp_num = e.element.qp->qp_num;\n",
        "to": "",
        "suite": "host",
        "tests": r"^(AsyncEvent\.ConcernsOnlyTheObjectItWasRaisedFor"
                 r"|DeviceAsyncEvents\.(KeptEventsMakeTheFdReadableUntilPolled|AQpsRouteHearsItsEventsAndDeviceFatalOnly))$",
        "why": "an async QP event is decoded without the QP number read before its acknowledgement, so it "
               "concerns no QP and reaches no route; AsyncEvent.ConcernsOnlyTheObjectItWasRaisedFor, "
               "DeviceAsyncEvents.AQpsRouteHearsItsEventsAndDeviceFatalOnly",
    },

    # ------------------------------------------------------------ device (SoftRoCE VM) ----
    {
        "id": "qp-init-grants-remote-read",
        "file": "src/queue_pair.cpp",
        "from": "a.qp_access_flags = static_cast<unsigned>(access_.value());",
        "to": "a.qp_access_flags = static_cast<unsigned>(access_.value()) | unsigned{IBV_ACCESS_REMOTE_READ};",
        "suite": "device",
        "tests": r"^RemoteError\.ReadFromAQpWithoutRemoteReadAccessIsAnInvalidRequest$",
        "why": "wrong access flag: RESET->INIT grants remote read the options did not ask for; "
               "RemoteError.ReadFromAQpWithoutRemoteReadAccessIsAnInvalidRequest expects REM_INV_REQ_ERR",
    },
    {
        "id": "qp-rnr-retry-not-applied",
        "file": "src/queue_pair.cpp",
        "from": "    a.rnr_retry = o.rnr_retry_count;\n",
        "to": "",
        "suite": "device",
        "tests": r"^QueuePair\.QueryReportsWhatConnectSetOnEachSide$",
        "why": "TransportOptions::rnr_retry_count is not applied at RTS (0 instead); "
               "QueuePair.QueryReportsWhatConnectSetOnEachSide reads rnr_retry_count 4 back with ibv_query_qp",
    },
    {
        "id": "qp-post-recv-on-srq-qp-not-refused",
        "file": "include/verbs/queue_pair.hpp",
        "from": "if (has_srq_) [[unlikely]] return PostResult::rejected(Errc::qp_has_srq, 0);",
        "to": "if (false) [[unlikely]] return PostResult::rejected(Errc::qp_has_srq, 0);",
        "suite": "device",
        "tests": r"^SharedReceiveQueue\.PostRecvOnAQpWithAnSrqIsRejected$",
        "why": "the check before posting a receive on a QP that takes them from an SRQ is gone; "
               "SharedReceiveQueue.PostRecvOnAQpWithAnSrqIsRejected expects Errc::qp_has_srq",
    },
    {
        "id": "srq-limit-at-creation-not-armed",
        "file": "src/shared_receive_queue.cpp",
        "from": "  if (o.limit != 0) {",
        "to": "  if (false) {",
        "suite": "device",
        "tests": r"^SharedReceiveQueue\.ALimitGivenAtCreationIsArmed$",
        "why": "SrqOptions::limit is left to ibv_create_srq, which ignores it, instead of armed with ibv_modify_srq; "
               "SharedReceiveQueue.ALimitGivenAtCreationIsArmed",
    },
    {
        "id": "ud-recv-grh-room-off-by-one",
        "file": "include/verbs/work_request.hpp",
        "from": "if (min_bytes != 0 && w.total_ < min_bytes) [[unlikely]]",
        "to": "if (min_bytes != 0 && w.total_ < min_bytes - 1) [[unlikely]]",
        "suite": "device",
        "tests": r"^UnreliableDatagram\.AReceiveWithoutRoomForTheGrhIsRefused$",
        "why": "the UD receive size check before posting admits 39 bytes for the 40-byte GRH; "
               "UnreliableDatagram.AReceiveWithoutRoomForTheGrhIsRefused",
    },
    {
        "id": "mr-slice-bounds-off-by-one",
        "file": "include/verbs/memory_region.hpp",
        "from": "if (offset > size() || len > size() - offset) [[unlikely]]",
        "to": "if (offset > size() || len > size() - offset + 1) [[unlikely]]",
        "suite": "device",
        "tests": r"^MemoryRegion\.SliceOutsideTheRegionThrowsLocalOutOfBounds$",
        "why": "MemoryRegion::slice's bounds check lets a slice end one byte past the region; "
               "MemoryRegion.SliceOutsideTheRegionThrowsLocalOutOfBounds (slice(4000, 97) of 4096 bytes)",
    },
    {
        "id": "mw-bind-range-end-not-checked",
        "file": "src/memory_window.cpp",
        "from": "range.addr() - base > mr.size() ||\n      range.length() > mr.size() - (range.addr() - base))",
        "to": "range.addr() - base > mr.size())",
        "suite": "device",
        "tests": r"^Window\.AWindowOnARegionAtAnIovaOpensThatIovaRange$",
        "why": "the bounds check before posting a window bind no longer looks at where the range ends; "
               "Window.AWindowOnARegionAtAnIovaOpensThatIovaRange binds 8 bytes from 4 before the region's end",
    },
    {
        "id": "mw-type2-does-not-keep-its-qp",
        "file": "src/memory_window.cpp",
        "from": "    qp_ = qp.shared_handle();",
        "to": "    qp_ = std::shared_ptr<ibv_qp>(std::shared_ptr<ibv_qp>(), qp.native_handle());",
        "suite": "device",
        "tests": r"^Window\.TearingDownTheQpAndTheRegionBeforeTheBoundWindowDoesNotStall$",
        "why": "lifetime: a bound type 2 window remembers its QP without keeping it alive, so the QP is destroyed "
               "under the bound window (rxe stalls about 51 s); "
               "Window.TearingDownTheQpAndTheRegionBeforeTheBoundWindowDoesNotStall expects under 10 s (the run takes ~1 min)",
    },
    {
        "id": "mw-bind-lkey-not-checked",
        "file": "src/memory_window.cpp",
        "from": "if (range.lkey() != mr.lkey() || range.addr() < base",
        "to": "if (range.addr() < base",
        "suite": "device",
        "tests": r"^Window\.BindsTheRegionOrTheQpCannotTakeAreRejectedWithNothingPosted$",
        "why": "the lkey check of a bind's range is gone: Window.BindsTheRegionOrTheQpCannotTakeAreRejectedWithNothingPosted "
               "binds a slice of a second region registered over the same memory (same addresses, another lkey), "
               "added when this mutant was missed (its other region's slice lay outside the range anyway)",
    },
    {
        "id": "cq-req-notify-drops-solicited-only",
        "file": "src/completion_queue.cpp",
        "from": "detail::check_rc(ibv_req_notify_cq(cq_.get(), solicited_only ? 1 : 0), \"ibv_req_notify_cq\");",
        "to": "detail::check_rc(ibv_req_notify_cq(cq_.get(), solicited_only ? 0 : 0), \"ibv_req_notify_cq\");",
        "suite": "device",
        "tests": r"^CompletionQueue\.SolicitedOnlyArmingWakesOnlyForSolicitedSends$",
        "why": "wrong flag: req_notify(true) arms for every completion, not solicited ones only; "
               "CompletionQueue.SolicitedOnlyArmingWakesOnlyForSolicitedSends sees an unsolicited send wake it",
    },
    {
        "id": "cq-wait-sleeps-past-its-deadline",
        "file": "src/completion_queue.cpp",
        "from": "const int n = ::poll(&p, 1, std::max(1, detail::poll_ms_until(deadline)));",
        "to": "const int n = ::poll(&p, 1, std::max(3000, detail::poll_ms_until(deadline)));",
        "suite": "device",
        "tests": r"^CompletionQueue\.WaitWithChannelAndNothingPostedTimesOutEmpty$",
        "why": "CompletionQueue::wait waits longer than its timeout (sleeps at least 3 s on the channel); "
               "CompletionQueue.WaitWithChannelAndNothingPostedTimesOutEmpty expects 500 ms to end within 2.5 s",
    },
    {
        "id": "cq-drain-and-arm-never-rearms",
        "file": "include/verbs/completion_queue.hpp",
        "from": "        got = arm_and_poll(buf, ec, solicited_only);",
        "to": "        (void)solicited_only;\n        got = poll(buf, ec);",
        "suite": "device",
        "tests": r"^CompletionChannel\.(DrainAndArmTakesEveryCompletionAndRearms|ReadingItSaysWhichCqFired)$",
        "why": "CQ arming skipped: drain_and_arm polls until empty but never arms again, so the next completion "
               "raises no event; CompletionChannel.DrainAndArmTakesEveryCompletionAndRearms (\"left the CQ unarmed\")",
    },
    {
        "id": "shared-channel-cq-destroyed-with-unacked-events",
        "file": "src/completion_queue.cpp",
        "from": "    if (shared) shared->remove(c);",
        "to": "    (void)shared;",
        "suite": "device",
        "tests": r"^CompletionChannel\.DestroyingACqWithUnacknowledgedEventsDoesNotBlock$",
        "why": "a CQ on a shared channel leaves the channel's books without acknowledging its remaining events, so "
               "ibv_destroy_cq blocks; CompletionChannel.DestroyingACqWithUnacknowledgedEventsDoesNotBlock (10 s bound)",
    },
    {
        "id": "completion-channel-wait-ignores-its-timeout",
        "file": "src/completion_channel.cpp",
        "from": "const auto deadline = detail::deadline_after(timeout);",
        "to": "const auto deadline = detail::deadline_after(timeout + std::chrono::seconds(5));",
        "suite": "device",
        "tests": r"^CompletionChannel\.FdIsNonBlockingAndEmptyReadsReturnAtOnce$",
        "why": "CompletionChannel::wait waits 5 s longer than asked; "
               "CompletionChannel.FdIsNonBlockingAndEmptyReadsReturnAtOnce expects a 50 ms wait to end within 2 s",
    },
    {
        "id": "cm-qp-grants-remote-write-not-asked",
        "file": "src/cm/connection_qp.cpp",
        "from": "a.qp_access_flags = static_cast<unsigned>(access.value());",
        "to": "a.qp_access_flags = static_cast<unsigned>(access.value()) | unsigned{IBV_ACCESS_REMOTE_WRITE};",
        "suite": "device",
        "tests": r"^Cm\.QpGrantsOnlyTheRemoteRightsAsked$",
        "why": "wrong access flag: a connection's QP grants remote write whatever QpOptions::access says; "
               "Cm.QpGrantsOnlyTheRemoteRightsAsked expects the client's write to fail",
    },
    {
        "id": "cm-mtu-tag-not-applied",
        "file": "src/cm/connection_qp.cpp",
        "from": "        if (peer_mtu) a.path_mtu = std::min(a.path_mtu, static_cast<ibv_mtu>(*peer_mtu));\n",
        "to": "",
        "suite": "device",
        "tests": r"^Cm\.A(Server|Client)ThatTakesASmallerMtuHas(TheClient|TheServer)WriteAtIt$",
        "why": "the peer's path MTU tag is parsed but not applied at RTR, so that side keeps the route's MTU; "
               "Cm.AServerThatTakesASmallerMtuHasTheClientWriteAtIt reads both QPs' path MTU (512 expected)",
    },
    {
        "id": "cm-private-data-limit-off-by-one",
        "file": "src/cm/connection_qp.cpp",
        "from": "if (o.private_data.size() + extra > limit)",
        "to": "if (o.private_data.size() + extra > limit + 1)",
        "suite": "device",
        "tests": r"^Cm\.PrivateDataOneByteOverTheLimitIsRefusedBeforeAnythingIsSent$",
        "why": "private data length off by one: 57 bytes pass the 56-byte check and reach rdma_connect; "
               "Cm.PrivateDataOneByteOverTheLimitIsRefusedBeforeAnythingIsSent expects EMSGSIZE naming 57 bytes",
    },
    {
        "id": "cm-rnr-retry-not-applied",
        "file": "src/cm/connection_qp.cpp",
        "from": "a.rnr_retry = t.rnr_retry_count;",
        "to": "a.rnr_retry = 7;",
        "suite": "device",
        "tests": r"^Cm\.EachSidesQpTakesItsOwnTransportOptions$",
        "why": "a connection's QP gets rnr_retry 7 (infinite) instead of TransportOptions::rnr_retry_count; "
               "Cm.EachSidesQpTakesItsOwnTransportOptions reads 3 and 2 back with ibv_query_qp",
    },
    {
        "id": "cm-reject-reason-decoded-wrongly",
        "file": "src/cm/event.cpp",
        "from": "e.status == 8 ? \"rejected: no listener",
        "to": "e.status == 28 ? \"rejected: no listener",
        "suite": "device",
        "tests": r"^(Cm\.NoListenerIsRejectedQuickly|CmEventLoop\.APendingConnectToNoListenerFailsInItsConnectPhase)$",
        "why": "error mapping: the IB CM reject reason 8 (invalid service ID) is not recognised as no listener; "
               "Cm.NoListenerIsRejectedQuickly and CmEventLoop.APendingConnectToNoListenerFailsInItsConnectPhase "
               "expect \"no listener\" in the error",
    },
    {
        "id": "cm-event-channel-notify-lost",
        "file": "src/cm/router.cpp",
        "from": "(void)!::write(notify_fd_, &one, sizeof one);",
        "to": "(void)one;",
        "suite": "device",
        "tests": r"^CmEventLoop\.AnEventChannelsFdStaysReadableUntilDispatchNamesWhatAnotherCallRead$",
        "why": "lost wakeup: ChannelHub lists a connection's news read by another call without writing notify_fd, "
               "so EventChannel::fd() stays silent; "
               "CmEventLoop.AnEventChannelsFdStaysReadableUntilDispatchNamesWhatAnotherCallRead",
    },
    {
        "id": "cm-handed-over-event-no-wakeup",
        "file": "src/cm/router.cpp",
        "from": "    (void)!::write(fd, &one, sizeof one);\n  }\n  return kept;",
        "to": "    (void)one;\n  }\n  return kept;",
        "suite": "device",
        "tests": r"^CmEventLoop\.(ABlockingConnectAndAcceptHearOfEventsAnotherThreadReadOffTheirChannel"
                 r"|ABlockingAcceptHearsOfRequestsAnotherThreadReadOffItsListenersChannel)$",
        "why": "lost wakeup: an event another thread reads off an EventChannel for a sleeping handshake is kept "
               "without waking it, which then sleeps to its deadline; "
               "CmEventLoop.ABlockingConnectAndAcceptHearOfEventsAnotherThreadReadOffTheirChannel and "
               "ABlockingAcceptHearsOfRequestsAnotherThreadReadOffItsListenersChannel (timing: the reader must win a "
               "race; each test repeats five handshakes for that)",
    },
    {
        "id": "cm-resolve-deadline-is-the-connects",
        "file": "src/cm/connect.cpp",
        "from": "  step_deadline = std::min(deadline, detail::deadline_after(each));\n  sockaddr_storage from",
        "to": "  step_deadline = deadline;\n  sockaddr_storage from",
        "suite": "device",
        "tests": r"^CmEventLoop\.APendingConnectToASilentAddressFailsAtItsDeadline$",
        "why": "a deadline ignored: address and route resolution wait for the whole connect timeout, not "
               "resolve_timeout; CmEventLoop.APendingConnectToASilentAddressFailsAtItsDeadline checks deadline()",
    },
    {
        "id": "cm-connect-step-never-times-out",
        "file": "src/cm/connect.cpp",
        "from": "          if (Clock::now() >= res.step_deadline) res.timed_out(where);\n",
        "to": "",
        "suite": "device",
        "tests": r"^CmEventLoop\.APendingConnectToAServerThatNeverAnswersFailsAtItsTimeout$",
        "why": "a deadline ignored: PendingConnect::step never fails at its phase's deadline, so a connect to a "
               "server that never answers waits forever; "
               "CmEventLoop.APendingConnectToAServerThatNeverAnswersFailsAtItsTimeout (gives up after 10 s)",
    },
    {
        "id": "cm-event-not-acknowledged",
        "file": "src/cm/router.cpp",
        "from": "    rdma_ack_cm_event(ev);  // at once: rdma_destroy_id(3) waits for its id's events\n",
        "to": "",
        "suite": "device",
        "tests": r"^Cm\.NoListenerIsRejectedQuickly$",
        "why": "an rdma_cm event read by next_event is never acknowledged, so rdma_destroy_id blocks for ever when "
               "the failed connect's id goes; Cm.NoListenerIsRejectedQuickly never returns: it fails as a hang, "
               "killed at verbs_cm_tests' ctest TIMEOUT (600 s) unless the runner bounds it (no test bounds a "
               "connection's teardown in time)",
    },
    {
        "id": "cm-async-route-left-behind",
        "file": "src/cm/connection.cpp",
        "from": "  if (routed_qp != nullptr) hub->remove_route(routed_qp);",
        "to": "  (void)routed_qp;",
        "suite": "device",
        "tests": r"^Cm\.AConnectionsAsyncEventRouteGoesWithIt$",
        "why": "a destroyed connection's async event route stays in the device's hub (its Impl freed): "
               "Cm.AConnectionsAsyncEventRouteGoesWithIt counts the hub's routes as connections come and go "
               "(written when this mutant was missed: every other test injected events only while its connections lived)",
    },
    {
        "id": "cm-datagram-qkey-not-applied",
        "file": "src/cm/datagram.cpp",
        "from": "  q.qkey = datagram_qkey;\n",
        "to": "",
        "suite": "device",
        "tests": r"^CmDatagram\.ResolveGetsTheListenersQpAndTrafficFlowsBothWays$",
        "why": "the Datagram's UD QP keeps QpOptions' default Q_Key instead of rdma_cm's, so peers' sends are "
               "dropped; CmDatagram.ResolveGetsTheListenersQpAndTrafficFlowsBothWays checks the QP's qkey and traffic",
    },
    {
        "id": "cm-datagram-sidr-status-decoded-wrongly",
        "file": "src/cm/datagram.cpp",
        "from": "      if (e.status == 1 || e.status == 2)\n",
        "to": "      if (e.status == -1 || e.status == 2)\n",
        "suite": "device",
        "tests": r"^CmDatagram\.ResolveWithNoListenerIsRefusedNamingIt$",
        "why": "error mapping: the SIDR reply status 1 (no service at that port) is not decoded and becomes "
               "EHOSTUNREACH; CmDatagram.ResolveWithNoListenerIsRefusedNamingIt expects ECONNREFUSED, "
               "\"no listening Datagram\"",
    },
    {
        "id": "cm-datagram-answer-private-data-off-by-one",
        "file": "src/cm/datagram.cpp",
        "from": "if (private_data.size() > max_answer_private_data)",
        "to": "if (private_data.size() > max_answer_private_data + 1)",
        "suite": "device",
        "tests": r"^CmDatagram\.BadOptionsAreRefusedBeforeAnythingIsMadeOrSent$",
        "why": "private data length off by one: an answer one byte over max_answer_private_data is not refused; "
               "CmDatagram.BadOptionsAreRefusedBeforeAnythingIsMadeOrSent expects EMSGSIZE from accept(10ms, 137 bytes)",
    },
    {
        "id": "cm-accept-waits-out-a-stalled-handshake",
        "file": "src/cm/listen.cpp",
        "from": "if (Clock::now() >= deadline || l.has_request()) return pending->impl_->unconfirmed();",
        "to": "if (Clock::now() >= deadline) return pending->impl_->unconfirmed();",
        "suite": "device",
        "tests": r"^Cm\.AStalledHandshakeIsHandedOutWhenTheNextRequestComes$",
        "why": "a lost wakeup of the passive side: accept() no longer looks for another request while it waits "
               "for a client's confirmation, so a stalled client holds the next one up to handshake_timeout; "
               "Cm.AStalledHandshakeIsHandedOutWhenTheNextRequestComes expects both accept()s within 3 s",
    },
    {
        "id": "cm-unconfirmed-connection-never-expires",
        "file": "src/cm/connection.cpp",
        "from": "Clock::now() < confirm_by ||",
        "to": "Clock::now() < confirm_by + std::chrono::hours(1) ||",
        "suite": "device",
        "tests": r"^Cm\.(AClientThatStopsMidHandshakeHoldsUpNoAccept|AnUnconfirmedConnectionsLimitIsSeenByEveryCallAndRewritesNoEarlierEnd)$",
        "why": "a deadline ignored: a connection accept() handed out unconfirmed waits for a client that never "
               "confirms; Cm.AClientThatStopsMidHandshakeHoldsUpNoAccept expects its wait to fail with ECONNABORTED "
               "within 10 s, Cm.AnUnconfirmedConnectionsLimitIsSeenByEveryCallAndRewritesNoEarlierEnd connected() false",
    },
    {
        "id": "cm-accept-fails-on-a-request-whose-client-left",
        "file": "src/cm/listen.cpp",
        "from": "continue;  // its client gave up: the next request",
        "to": "throw;  // its client gave up: the next request",
        "suite": "device",
        "tests": r"^Cm\.ARequestWhoseClientLeftIsSkippedByAccept$",
        "why": "accept() fails (EINVAL from rdma_accept) on a request whose client has gone instead of taking "
               "the next; Cm.ARequestWhoseClientLeftIsSkippedByAccept expects the next client's connection",
    },
    {
        "id": "sendwr-copies-only-its-first-slice",
        "file": "include/verbs/work_request.hpp",
        "from": "for (std::size_t i = 0; i < s.size(); ++i) sge_[i] = s[i].native();",
        "to": "for (std::size_t i = 0; i < s.size() && i < 1; ++i) sge_[i] = s[i].native();",
        "suite": "host",
        "tests": r"^(SendWr\.SpanFormsCopyTheCallersSlices|QueuePairStub\.AChainOfMultiSgeRequestsPostsItsSlicesAfterTheCallersArrayIsReused|QueuePairStub\.AKeptMultiSgeRequestPostedAloneCarriesItsSlices)$",
        "why": "a multi-SGE SendWr keeps only its first slice (the rest of its SGEs never written): what it posts "
               "reads unwritten entries; SendWr.SpanFormsCopyTheCallersSlices and the kept-request posting tests "
               "compare every SGE with the caller's slices",
    },
]


if __name__ == "__main__":
    import pathlib
    import sys

    root = pathlib.Path(__file__).resolve().parents[2]
    bad = 0
    ids = set()
    for m in MUTANTS:
        problems = []
        if m["id"] in ids:
            problems.append("duplicate id")
        ids.add(m["id"])
        if m["suite"] not in ("host", "device"):
            problems.append("suite " + m["suite"])
        f = m["file"]
        if not (f.startswith("src/") and f.endswith(".cpp")) and not (
                f.startswith("include/verbs/") and f.endswith(".hpp")):
            problems.append("not library code: " + f)
        if m["from"] == m["to"]:
            problems.append("from == to")
        path = root / f
        if not path.is_file():
            problems.append("no such file")
        else:
            n = path.read_text().count(m["from"])
            if n != 1:
                problems.append("'from' occurs %d times" % n)
        if problems:
            bad += 1
            print("%s (%s): %s" % (m["id"], f, "; ".join(problems)))
    host = sum(m["suite"] == "host" for m in MUTANTS)
    device = sum(m["suite"] == "device" for m in MUTANTS)
    missed = sum(m.get("expect") == "missed" for m in MUTANTS)
    print("%d mutants: %d host, %d device (%d expected missed); %d with problems" %
          (len(MUTANTS), host, device, missed, bad))
    sys.exit(1 if bad else 0)
