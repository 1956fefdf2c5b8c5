#!/usr/bin/env bash
# One stage of `make`'s set-up, quietly: runs COMMAND (a shell command line) with all its output appended to LOG,
# and prints one line for the stage: its name and description when it starts, its time when it ends. On failure
# the line ends in FAILED, then the end of LOG and LOG's path follow (on stderr), and it exits with the command's
# status.
#
#   bash tools/setup_stage.sh LOG NAME DESCRIPTION COMMAND
#
# Env: SETUP_TAIL_LINES (default 25), how much of the log a failure shows.
set -uo pipefail

if [[ $# -ne 4 ]]; then
  echo "usage: setup_stage.sh LOG NAME DESCRIPTION COMMAND (got $# arguments)" >&2
  exit 2
fi
log=$1 name=$2 description=$3 command=$4

mkdir -p "$(dirname "$log")"
printf '\n==== %s: %s\n$ %s\n' "$name" "$description" "$command" >>"$log"
printf '[setup] %-9s %-68s ' "$name" "$description"
started=$SECONDS
bash -c "$command" >>"$log" 2>&1 </dev/null
status=$?
elapsed=$((SECONDS - started))
if [[ $status -eq 0 ]]; then
  printf '%4d s\n' "$elapsed"
  exit 0
fi
printf 'FAILED (exit %d after %d s)\n' "$status" "$elapsed"
{
  printf '[setup] the end of the log:\n'
  tail -n "${SETUP_TAIL_LINES:-25}" "$log" | sed 's/^/    /'
  printf '[setup] the whole log: %s\n' "$log"
} >&2
exit "$status"
