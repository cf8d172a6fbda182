# shellcheck shell=bash
# Sourced by the stub commands: record argv, count invocations per tool, keep "installed" state in
# $STUB_STATE. STUB_PREINSTALLED="name=version ..." seeds packages a vendor image already has.
: "${STUB_STATE:?STUB_STATE must point to the stub state folder}"
mkdir -p "$STUB_STATE/pkgs" "$STUB_STATE/py" "$STUB_STATE/count"
if [[ -n ${STUB_PREINSTALLED:-} && ! -e $STUB_STATE/seeded ]]; then
  for _p in $STUB_PREINSTALLED; do printf '%s' "${_p#*=}" >"$STUB_STATE/pkgs/${_p%%=*}"; done
  : >"$STUB_STATE/seeded"
fi
record() {
  local tool n=0
  tool=$(basename "$0")
  printf '%s\n' "$tool $*" >>"${STUB_CALLS:-$STUB_STATE/calls}"
  [[ -f $STUB_STATE/count/$tool ]] && n=$(<"$STUB_STATE/count/$tool")
  printf '%s' "$((n + 1))" >"$STUB_STATE/count/$tool"
}
installed() { [[ -f $STUB_STATE/pkgs/$1 ]]; }
