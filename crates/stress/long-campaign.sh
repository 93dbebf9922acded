#!/bin/bash
# Long stress campaign for the device machine: callpatch flip and paper at
# every form and split, 10 trials x <= 1e7 toggles each (>= 1e8 per
# configuration when the machine keeps up), six configurations' processes
# in parallel; then threads > CPUs; then the SyncCore word strategies.
B=target/release/fastinst-stress
nproc > $OUT/nproc.txt; uname -a > $OUT/uname.txt; lscpu > $OUT/lscpu.txt 2>&1
run() { name=$1; shift; timeout 300 $B run "$@" > $OUT/$name.txt 2>&1; echo "$name rc $?" >> $OUT/rc.txt; }
for s in call-flip call-paper; do
  for f in call ind jmp jmpind; do
    run $s-$f --strategies $s --forms $f --trials 10 --toggles 10000000 --seconds 30 --executors 2 &
  done
done
wait
run oversub --strategies call-flip,call-paper --forms call --trials 1 --toggles 10000000 --seconds 5 --executors 20
run synccore --strategies word-synccore,word-async-synccore --trials 3 --toggles 10000000 --seconds 4 --executors 4
grep -h "^total" $OUT/*.txt > $OUT/totals.txt
