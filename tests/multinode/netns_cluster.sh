#!/usr/bin/env bash
# netns_cluster.sh: simulated hosts for dtensor's multi-node tests.
#
# Makes N "hosts" as Linux network namespaces, each with its own loopback and one interface (eth0)
# on a private bridge that lives in a dedicated "switch" namespace, and starts in each host
#
#   dtrun --nnodes N --node-rank i --master-addr <host 0> --master-port P --nproc-per-node K PROG ...
#
# exactly as a user would on N real machines. Nothing is added to the caller's namespace: traffic
# stays between these namespaces and their loopbacks, and parallel runs cannot collide (names carry
# this script's PID; the subnet is 10.213.X.0/24 with X derived from it).
#
#   host i  = namespace dtmn<PID>-h<i>, eth0 = 10.213.X.(i+1)/24     (host 0 runs rank 0 = the store)
#   switch  = namespace dtmn<PID>-sw, bridge br0, port p<i> <-veth-> host i's eth0
#
# usage: netns_cluster.sh --bin-dir DIR --hosts N --nproc-per-node K [options] -- PROG ARGS...
#   --bin-dir DIR          where dtrun is; PROG without a '/' is looked up there first
#   --hosts N              simulated hosts (1..200)              default 2
#   --nproc-per-node K     ranks per host                         default 2
#   --env NAME=VALUE       for every rank (repeatable)            DT_BACKEND=gloo is always set first
#   --rounds FILE          one launch of every host per line ("PROG ARGS...", words split on blanks,
#                          '#' comments), each on its own master port, instead of PROG after --
#   --expect-output RE     success: every rank prints a line matching RE (grep -E)
#   --expect-output-once RE  success: some rank prints a line matching RE
#   --fault KIND:H         kill-host:H   SIGKILL every process of host H (dtrun and its ranks) once
#                                        every rank printed MN-LOOPING (tests/multinode/multinode_worker)
#                          link-down:H   take host H's switch port down at that moment
#                          absent:H      never start dtrun on host H
#   --expect-collective RE fault: each surviving rank's "MN-ERROR rank=R at_ms=T ... msg=M" line must
#                          have M matching RE, name every rank it lost in "rank(s) [...]" lists
#                          (the other side of the fault), and come within $DT_TIMEOUT_MS + slack of
#                          the fault; dtrun must exit non-zero on every surviving host
#   --expect-named none    fault: skip the "name every lost rank" check (when host 0, which runs the
#                          store, never starts, the survivors cannot know more than "rank 0")
#   --slack-ms MS          allowed lateness of an error report    default 2500
#   --deadline S           wall-clock limit of each launch        default 60
#   --keep-logs DIR        copy the hosts' logs there
#
# Every launch must end before its deadline (a hang fails the test), and afterwards no process may
# be left in any host namespace (an orphan fails the test). Whatever happens — failure, timeout,
# Ctrl-C, SIGTERM from ctest — the EXIT trap kills every process in the namespaces and deletes them;
# namespaces left by a run that was SIGKILLed are removed by the next run (their PID is gone).
#
# Exit status: 0 pass; 1 fail; 2 bad usage; 77 skipped (network namespaces not permitted here:
# not root, no CAP_SYS_ADMIN/CAP_NET_ADMIN, or no veth/bridge support) — ctest's SKIP_RETURN_CODE.

# shellcheck disable=SC2317  # cleanup and the signal handlers run from traps
set -u -o pipefail

readonly ME=$$
readonly PREFIX="dtmn${ME}-"
readonly SUBNET="10.213.$((ME % 250 + 1))"
readonly SWITCH="${PREFIX}sw"

BIN_DIR=""
HOSTS=2
NPROC=2
ENVS=(DT_BACKEND=gloo)
ROUNDS_FILE=""
EXPECT_OUTPUT=""
EXPECT_OUTPUT_ONCE=""
FAULT="none"
FAULT_HOST=-1
EXPECT_COLLECTIVE=""
EXPECT_NAMED=lost
SLACK_MS=2500
DEADLINE_S=60
KEEP_LOGS=""
CMD=()

NAMESPACES=()   # created by us, deleted by cleanup
LOGDIR=""
FAILURES=()

