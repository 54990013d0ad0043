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
    # Re-install only when pyproject.toml, setup.py or a C source changed since the last
    # install (pip caches wheels); the install builds the C extension in place.
    local stamp="$VENV/.kafkakv-installed-$extras" source
    local stale=""
    for source in "$ROOT/pyproject.toml" "$ROOT/setup.py" $(find "$ROOT/src" -name '*.c' -o -name '*.h'); do
        [ "$source" -nt "$stamp" ] && stale=1
    done
    if [ ! -f "$stamp" ] || [ -n "$stale" ]; then
        echo "==> installing kafkakv[$extras] into $VENV"
        "$VENV/bin/python" -m pip install --quiet -e "$ROOT[$extras]"
        touch "$stamp"
    fi
}

ensure_chromium() {
    # The console's tests drive Debian's chromium headless; the load benchmark uses wrk.
    # Quiet when both are present; installs them as root, else says how and goes on (the
    # browser tests then fail, naming what is missing).
    local missing=()
    [ -x /usr/bin/chromium ] || missing+=(chromium)
    command -v wrk >/dev/null 2>&1 || missing+=(wrk)
    [ "${#missing[@]}" -eq 0 ] && return 0
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "==> installing ${missing[*]} with apt-get (browser tests, load benchmark)"
        if ! { apt-get update -qq &&
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null; }; then
            echo "    apt-get could not install ${missing[*]}; going on without" >&2
        fi
    else
        echo "==> missing: ${missing[*]}; install with: sudo apt-get install ${missing[*]}" >&2
        if [ ! -x /usr/bin/chromium ]; then
            echo "    (tests/serve/test_console.py fails without /usr/bin/chromium)" >&2
        fi
    fi
}

ensure_go() {
    # The linearizability tests check histories with porcupine, a Go library
    # (tests/lincheck); its module comes from the Go proxy into Go's own cache. Quiet when
    # `go` is present; installs Debian's golang-go as root, else says how (the tests then fail,
    # naming what is missing).
    command -v go >/dev/null 2>&1 && return 0
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "==> installing golang-go with apt-get (the linearizability checker)"
        if ! { apt-get update -qq &&
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq golang-go >/dev/null; }; then
            echo "    apt-get could not install golang-go; going on without" >&2
        fi
    else
        echo "==> missing: go; install with: sudo apt-get install golang-go" >&2
        echo "    (tests/map/test_linearizability.py fails without it)" >&2
    fi
}

ensure_netns_tools() {
    # The tests of simulated hosts (tests/dev/test_hosts*.py, kafkakv.dev.hosts) make network
    # namespaces with `ip` (iproute2) and cut links inside them with `iptables`. Quiet when
    # both are present; installs them as root, else says how (those tests then fail, naming
    # what is missing).
    local missing=()
    command -v ip >/dev/null 2>&1 || [ -x /usr/sbin/ip ] || missing+=(iproute2)
    command -v iptables >/dev/null 2>&1 || [ -x /usr/sbin/iptables ] || missing+=(iptables)
    [ "${#missing[@]}" -eq 0 ] && return 0
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "==> installing ${missing[*]} with apt-get (simulated hosts for the fault tests)"
        if ! { apt-get update -qq &&
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null; }; then
            echo "    apt-get could not install ${missing[*]}; going on without" >&2
        fi
    else
        echo "==> missing: ${missing[*]}; install with: sudo apt-get install ${missing[*]}" >&2
        echo "    (tests/dev/test_hosts*.py fail without them)" >&2
    fi
}
