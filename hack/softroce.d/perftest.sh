#!/bin/sh
# Guest payload: perftest's ib_read_lat and ib_read_bw between the two rxe devices, and
# ib_read_lat once more with the connection set up by rdma_cm (-R) instead of a TCP
# exchange. Server on rxe1 (SOFTROCE_ADDR1), client on rxe0. Prints each tool's report, one
# summary line per run ("softroce-perftest: ib_read_lat ..."), and writes the figures to
# /run/softroce-perftest.env for later payload steps (SOFTROCE_READ_LAT_TYPICAL_US,
# SOFTROCE_READ_LAT_AVG_US, SOFTROCE_READ_LAT_P99_US, SOFTROCE_READ_BW_AVG_MBPS). Exits
# non-zero if either fails or gives no usable figure in 5 attempts.
#
# `perftest.sh lat PORT [BYTES]`: ib_read_lat alone (first attempt on PORT; reads of BYTES,
# default perftest's 2), its summary line only ("softroce-perftest: ib_read_lat bytes=..
# ... t_typical_us=.. t_p99_us=.. PASS"), for payloads that measure it again between
# their own runs.
#
# Knobs (environment): PERFTEST_LAT_ITERS (default 1000), PERFTEST_BW_ITERS (default 300),
# PERFTEST_CM_ITERS (default 200), PERFTEST_TIMEOUT seconds per tool (default 120).
set -u
# shellcheck disable=SC1091 # written by net-setup.sh at boot
. /run/softroce.env

LAT_ITERS=${PERFTEST_LAT_ITERS:-1000}
BW_ITERS=${PERFTEST_BW_ITERS:-300}
CM_ITERS=${PERFTEST_CM_ITERS:-200}
TOOL_TIMEOUT=${PERFTEST_TIMEOUT:-120}
OUT=/tmp/perftest
mkdir -p "$OUT"

# wait_listen PORT: bounded wait (10 s) until a TCP or rdma_cm listener is on PORT.
wait_listen() {
    n=0
    while [ "$n" -lt 100 ]; do
        ss -ltnH "sport = :$1" 2>/dev/null | grep -q . && return 0
        rdma resource show cm_id 2>/dev/null | grep LISTEN | grep -q ":$1 " && return 0
        n=$((n + 1))
        sleep 0.1
    done
    return 1
}

# run_pair NAME TOOL PORT ARGS...: server on rxe1, client on rxe0; client report in
# $OUT/NAME, server output in $OUT/NAME.server.
run_pair() {
    name=$1 tool=$2 port=$3
    shift 3
    timeout "$TOOL_TIMEOUT" "$tool" -d "$SOFTROCE_DEV1" -x "$SOFTROCE_GID1" -p "$port" -F "$@" \
        >"$OUT/$name.server" 2>&1 &
    server=$!
    if ! wait_listen "$port"; then
        echo "softroce-perftest: $name server did not listen on port $port"
        kill "$server" 2>/dev/null
        wait "$server"
        cat "$OUT/$name.server"
        return 1
    fi
    timeout "$TOOL_TIMEOUT" "$tool" -d "$SOFTROCE_DEV0" -x "$SOFTROCE_GID0" -p "$port" -F "$@" \
        "$SOFTROCE_ADDR1" >"$OUT/$name" 2>&1
    client_rc=$?
    wait "$server"
    server_rc=$?
    cat "$OUT/$name"
    if [ "$client_rc" -ne 0 ] || [ "$server_rc" -ne 0 ]; then
        echo "softroce-perftest: $name failed (client exit $client_rc, server exit $server_rc)"
        echo "--- $name server output:"
        cat "$OUT/$name.server"
        return 1
    fi
    return 0
}

# result_row FILE: the first report row (it starts with the message size).
result_row() { awk '$1 ~ /^[0-9]+$/ && NF >= 4 { print; exit }' "$1"; }

# positive FIGURE: true when FIGURE is a number above zero (not 0.00, inf or nan).
positive() { awk -v v="$1" 'BEGIN { exit !(v ~ /^[0-9]*[.]?[0-9]+$/ && v + 0 > 0) }'; }