say() { printf 'netns_cluster: %s\n' "$*"; }
usage() { sed -n '/^# usage:/,/^#$/p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
fail() { FAILURES+=("$*"); say "FAIL: $*"; }
now_ms() { date +%s%3N; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --bin-dir) BIN_DIR=$2; shift 2 ;;
    --hosts) HOSTS=$2; shift 2 ;;
    --nproc-per-node) NPROC=$2; shift 2 ;;
    --env) ENVS+=("$2"); shift 2 ;;
    --rounds) ROUNDS_FILE=$2; shift 2 ;;
    --expect-output) EXPECT_OUTPUT=$2; shift 2 ;;
    --expect-output-once) EXPECT_OUTPUT_ONCE=$2; shift 2 ;;
    --fault) FAULT=${2%%:*}; FAULT_HOST=${2#*:}; shift 2 ;;
    --expect-collective) EXPECT_COLLECTIVE=$2; shift 2 ;;
    --expect-named) EXPECT_NAMED=$2; shift 2 ;;
    --slack-ms) SLACK_MS=$2; shift 2 ;;
    --deadline) DEADLINE_S=$2; shift 2 ;;
    --keep-logs) KEEP_LOGS=$2; shift 2 ;;
    --) shift; CMD=("$@"); break ;;
    -h|--help) usage ;;
    *) say "unknown option $1"; usage ;;
  esac
done

[[ "$HOSTS" =~ ^[0-9]+$ && "$HOSTS" -ge 1 && "$HOSTS" -le 200 ]] || { say "bad --hosts '$HOSTS'"; exit 2; }
[[ "$NPROC" =~ ^[0-9]+$ && "$NPROC" -ge 1 ]] || { say "bad --nproc-per-node '$NPROC'"; exit 2; }
# Skip first where namespaces are not permitted (such a user may not even be able to read --bin-dir).
if command -v unshare >/dev/null && ! unshare --net true 2>/dev/null; then
  say "SKIP: cannot create a network namespace — simulated hosts need network namespaces (run as root, or with CAP_SYS_ADMIN and CAP_NET_ADMIN)"
  exit 77
fi
[[ -x "$BIN_DIR/dtrun" ]] || { say "no dtrun in --bin-dir '$BIN_DIR'"; exit 2; }
[[ "$EXPECT_NAMED" == lost || "$EXPECT_NAMED" == none ]] || { say "bad --expect-named '$EXPECT_NAMED'"; exit 2; }
case "$FAULT" in
  none) ;;
  kill-host|link-down|absent)
    [[ "$FAULT_HOST" =~ ^[0-9]+$ && "$FAULT_HOST" -lt "$HOSTS" ]] || { say "bad fault host '$FAULT_HOST'"; exit 2; }
    [[ -n "$EXPECT_COLLECTIVE" ]] || { say "--fault needs --expect-collective"; exit 2; } ;;
  *) say "bad --fault '$FAULT'"; exit 2 ;;
