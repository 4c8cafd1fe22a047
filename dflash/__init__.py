"""dflash: DFlash speculative decoding for Qwen3, written from scratch in plain PyTorch.

A small *drafter* guesses a whole block of upcoming tokens at once (by block
diffusion: it fills a block of mask tokens in one forward pass, conditioned on
the target model's hidden states), and the large *target* model checks the
whole block in a single forward pass, keeping the longest prefix it agrees with.
The output is exactly what the target alone would have produced; only faster.

Modules, from the ground up: `checkpoint` (official checkpoint layouts in and
out), `qwen3` (the target model and its KV cache), `drafter` (the DFlash
drafter), `tree` (draft trees), `tokenizer` (text, token healing and the chat
template), `cli` (what every program shares) and `training` (generic training
pieces: data-parallel placement, state, schedule). The decoding loops live in the
top-level `generate.py`, which stands on this package; nothing here imports a
top-level script. Import the modules directly, e.g. `from dflash.qwen3 import
...`; this file imports nothing so that `import dflash` stays instant.
"""
