#!/usr/bin/env bash
# The real-MNIST rows that need a GPU (issue 29) in one run of at most 9 minutes on one H100-class GPU:
# MACER, SmoothAdv and SmoothAdv + Consistency at sigma 0.25, 0.5 and 1.0, each LeNet trained 90 epochs
# with the settings of Jeong and Shin's released logs and the published optimiser, and certified at
# n = 100,000 on the protocol's 500 images.
#
#   benchmarks/gpu_check.sh --prepare    here: fills the kit folder .gpu/ (skorch's wheel, the shared MNIST)
#   benchmarks/gpu_tables.sh             on the GPU machine, with .gpu/ carried beside the working tree
#   benchmarks/gpu_tables.sh --dry-run   two rows at toy size on the CPU (tests/test_gpu_check.py)
#
# ROWS names the processes: each a row, or a comma-separated group of rows run in that order in one
# process (experts, then their router); at most $PARALLEL at once: one LeNet keeps a GPU only partly busy
# (on an H200, fourteen at once trained SmoothAdv in about 460 s and left no time to certify). All a
# row writes (model, certificates, checkpoint, log) lands in one archive, $OUT/tables.tar.gz, also where
# the time limit stopped it, because the machine gives back few files. Unpacked into $KIT/tables (tar -xzf
# tables.tar.gz -C .gpu), a second run resumes there: trained models are read back, and certification
# goes on from its checkpoint. Here, unpack it into benchmarks/results/mnist to make the results page.
set -u
cd "$(dirname "$0")/.."

MODE=${1:-run}
KIT=${GPU_KIT:-.gpu}
OUT=${OUT:-$(mktemp -d)}
LIMIT=${LIMIT:-480}
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
if [ "$MODE" = --dry-run ]; then
    ROWS=${ROWS:-macer-1 smoothadv+consistency-0.25}
    ARGS="--device cpu --data ${MNIST_DATA:-../shared/data/mnist} --n 200 --images 2 --epochs 1
          --certify-batch-size 100"
    PARALLEL=2
else
    ROWS=${ROWS:-smoothadv+consistency-1 smoothadv+consistency-0.5 smoothadv+consistency-0.25 smoothadv-1
          smoothadv-0.5 smoothadv-0.25 macer-1 macer-0.5 macer-0.25}
    ARGS="--device cuda --data $KIT/mnist --certify-batch-size 10000"
    PARALLEL=${PARALLEL:-9}
    python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site "$KIT"/wheels/*.whl . \
        >"$OUT/setup.log" 2>&1 || { cat "$OUT/setup.log"; exit 1; }
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT  # the scratch folder; what is kept goes to $OUT
mkdir -p "$WORK/tables" "$OUT"
if [ -d "$KIT/tables" ]; then
    cp -r "$KIT/tables/." "$WORK/tables/"
fi

# row NAME: trains and certifies one row, its output in tables/NAME.log.
row() {
    timeout "$LIMIT" python3 benchmarks/bench_mnist.py $ARGS --optimizer published --loop-images 0 \
        --out "$WORK/tables" --rows "$1" >"$WORK/tables/$1.log" 2>&1
}
export ARGS LIMIT WORK
export -f row
start=$(date +%s)
printf '%s\n' $ROWS | xargs -P "$PARALLEL" -I{} bash -c 'row "$1"' row {}

SUMMARY=$OUT/summary.md
echo "# gpu_tables $(date -u +%Y-%m-%dT%H:%MZ), mode $MODE, $(($(date +%s) - start)) s" >"$SUMMARY"
missing=0
for name in $ROWS; do
    # A process's table rows: one per row it was given (a comma-separated group prints one each).
    lines=$(grep -h '^| [a-z]' "$WORK/tables/$name.log" | grep -v '^| row |')
    [ -n "$lines" ] && echo "$lines" >>"$SUMMARY"
    if [ "$(grep -c . <<<"$lines")" != "$(tr ',' '\n' <<<"$name" | grep -c .)" ]; then
        echo "| $name | not finished: see tables/$name.log |" >>"$SUMMARY"
        missing=$((missing + 1))
    fi
done
tar -czf "$OUT/tables.tar.gz" -C "$WORK" tables
cat "$SUMMARY"
[ "$missing" = 0 ]
