// verbs: RAII C++20 wrappers for libibverbs. Include this for the whole core API.
#pragma once

/// @namespace verbs
/// RAII C++20 wrappers for libibverbs: Device, ProtectionDomain, MemoryRegion, CompletionQueue,
/// QueuePair, SharedReceiveQueue and AddressHandle, with typed flags and std::error_code errors.

#include "verbs/address_handle.hpp"      // IWYU pragma: export
#include "verbs/completion_channel.hpp"  // IWYU pragma: export
#include "verbs/completion_queue.hpp"    // IWYU pragma: export
#include "verbs/device.hpp"              // IWYU pragma: export
#include "verbs/error.hpp"               // IWYU pragma: export
#include "verbs/flags.hpp"               // IWYU pragma: export
#include "verbs/memory_region.hpp"       // IWYU pragma: export
#include "verbs/memory_window.hpp"       // IWYU pragma: export
#include "verbs/protection_domain.hpp"   // IWYU pragma: export
#include "verbs/queue_pair.hpp"          // IWYU pragma: export
#include "verbs/shared_receive_queue.hpp"  // IWYU pragma: export
#include "verbs/topology.hpp"            // IWYU pragma: export
#include "verbs/work_request.hpp"        // IWYU pragma: export
