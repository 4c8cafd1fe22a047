#!/bin/bash
# Two drafters at an equal budget (600 steps of 16 sequences, the same seed, data and anchors):
# hard labels (--distill-weight 0) and distillation (--distill-weight 1). The shipped drafter's
# recipe (weights/README.md) with --steps 600 instead of 1250 and no --minutes / --eval-prompts.
# Run it again to resume (--auto-resume); checkpoints every 100 steps.
set -e
cd /work/distill_runs/code  # a snapshot of the distill branch (git archive HEAD)
R=/work/distill_runs
for w in 0 1; do
  echo "== distill-weight $w: $(date -u)"
  PYTHONPATH=. OMP_NUM_THREADS=1 nice -n 19 /work/main/.venv/bin/python train.py \
      --target weights/tiny-qwen3 --data $R/drafter_data.jsonl --out $R/drafter_w$w \
      --drafter-layers 2 --block-size 16 --num-anchors 32 --batch-size 16 --lr 3e-3 --steps 600 \
      --seed 0 --keep-activations --device cpu --threads 1 --save-every 100 --log-every 25 \
      --auto-resume --distill-weight $w
  echo "== done $w: $(date -u)"
done
