#!/bin/sh
# Guest payload: Ferrite's one-sided GET over RDMA verbs between the two rxe devices.
# 1. perftest.sh: ib_read_lat / ib_read_bw in this guest (the ceiling, and the figure the
#    GET latency is compared to);
# 2. the verbs_softroce test binary (built on the host with --features rdma) with --ignored:
#    engine on rxe1 (SOFTROCE_ADDR1, verbs side channel on port 7601), clients on rxe0:
#    concurrent writers + verbs one-sided readers checked for latest values, GET latency,
#    and a clear error after the engine is killed;
# 3. `ferrite bench kv --fabric verbs` against a ferrite-engine on rxe1 (RPC over
#    loopback TCP): one GET at a time, then batches of 8 (one doorbell for the buckets,
#    one for the records); ops/s, p50/p99 and the one-sided hit rate;
# 4. prints "ferrite-verbs: ..." lines with the GET latencies as ratios to ib_read_lat
#    (target <= 2.5: two reads per cold GET, one per cached bucket).
# Exits non-zero when a test or a bench run fails (perftest failing only drops the ratios).
# Needs in /opt/ferrite/bin: ferrite-engine, ferrite and verbs_softroce-* (see
# ci/softroce --verbs). Knobs: FERRITE_BENCH_SECONDS (default 5), FERRITE_BENCH_KEYS
# (default 10K), FERRITE_ENGINE_START_TIMEOUT_S (default 300: an emulated CPU on a
# loaded host can take minutes to start an engine).
set -u
# shellcheck disable=SC1091 # written by net-setup.sh at boot
. /run/softroce.env

perftest.sh || echo "ferrite-verbs: perftest failed; going on without the ratio"
lat=""
if [ -r /run/softroce-perftest.env ]; then
    # shellcheck disable=SC1091
    . /run/softroce-perftest.env
    lat=${SOFTROCE_READ_LAT_TYPICAL_US:-}
fi

# The test finds ferrite-engine next to its own folder (target/<profile>/ on a host). The
# guest's file systems are all in memory and refuse O_DIRECT: this wrapper turns the test's
# uring bdev spec into a buffered one (direct=0) and execs the engine (same pid).
cat >/opt/ferrite/ferrite-engine <<'WRAP'
#!/bin/sh
n=$#
i=0
while [ "$i" -lt "$n" ]; do
    a=$1
    shift
    case $a in uring:*\?*) a="$a&direct=0" ;; esac
    set -- "$@" "$a"
    i=$((i + 1))
done
exec /opt/ferrite/bin/ferrite-engine "$@"
WRAP
chmod 0755 /opt/ferrite/ferrite-engine
test_bin=$(find /opt/ferrite/bin -maxdepth 1 -name 'verbs_softroce-*' -type f | head -n 1)
if [ -z "$test_bin" ]; then
    echo "ferrite-verbs: no verbs_softroce test binary in /opt/ferrite/bin"
    exit 1
fi
export FERRITE_ENGINE_START_TIMEOUT_S="${FERRITE_ENGINE_START_TIMEOUT_S:-300}"
export FERRITE_VERBS_PROVIDER="verbs=$SOFTROCE_DEV1@$SOFTROCE_ADDR1:7601"
export FERRITE_VERBS_CLIENT_DEVICE="$SOFTROCE_DEV0"
timeout 400 "$test_bin" --ignored --test-threads=1 --nocapture >/tmp/ferrite-verbs.out 2>&1
rc=$?
cat /tmp/ferrite-verbs.out
p50=$(sed -n 's/.*FERRITE_VERBS_GET_P50_US=//p' /tmp/ferrite-verbs.out | head -n 1)
avg=$(sed -n 's/.*FERRITE_VERBS_GET_AVG_US=//p' /tmp/ferrite-verbs.out | head -n 1)
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
if [ -n "$p50" ] && [ -n "$lat" ]; then
    echo "ferrite-verbs: one-sided GET p50 ${p50} us (avg ${avg} us), ib_read_lat typical ${lat} us, ratio $(ratio "$p50" "$lat") (target <= 2.5)"
else
    echo "ferrite-verbs: GET p50 '${p50}' us, ib_read_lat '${lat}' us: no ratio"
fi
g8=$(sed -n 's/.*FERRITE_VERBS_8_GETS_P50_US=//p' /tmp/ferrite-verbs.out | head -n 1)
b8=$(sed -n 's/.*FERRITE_VERBS_BATCH_8_P50_US=//p' /tmp/ferrite-verbs.out | head -n 1)
if [ -n "$g8" ] && [ -n "$b8" ]; then
    echo "ferrite-verbs: 8 GETs (warm buckets) one by one p50 ${g8} us, as one batch (one doorbell) p50 ${b8} us, ratio $(ratio "$b8" "$g8")"