esac
if [[ -n "$ROUNDS_FILE" ]]; then
  [[ -r "$ROUNDS_FILE" && ${#CMD[@]} -eq 0 && "$FAULT" == none ]] || { say "--rounds FILE replaces PROG and takes no --fault"; exit 2; }
else
  [[ ${#CMD[@]} -gt 0 ]] || { say "no program to run"; exit 2; }
fi
TIMEOUT_MS=300000
for e in "${ENVS[@]}"; do [[ "$e" == DT_TIMEOUT_MS=* ]] && TIMEOUT_MS=${e#DT_TIMEOUT_MS=}; done
# With a fault, dtrun's grace period (its SIGKILL after the first failing rank) must not end
# before every survivor had its chance to report: a survivor that gloo only tells at its timeout
# (docs/mesh.md) has until timeout + slack, counted from the fault, not from the first failure.
GRACE=()
[[ "$FAULT" != none ]] && GRACE=(--grace-period $(((TIMEOUT_MS + SLACK_MS) / 1000 + 2)))

host_ns() { printf '%sh%d' "$PREFIX" "$1"; }

# Kills every process in namespace $1 (SIGKILL, repeated until none is left or 5 s passed).
kill_ns() {
  local ns=$1 pids tries=0
  while pids=$(ip netns pids "$ns" 2>/dev/null) && [[ -n "$pids" ]]; do
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null
    ((++tries > 50)) && { say "cannot empty namespace $ns: ${pids//$'\n'/ }"; return 1; }
    sleep 0.1
  done
  return 0
}

delete_ns() { kill_ns "$1"; ip netns del "$1" 2>/dev/null; }

cleanup() {
  local rc=$?
  trap - EXIT INT TERM HUP
  [[ -n "$LOGDIR" && -s "$LOGDIR/reaper.pid" ]] && kill "$(cat "$LOGDIR/reaper.pid")" 2>/dev/null
  local ns
  for ns in "${NAMESPACES[@]}"; do kill_ns "$ns"; done
  wait 2>/dev/null  # reap our background `ip netns exec` children
  for ns in "${NAMESPACES[@]}"; do ip netns del "$ns" 2>/dev/null; done
  for ns in "${NAMESPACES[@]}"; do
    [[ -e "/run/netns/$ns" ]] && say "warning: namespace $ns is still there"
  done
  [[ -n "$LOGDIR" && -d "$LOGDIR" ]] && rm -rf "$LOGDIR"
  exit "$rc"
}
trap cleanup EXIT
trap 'say "interrupted"; exit 130' INT
trap 'say "terminated"; exit 143' TERM
trap 'say "hung up"; exit 129' HUP

# Namespaces of earlier runs that were SIGKILLed (their PID is gone) would otherwise stay forever.
remove_stale() {
  local name pid
  while read -r name _; do
    [[ "$name" =~ ^dtmn([0-9]+)- ]] || continue
    pid=${BASH_REMATCH[1]}
    [[ "$pid" == "$ME" ]] && continue
    kill -0 "$pid" 2>/dev/null && continue
    say "removing stale namespace $name (its run, pid $pid, is gone)"
    delete_ns "$name"
  done < <(ip netns list 2>/dev/null)
}

# A detached watchdog (outside our process tree, so it survives ctest's timeout, which SIGKILLs the
# tree and no trap runs): once this script is gone without cleaning up, it empties and deletes our
# namespaces. The normal cleanup stops it first.
start_reaper() {
  (
    # shellcheck disable=SC2016  # the watchdog's own script, expanded by it
    setsid bash -c '
      echo $$ >"$3/reaper.pid"
      while kill -0 "$1" 2>/dev/null; do sleep 0.5; done
      for ns in $(ip netns list | grep -oE "^$2[a-z0-9]+"); do
        for try in 1 2 3 4 5 6 7 8 9 10; do
          pids=$(ip netns pids "$ns") && [ -n "$pids" ] || break
          kill -KILL $pids; sleep 0.1
        done
        ip netns del "$ns"
      done
      rm -rf "$3"' reaper "$ME" "$PREFIX" "$LOGDIR" </dev/null >/dev/null 2>&1 &
  )
  local tries=0
  until [[ -s "$LOGDIR/reaper.pid" ]] || ((++tries > 50)); do sleep 0.02; done
}

skip() {
  say "SKIP: $* — simulated hosts need network namespaces (run as root, or with CAP_SYS_ADMIN and CAP_NET_ADMIN)"
  exit 77
}

# --- the cluster ----------------------------------------------------------------------------------

make_cluster() {
  local err i ns
  command -v ip >/dev/null || skip "the 'ip' command (iproute2) is not installed"
  NAMESPACES+=("$SWITCH")
  err=$(ip netns add "$SWITCH" 2>&1) || skip "'ip netns add' failed: $err"
  ip -n "$SWITCH" link set lo up
  err=$(ip -n "$SWITCH" link add br0 type bridge 2>&1) || skip "cannot create a bridge: $err"
  ip -n "$SWITCH" link set br0 up
  for ((i = 0; i < HOSTS; ++i)); do
    ns=$(host_ns "$i")
    NAMESPACES+=("$ns")
    err=$(ip netns add "$ns" 2>&1) || skip "'ip netns add $ns' failed: $err"
    err=$(ip link add eth0 netns "$ns" type veth peer name "p$i" netns "$SWITCH" 2>&1) ||
      skip "cannot create a veth pair: $err"
    if ! { ip -n "$SWITCH" link set "p$i" master br0 && ip -n "$SWITCH" link set "p$i" up &&
      ip -n "$ns" link set lo up && ip -n "$ns" addr add "$SUBNET.$((i + 1))/24" dev eth0 &&
      ip -n "$ns" link set eth0 up; }; then
      say "cannot configure host $i"
      exit 1
    fi
  done
  # Wait until host 0 is reachable from every host (the bridge needs a moment to forward).
  local deadline=$(($(now_ms) + 10000))
  for ((i = 1; i < HOSTS; ++i)); do
    # Nothing listens on port 9: "Connection refused" means host 0 answered.
    until [[ $(ip netns exec "$(host_ns "$i")" timeout 1 bash -c "exec 3<>/dev/tcp/$SUBNET.1/9" 2>&1) == *refused* ]]; do
      (($(now_ms) > deadline)) && { say "host $i cannot reach host 0 at $SUBNET.1"; exit 1; }
      sleep 0.05
    done
  done
  say "$HOSTS hosts × $NPROC ranks: namespaces ${PREFIX}h0..h$((HOSTS - 1)) on $SUBNET.0/24 (bridge in ${SWITCH}), master $SUBNET.1"
}

# --- one launch ---------------------------------------------------------------------------------

declare -a PIDS RCS STARTED
LAUNCH_MS=0

resolve() {
  if [[ "$1" != */* && -x "$BIN_DIR/$1" ]]; then printf '%s' "$BIN_DIR/$1"; else printf '%s' "$1"; fi
}

# launch PORT PROG ARGS...: dtrun in every host but an absent one; logs in $LOGDIR/host<i>.log.
launch() {
  local port=$1 i
  shift
  local prog
  prog=$(resolve "$1")
  shift
  LAUNCH_MS=$(now_ms)
  for ((i = 0; i < HOSTS; ++i)); do
    PIDS[i]=""
    RCS[i]=""
    STARTED[i]=1
    : >"$LOGDIR/host$i.log"
    if [[ "$FAULT" == absent && "$i" == "$FAULT_HOST" ]]; then
      STARTED[i]=0
      continue
    fi
    # The subshell passes dtrun's status on and keeps bash's "Killed" notices out of the output.
    (
      ip netns exec "$(host_ns "$i")" env "${ENVS[@]}" "$BIN_DIR/dtrun" --nnodes "$HOSTS" --node-rank "$i" \
        --master-addr "$SUBNET.1" --master-port "$port" --nproc-per-node "$NPROC" "${GRACE[@]}" "$prog" "$@" \
        >"$LOGDIR/host$i.log" 2>&1
      exit $?
    ) 2>/dev/null &
    PIDS[i]=$!
  done
}

# Reaps the dtruns that have exited (their status goes to RCS) and sets RUNNING to the others' count.
# Not in a subshell: `wait` only knows this shell's children.
RUNNING=0
poll_hosts() {
  local i
  RUNNING=0
  for ((i = 0; i < HOSTS; ++i)); do
    [[ -n "${PIDS[i]}" && -z "${RCS[i]}" ]] || continue
    if kill -0 "${PIDS[i]}" 2>/dev/null; then
      ((++RUNNING))
    else
      wait "${PIDS[i]}" 2>/dev/null
      RCS[i]=$?
    fi
  done
}

# Waits for every dtrun until the launch's deadline; a hang is a failure (and gets killed).
wait_hosts() {
  local deadline=$((LAUNCH_MS + DEADLINE_S * 1000)) i
  while poll_hosts && [[ $RUNNING -gt 0 ]]; do
    if (($(now_ms) > deadline)); then
      for ((i = 0; i < HOSTS; ++i)); do
        [[ -n "${PIDS[i]}" && -z "${RCS[i]}" ]] && fail "dtrun on host $i still running after ${DEADLINE_S} s (hang)"
      done
      for ((i = 0; i < HOSTS; ++i)); do kill_ns "$(host_ns "$i")"; done
      poll_hosts
      return 1
    fi
    sleep 0.1
  done
  return 0
}

# After every dtrun has exited, nothing may remain in the hosts (dtrun promises no orphans).
check_orphans() {
  local i ns pids deadline=$(($(now_ms) + 3000))
  for ((i = 0; i < HOSTS; ++i)); do
    ns=$(host_ns "$i")
    while pids=$(ip netns pids "$ns") && [[ -n "$pids" ]]; do
      if (($(now_ms) > deadline)); then
        # shellcheck disable=SC2086
        fail "orphan process(es) left in host $i after its dtrun exited: $(ps -o pid=,args= -p "$(echo $pids | tr ' ' ,)" | tr '\n' ';')"
        kill_ns "$ns"
        break
      fi
      sleep 0.1
    done
  done
}

# The number of ranks that printed a line matching $1 (per-rank prefixes from dtrun).
ranks_matching() {
  cat "$LOGDIR"/host*.log | grep -E "^\[rank [0-9]+\] .*($1)" | sed -E 's/^\[rank ([0-9]+)\].*/\1/' | sort -u | wc -l
}

dump_logs() {
  local i
  for ((i = 0; i < HOSTS; ++i)); do
    [[ "${STARTED[i]:-1}" == 1 ]] || continue
    echo "----- host $i (dtrun exit ${RCS[i]:-?}), last 40 lines -----"
    tail -n 40 "$LOGDIR/host$i.log"
  done
  echo "-----"
}

# Copies the hosts' logs to --keep-logs DIR as <label>host<i>.log.
keep_logs() {
  [[ -n "$KEEP_LOGS" ]] || return 0
  mkdir -p "$KEEP_LOGS" || return 0
  local i
  for ((i = 0; i < HOSTS; ++i)); do cp "$LOGDIR/host$i.log" "$KEEP_LOGS/$1host$i.log" 2>/dev/null; done
}

# --- scenarios ----------------------------------------------------------------------------------

# One launch that must succeed on every host.
run_success() {
  local port=$1 label=$2
  shift 2
  local before=${#FAILURES[@]} i
  launch "$port" "$@"
  wait_hosts
  for ((i = 0; i < HOSTS; ++i)); do
    [[ "${RCS[i]}" == 0 ]] || fail "$label: dtrun on host $i exited with ${RCS[i]:-nothing}"
  done
  local total=$((HOSTS * NPROC)) n
  if [[ -n "$EXPECT_OUTPUT" ]]; then
    n=$(ranks_matching "$EXPECT_OUTPUT")
    [[ "$n" == "$total" ]] || fail "$label: $n of $total ranks printed a line matching /$EXPECT_OUTPUT/"
  fi
  if [[ -n "$EXPECT_OUTPUT_ONCE" ]]; then
    n=$(ranks_matching "$EXPECT_OUTPUT_ONCE")
    [[ "$n" -ge 1 ]] || fail "$label: no rank printed a line matching /$EXPECT_OUTPUT_ONCE/"
  fi
  check_orphans
  local secs
  secs=$(awk -v a="$LAUNCH_MS" -v b="$(now_ms)" 'BEGIN { printf "%.1f", (b - a) / 1000 }')
  keep_logs "$label."
  if [[ ${#FAILURES[@]} -gt "$before" ]]; then
    say "$label: FAILED after $secs s: $*"
    dump_logs
    return 1
  fi
  say "$label: ok in $secs s: $*"
  return 0
}

# The ranks that a rank on host $1 must name as lost: for a link cut, the other side of it.
lost_ranks() {
  local g=$1 h l
  for ((h = 0; h < HOSTS; ++h)); do
    if [[ "$FAULT" == link-down ]]; then
      local g_cut=0 h_cut=0
      [[ "$g" == "$FAULT_HOST" ]] && g_cut=1
      [[ "$h" == "$FAULT_HOST" ]] && h_cut=1
      [[ "$g_cut" == "$h_cut" ]] && continue
    else
      [[ "$h" != "$FAULT_HOST" ]] && continue
    fi
    for ((l = 0; l < NPROC; ++l)); do printf '%d ' $((h * NPROC + l)); done
  done
}

run_fault() {
  local port=$1 i
  shift
  launch "$port" "$@"
  local fault_ms=$LAUNCH_MS
  if [[ "$FAULT" != absent ]]; then
    # Strike once every rank is looping in collectives.
    local total=$((HOSTS * NPROC)) deadline=$((LAUNCH_MS + DEADLINE_S * 1000))
    until [[ $(ranks_matching "MN-LOOPING") == "$total" ]]; do
      poll_hosts
      if [[ $RUNNING -lt "$HOSTS" ]] || (($(now_ms) > deadline)); then
        fail "not every rank reached MN-LOOPING before the fault"
        wait_hosts
        dump_logs
        return 1
      fi
      sleep 0.05
    done
    sleep 0.2
    fault_ms=$(now_ms)
    case "$FAULT" in
      kill-host)
        say "killing every process of host $FAULT_HOST (ranks $(lost_ranks 0)) mid-collective"
        kill_ns "$(host_ns "$FAULT_HOST")" ;;
      link-down)
        say "taking host $FAULT_HOST's link down mid-collective (switch port p$FAULT_HOST)"
        ip -n "$SWITCH" link set "p$FAULT_HOST" down ;;
    esac
  else
    say "host $FAULT_HOST never starts (ranks $(lost_ranks 0))"
  fi
  wait_hosts
  local done_ms
  done_ms=$(now_ms)
  check_orphans

  local g l r line at msg lost want named late
  for ((g = 0; g < HOSTS; ++g)); do
    [[ "$FAULT" != link-down && "$g" == "$FAULT_HOST" ]] && continue
    [[ "${RCS[g]}" != 0 && -n "${RCS[g]}" ]] || fail "dtrun on surviving host $g exited with ${RCS[g]:-nothing} (want non-zero)"
    lost=$(lost_ranks "$g")
    for ((l = 0; l < NPROC; ++l)); do
      r=$((g * NPROC + l))
      line=$(grep -m1 -E "^\[rank $r\] MN-ERROR " "$LOGDIR/host$g.log")
      if [[ -z "$line" ]]; then
        fail "rank $r (host $g) reported no error"
        continue
      fi
      at=$(sed -E 's/.* at_ms=([0-9]+) .*/\1/' <<<"$line")
      msg=${line#* msg=}
      late=$((at - fault_ms))
      say "rank $r reported after $late ms: ${msg:0:400}"
      ((late <= TIMEOUT_MS + SLACK_MS)) || fail "rank $r reported $late ms after the fault (timeout $TIMEOUT_MS ms + slack $SLACK_MS ms)"
      grep -qE -- "$EXPECT_COLLECTIVE" <<<"$msg" || fail "rank $r: the error does not match /$EXPECT_COLLECTIVE/: $msg"
      named=" $(grep -oE 'rank\(s\) \[[0-9, ]*\]' <<<"$msg" | grep -oE '[0-9]+' | tr '\n' ' ') "
      [[ "$EXPECT_NAMED" == none ]] && continue
      for want in $lost; do
        [[ "$named" == *" $want "* ]] || fail "rank $r: the error does not name lost rank $want (named:$named): $msg"
      done
    done
  done
  local secs
  secs=$(awk -v a="$LAUNCH_MS" -v b="$done_ms" 'BEGIN { printf "%.1f", (b - a) / 1000 }')
  keep_logs ""
  if [[ ${#FAILURES[@]} -gt 0 ]]; then
    dump_logs
    return 1
  fi
  say "fault $FAULT:$FAULT_HOST: every surviving rank reported in time, every surviving dtrun failed, no orphans ($secs s)"
  return 0
}

# --- main ---------------------------------------------------------------------------------------

remove_stale
LOGDIR=$(mktemp -d "${TMPDIR:-/tmp}/dtmn${ME}.XXXXXX")
start_reaper
make_cluster
BASE_PORT=29500

if [[ "$FAULT" != none ]]; then
  run_fault "$BASE_PORT" "${CMD[@]}"
elif [[ -n "$ROUNDS_FILE" ]]; then
  k=0
  while IFS= read -r line || [[ -n "$line" ]]; do
    line=${line%%#*}
    read -ra words <<<"$line"
    [[ ${#words[@]} -gt 0 ]] || continue
    run_success $((BASE_PORT + k)) "round $k" "${words[@]}"
    # A hung round leaves the hosts out of step; stop there.
    [[ -n "${RCS[0]}" ]] || break
    ((++k))
  done <"$ROUNDS_FILE"
  say "$k round(s)"
else
  run_success "$BASE_PORT" "run" "${CMD[@]}"
fi

if [[ ${#FAILURES[@]} -gt 0 ]]; then
  say "${#FAILURES[@]} failure(s)"
  exit 1
fi
say "PASS"
exit 0
