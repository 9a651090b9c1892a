#!/bin/sh
# Guest payload: Ferrite's one-sided GET over RDMA verbs between the two rxe devices.
# 1. perftest.sh: ib_read_lat / ib_read_bw / ib_read_lat -R in this guest (the tools work,
#    and the bandwidth ceiling);
# 2. the verbs_softroce test binary (built on the host with --features rdma) with --ignored:
#    engine on rxe1 (SOFTROCE_ADDR1, verbs side channel on port 7601), clients on rxe0:
#    concurrent writers + verbs one-sided readers checked for latest values, RDMA READs and
#    doorbells per GET (1 cached, 2 cold, 2 doorbells per batch), many get_async GETs from
#    one thread on its queue pair (one-sided, no RPC; their reads share doorbells) and
#    event-queue GETs, a disconnect error naming the engine and the cause after the engine
#    is killed (its side channel closes) and when the path to a live engine is lost (a
#    bogus neighbour entry: the queue pair's retries run out);
# 3. `ferrite bench kv --fabric verbs` against a ferrite-engine on rxe1 (RPC over loopback
#    TCP): batches of 8 (one doorbell for the buckets, one for the records) and 8 get_async
#    futures at a time (--async-gets) for ops/s; then
#    FERRITE_LAT_ROUNDS (default 3) rounds, each of ib_read_lat (PERFTEST_LAT_ITERS, default
#    50000 reads, 2-2.5 s here: about as long as a GET run, so that both medians come from
#    windows of the same length of a noisy host; of 2 bytes, and of the bench's bucket and
#    record sizes), one GET at a time
#    with cached buckets (--warm over 256 keys) and one GET at a time with no bucket cache
#    (cold buckets: bucket READ, then record READ);
# 4. prints "ferrite-verbs: ..." lines: each round's figures, then the medians over the
#    rounds of GET p50/p99 (cached and cold) beside ib_read_lat's typical/p99, and the
#    ratios (target <= 2.5: two reads per cold GET, one per cached bucket). The target
#    figure is the median of the rounds' own ratios: each round's GETs run seconds after its
#    ib_read_lat runs, while rounds minutes apart see a host whose load changes (a round
#    where both are slow and one where both are fast each give a fair ratio, but their
#    medians mixed need not). The ratio of the medians is printed beside it. perftest's
#    "typical" is the median of its post-to-post times (both sides busy-poll), the same
#    statistic as the GET p50, and both are timed with the CPU's time-stamp counter (one
#    rdtsc; a clock_gettime costs about a microsecond on this emulated CPU). The target
#    ratios compare reads of the same sizes: a cold GET to the mean typical of ib_read_lat
#    reads of its two sizes (bucket, record), a cached one to reads of a record's size.
#    Beside them, the ratios to perftest's default
#    2-byte reads: under TCG a read of 80 bytes or more also pays the guest kernel's FPU
#    save and restore for rxe's PCLMUL ICRC (about 7 us here), which 2-byte reads and
#    hardware do not. Rounds alternate the tools so that a busy host slows both alike;
#    medians drop an odd round.
# Exits non-zero when a test or a bench run fails (perftest failing only drops the ratios).
# Needs in /opt/ferrite/bin: ferrite-engine, ferrite and verbs_softroce-* (see
# ci/softroce --verbs). Knobs: FERRITE_BENCH_SECONDS (default 5, the batched run),
# FERRITE_LAT_SECONDS (default 3, each latency run), FERRITE_BENCH_KEYS (default 10K),
# FERRITE_ENGINE_START_TIMEOUT_S (default 300: an emulated CPU on a loaded host can take
# minutes to start an engine).
set -u
# shellcheck disable=SC1091 # written by net-setup.sh at boot
. /run/softroce.env

perftest.sh || echo "ferrite-verbs: perftest failed; going on without the ratios"
if [ -r /run/softroce-perftest.env ]; then
    # shellcheck disable=SC1091
    . /run/softroce-perftest.env
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
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a > 0 && b > 0) printf "%.2f", a / b; else print "n/a" }'; }
g8=$(sed -n 's/.*FERRITE_VERBS_8_GETS_P50_US=//p' /tmp/ferrite-verbs.out | head -n 1)
b8=$(sed -n 's/.*FERRITE_VERBS_BATCH_8_P50_US=//p' /tmp/ferrite-verbs.out | head -n 1)
if [ -n "$g8" ] && [ -n "$b8" ]; then
    echo "ferrite-verbs: 8 GETs (warm buckets) one by one p50 ${g8} us, as one batch (one doorbell) p50 ${b8} us, ratio $(ratio "$b8" "$g8")"