fi
echo "ferrite-verbs: tests exit status $rc"

# --- ferrite bench kv --fabric verbs -------------------------------------------------
BENCH_DIR=/tmp/ferrite-bench-engine
BENCH_SIDE="$SOFTROCE_ADDR1:7602"
ENGINE_PID=""

# engine_start: a ferrite-engine for the bench, one-sided reads over verbs on rxe1, RPC on
# loopback TCP; waits (bounded) for its "ready" line and says why when it does not come.
engine_start() {
    rm -rf "$BENCH_DIR"
    mkdir -p "$BENCH_DIR"
    /opt/ferrite/ferrite-engine --data-dir "$BENCH_DIR" --xstreams 1 --tcp 127.0.0.1:7600 \
        --unix "" --jobs "" --providers "verbs=$SOFTROCE_DEV1@$BENCH_SIDE" \
        --bdev 'uring:{dir}/target-{i}.bdev?size=256M' --ring-bytes 16M --buckets 65536 \
        >"$BENCH_DIR/stdout" 2>"$BENCH_DIR/stderr" &
    ENGINE_PID=$!
    start=$(date +%s)
    limit=$FERRITE_ENGINE_START_TIMEOUT_S
    while [ $(($(date +%s) - start)) -lt "$limit" ]; do
        if grep -qx ready "$BENCH_DIR/stdout"; then
            echo "ferrite-verbs: bench engine ready after $(($(date +%s) - start)) s"
            return 0
        fi
        if ! kill -0 "$ENGINE_PID" 2>/dev/null; then
            wait "$ENGINE_PID"
            echo "ferrite-verbs: bench engine exited (status $?) before ready; its output:"
            cat "$BENCH_DIR/stdout" "$BENCH_DIR/stderr"
            ENGINE_PID=""
            return 1
        fi
        sleep 0.2
    done
    echo "ferrite-verbs: bench engine not ready within $limit s; its output so far:"
    cat "$BENCH_DIR/stdout" "$BENCH_DIR/stderr"
    return 1
}

engine_stop() {
    [ -n "$ENGINE_PID" ] || return 0
    kill "$ENGINE_PID" 2>/dev/null
    wait "$ENGINE_PID" 2>/dev/null
    ENGINE_PID=""
}

bench_rc=0
if ! command -v ferrite >/dev/null 2>&1; then
    echo "ferrite-verbs: no ferrite binary in /opt/ferrite/bin: bench kv FAIL"
    bench_rc=1
elif ! engine_start; then
    bench_rc=1
fi
if [ "$bench_rc" -eq 0 ]; then
    # json_field FILE NAME: a number from the bench's one-line JSON report.
    json_field() { sed -n "s/.*\"$2\":\([0-9.e+-]*\).*/\1/p" "$1" | head -n 1; }
    for depth in 1 8; do
        out=/tmp/ferrite-bench-p$depth.json
        timeout 300 ferrite bench kv --engine tcp://127.0.0.1:7600 \
            --fabric "verbs=$SOFTROCE_DEV0@$BENCH_SIDE" --op get \
            --keys "${FERRITE_BENCH_KEYS:-10K}" --value-size 64 --pipeline "$depth" \
            -t "${FERRITE_BENCH_SECONDS:-5}" --json >"$out" 2>/tmp/ferrite-bench.err
        brc=$?
        cat "$out" /tmp/ferrite-bench.err
        ops=$(json_field "$out" ops_per_sec)
        bp50=$(json_field "$out" p50)
        bp99=$(json_field "$out" p99)
        hit=$(json_field "$out" one_sided_hit_rate)
        errors=$(json_field "$out" errors)
        if [ "$brc" -ne 0 ] || [ -z "$ops" ] || [ "${errors:-1}" != 0 ]; then
            echo "ferrite-verbs: bench kv --fabric verbs --pipeline $depth FAIL (exit $brc, errors '${errors}')"
            bench_rc=1
            continue
        fi
        echo "ferrite-verbs: bench kv get --fabric verbs --pipeline $depth: ${ops} ops/s, p50 ${bp50} us, p99 ${bp99} us, one-sided hit rate ${hit}; ib_read_lat typical ${lat:-?} us (p50 ratio $(ratio "$bp50" "${lat:-0}")), ib_read_bw ${SOFTROCE_READ_BW_AVG_MBPS:-?} MB/s"
    done
fi
engine_stop
echo "ferrite-verbs: bench exit status $bench_rc"
[ "$rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
