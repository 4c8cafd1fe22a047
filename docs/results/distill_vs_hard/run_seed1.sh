#!/bin/bash
# A second seed of the pair (--seed 1: another initialisation, data order and anchors), the two runs
# side by side, started once run_pair.sh (seed 0) has finished. Same recipe as run_pair.sh.
cd /work/distill_runs/code  # a snapshot of the distill branch (git archive HEAD)
R=/work/distill_runs
while pgrep -f "run_pair.sh" > /dev/null; do sleep 10; done
for w in 0 1; do
  PYTHONPATH=. OMP_NUM_THREADS=1 nice -n 19 /work/main/.venv/bin/python train.py \
      --target weights/tiny-qwen3 --data $R/drafter_data.jsonl --out $R/drafter_seed1_w$w \
      --drafter-layers 2 --block-size 16 --num-anchors 32 --batch-size 16 --lr 3e-3 --steps 600 \
      --seed 1 --keep-activations --device cpu --threads 1 --save-every 100 --log-every 25 \
      --auto-resume --distill-weight $w > $R/seed1_w$w.log 2>&1 &
done
wait
echo "seed 1 done: $(date -u)"
