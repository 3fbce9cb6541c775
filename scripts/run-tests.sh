#!/usr/bin/env bash
# Every test of the workspace, as `cargo test --workspace --no-fail-fast` runs them, with
# the tests run side by side instead of one binary after another.
#
# Most tests wait on timers (leases, session timeouts, failovers), so one binary at a time
# leaves the machine idle. This script builds every test binary once
# (`cargo test --workspace --no-run`); each crate's integration tests are one binary
# (`tests/it`), so it splits that binary into jobs by top-level module (`conformance`,
# `chaos`, `faults`...: each job runs the binary with the exact names of that module's
# tests), and runs the jobs TEST_JOBS at a time (default 4), longest first (durations of
# the last run in target/test-durations, else a fixed guess), each in its package's
# directory with the environment cargo would give it. A job's output is kept whole in
# target/test-logs/ and printed as one block when it ends; every job runs even when others
# failed (--no-fail-fast), and the exit status is non-zero if any job or the doc tests
# failed. Arguments are passed to every test binary (e.g. `-- --test-threads 1`);
# TEST_JOBS=1 runs the jobs one at a time.
#
# `make chaos` runs its long schedules through the same runner: TEST_BUILD replaces
# `--workspace` in the build command (e.g. `--release -p lab --test it`), TEST_ONLY keeps
# the jobs whose label matches that extended regex (and skips the doc tests), TEST_SPLIT
# splits an `it` binary by that many module levels (default 1: `chaos`; 2: `chaos/single`,
# `chaos/semaphore`...), and TEST_RUN names the run's logs and durations (default `test`:
# target/test-logs, target/test-durations).
set -uo pipefail
cd "$(dirname "$0")/.."

CARGO=${CARGO:-cargo}
JOBS=${TEST_JOBS:-4}
RUN=${TEST_RUN:-test}
ONLY=${TEST_ONLY:-}
SPLIT=${TEST_SPLIT:-1}
read -r -a BUILD <<<"${TEST_BUILD:---workspace}"
TARGET_DIR=${CARGO_TARGET_DIR:-target}
LOGS="$TARGET_DIR/$RUN-logs"
DURATIONS="$TARGET_DIR/$RUN-durations"
rm -rf "$LOGS" && mkdir -p "$LOGS"

# One seed for the option sets every conformance rule and chaos scenario draws
# (conformance::explore): new each run so that runs cover the space, printed to replay.
export LOCK_TEST_SEED=${LOCK_TEST_SEED:-$(( $(date +%s) % 1000000007 ))}
echo "run-tests: option sets drawn with LOCK_TEST_SEED=$LOCK_TEST_SEED (set it to replay them)"

started=$(date +%s)
# The build fails loudly: nothing runs on a half-built workspace.
if ! "$CARGO" test "${BUILD[@]}" --no-run --message-format json-render-diagnostics \
    >"$LOGS/build.json"; then
    echo "run-tests: building the test binaries failed" >&2
    exit 101
fi
built=$(($(date +%s) - started))

