#!/usr/bin/env bash
# Prints the absolute path of a Python interpreter that has the official MCP
# Python SDK (PyPI `mcp`, the version pinned below), installing it into the
# repo-local virtual environment .mcp-python/ (git-ignored) when missing.
# The e2e test TestMCPPythonSDK runs its client script with it. Every failure
# is one line on stderr and exit 1; stdout carries only the path.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
want="2.3.0"
venv="$root/.mcp-python"
py="$venv/bin/python"

die() { echo "mcp-python: $*" >&2; exit 1; }

have() { [ -x "$py" ] && [ "$("$py" -c 'import importlib.metadata as m; print(m.version("mcp"))' 2>/dev/null)" = "$want" ]; }

if ! have; then
  command -v python3 >/dev/null || die "python3 is not installed"
  python3 -m venv "$venv" >&2 || die "failed to create $venv"
  "$py" -m pip install --quiet --disable-pip-version-check "mcp==$want" >&2 || die "failed to install mcp==$want into $venv"
  have || die "mcp==$want is not importable from $venv"
fi
echo "$py"
