# Shared by scripts/test and scripts/demo: make (or reuse) the project's virtual environment
# and install kafkakv into it with what the caller asks for. Source it, don't run it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${KAFKAKV_VENV:-$ROOT/.venv}"
PYTHON_BIN="${PYTHON:-python3}"

ensure_venv() {
    local extras="$1"
    if ! "$PYTHON_BIN" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
        echo "kafkakv needs Python >= 3.11; $PYTHON_BIN is $("$PYTHON_BIN" --version 2>&1)" >&2
        exit 1
    fi
    if [ ! -x "$VENV/bin/python" ]; then
        echo "==> creating virtual environment $VENV"
        "$PYTHON_BIN" -m venv "$VENV"
        "$VENV/bin/python" -m pip install --quiet --upgrade pip
    fi
    # Re-install only when pyproject.toml changed since the last install (pip caches wheels).
    local stamp="$VENV/.kafkakv-installed-$extras"
    if [ ! -f "$stamp" ] || [ "$ROOT/pyproject.toml" -nt "$stamp" ]; then
        echo "==> installing kafkakv[$extras] into $VENV"
        "$VENV/bin/python" -m pip install --quiet -e "$ROOT[$extras]"
        touch "$stamp"
    fi
}
