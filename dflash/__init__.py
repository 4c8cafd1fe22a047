"""dflash: DFlash speculative decoding for Qwen3, written from scratch in plain PyTorch.

A small drafter fills a whole block of mask tokens in one forward pass, conditioned on the target's hidden
states; the target checks the block in one pass and keeps the longest prefix it agrees with, so the output
is exactly the target's own, only faster. The decoding loops live in the top-level `generate.py`; nothing
here imports a top-level script, and this file imports nothing, so that `import dflash` stays instant.
"""
