# Sourced by scripts/setup_env.sh and scripts/build_wheels.sh: run a step with its output in $log, print
# one line with its title and time; on failure, the end of the log.
step() {  # step TITLE COMMAND...
  local title=$1 started=$SECONDS
  shift
  printf '  %-68s' "$title"
  echo "=== $title: $*" >>"$log"
  if "$@" >>"$log" 2>&1; then
    printf '%4d s\n' $((SECONDS - started))
  else
    printf 'FAILED\n\nThe last lines of %s:\n' "$log"
    tail -n 25 "$log"
    exit 1
  fi
}