# measure NAME TOOL PORT COLUMN ARGS...: runs TOOL (at most 5 attempts) until it completes
# and column COLUMN of its report row is a positive figure; the row goes to $OUT/NAME.row.
# perftest converts cycles to microseconds and MB/s with a TSC frequency it samples at
# start; on a busy host that sampling can fail and the figures come out as 0.00 or inf.
measure() {
    name=$1 tool=$2 port=$3 column=$4 attempt=1
    shift 4
    while [ "$attempt" -le 5 ]; do
        if run_pair "$name" "$tool" "$port" "$@"; then
            row=$(result_row "$OUT/$name")
            fig=$(echo "$row" | awk -v c="$column" '{ print $c }')
            if positive "$fig"; then
                echo "$row" >"$OUT/$name.row"
                return 0
            fi
            echo "softroce-perftest: $name attempt $attempt reported '$fig' (TSC sampling failed?)"
        fi
        attempt=$((attempt + 1))
        port=$((port + 10))
    done
    return 1
}

# read_lat NAME PORT [ARGS...]: ib_read_lat; prints its summary line; the row's columns
# are bytes iterations t_min t_max t_typical t_avg t_stdev p99 p99.9.
read_lat() {
    lat_name=$1 lat_port=$2
    shift 2
    if ! measure "$lat_name" ib_read_lat "$lat_port" 5 -n "$LAT_ITERS" "$@"; then
        echo "softroce-perftest: ib_read_lat FAIL"
        return 1
    fi
    # shellcheck disable=SC2046 # split the row into its columns
    set -- $(cat "$OUT/$lat_name.row")
    echo "softroce-perftest: ib_read_lat bytes=$1 iters=$2 t_min_us=$3 t_typical_us=$5 t_avg_us=$6 t_p99_us=$8 PASS"
}

if [ "${1:-}" = lat ]; then
    [ -n "${2:-}" ] || { echo "perftest.sh lat: needs a port"; exit 2; }
    read_lat "ib_read_lat-$2" "$2" ${3:+-s "$3"} >"$OUT/lat-$2.log" 2>&1
    rc=$?
    grep '^softroce-perftest: ' "$OUT/lat-$2.log"
    exit "$rc"
fi

fail=0
if read_lat ib_read_lat 18515; then
    # shellcheck disable=SC2046 # split the row into its columns
    set -- $(cat "$OUT/ib_read_lat.row")
    echo "export SOFTROCE_READ_LAT_TYPICAL_US=$5 SOFTROCE_READ_LAT_AVG_US=$6 SOFTROCE_READ_LAT_P99_US=$8" >>/run/softroce-perftest.env
else
    fail=1
fi

# ib_read_bw columns: bytes iterations bw_peak bw_average msg_rate
if measure ib_read_bw ib_read_bw 18516 4 -n "$BW_ITERS"; then
    # shellcheck disable=SC2046 # split the row into its columns
    set -- $(cat "$OUT/ib_read_bw.row")
    echo "softroce-perftest: ib_read_bw bytes=$1 iters=$2 bw_peak_MBps=$3 bw_avg_MBps=$4 msg_rate_Mpps=$5 PASS"
    echo "export SOFTROCE_READ_BW_AVG_MBPS=$4" >>/run/softroce-perftest.env
else
    echo "softroce-perftest: ib_read_bw FAIL"
    fail=1
fi

if measure ib_read_lat_cm ib_read_lat 18517 5 -R -n "$CM_ITERS"; then
    # shellcheck disable=SC2046 # split the row into its columns
    set -- $(cat "$OUT/ib_read_lat_cm.row")
    echo "softroce-perftest: ib_read_lat (rdma_cm) bytes=$1 iters=$2 t_min_us=$3 t_typical_us=$5 t_avg_us=$6 PASS"
else
    echo "softroce-perftest: ib_read_lat (rdma_cm) FAIL"
    fail=1
fi

exit "$fail"
