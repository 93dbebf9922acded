#!/bin/bash
# Long stress of the SyncCore word strategies on the device machine: every
# split of the word site, warm and cold executors, each trial in a forked
# child. Split 0 does not straddle and toggles fast, so it runs first; the
# straddling splits (each toggle makes three membarrier calls) then run all
# at once, threads > CPUs, until their time is spent. Every output is
# gathered into one file because only a few files come back.
B=target/release/fastinst-stress
L=/tmp/long-synccore; mkdir -p $L
{ nproc; uname -a; grep -m1 'model name' /proc/cpuinfo; } > $L/0-machine.txt
run() { name=$1; shift; $B run "$@" > $L/$name.txt 2>&1; echo "$name rc $?" >> $L/rc.txt; }
# SPLIT0=0 skips split 0 (a later run adding to the straddling splits).
for s in word-synccore word-async-synccore; do
  [ "${SPLIT0:-1}" = 0 ] && break
  for f in warm cold; do
    run $s-0-$f --strategies $s --splits 0 --fetch $f --trials 10 --toggles 10000000 --seconds 8 --executors 2 &
  done
done
wait
for s in word-synccore word-async-synccore; do
  for p in 1 2 3 4; do
    for f in warm cold; do
      run $s-$p-$f --strategies $s --splits $p --fetch $f --trials 10 --toggles 10000000 --seconds ${TRIAL_S:-34} --executors 1 &
    done
  done
done
wait
for f in $L/*.txt; do echo "== $(basename $f)"; cat $f; done > $OUT/long-synccore.txt
grep -h '^RESULT' $L/*.txt > $OUT/results.txt
