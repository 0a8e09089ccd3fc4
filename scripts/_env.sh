# Shared by scripts/demo and scripts/test: create the virtual environment and install into it.
# Usage: ensure_env EXTRAS MIN_PYTHON   (EXTRAS is "" for the core package or "[dev]" for tests;
#        MIN_PYTHON is the least interpreter version, "3.10" for the core, "3.12" for lerobot 0.6)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${ROBO_RESUME_VENV:-$ROOT/.venv}"

# version_ok PYTHON MIN: the interpreter runs and is at least MIN (e.g. 3.12).
version_ok() {
  "$1" -c "import sys; want = tuple(map(int, '$2'.split('.')));
sys.exit(0 if sys.version_info[:2] >= want else 1)" >/dev/null 2>&1
}

# find_python MIN: $PYTHON if set, else the first interpreter of at least MIN among python3.12,
# python3.13, python3 on PATH and in pyenv's and uv's usual folders. Prints its path.
find_python() {
  local min="$1" c
  if [ -n "${PYTHON:-}" ]; then
    if version_ok "$PYTHON" "$min"; then echo "$PYTHON"; return 0; fi
    echo "[setup] PYTHON=$PYTHON is not a Python >= $min" >&2
    return 1
  fi
  for c in python3.12 python3.13 \
    "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12 \
    "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.13*/bin/python3.13 \
    "$HOME"/.local/share/uv/python/cpython-3.12*/bin/python3.12 \
    /usr/local/bin/python3.12 /usr/bin/python3.12 python3; do
    if command -v "$c" >/dev/null 2>&1 && version_ok "$c" "$min"; then
      command -v "$c"
      return 0
    fi
  done
  return 1
}

ensure_env() {
  local extras="$1" min="${2:-3.12}"
  if [ -x "$VENV/bin/python" ] && ! version_ok "$VENV/bin/python" "$min"; then
    echo "[setup] $VENV has Python $("$VENV/bin/python" -c 'import sys; print(sys.version.split()[0])'), need >= $min: recreating it" >&2
    rm -rf "$VENV"
  fi
  if [ ! -x "$VENV/bin/python" ]; then
    local py
    if ! py="$(find_python "$min")"; then
      if [ -n "${PYTHON:-}" ]; then
        echo "[setup] unset PYTHON to search the usual places, or point it at a Python >= $min" >&2
        exit 2
      fi
      cat >&2 <<EOF
[setup] no Python >= $min found (looked for python3.12, python3.13, pyenv and uv installs, python3).
[setup] lerobot 0.6, the reference the tests compare with, needs Python >= 3.12. Install one, e.g.
[setup]   apt-get install python3.12 python3.12-venv   (Debian 13 / Ubuntu 24.04)
[setup]   uv python install 3.12   or   pyenv install 3.12
[setup] then run this again, or point PYTHON=/path/to/python3.12 at it.
EOF
      exit 2
    fi
    echo "[setup] creating virtual environment $VENV with $py ($("$py" -c 'import sys; print(sys.version.split()[0])'))" >&2
    "$py" -m venv "$VENV"
  fi
  local tag
  tag="$(cat "$ROOT/pyproject.toml" | sha1sum | cut -c1-12)"
  local stamp="$VENV/.installed${extras}-$tag"
  if [ ! -f "$stamp" ]; then
    echo "[setup] installing robo_resume$extras into $VENV (first run only)" >&2
    "$VENV/bin/python" -m pip install -q --upgrade pip >&2
    "$VENV/bin/python" -m pip install -q -e "$ROOT$extras" >&2
    touch "$stamp"
  fi
}
