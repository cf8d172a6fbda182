# shellcheck shell=bash
# Sourced by the stub commands: record argv, keep "installed" state in $STUB_STATE.
: "${STUB_STATE:?STUB_STATE must point to the stub state folder}"
mkdir -p "$STUB_STATE/pkgs" "$STUB_STATE/py"
record() { printf '%s\n' "$(basename "$0") $*" >>"${STUB_CALLS:-$STUB_STATE/calls}"; }
installed() { [[ -f $STUB_STATE/pkgs/$1 ]]; }
