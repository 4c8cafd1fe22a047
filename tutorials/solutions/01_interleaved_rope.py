"""Notebook 1, exercise 4: interleaved (GPT-J) RoPE swapped into a split-half checkpoint.

Run from tutorials/: python solutions/01_interleaved_rope.py
"""

import sys
from pathlib import Path

ROOT = Path.cwd().parent  # run from tutorials/, as the notebooks are
sys.path.insert(0, str(ROOT))

import torch
from safetensors.torch import load_file

import dflash.qwen3
from dflash.qwen3 import Qwen3, RotaryEmbedding, apply_rope
from dflash.tokenizer import load_tokenizer
from generate import generate_autoregressive


def interleaved_rope(x, cos, sin):
    """Rotate pairs (x[2i], x[2i+1]) by the angles of pair i; x (..., seq, head_dim), cos/sin (seq, head_dim).

    cos/sin come laid out split-half (pair i's angle in columns i and i + d/2); the
    interleaved layout wants it in columns 2i and 2i + 1.
    """
    half = x.shape[-1] // 2
    cos, sin = cos[..., :half].repeat_interleave(2, dim=-1), sin[..., :half].repeat_interleave(2, dim=-1)
    even, odd = x[..., 0::2], x[..., 1::2]  # (..., seq, d/2) each: the two members of every pair
    partner = torch.stack([-odd, even], dim=-1).flatten(-2)  # (..., seq, d): (-x[2i+1], x[2i]) at (2i, 2i+1)
    return x * cos + partner * sin


def with_rope(rope, run):
    """Run `run()` with every attention layer rotating by `rope`, then put split-half back."""
    split_half, dflash.qwen3.apply_rope = dflash.qwen3.apply_rope, rope
    try:
        return run()
    finally:
        dflash.qwen3.apply_rope = split_half


torch.manual_seed(0)
torch.set_grad_enabled(False)
x = torch.randn(1, 2, 5, 64)  # (batch, heads, seq, head_dim)
cos, sin = RotaryEmbedding(64, 1e6)(torch.arange(5), x.dtype)  # (seq, head_dim) each
assert torch.allclose(interleaved_rope(x, cos, sin).norm(dim=-1), x.norm(dim=-1), atol=1e-4)  # a rotation
assert not torch.allclose(interleaved_rope(x, cos, sin), apply_rope(x, cos, sin))  # not the split-half one
q, k = torch.randn(2, 64).unbind(0)
dots = []
for m in (4, 40, 400):  # the relative-position property holds for this pairing too
    cos_m, sin_m = RotaryEmbedding(64, 1e6)(torch.tensor([m, m - 3]), x.dtype)  # (2, head_dim) each
    rotated = interleaved_rope(torch.stack([q, k]), cos_m, sin_m)  # (2, head_dim): q at m, k at m - 3
    dots.append(torch.dot(rotated[0], rotated[1]))
assert max(dots) - min(dots) < 1e-3

# The fixture of notebook 1, section 8: official logits, computed with split-half RoPE.
fixture = ROOT / "tests/fixtures/qwen3-tiny"
reference = load_file(fixture / "reference.safetensors")
small = Qwen3.from_pretrained(fixture)
ours = small.logits(small(reference["input_ids"])[0])  # (2, 23, vocab)
swapped = with_rope(interleaved_rope, lambda: small.logits(small(reference["input_ids"])[0]))  # (2, 23, vocab)
agree = (swapped.argmax(-1) == reference["logits"].argmax(-1)).float().mean().item()
error, span = (swapped - reference["logits"]).abs().max().item(), reference["logits"].abs().max().item()
print(f"fixture: largest logit difference {error:.2f} against logits spanning ±{span:.2f} "
      f"(split-half: {(ours - reference['logits']).abs().max():.1e}); likeliest token agrees at {agree:.0%} of positions")
assert error > 0.1 * span and agree < 0.9  # a pairing the checkpoint was not trained with changes the output

# The trained demo target: its answer falls apart.
folder = ROOT / "weights/tiny-qwen3"
target, tokenizer = Qwen3.from_pretrained(folder), load_tokenizer(folder)
prompt_ids = tokenizer.encode_chat([{"role": "user", "content": "Mia has 14 apples. She buys 9 more. "
                                                                 "How many apples are there now?"}])
answer = generate_autoregressive(target, prompt_ids, 40, stop_ids=tokenizer.stop_token_ids).new_ids
garbled = with_rope(interleaved_rope,
                    lambda: generate_autoregressive(target, prompt_ids, 40, stop_ids=tokenizer.stop_token_ids).new_ids)
print("split-half: ", tokenizer.decode(answer))
print("interleaved:", tokenizer.decode(garbled))
assert "The answer is 23" in tokenizer.decode(answer) and "The answer is 23" not in tokenizer.decode(garbled)
print("exercise 4: solved")
