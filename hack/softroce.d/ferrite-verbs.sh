#!/bin/sh
# Guest payload: Ferrite's one-sided GET over RDMA verbs between the two rxe devices.
# 1. perftest.sh: ib_read_lat / ib_read_bw in this guest (the ceiling, and the figure the
#    GET latency is compared to);
# 2. the verbs_softroce test binary (built on the host with --features rdma) with --ignored:
#    engine on rxe1 (SOFTROCE_ADDR1, verbs side channel on port 7601), clients on rxe0:
#    concurrent writers + verbs one-sided readers checked for latest values, GET latency,
#    and a clear error after the engine is killed;
# 3. prints "ferrite-verbs: ..." with the GET latency as a ratio to ib_read_lat (target
#    <= 2.5: two reads per cold GET, one per cached bucket).
# Needs in /opt/ferrite/bin: ferrite-engine and verbs_softroce-* (see ci/softroce).
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
export FERRITE_VERBS_PROVIDER="verbs=$SOFTROCE_DEV1@$SOFTROCE_ADDR1:7601"
export FERRITE_VERBS_CLIENT_DEVICE="$SOFTROCE_DEV0"
timeout 400 "$test_bin" --ignored --test-threads=1 --nocapture >/tmp/ferrite-verbs.out 2>&1
rc=$?
cat /tmp/ferrite-verbs.out
p50=$(sed -n 's/.*FERRITE_VERBS_GET_P50_US=//p' /tmp/ferrite-verbs.out | head -n 1)
avg=$(sed -n 's/.*FERRITE_VERBS_GET_AVG_US=//p' /tmp/ferrite-verbs.out | head -n 1)
if [ -n "$p50" ] && [ -n "$lat" ]; then
    ratio=$(awk -v a="$p50" -v b="$lat" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }')
    echo "ferrite-verbs: one-sided GET p50 ${p50} us (avg ${avg} us), ib_read_lat typical ${lat} us, ratio ${ratio} (target <= 2.5)"
else
    echo "ferrite-verbs: GET p50 '${p50}' us, ib_read_lat '${lat}' us: no ratio"
fi
echo "ferrite-verbs: tests exit status $rc"
exit "$rc"
