#!/usr/bin/env bash
# Tests of verbs-info. Usage: verbs_info_test.sh CASE VERBS_INFO   (exit 77: skipped)
#   host_no_device  without a device: exit 2 and advice that names `rdma link add`
#   host_json       --json is valid JSON (devices, checks, healthy), also without a device
#   host_topology   --topology on a fake GPU server (VERBS_INFO_SYSROOT): its text, the ranking
#                   near a GPU and a NUMA node (--json), and what it refuses
#   topology        --topology --json for the test device (rxe: its PCI function is its netdev's)
#   host_defaults   the defaults line (text and --json, with or without a device) gives the
#                   failure bound of TransportOptions{}, recomputed here from the specification,
#                   and the guide's "Defaults that never hang" paragraph (README.md, docs/*.md:
#                   VERBS_DOC_PAGES) gives the same figures
#   healthy         --check on the test device: exit 0, "healthy"; the text report is complete
#   json            --json on the test device: the port, the chosen GID, the probed inline size
#   netdev_down, mtu_small, no_ipv4_gid
#                   break the setup for real (ip link/addr), expect --check to name that problem
#                   and its fix, then restore it and wait until --check is healthy again. They
#                   run only in the throwaway SoftRoCE VM of scripts/rxe-vm, or where
#                   VERBS_INFO_BREAK_SETUP=1 says this machine's network may be disturbed.
#   rdma_cm_module_missing, rdma_cm_device_missing
#                   the same through VERBS_INFO_SYSROOT, a fake /sys/module or /dev/infiniband
# Environment: VERBS_TEST_DEVICE (default: the first device), VERBS_PYTHON3 (default python3).
set -uo pipefail
case_=$1 info=$2
python=${VERBS_PYTHON3:-python3}
PATH=$PATH:/usr/sbin:/sbin

fail() { echo "verbs_info_test $case_: FAILED: $*" >&2; exit 1; }
skip() { echo "verbs_info_test $case_: skipped: $*"; exit 77; }

out= rc=0
run() { # runs verbs-info with these arguments; sets out (stdout and stderr) and rc
  out=$("$info" "$@" 2>&1)
  rc=$?
  printf '$ verbs-info %s   (exit %d)\n%s\n' "$*" "$rc" "$out"
}
expect_rc() { [ "$rc" -eq "$1" ] || fail "exit status $rc, expected $1"; }
expect() { grep -qF -- "$1" <<<"$out" || fail "the output lacks: $1"; }

has_device() { [ -n "$(ls -A /sys/class/infiniband 2>/dev/null)" ]; }

# Checks a JSON document on stdin with python: valid, and the assertions in $1 hold (variable d;
# further arguments are sys.argv[1:]).
check_json() {
  command -v "$python" >/dev/null || skip "no python3 to parse JSON"
  "$python" -c '
import json, re, sys
d = json.load(sys.stdin)
assert isinstance(d["devices"], list) and isinstance(d["checks"], list) and isinstance(d["healthy"], bool), "top-level keys"
for c in d["checks"]:
    assert set(c) >= {"id", "ok", "subject", "message"} and (c["ok"] or c["fix"]), c
'"$1"'
print("JSON ok:", len(d["devices"]), "device(s),", len(d["checks"]), "check(s), healthy:", d["healthy"])
' "${@:2}" || fail "the JSON is not what was expected"
}

device=${VERBS_TEST_DEVICE:-}
need_device() {
  has_device || skip "no RDMA device"
  [ -n "$device" ] || device=$(ls /sys/class/infiniband | head -n1)
  [ -d "/sys/class/infiniband/$device" ] || fail "no device $device"
}
need_breakable() {
  need_device
  if ! { [ "$(hostname)" = rxe-vm ] && [ -d /run/rxe-vm ]; } && [ "${VERBS_INFO_BREAK_SETUP:-0}" != 1 ]; then
    skip "changes the network setup: runs only in the scripts/rxe-vm VM (or with VERBS_INFO_BREAK_SETUP=1)"
  fi
  netdev=$(cat "/sys/class/infiniband/$device/parent" 2>/dev/null) || skip "$device has no parent netdev (not rxe)"
}