fi
parts=$(sed -n 's/.*FERRITE_VERBS_PARTS_P50_US=//p' /tmp/ferrite-verbs.out | head -n 1)
[ -z "$parts" ] || echo "ferrite-verbs: p50 us, back to back in the test: $parts (ib_read_lat typical ${SOFTROCE_READ_LAT_TYPICAL_US:-?} us)"
a40=$(sed -n 's/.*FERRITE_VERBS_ASYNC_40_GETS_ROUND_0=//p' /tmp/ferrite-verbs.out | head -n 1)
[ -z "$a40" ] || echo "ferrite-verbs: 40 get_async GETs issued together on one thread, cold buckets: $a40 (reads staged before a poll share a doorbell)"
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
# json_field FILE NAME: a number from the bench's one-line JSON report.
json_field() { sed -n "s/.*\"$2\":\([0-9.e+-]*\).*/\1/p" "$1" | head -n 1; }

# bench NAME ARGS...: one `ferrite bench kv --op get --fabric verbs` run against the bench
# engine, JSON report in /tmp/ferrite-bench-NAME.json; sets ops, p50, p99, hit (one-sided
# hit rate) and cached (bucket cache hits per GET); fails (and says why) when the run
# fails or counts an error.
bench() {
    name=$1
    shift
    out=/tmp/ferrite-bench-$name.json
    timeout 300 ferrite bench kv --engine tcp://127.0.0.1:7600 \
        --token-file "$BENCH_DIR/engine.token" \
        --fabric "verbs=$SOFTROCE_DEV0@$BENCH_SIDE" --op get --value-size 64 --json "$@" \
        >"$out" 2>/tmp/ferrite-bench.err
    brc=$?
    cat "$out" /tmp/ferrite-bench.err
    ops=$(json_field "$out" ops_per_sec)
    p50=$(json_field "$out" p50)
    p99=$(json_field "$out" p99)
    hit=$(json_field "$out" one_sided_hit_rate)
    cached=$(json_field "$out" bucket_cache_hits_per_get)
    errors=$(json_field "$out" errors)
    if [ "$brc" -ne 0 ] || [ -z "$ops" ] || [ "${errors:-1}" != 0 ]; then
        echo "ferrite-verbs: bench kv $name FAIL (exit $brc, errors '${errors}')"
        return 1
    fi
}

# median FIGURE...: the median of the positive figures given ("" when none).
median() {
    printf '%s\n' "$@" | awk '$1 > 0' | sort -n | awk '{ v[NR] = $1 }
        END { if (NR == 0) exit; m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "%.2f", m }'
}

if [ "$bench_rc" -eq 0 ]; then
    # Loads the keys; batches of 8 GETs, random keys: throughput with doorbell batching.
    if bench p8 --keys "${FERRITE_BENCH_KEYS:-10K}" --pipeline 8 -t "${FERRITE_BENCH_SECONDS:-5}"; then
        echo "ferrite-verbs: bench kv get --fabric verbs --pipeline 8: ${ops} ops/s, p50 ${p50} us (a batch), p99 ${p99} us, one-sided hit rate ${hit}; ib_read_bw ${SOFTROCE_READ_BW_AVG_MBPS:-?} MB/s"
    else
        bench_rc=1
    fi
fi
if [ "$bench_rc" -eq 0 ]; then
    # The same keys as 8 get_async futures at a time from one thread: each GET's reads
    # posted on its own (no batch), all in flight together on the thread's queue pair.
    if bench a8 --keys "${FERRITE_BENCH_KEYS:-10K}" --no-load --pipeline 8 --async-gets -t "${FERRITE_BENCH_SECONDS:-5}"; then
        echo "ferrite-verbs: bench kv get --fabric verbs --async-gets --pipeline 8: ${ops} ops/s, p50 ${p50} us (8 futures), p99 ${p99} us, one-sided hit rate ${hit}"
    else
        bench_rc=1
    fi
