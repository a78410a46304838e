// What the rails device tests share (rails_test.cpp, rails_alloc_test.cpp): targets served on a
// thread of their own, the options of a group whose rails all lead to one target over the test
// address, and a bounded wait for a transfer.
#pragma once

#include <array>
#include <atomic>
#include <thread>
#include <vector>

#include <verbs/rails.hpp>

#include "cm_fixture.hpp"

namespace verbs::test {

using rails::Group;
using rails::GroupOptions;
using rails::RailState;
using rails::Target;

// A Target served by a thread of its own until destroyed.
class ServedTarget {
 public:
  ServedTarget(std::span<std::byte> buffer, AccessFlags access = Access::remote_write | Access::remote_read)
      : target_(rails::TargetOptions{.addresses = {test_addr()}}, buffer, access) {
    thread_ = std::thread([this] {
      while (!stop_) target_.run_for(20ms);
    });
  }
  ServedTarget(const ServedTarget&) = delete;
  ServedTarget& operator=(const ServedTarget&) = delete;
  ~ServedTarget() {
    stop_ = true;
    thread_.join();
  }
  [[nodiscard]] std::uint16_t port() const { return port_; }

 private:
  Target target_;
  std::uint16_t port_ = target_.port();
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

inline GroupOptions options_for(std::uint16_t port, std::size_t rails_n, int qps) {
  GroupOptions o;
  for (std::size_t i = 0; i < rails_n; ++i) o.rails.push_back({test_addr(), test_addr()});
  o.port = port;
  o.qps_per_rail = qps;
  o.chunk_size = 64 * 1024;
  o.max_in_flight = 2;
  o.transport.ack_timeout = 14;
  o.transport.retry_count = 3;
  o.reconnect_interval = 200ms;
  return o;
}

// Waits for `id`, failing the test (not hanging) after `timeout`.
inline rails::Completion finish(Group& g, std::uint64_t id, std::chrono::milliseconds timeout = 60s) {
  auto c = g.wait(id, timeout);
  if (!c) {
    ADD_FAILURE() << "transfer " << id << " did not finish within " << timeout.count() << " ms";
    return {};
  }
  return *c;
}

class Rails : public CmFixture {};

// A target that says it allows reads but registered its buffer for writes only: a read is
// refused by the device (a request error), not by the Group.
class LyingTarget {
 public:
  explicit LyingTarget(std::span<std::byte> buffer)
      : device_(cm::device_for(test_addr())), pd_(*device_), mr_(pd_, buffer, Access::local_write | Access::remote_write),
        listener_(test_addr(), 0) {
    thread_ = std::thread([this] {
      static constexpr std::array<std::byte, 4> says_read_too{std::byte{'R'}, std::byte{'L'}, std::byte{1}, std::byte{3}};
      cm::ConnectionOptions o;
      o.qp.access = Access::remote_write | Access::remote_read;
      o.pd = &pd_;
      o.expose = mr_.remote();
      o.private_data = says_read_too;
      while (!stop_) {
        std::error_code ec;
        if (auto c = listener_.accept(100ms, o, ec)) connections_.push_back(std::move(*c));
      }
    });
  }
  LyingTarget(const LyingTarget&) = delete;
  LyingTarget& operator=(const LyingTarget&) = delete;
  ~LyingTarget() {
    stop_ = true;
    thread_.join();
  }
  [[nodiscard]] std::uint16_t port() const { return listener_.port(); }

 private:
  std::optional<Device> device_;
  ProtectionDomain pd_;
  MemoryRegion mr_;
  cm::Listener listener_;
  std::vector<cm::Connection> connections_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace verbs::test