# Polls --check until its output contains $1 (a problem id in brackets, or "healthy").
wait_for() {
  local i
  for i in $(seq 1 100); do
    out=$("$info" --check -d "$device" 2>&1)
    rc=$?
    grep -qF -- "$1" <<<"$out" && { printf '$ verbs-info --check -d %s   (exit %d, after %d tries)\n%s\n' "$device" "$rc" "$i" "$out"; return 0; }
    sleep 0.2
  done
  printf '%s\n' "$out"
  return 1
}
restore_and_wait() { # $@: the command that restores the setup
  echo "restoring: $*"
  "$@" || echo "restore command failed: $*" >&2
  wait_for "verbs-info: healthy" && [ "$rc" -eq 0 ] || fail "the setup did not become healthy again after: $*"
}

case $case_ in
  host_no_device)
    has_device && skip "this host has an RDMA device"
    run
    expect_rc 2
    expect "no RDMA device"
    expect "rdma link add rxe0 type rxe netdev"
    run --check
    expect_rc 2
    expect "rdma link add"
    ;;
  host_json)
    json=$("$info" --json)
    rc=$?
    printf '%s\n' "$json"
    if has_device; then
      expect_rc 0
      check_json 'assert d["devices"], "devices"' <<<"$json"
    else
      expect_rc 2
      check_json 'assert d["devices"] == [] and d["checks"][0]["id"] == "no_device" and not d["healthy"]
