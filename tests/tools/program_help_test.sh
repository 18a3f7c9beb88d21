#!/usr/bin/env bash
# A program's command line as every dtensor program has it (tools/flags.h), on the program and on
# each of its subcommands (ctest cli_help_<target>, label cpu):
#   - --help and -h exit 0 and print the same text on stdout, whose first line is "usage: ...";
#   - that text lists the flags ("flags:"), unless the program has subcommands: its usage line is
#     then "usage: NAME sub1 | sub2 | ... [flags]", and each `NAME sub` is checked the same way;
#   - an unknown flag exits 2 with a line on stderr that names it.
#   tests/tools/program_help_test.sh PROGRAM
set -uo pipefail
failed=0
check() {  # check PROGRAM [SUBCOMMAND]
  local -a prog=("$@")
  local help short err st subs
  fail() { echo "FAIL ${prog[*]}: $*"; failed=$((failed + 1)); }
  if ! help=$("${prog[@]}" --help 2>/dev/null); then fail "--help exits $?"; return; fi
  [[ $help == usage:* ]] || fail "--help does not start with 'usage:': $help"
  short=$("${prog[@]}" -h 2>/dev/null) || fail "-h exits $?"
  [[ $short == "$help" ]] || fail "-h prints another text than --help: $short"
  err=$("${prog[@]}" --no-such-flag 2>&1 >/dev/null)
  st=$?
  [[ $st -eq 2 ]] || fail "--no-such-flag exits $st, not 2: $err"
  grep -q -- '--no-such-flag' <<<"$err" || fail "--no-such-flag is not named: $err"
  # Subcommands: "usage: dtensor explain | verify | calibrate [flags]".
  subs=$(head -n 1 <<<"$help" | sed -nE 's/^usage: [^ ]+ ([a-z]+( \| [a-z]+)+) \[flags\]$/\1/p')
  if [[ ${#prog[@]} -eq 1 && -n $subs ]]; then
    for sub in ${subs//|/ }; do check "${prog[0]}" "$sub"; done
  else
    grep -q '^flags:' <<<"$help" || fail "--help lists no flags: $help"
  fi
  echo "checked ${prog[*]}"
}
check "$1"
[[ $failed -eq 0 ]]
