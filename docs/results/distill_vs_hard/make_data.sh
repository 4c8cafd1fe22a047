#!/bin/bash
# The recipe's drafter data (weights/README.md), scaled down: 4,000 greedy + 1,000 sampled answers.
set -e
cd /work/wt-distill
R=/work/distill_runs
PY=/work/main/.venv/bin/python
export OMP_NUM_THREADS=1
PYTHONPATH=. nice -n 19 $PY make_data.py --target weights/tiny-qwen3 --prompts $R/questions_greedy.jsonl \
    --out $R/data_greedy.jsonl --max-new-tokens 96 --batch-size 100 --device cpu --threads 1
PYTHONPATH=. nice -n 19 $PY make_data.py --target weights/tiny-qwen3 --prompts $R/questions_sampled.jsonl \
    --out $R/data_t07.jsonl --max-new-tokens 96 --batch-size 100 --temperature 0.7 --seed 1 \
    --device cpu --threads 1
cat $R/data_greedy.jsonl $R/data_t07.jsonl > $R/drafter_data.jsonl
echo done
