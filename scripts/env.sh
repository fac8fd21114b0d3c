# Environment shared by tco's scripts (sourced, not run). Everything here is a
# default: a value already in the environment wins.
TCO_REPO=${TCO_REPO:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
export TCO_REPO
export SGE_ROOT=${SGE_ROOT:-/var/lib/gridengine}
export SGE_CELL=${SGE_CELL:-default}
export DRMAA_LIBRARY_PATH=${DRMAA_LIBRARY_PATH:-/usr/lib/gridengine-drmaa/lib/libdrmaa.so.1.0}
# libdrmaa is linked with jemalloc, whose TLS model fails when dlopen()ed late
# ("cannot allocate memory in static TLS block"): preload it in every process
# that may load libdrmaa (the submit worker, the tests).
export TCO_JEMALLOC=${TCO_JEMALLOC:-/usr/lib/x86_64-linux-gnu/libjemalloc.so.2}
export TCO_USER=${TCO_USER:-tco}
export TCO_STATE_DIR=${TCO_STATE_DIR:-$TCO_REPO/var}
export TCO_PORT=${TCO_PORT:-8000}
# Redis (scripts/dev-cluster): loopback, a password in TCO_REDIS_PASSWORD_FILE
# (readable by tco and root only). tco's processes build REDIS_URL from these
# themselves (tco_web/settings.py), so the password is never on a command
# line; an explicit REDIS_URL still wins. redis_cli ARGS... talks to it.
export TCO_REDIS_PORT=${TCO_REDIS_PORT:-6379}
export TCO_REDIS_DB=${TCO_REDIS_DB:-0}
export TCO_REDIS_PASSWORD_FILE=${TCO_REDIS_PASSWORD_FILE:-/etc/tco/redis-password}
redis_cli() {
    REDISCLI_AUTH=$(cat "$TCO_REDIS_PASSWORD_FILE" 2>/dev/null || true) \
        redis-cli -h 127.0.0.1 -p "$TCO_REDIS_PORT" --no-auth-warning "$@"
}
source "$TCO_REPO/scripts/fds.sh"     # close_inherited_fds
export PYTHONDONTWRITEBYTECODE=1
export DJANGO_SETTINGS_MODULE=tco_web.settings
PY=$TCO_REPO/.venv/bin/python

# as_tco CMD...: run CMD as the unprivileged submit account, keeping tco's
# environment, with umask 077: whatever tco creates (database, spool, logs) is
# its own alone.
as_tco() {
    if [ "$(id -un)" = "$TCO_USER" ]; then
        (umask 077 && "$@")
    else
        runuser -u "$TCO_USER" -- env HOME="$(getent passwd "$TCO_USER" | cut -d: -f6)" \
            PATH="$PATH" TCO_REPO="$TCO_REPO" SGE_ROOT="$SGE_ROOT" SGE_CELL="$SGE_CELL" \
            DRMAA_LIBRARY_PATH="$DRMAA_LIBRARY_PATH" TCO_JEMALLOC="$TCO_JEMALLOC" \
            TCO_STATE_DIR="$TCO_STATE_DIR" TCO_PORT="$TCO_PORT" TCO_REDIS_PORT="$TCO_REDIS_PORT" \
            TCO_REDIS_DB="$TCO_REDIS_DB" TCO_REDIS_PASSWORD_FILE="$TCO_REDIS_PASSWORD_FILE" \
            ${REDIS_URL:+REDIS_URL="$REDIS_URL"} ${TCO_REDIS_PREFIX:+TCO_REDIS_PREFIX="$TCO_REDIS_PREFIX"} \
            PYTHONDONTWRITEBYTECODE=1 DJANGO_SETTINGS_MODULE=tco_web.settings \
            ${SGE_QMASTER_PORT:+SGE_QMASTER_PORT="$SGE_QMASTER_PORT"} \
            ${SGE_EXECD_PORT:+SGE_EXECD_PORT="$SGE_EXECD_PORT"} \
            ${DATABASE_URL:+DATABASE_URL="$DATABASE_URL"} ${DATABASE_URL_FILE:+DATABASE_URL_FILE="$DATABASE_URL_FILE"} \
            ${CI:+CI="$CI"} sh -c 'umask 077 && exec "$@"' sh "$@"
    fi
}
