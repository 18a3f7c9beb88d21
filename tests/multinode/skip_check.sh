#!/usr/bin/env bash
# The harness must skip (exit 77, a clear message, nothing left behind) where network namespaces
# are not permitted. Checked by running it as user nobody without capabilities; this check itself
# needs root to drop privileges, and is skipped (77) without it.
#
# usage: skip_check.sh HARNESS BIN_DIR
set -u
harness=$1 bin_dir=$2
if [[ $(id -u) != 0 ]] || ! command -v setpriv >/dev/null; then
  echo "skip_check: SKIP: needs root and setpriv to run the harness unprivileged"
  exit 77
fi
# The checkout may sit below a directory `nobody` cannot enter (mktemp -d is mode 700): run a copy of
# the harness from a directory of its own that everyone can read.
copy_dir=$(mktemp -d)
trap 'rm -rf "$copy_dir"' EXIT
chmod 755 "$copy_dir"
install -m 755 "$harness" "$copy_dir/netns_cluster.sh"
harness=$copy_dir/netns_cluster.sh
before=$(ip netns list 2>/dev/null | grep -o "^dtmn[^ ]*" | sort)
out=$(setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all --bounding-set=-all \
  "$harness" --bin-dir "$bin_dir" --hosts 2 --nproc-per-node 1 -- /bin/true 2>&1)
rc=$?
echo "$out"
after=$(ip netns list 2>/dev/null | grep -o "^dtmn[^ ]*" | sort)
[[ $rc == 77 ]] || { echo "skip_check: FAIL: exit status $rc, want 77"; exit 1; }
[[ "$out" == *"SKIP: "*"need network namespaces"* ]] || { echo "skip_check: FAIL: no clear SKIP message"; exit 1; }
[[ "$before" == "$after" ]] || { echo "skip_check: FAIL: namespaces changed: $before -> $after"; exit 1; }
echo "skip_check: PASS (the harness skips with status 77 when it may not create namespaces)"