fi
rounds=${FERRITE_LAT_ROUNDS:-3}
lat_s=${FERRITE_LAT_SECONDS:-3}
# Bytes of the bench's reads: a bucket, and a record of a 64-byte value under a 16-byte
# dkey (72-byte header + 16 + 64, 8-aligned). Under TCG the soft-RoCE CRC and copies
# cost tens of ns a byte, so ib_read_lat of these sizes is the size-matched ceiling
# beside its default 2-byte reads.
BUCKET_BYTES=64 RECORD_BYTES=152
# read_lat PORT [BYTES]: "typical p99" of one ib_read_lat run ("" when it fails).
read_lat() {
    line=$(PERFTEST_LAT_ITERS=${PERFTEST_LAT_ITERS:-50000} perftest.sh lat "$@")
    echo "$line" >&2
    echo "$line" | sed -n 's/.* t_typical_us=\([0-9.]*\).* t_p99_us=\([0-9.]*\) PASS$/\1 \2/p'
}
first() { echo "${1% *}"; }
second() { echo "${1#* }"; }
ib_typ="" ib_p99="" ib_b="" ib_r="" warm_p50="" warm_p99="" cold_p50="" cold_p99=""
# Each round's ratios (its GETs to its own ib_read_lat runs, seconds apart).
warm_ratios="" cold_ratios=""
round=1
while [ "$bench_rc" -eq 0 ] && [ "$round" -le "$rounds" ]; do
    # ib_read_lat between the same two devices, alone (the bench engine idles).
    port=$((18600 + 200 * round))
    t=$(read_lat "$port") tb=$(read_lat $((port + 50)) "$BUCKET_BYTES")
    tr=$(read_lat $((port + 100)) "$RECORD_BYTES")
    ib_typ="$ib_typ $(first "$t")" ib_p99="$ib_p99 $(second "$t")"
    ib_b="$ib_b $(first "$tb")" ib_r="$ib_r $(first "$tr")"
    # One GET at a time, 256 keys whose buckets the warm-up cached: one READ per GET.
    bench "warm$round" --keys 256 --no-load --warm --pipeline 1 -t "$lat_s" || { bench_rc=1; break; }
    w50=$p50 w99=$p99 wcached=$cached
    # The same keys with no bucket cache: bucket READ, then record READ, per GET.
    bench "cold$round" --keys 256 --no-load --bucket-cache 0 --pipeline 1 -t "$lat_s" || { bench_rc=1; break; }
    warm_p50="$warm_p50 $w50" warm_p99="$warm_p99 $w99" cold_p50="$cold_p50 $p50" cold_p99="$cold_p99 $p99"
    mean2=$(awk -v a="$(first "$tb")" -v b="$(first "$tr")" 'BEGIN { if (a > 0 && b > 0) printf "%.2f", (a + b) / 2 }')
    ratio_w=$(ratio "$w50" "$(first "$tr")") ratio_c=$(ratio "$p50" "${mean2:-0}")
    [ "$ratio_w" = n/a ] || warm_ratios="$warm_ratios $ratio_w"
    [ "$ratio_c" = n/a ] || cold_ratios="$cold_ratios $ratio_c"
    echo "ferrite-verbs: round $round: ib_read_lat typical 2 B $(first "$t") us ($BUCKET_BYTES B: $(first "$tb") us, $RECORD_BYTES B: $(first "$tr") us), p99 $(second "$t") us; GET cached p50 $w50 us p99 $w99 us (bucket cache hits per GET $wcached; ratio to $RECORD_BYTES-byte reads $(ratio "$w50" "$(first "$tr")"), to 2-byte reads $(ratio "$w50" "$(first "$t")")); GET cold p50 $p50 us p99 $p99 us (bucket cache hits per GET $cached; ratio to reads of its sizes $(ratio "$p50" "${mean2:-0}"), to 2-byte reads $(ratio "$p50" "$(first "$t")"))"
    round=$((round + 1))
done
if [ "$bench_rc" -eq 0 ]; then
    # shellcheck disable=SC2086 # lists of figures
    mt=$(median $ib_typ) m99=$(median $ib_p99) mb=$(median $ib_b) mr=$(median $ib_r)
    # shellcheck disable=SC2086
    w50=$(median $warm_p50) w99=$(median $warm_p99) c50=$(median $cold_p50) c99=$(median $cold_p99)
    mean2=$(awk -v a="${mb:-0}" -v b="${mr:-0}" 'BEGIN { if (a > 0 && b > 0) printf "%.2f", (a + b) / 2 }')
    echo "ferrite-verbs: medians of $rounds rounds: ib_read_lat typical ${mt:-?} us, p99 ${m99:-?} us; typical of $BUCKET_BYTES-byte reads ${mb:-?} us, of $RECORD_BYTES-byte reads ${mr:-?} us"
    # shellcheck disable=SC2086 # lists of figures
    wr=$(median $warm_ratios) cr=$(median $cold_ratios)
    echo "ferrite-verbs: cached-bucket GET (1 RDMA READ of $RECORD_BYTES B): p50 $w50 us, p99 $w99 us; median of the rounds' ratios p50 / typical of $RECORD_BYTES-byte reads ${wr:-n/a} (target <= 2.5; rounds:$warm_ratios), ratio of the medians $(ratio "$w50" "$mr"); to 2-byte reads: p50/typical $(ratio "$w50" "$mt"), p99/p99 $(ratio "$w99" "$m99")"
    echo "ferrite-verbs: cold-bucket GET (2 dependent RDMA READs: bucket $BUCKET_BYTES B, then record $RECORD_BYTES B): p50 $c50 us, p99 $c99 us; median of the rounds' ratios p50 / typical of reads of its sizes (mean of $BUCKET_BYTES B and $RECORD_BYTES B) ${cr:-n/a} (target <= 2.5; rounds:$cold_ratios), ratio of the medians (${mean2:-?} us) $(ratio "$c50" "${mean2:-0}"); to 2-byte reads: p50/typical $(ratio "$c50" "$mt"), p99/p99 $(ratio "$c99" "$m99")"
fi
engine_stop
echo "ferrite-verbs: bench exit status $bench_rc"
[ "$rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
