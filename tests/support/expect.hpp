// Small assertions shared by the host and device tests.
#pragma once

#include <gtest/gtest.h>

#include <optional>
#include <string_view>
#include <utility>

#include <verbs/error.hpp>

namespace verbs::test {

/// Success when `text` contains `part`.
inline ::testing::AssertionResult contains(std::string_view text, std::string_view part) {
  if (text.find(part) != std::string_view::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << '"' << text << "\" does not contain \"" << part << '"';
}

/// Runs `f`, which should throw an E, and returns what it threw (empty if it threw nothing).
template <typename E = Error, typename F>
std::optional<E> thrown_by(F&& f) {
  try {
    std::forward<F>(f)();
  } catch (const E& e) {
    return e;
  }
  return std::nullopt;
}

}  // namespace verbs::test
