# scripts/fds.sh -- sourced by scripts/env.sh and scripts/dev-cluster.
# close_inherited_fds: close the descriptors the calling script inherited (the lock of a
# `flock FILE make demo` or `flock FILE scripts/test` among them), so a daemon it starts
# (redis-server, sge_qmaster, an execd, tco's services) never keeps holding the caller's lock
# after the caller ends: Redis kept the dev cluster's lock for good after a `flock ... make demo`.
# 0-2 and bash's own script descriptor (255) stay.
close_inherited_fds() {
    local fd
    for fd in /proc/$$/fd/*; do
        fd=${fd##*/}
        case $fd in 0 | 1 | 2 | 255) ;; *) [[ $fd =~ ^[0-9]+$ ]] && eval "exec $fd>&-" ;; esac
    done
    return 0
}
