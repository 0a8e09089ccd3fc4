# Shared by scripts/demo and scripts/test: create the virtual environment and install into it.
# Usage: ensure_env EXTRAS   (EXTRAS is "" for the core package or "[dev]" for tests)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${ROBO_RESUME_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"

ensure_env() {
  local extras="$1"
  if [ ! -x "$VENV/bin/python" ]; then
    echo "[setup] creating virtual environment $VENV" >&2
    "$PY" -m venv "$VENV"
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
