#!/usr/bin/env bash
# scripts/commit-msg on sample messages, and scripts/install-hooks with a real `git commit` in a
# scratch repository (ctest scripts.commit_msg, label cpu). Exit 77 (skipped) without git.
#   tests/scripts/commit_msg_test.sh SOURCE_DIR
set -uo pipefail
root=$(cd "${1:?usage: commit_msg_test.sh SOURCE_DIR}" && pwd)
command -v git >/dev/null || { echo "no git: skipped"; exit 77; }
unset GIT_DIR GIT_WORK_TREE GIT_INDEX_FILE GIT_OBJECT_DIRECTORY
export LC_ALL=C.UTF-8 GIT_CONFIG_NOSYSTEM=1 HOME=$(mktemp -d)
work=$(mktemp -d)
trap 'rm -rf "$work" "$HOME"' EXIT
cd "$work" && git init -q repo && cd repo || exit 1
git config user.name test && git config user.email test@example.com
# The scripts run from this scratch clone, as from a checkout of the project: install-hooks
# installs into the repository it is part of, never into the one this test runs from.
mkdir scripts && cp "$root/scripts/commit-msg" "$root/scripts/install-hooks" scripts/
hook=$PWD/scripts/commit-msg
hooks=$(git rev-parse --path-format=absolute --git-path hooks)
[[ $hooks == "$work"/* ]] || { echo "hooks would go to $hooks, outside $work"; exit 1; }
printf 'line %s\n' $(seq 1 20) >file.txt && git add file.txt && git commit -qm init --no-verify

failed=0
# expect STATUS NAME MESSAGE [NEEDLE]: the hook on MESSAGE exits STATUS (and says NEEDLE).
expect() {
  local want=$1 name=$2 msg=$3 needle=${4:-}
  printf '%s' "$msg" >"$work/msg"
  local out st
  out=$("$hook" "$work/msg" 2>&1)
  st=$?
  if [[ $st -ne $want ]] || [[ -n $needle && $out != *"$needle"* ]]; then
    echo "FAIL $name: exit $st (want $want), output: $out"
    failed=$((failed + 1))
  else
    echo "ok   $name"
  fi
}
s72=$(printf 'x%.0s' $(seq 1 72))
s73=${s72}y
u72=$(printf 'é%.0s' $(seq 1 72))  # 72 characters, 144 bytes

# A change of 20 lines staged: a body is needed.
printf 'new %s\n' $(seq 1 10) >file.txt && git add file.txt
expect 0 "subject, blank, body" $'Add the thing\n\nWhy: because, 2x faster.\n'
expect 0 "72-character subject" "$s72"$'\n\nbody\n'
expect 0 "72 characters in 144 bytes" "$u72"$'\n\nbody\n'
expect 1 "73-character subject" "$s73"$'\n\nbody\n' "the subject is 73 characters, at most 72"
expect 1 "no blank line" $'Add the thing\nWhy: because.\n' "the second line must be blank"
expect 1 "no body" $'Add the thing\n' "needs a body"
expect 1 "blank body" $'Add the thing\n\n\n  \n' "needs a body"
expect 1 "empty" $'\n# only a comment\n' "the message is empty"
expect 0 "comments and scissors are not the message" \
  "# Please enter the commit message"$'\nAdd the thing\n# '"$s73"$'\n\nbody\n# ------------------------ >8 ------------------------\n'"$s73"$'\n'
expect 0 "leading blank lines" $'\n\nAdd the thing\n\nbody\n'
expect 0 "fixup" $'fixup! Add the thing\n'
expect 0 "merge" $'Merge branch \'x\'\n'
expect 0 "revert" $'Revert "Add the thing"\n'
# A one-line change (2 lines: one removed, one added): a subject alone is enough.
git reset -q --hard && sed -i 's/line 3/line three/' file.txt && git add file.txt
expect 0 "trivial change, no body" $'Fix a typo in file.txt\n'
expect 1 "trivial change, long subject" "$s73"$'\n' "at most 72"
# Nothing staged (a reword): a body is needed.
git reset -q --hard
expect 1 "empty diff, no body" $'Reword\n' "needs a body"

# install-hooks links the hook, and git then runs it.
scripts/install-hooks >/dev/null || { echo "FAIL install-hooks"; failed=$((failed + 1)); }
echo change >>file.txt && echo more >>file.txt && echo again >>file.txt && git add file.txt
if git commit -q -m "$s73" -m body 2>/dev/null; then
  echo "FAIL git commit took a 73-character subject"; failed=$((failed + 1))
else
  echo "ok   git commit refuses through the installed hook"
fi
if git commit -q -m "Add three lines" -m "Because the test needs them."; then
  echo "ok   git commit takes a good message"
else
  echo "FAIL git commit refused a good message"; failed=$((failed + 1))
fi
# Another hook in place is kept.
rm "$hooks/commit-msg"
echo '#!/bin/sh' >"$hooks/commit-msg"
if scripts/install-hooks 2>/dev/null; then
  echo "FAIL install-hooks replaced another hook"; failed=$((failed + 1))
else
  echo "ok   install-hooks keeps another hook"
fi
echo "$failed failed"
[[ $failed -eq 0 ]]