# One line per test binary: label, executable, package directory, package name.
artifact='"package_id":"[^"]*[/#]([A-Za-z0-9_-]+)(@[^"]*|#[^"]*)?","manifest_path":"([^"]*)/Cargo.toml","target":\{"kind":\["([a-z-]+)"\][^}]*"name":"([^"]*)"'
while IFS= read -r line; do
    [[ $line == *'"reason":"compiler-artifact"'* && $line =~ \"profile\":\{[^}]*\"test\":true\} ]] || continue
    [[ $line =~ \"executable\":\"([^\"]+)\" ]] || continue
    exe=${BASH_REMATCH[1]}
    [[ $line =~ $artifact ]] || continue
    dir=${BASH_REMATCH[3]}
    printf '%s/%s/%s\t%s\t%s\t%s\n' "${dir##*/}" "${BASH_REMATCH[4]}" "${BASH_REMATCH[5]}" \
        "$exe" "$dir" "${BASH_REMATCH[1]}"
done <"$LOGS/build.json" | sort -u >"$LOGS/binaries.tsv"
if [[ ! -s $LOGS/binaries.tsv ]]; then
    echo "run-tests: no test binary found in cargo's build output ($LOGS/build.json)" >&2
    exit 101
fi

# The jobs: an `it` binary's tests by module (SPLIT levels), any other binary whole. One
# line per job: label, binary label, then the exact test names (none: the whole binary).
list_tests() {
    local exe=$1 dir=$2 pkg=$3
    (cd "$dir" && CARGO_MANIFEST_DIR="$dir" CARGO_PKG_NAME="$pkg" "$exe" --list --format terse) |
        sed -n 's/: test$//p'
}
while IFS=$'\t' read -r label exe dir pkg; do
    if [[ $label != */it ]]; then
        printf '%s\t%s\n' "$label" "$label"
        continue
    fi
    if ! names=$(list_tests "$exe" "$dir" "$pkg"); then
        echo "run-tests: $label does not list its tests" >&2
        exit 101
    fi
    awk -v b="$label" -v depth="$SPLIT" '{ n = split($0, part, "::"); m = part[1]
            for (i = 2; i <= depth && i <= n; i++) m = m "/" part[i]
            t[m] = t[m] "\t" $0 }
        END { for (m in t) print b "/" m "\t" b t[m] }' <<<"$names"
done <"$LOGS/binaries.tsv" | sort | awk -F'\t' -v only="$ONLY" 'only == "" || $1 ~ only' >"$LOGS/jobs.tsv"
if [[ ! -s $LOGS/jobs.tsv ]]; then
    echo "run-tests: no job matches TEST_ONLY=$ONLY" >&2
    exit 101
fi

# Expected duration of a job: last run's, else a guess from the name (servers and
# fault schedules first, unit tests last).
expected() {
    local label=$1 seconds
    seconds=$(awk -F'\t' -v l="$label" '$1 == l { print $2 }' "$DURATIONS" 2>/dev/null | tail -1)
    if [[ -n $seconds ]]; then
        echo "$seconds"
        return
    fi
    case $label in
        */dual_chaos | */chaos/*) echo 600 ;;
        */chaos | */dual | */conformance) echo 90 ;;
        */operations | */faults | */session | */sentinel | */migration) echo 30 ;;
        */it/*) echo 10 ;;
        *) echo 1 ;;
    esac
}

queue=()
while IFS=$'\t' read -r label _; do
    queue+=("$(expected "$label")"$'\t'"$label")
done <"$LOGS/jobs.tsv"
if [[ -z $ONLY ]]; then
    queue+=("$(expected doc-tests)"$'\t'"doc-tests")
fi
mapfile -t queue < <(printf '%s\n' "${queue[@]}" | sort -t$'\t' -k1,1nr | cut -f2)

declare -A pid_label=() began=()
failed=()
new_durations=()

run_one() {
    local label=$1
    shift
    if [[ $label == doc-tests ]]; then
        "$CARGO" test --workspace --doc --no-fail-fast -- "$@"
        return
    fi
    local binary exe dir pkg names=()
    IFS=$'\t' read -r _ binary < <(awk -F'\t' -v l="$label" '$1 == l { print $1 "\t" $2 }' "$LOGS/jobs.tsv")
    IFS=$'\t' read -r -a names < <(awk -F'\t' -v l="$label" '$1 == l { $1 = $2 = ""; sub(/^\t\t/, ""); print }' OFS='\t' "$LOGS/jobs.tsv")
    IFS=$'\t' read -r _ exe dir pkg < <(awk -F'\t' -v l="$binary" '$1 == l' "$LOGS/binaries.tsv")
    if ((${#names[@]} > 0)); then
        set -- --exact "${names[@]}" "$@"
    fi
    cd "$dir" && CARGO_MANIFEST_DIR="$dir" CARGO_PKG_NAME="$pkg" exec "$exe" "$@"
}

finish() {
    local pid=$1 status=$2 label=${pid_label[$1]} took
    took=$(($(date +%s) - ${began[$1]}))
    unset "pid_label[$pid]"
    new_durations+=("$label"$'\t'"$took")
    echo
    echo "     Running $label (${took}s, exit $status)"
    cat "$LOGS/${label//\//.}.log"
    if ((status != 0)); then
        failed+=("$label")
    fi
}

args=("$@")
[[ ${args[0]:-} == -- ]] && args=("${args[@]:1}")
for label in "${queue[@]}"; do
    while ((${#pid_label[@]} >= JOBS)); do
        wait -n -p done_pid
        status=$?
        finish "$done_pid" "$status"
    done
    run_one "$label" "${args[@]}" >"$LOGS/${label//\//.}.log" 2>&1 &
    pid_label[$!]=$label
    began[$!]=$(date +%s)
done
while ((${#pid_label[@]} > 0)); do
    wait -n -p done_pid
    status=$?
    finish "$done_pid" "$status"
done

printf '%s\n' "${new_durations[@]}" | sort -t$'\t' -k2,2nr >"$DURATIONS"
echo
echo "run-tests: built in ${built}s, then $(wc -l <"$DURATIONS") jobs, $JOBS at a time," \
    "in $(($(date +%s) - started - built))s ($(awk -F'\t' '{ s += $2 } END { print s }' "$DURATIONS")s" \
    "one after another); slowest:"
head -5 "$DURATIONS" | sed 's/^/  /'
if ((${#failed[@]} > 0)); then
    echo "run-tests: failed: ${failed[*]} (logs in $LOGS)"
    exit 101
fi
