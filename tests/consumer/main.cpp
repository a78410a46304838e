// Lists the RDMA devices through verbs: proof that a project outside the tree can build and
// link against it. No device is needed.
#include <cstdio>

#include <verbs/verbs.hpp>

int main() try {
  const std::vector<verbs::DeviceInfo> devices = verbs::list_devices();
  std::printf("verbs consumer: %zu RDMA device(s)\n", devices.size());
  for (const verbs::DeviceInfo& d : devices) std::printf("  %s\n", d.name.c_str());
  std::printf("verbs consumer: %s\n", make_error_code(verbs::Errc::no_device).message().c_str());
  return 0;
} catch (const verbs::Error& e) {
  std::fprintf(stderr, "verbs consumer: %s\n", e.what());
  return 1;
}
