set -u
export PATH=/usr/local/cuda/bin:$PATH
[ -f build-gpu/build.ninja ] || meson setup build-gpu -Dwerror=false --buildtype=release >/dev/null || exit 1
ninja -C build-gpu tools/rmmc-replay >/dev/null || exit 1
L=$(mktemp -d); G=tools/gen_trace.py; F=bench/results/h100-2026-11-26c/fsdp-logged
python3 $G transformer --events 200000 --threads 4 --streams 4 -o $L/t4.csv
python3 $G transformer --events 200000 -o $L/t1.csv
python3 $G random --events 200000 -o $L/random.csv
for log in $L/t4.csv $L/t1.csv $L/random.csv bench/traces/torch_server.csv.gz $F/fsdp-w4-0.csv.gz $F/fsdp-w2-0.csv.gz; do
  n=$(basename $log | sed 's/\..*//')
  for cfg in "rb3|pool(release_band=3) > cuda" "every|pool > cuda" "cycle|pool > cuda" "rb3.5|pool(release_band=3.5) > cuda"; do
    name=${cfg%%|*}; spec=${cfg#*|}
    if [ $name = cycle ]; then export RMMC_BAND_RULE=1; else unset RMMC_BAND_RULE; fi
    timeout 90 build-gpu/tools/rmmc-replay --warm --stack "$spec" --json $L/o.json $log >/dev/null 2>&1
    python3 -c "import json;d=json.load(open('$L/o.json'))[0];print('$n $name %.3f calls %d peak %d MiB'%(d['ratio'],d['upstream_calls'],d['peak_reserved_bytes']>>20))"
  done
done
