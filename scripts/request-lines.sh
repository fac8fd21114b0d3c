# scripts/request-lines.sh -- sourced by scripts/cluster-faults: whole request
# lines from a FIFO read with a timeout.
#
# `read -t` keeps what it had read when its timeout fires (bash(1), read: "If
# read times out, read saves any partial input read into the specified
# variable"), and it reads a FIFO one byte at a time, so a line that arrives
# while the timeout expires comes back in two parts. Dropping the first part
# turned "ID window none" into "D window none": the request ran, but under an
# id its writer never saw answered.

# next_request FD: the next whole line on FD (no newline) into REQUEST, status
# 0; or status 1 when none was complete within REQUEST_TIMEOUT_S seconds (1; the
# unit test of these lines shortens it). A partial line is kept in
# REQUEST_PART for the next call; one longer than 4096 bytes is dropped whole
# (REQUEST_SKIP: the rest of such a line is being skipped).
REQUEST_TIMEOUT_S=${REQUEST_TIMEOUT_S:-1}
REQUEST_PART=
REQUEST_SKIP=0
next_request() {
    local part=
    if IFS= read -r -t "$REQUEST_TIMEOUT_S" -u "$1" part; then
        REQUEST=$REQUEST_PART$part
        REQUEST_PART=
        if (( REQUEST_SKIP || ${#REQUEST} > 4096 )); then
            REQUEST_SKIP=0; REQUEST=
            return 1
        fi
        return 0
    fi
    REQUEST_PART+=$part
    if (( ${#REQUEST_PART} > 4096 )); then
        REQUEST_PART=; REQUEST_SKIP=1
    fi
    return 1
}