assert "rdma link add" in d["checks"][0]["fix"]' <<<"$json"
    fi
    ;;
  host_defaults)
    # Without a device the listing is only the defaults line (and exit 2); with one, it ends with it.
    text=$("$info" 2>/dev/null | grep '^defaults: ')
    printf '$ verbs-info | grep defaults:\n%s\n' "$text"
    [ -n "$text" ] || fail "verbs-info printed no defaults line"
    json=$("$info" --json 2>/dev/null)
    # The pages of the guide, as cmake/doc_snippets.cmake lists them (":" between).
    top=$(cd "$(dirname "$0")/../.." && pwd)
    pages=${VERBS_DOC_PAGES:-$(printf '%s:' "$top/README.md" "$top"/docs/*.md)}
    pages=${pages%:}
    check_json '
x = d["defaults"]
o = x["transport_options"]
def rnr_us(c):  # the specification table: 655.36 ms, 0.01 ms, then 2 and 3 times 2^k x 10 us by turns
    return 655360 if c == 0 else 10 if c == 1 else 10 * (2 if c % 2 == 0 else 3) * 2 ** ((c - 2) // 2)
tr_ns = 4096 * 2 ** o["ack_timeout"] if o["ack_timeout"] else None
assert x["ack_timeout_ns"] == tr_ns and x["rnr_timer_us"] == rnr_us(o["min_rnr_timer"]), x
up = lambda ns: -(-ns // 1000000)
t_ns = 4 * tr_ns * (o["retry_count"] + 1) if tr_ns and o["retry_count"] != 7 else None
r_ns = rnr_us(o["min_rnr_timer"]) * 1000 * o["rnr_retry_count"] if o["rnr_retry_count"] != 7 else None
want = {"transport": t_ns and up(t_ns), "rnr": None if r_ns is None else up(r_ns),
        "total": None if t_ns is None or r_ns is None else up(t_ns + r_ns)}
assert x["failure_bound_ms"] == want, (x["failure_bound_ms"], want)
def text(ms):
    if ms is None: return "never"
    if ms < 1000: return "%d ms" % ms
    return ("%d.%03d" % (ms // 1000, ms % 1000)).rstrip("0").rstrip(".") + " s"
line = x["text"]
for part in ("within %s of a peer that stops answering" % text(want["transport"]),
             "within %s of a receiver that posts nothing" % text(want["rnr"]),
             "%s if it meets both" % text(want["total"]), "verbs::failure_bound"):
    assert part in line, (part, line)
assert line == sys.argv[1], ("text and --json differ", line, sys.argv[1])
# The paragraph (blank lines apart) of the pages that starts so: exactly one.
paras = [(page, " ".join(p.split())) for page in sys.argv[2].split(":")
         for p in re.split(r"\n\s*\n", open(page).read())]
found = [(page, p) for page, p in paras if p.startswith("**Defaults that never hang.**")]
assert len(found) == 1, ("not one paragraph that starts with **Defaults that never hang.**", [f[0] for f in found])
page, para = found[0]
for figure in (text(want["transport"]), text(want["rnr"]), text(want["total"])):
    assert figure in para, (page + " does not give", figure, para)' "$text" "$pages" <<<"$json"
    ;;
  healthy)
    need_device
    run --check -d "$device"
    expect_rc 0
    expect "verbs-info: healthy"
    expect "ok       $device port 1: ACTIVE"
    expect "ok       rdma_cm:"
    run -d "$device"
    expect_rc 0
    for s in "port 1: ACTIVE" "MTU active" "link layer" "speed" "GID table" "verbs chooses GID" "max_qp_wr" \
      "max_sge" "max_cqe" "max_mr_size" "max_inline_data" "probed" "atomics" "on-demand paging" "memory windows" \
      "defaults: a request fails within"; do
      expect "$s"
    done
    ;;
  host_topology)
    # --topology on the fake GPU server of the Topology host tests (tests/host/topology), built
    # under VERBS_INFO_SYSROOT: what it prints, the ranking near a GPU, and the refusals.
    command -v "$python" >/dev/null || skip "no python3 to build the fake tree"
    top=$(cd "$(dirname "$0")/../.." && pwd)
    root=$(mktemp -d) || fail "mktemp"
    trap 'rm -rf "$root"' EXIT
    "$python" - "$top/tests/host/topology/gpu_server.tree" "$root" <<'PY' || fail "the fake tree could not be built"
import os, re, sys
tree, root = sys.argv[1], sys.argv[2]
var = {}
for line in open(tree):
    if not line.strip() or line.lstrip().startswith("#"):
        continue
    line = re.sub(r"\$\{(\w+)\}", lambda m: var[m.group(1)], line.rstrip("\n"))
    words = line.split(None, 2)
    if not words or words[0].startswith("#"):
        continue
    op, path, rest = words[0], words[1], words[2] if len(words) > 2 else ""
    full = os.path.join(root, path)
    if op == "set": var[path] = rest
    elif op == "dir": os.makedirs(full, exist_ok=True)
    elif op == "file":
        os.makedirs(os.path.dirname(full), exist_ok=True)
        open(full, "w").write(rest + "\n")
    elif op == "link":
        os.makedirs(os.path.dirname(full), exist_ok=True)
        os.symlink(rest, full)
    elif op == "pci":
        dev = os.path.join(root, "sys/devices", path)
        os.makedirs(dev, exist_ok=True)
        open(os.path.join(dev, "numa_node"), "w").write(rest + "\n")
        os.makedirs(os.path.join(root, "sys/bus/pci/devices"), exist_ok=True)
        os.symlink("../../../devices/" + path, os.path.join(root, "sys/bus/pci/devices", os.path.basename(path)))
    else: sys.exit("bad line: " + line)
PY
    export VERBS_INFO_SYSROOT=$root
    run --topology --near 0000:03:00.0
    expect_rc 0
    expect "NUMA nodes: 2"
    expect "  pci 0000:05:00.0, below pci0000:00 > 0000:00:01.1 > 0000:01:00.0 > 0000:02:02.0"
    expect "  port 1 ACTIVE, InfiniBand, 200 Gb/sec (4X HDR)"
    expect "  port 1 DOWN, Ethernet, 100 Gb/sec (4X EDR), netdev ens5np0"
    expect "nearest to 0000:03:00.0 first:"
    grep -qE '^  1\. mlx5_0 +same switch +PCI hops 4 ' <<<"$out" || fail "mlx5_0 is not first, below GPU 0's switch"
    json=$("$info" --topology --json --near numa:1 -d mlx5_2)
    rc=$?
    printf '%s\n' "$json"
    expect_rc 0
    "$python" -c '
import json, sys
d = json.load(sys.stdin)
assert d["numa_nodes"] == [0, 1], d["numa_nodes"]
assert [x["name"] for x in d["devices"]] == ["mlx5_2"], "-d keeps one device"
x = d["devices"][0]
assert x["pci"] == "0000:85:00.0" and x["numa_node"] == 1 and x["host_bridge"] == "pci0000:80", x
assert x["bridges"] == ["0000:80:01.1", "0000:81:00.0", "0000:82:02.0"] and x["netdevs"] == ["ibp133s0"], x
assert x["ports"][0]["rate_gbps"] == 200 and x["active"], x
r = d["near"]["ranking"]
assert d["near"]["place"] == "numa:1" and [e["name"] for e in r] == ["mlx5_2", "mlx5_3", "mlx5_0", "mlx5_1", "mlx5_4"], r
assert r[0]["proximity"] == "same NUMA node" and r[2]["proximity"] == "other NUMA node", r
print("JSON ok")' <<<"$json" || fail "the --topology JSON is not what was expected"
    run --topology --near gpu:0
    expect_rc 64
    expect "numa:N or cpu:N"
    run --topology -d mlx5_9
    expect_rc 2
    expect "no RDMA device 'mlx5_9'"
    run --topology --check
    expect_rc 64
    ;;
  topology)
    # The device's place as sysfs shows it in the VM: rxe is virtual, its PCI function its netdev's.
    need_device
    json=$("$info" --topology --json -d "$device" --near cpu:0)
    rc=$?
    printf '%s\n' "$json"
    expect_rc 0
    "$python" -c '
import json, sys
d = json.load(sys.stdin)
x = d["devices"][0]
assert x["name"] == sys.argv[1] and x["netdevs"] and x["ports"] and x["ports"][0]["state"] == "ACTIVE", x
assert x["pci"] is None or x["pci_from_netdev"] == x["name"].startswith("rxe"), x
assert sys.argv[1] in [e["name"] for e in d["near"]["ranking"]]
print("JSON ok")' "$device" <<<"$json" || fail "the --topology JSON is not what was expected"
    ;;
  json)
    need_device
    json=$("$info" --json -d "$device")
    rc=$?
    printf '%s\n' "$json"
    expect_rc 0
    check_json '
dev = d["devices"][0]
assert dev["name"] == "'"$device"'" and len(d["devices"]) == 1
p = dev["ports"][0]
assert p["state"] == "ACTIVE" and p["active_mtu"] in (256, 512, 1024, 2048, 4096) and p["gids"], p
g = p["chosen_gid"]
assert g["gid"].startswith("::ffff:") and g["type"] == "RoCE v2" and "IPv4" in g["reason"], g
assert dev["limits"]["max_inline_data"]["value"] > 0 and dev["limits"]["max_inline_data"]["probed"]
assert dev["limits"]["max_qp_wr"] > 0 and d["healthy"]' <<<"$json"
    ;;
  netdev_down)
    need_breakable
    trap 'restore_and_wait ip link set "$netdev" up' EXIT
    ip link set "$netdev" down || fail "ip link set $netdev down"
    wait_for "[port_down]" || fail "--check did not report port_down"
    expect_rc 1
    expect "because its netdev $netdev is down"
    expect "ip link set $netdev up"
    ;;
  mtu_small)
    need_breakable
    mtu=$(cat "/sys/class/net/$netdev/mtu")
    trap 'restore_and_wait ip link set "$netdev" mtu "$mtu"' EXIT
    ip link set "$netdev" mtu 1000 || fail "ip link set $netdev mtu 1000"
    wait_for "[netdev_mtu_small]" || fail "--check did not report netdev_mtu_small"
    expect_rc 1
    expect "netdev $netdev MTU 1000, active RDMA MTU 512"
    expect "ip link set $netdev mtu 1500"
    ;;
  no_ipv4_gid)
    need_breakable
    addr=$(ip -o -4 addr show dev "$netdev" | awk '{ print $4; exit }')
    [ -n "$addr" ] || fail "$netdev has no IPv4 address to remove"
    trap 'restore_and_wait ip addr add "$addr" dev "$netdev"' EXIT
    ip addr del "$addr" dev "$netdev" || fail "ip addr del $addr dev $netdev"
    wait_for "[no_ipv4_gid]" || fail "--check did not report no_ipv4_gid"
    expect_rc 1
    expect "no RoCE v2 GID with an IPv4 address"
    expect "ip addr add <address>/<prefix> dev $netdev"
    ;;
  rdma_cm_module_missing | rdma_cm_device_missing)
    need_device
    run --check -d "$device"
    expect "ok       rdma_cm:"
    root=$(mktemp -d)
    trap 'rm -rf "$root"' EXIT
    mkdir -p "$root/sys/module" "$root/dev/infiniband"
    ln -s /sys/class "$root/sys/class"
    [ "$case_" = rdma_cm_device_missing ] && rmdir "$root/sys/module" && ln -s /sys/module "$root/sys/module"
    VERBS_INFO_SYSROOT=$root run --check -d "$device"
    expect_rc 1
    expect "[$case_]"
    expect "modprobe rdma_ucm"
    [ "$(grep -c '^PROBLEM' <<<"$out")" -eq 1 ] || fail "expected exactly one problem"
    ;;
  *) fail "unknown case" ;;
esac
echo "verbs_info_test $case_: ok"
