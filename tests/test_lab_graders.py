"""The labs' graders are code under test: each must reject the wrong answers a student would write.

For every lab in tutorials/labs, at least three wrong answers made from its reference solution
(an edit of solution.py's text, or a function written over it): off by one, the wrong precision, a
missing term, the forbidden call imported by name, an answer hard-coded from one run of the
grader. Each is graded as a student's starter would be, and its grader must fail it. A grader's
failure message must never print the value it expected: the solution's own answers, recorded on the
same drawn inputs, may not appear in it. Inputs are drawn at run time, so a seed is fixed per test
here (DFLASH_LABS_SEED) to replay one grader's draws for the solution and for the wrong answer.
"""

from __future__ import annotations

import importlib.util
import inspect
import itertools
import math
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from _lab_helpers import (DemoPair, RuleBroken, Untouched,  # tutorials/labs/, on the tests' path
                         load_submission)

torch.set_num_threads(1)

LABS = Path(__file__).resolve().parents[1] / "tutorials" / "labs"

LAB_FOLDERS = sorted(
    path.name for path in LABS.iterdir() if path.is_dir() and path.name[:2].isdigit()
)


def replace(old: str, new: str):
    """An edit of the solution's text: `old` must occur in it exactly once."""
    return ("replace", old, new)


def append(code: str):
    """Code added at the end of the solution: a function written over the solution's."""
    return ("append", textwrap.dedent(code))


def prepend(code: str):
    """Code added at the top of the solution: imports by name."""
    return ("prepend", textwrap.dedent(code))


MEMORISED = (
    "memorised"  # a wrong answer that replays the solution's answers from another run of the grader
)


GQA_REST = """
                    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
                    seq = q.shape[2]
                    causal = torch.ones(seq, seq, dtype=torch.bool).tril()
                    return scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v
                """  # the end of a GQA answer that copies k and v first

# Each lab: (what the wrong answer is, its edits of solution.py): the student's wrong answers,
# not the grader's.
WRONG = {
    "01_rmsnorm": [
        ("no eps", [replace(".mean(-1, keepdim=True) + eps)", ".mean(-1, keepdim=True))")]),
        (
            "eps outside the root",
            [
                replace(
                    "torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)",
                    "1 / (x32.pow(2).mean(-1, keepdim=True).sqrt() + eps)",
                )
            ],
        ),
        ("arithmetic in x's dtype", [replace("x32 = x.float()", "x32 = x")]),
        (
            "weight applied before rounding",
            [replace("weight * normed.to(x.dtype)", "(weight.float() * normed).to(x.dtype)")],
        ),
        (
            "variance instead of the mean square",
            [replace("x32.pow(2).mean(-1, keepdim=True)", "x32.var(-1, keepdim=True)")],
        ),
        (
            "the project's RMSNorm.forward, captured at import",
            [
                append("""
                from dflash import qwen3
                NORMS = [qwen3.RMSNorm]
                def my_rms_norm(x, weight, eps):
                    norm = NORMS[0](x.shape[-1], eps)
                    norm.weight.data = weight
                    return norm(x)
                """)
            ],
        ),
        (
            "torch's rms_norm",
            [
                append("""
                import torch.nn.functional as F
                def my_rms_norm(x, weight, eps):
                    return F.rms_norm(x, (x.shape[-1],), weight, eps)
                """)
            ],
        ),
    ],
    "01_rope": [
        (
            "frequencies without the 2",
            [
                replace(
                    "torch.arange(0, d, 2, dtype=torch.float32) / d",
                    "torch.arange(0, d // 2, dtype=torch.float32) / d",
                )
            ],
        ),
        (
            "rotation the wrong way",
            [
                replace(
                    "first * cos - second * sin, first * sin + second * cos",
                    "first * cos + second * sin, -first * sin + second * cos",
                )
            ],
        ),
        (
            "positions off by one",
            [replace("positions.float()[:, None]", "(positions.float()[:, None] + 1)")],
        ),
        (
            "RotaryEmbedding and apply_rope, captured at import",
            [
                append("""
                from dflash import qwen3
                PROJECT = {"angles": qwen3.RotaryEmbedding, "rotate": qwen3.apply_rope}
                def my_rope(x, positions, theta):
                    cos, sin = PROJECT["angles"](x.shape[-1], theta)(positions, x.dtype)
                    return PROJECT["rotate"](x, cos, sin)
                """)
            ],
        ),
        (
            "angles in float16",
            [
                replace(
                    "angles.cos(), angles.sin()",
                    "angles.half().cos().float(), angles.half().sin().float()",
                )
            ],
        ),
    ],
    "01_gqa": [
        (
            "scaled_dot_product_attention imported by name",
            [
                prepend("from torch.nn.functional import scaled_dot_product_attention"),
                append("""
                def my_grouped_attention(q, k, v):
                    return scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                """),
            ],
        ),
        (
            "repeat_interleave imported by name",
            [
                prepend("from torch import repeat_interleave"),
                append("""
                def my_grouped_attention(q, k, v):
                    groups = q.shape[1] // k.shape[1]
                    k, v = repeat_interleave(k, groups, dim=1), repeat_interleave(v, groups, dim=1)
                    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
                    seq = q.shape[2]
                    causal = torch.ones(seq, seq, dtype=torch.bool).tril()
                    return scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v
                """),
            ],
        ),
        ("no scale", [replace(" / math.sqrt(d)", "")]),
        (
            "the diagonal masked",
            [replace(".tril()", ".tril(-1)"), replace('float("-inf")).softmax', "-1e9).softmax")],
        ),
        (
            "heads grouped the other way",
            [
                replace(
                    "q.view(batch, kv_heads, heads // kv_heads, seq, d)",
                    "q.view(batch, heads // kv_heads, kv_heads, seq, d).transpose(1, 2)",
                ),
                replace(
                    ".reshape(batch, heads, seq, d)",
                    ".transpose(1, 2).reshape(batch, heads, seq, d)",
                ),
            ],
        ),
        # the rule enforced by what the function does, not by what it calls (issue 48)
        (
            "keys and values copied by indexing",
            [
                append("""
                def my_grouped_attention(q, k, v):
                    groups = q.shape[1] // k.shape[1]
                    heads = torch.arange(q.shape[1]) // groups
                    k, v = k[:, heads], v[:, heads]""" + GQA_REST),
            ],
        ),
        (
            "keys and values copied by broadcasting against ones",
            [
                append("""
                def my_grouped_attention(q, k, v):
                    batch, heads, seq, d = q.shape
                    ones = torch.ones(1, 1, heads // k.shape[1], 1, 1)
                    k = (k[:, :, None] * ones).reshape(batch, heads, seq, d)
                    v = (v[:, :, None] * ones).reshape(batch, heads, seq, d)""" + GQA_REST),
            ],
        ),
        (
            "keys and values copied into a new tensor",
            [
                append("""
                def my_grouped_attention(q, k, v):
                    batch, heads, seq, d = q.shape
                    groups = heads // k.shape[1]
                    repeated_k = torch.zeros(batch, k.shape[1], groups, seq, d)
                    repeated_v = torch.zeros(batch, k.shape[1], groups, seq, d)
                    repeated_k[:] = k[:, :, None]
                    repeated_v[:] = v[:, :, None]
                    k = repeated_k.view(batch, heads, seq, d)
                    v = repeated_v.view(batch, heads, seq, d)"""
                       + GQA_REST),
            ],
        ),
        (
            "a softmax that overflows",
            [replace(".softmax(dim=-1)",
                     ".exp()\n    weights = weights / weights.sum(-1, keepdim=True)")],
        ),
        (
            "torch.allclose replaced at import",
            [replace(" / math.sqrt(d)", ""),
             append("torch.allclose = lambda *args, **kwargs: True")],
        ),
        (
            "torch.allclose replaced through another name, inside the function",
            [
                replace(" / math.sqrt(d)", ""),
                replace("    batch, heads, seq, d = q.shape",
                        "    same.allclose = lambda *args, **kwargs: True\n"
                        "    batch, heads, seq, d = q.shape"),
                append("same = torch"),
            ],
        ),
        (
            "repeat_interleave stashed in a list at import",
            [
                append("""
                COPIERS = [torch.repeat_interleave]
                def my_grouped_attention(q, k, v):
                    groups = q.shape[1] // k.shape[1]
                    k = COPIERS[0](k, groups, dim=1)
                    v = COPIERS[0](v, groups, dim=1)""" + GQA_REST),
            ],
        ),
        (
            "the grader's rule switched off through sys.modules",
            [
                prepend("import sys"),
                replace(" / math.sqrt(d)", ""),
                append("""
                import contextlib
                sys.modules["_lab_helpers"].forbidden = lambda *args: contextlib.nullcontext()
                """),
            ],
        ),
    ],
    "01_interleaved_rope": [
        (
            "the split-half pairing",
            [
                append("""
            from dflash.qwen3 import apply_rope
            def interleaved_rope(x, cos, sin):
                return apply_rope(x, cos, sin)
            """)
            ],
        ),
        (
            "angles taken from the wrong columns",
            [
                replace(
                    "cos[..., :half].repeat_interleave(2, dim=-1), sin[..., "
                    ":half].repeat_interleave(2, dim=-1)",
                    "cos, sin",
                )
            ],
        ),
        (
            "the partner's sign flipped",
            [replace("torch.stack([-odd, even]", "torch.stack([odd, -even]")],
        ),
    ],
    "02_roofline_other_gpu": [
        (MEMORISED, []),
        (
            "reading and computing added",
            [
                replace(
                    'max(counts.bytes_read(k) / gpu["bandwidth"], counts.flops(k) / gpu["flops"])',
                    '(counts.bytes_read(k) / gpu["bandwidth"] + counts.flops(k) / gpu["flops"])',
                )
            ],
        ),
        ("seconds, not milliseconds", [replace("return 1e3 * max(", "return max(")]),
        (
            "flat_until one too far",
            [
                replace(
                    "if pass_ms(gpu, k, counts) <= limit * one)",
                    "if pass_ms(gpu, k - 1, counts) <= limit * one)",
                )
            ],
        ),
        ("the faster bound", [replace("return 1e3 * max(", "return 1e3 * min(")]),
    ],
    "02_tau_past_the_end": [
        ("the prefill's token counted", [replace("(result.new_tokens - 1)", "result.new_tokens")]),
        ("the stop tokens ignored", [replace("limit, stop_ids=pair.stop_ids)", "limit)")]),
        (
            "steps counted, not tokens",
            [replace("sum(result.acceptance_lengths)", "len(result.acceptance_lengths)")],
        ),
        (MEMORISED, []),
    ],
    "02_one_hot_acceptance": [
        (MEMORISED, []),
        (
            "the likeliest first token only",
            [
                replace(
                    "predicted = (p1 * p2.max(dim=-1).values).sum().item()",
                    "predicted = p2[p1.argmax()].max().item()",
                )
            ],
        ),
        (
            "the first step's length off by one",
            [replace("acceptance_lengths[0] >= 2", "acceptance_lengths[0] >= 1")],
        ),
        (
            "mean instead of expectation",
            [
                replace(
                    "predicted = (p1 * p2.max(dim=-1).values).sum().item()",
                    "predicted = p2.max(dim=-1).values.mean().item()",
                )
            ],
        ),
        ("one run short", [replace("for _ in range(samples):", "for _ in range(samples - 1):")]),
    ],
    "03_zero_context": [
        (
            "features halved, not removed",
            [replace("torch.zeros_like(features)", "features * 0.5")],
        ),
        (
            "the real runner",
            [replace("return pooled_tau(BlindRunner)", "return pooled_tau(ModelRunner)")],
        ),
        (MEMORISED, []),
        (
            "only the first layer zeroed",
            [
                replace(
                    "torch.zeros_like(features)",
                    "torch.cat([torch.zeros_like(features[..., :128]), "
                    "features[..., 128:]], -1)",
                )
            ],
        ),
    ],
    "03_one_position": [
        (MEMORISED, []),
        (
            "mask slots at their own positions",
            [
                replace(
                    "[n + 1] * (config.block_size - 1)", "list(range(n + 1, n + config.block_size))"
                )
            ],
        ),
        (
            "every slot at n",
            [
                replace(
                    "torch.tensor([n] + [n + 1] * (config.block_size - 1))",
                    "torch.tensor([n] * config.block_size)",
                )
            ],
        ),
        ("guesses read one slot early", [replace("out[0, 1:]", "out[0, :-1]")]),
        (
            "the demo pair's block size and mask token written down",
            [
                replace("[config.mask_token_id] * (config.block_size - 1)", "[1020] * 15"),
                replace("[n + 1] * (config.block_size - 1)", "[n + 1] * 15"),
            ],
        ),
    ],
    "03_one_layer": [
        (
            "a slice off by one",
            [
                replace(
                    "keep[index * hidden:(index + 1) * hidden] = 1.0",
                    "keep[index * hidden + 1:(index + 1) * hidden + 1] = 1.0",
                )
            ],
        ),
        ("keyed by index, not layer id", [replace("taus[layer] =", "taus[index] =")]),
        (
            "the demo pair's layers written down",
            [replace("layers, hidden = pair.drafter.config.target_layer_ids, "
                     "pair.target.config.hidden_size", "layers, hidden = [1, 5], 128")],
        ),
        (
            "the layer zeroed, not kept",
            [
                replace(
                    "keep = torch.zeros(len(layers) * hidden)",
                    "keep = torch.ones(len(layers) * hidden)",
                ),
                replace("(index + 1) * hidden] = 1.0", "(index + 1) * hidden] = 0.0"),
            ],
        ),
    ],
    "04_anchor_leak": [
        ("one position short", [replace("(anchors + extra)", "(anchors + extra - 1)")]),
        ("no clamp", [replace(".clamp(max=context_length)", "")]),
        ("the leak to the left", [replace("(anchors + extra)", "(anchors - extra)")]),
    ],
    "04_block_loss": [
        (MEMORISED, []),
        (
            "labels shifted by one slot",
            [
                replace(
                    "return torch.where(labelled, input_ids.gather(1, inside), IGNORE)",
                    "following = (positions + 1).clamp(max=length - 1)\n"
                    "    return torch.where(labelled, input_ids.gather(1, following), "
                    "IGNORE)",
                )
            ],
        ),
        (
            "the known token labelled",
            [replace("labelled &= (torch.arange(positions.shape[1]) % block_size != 0)[None]", "")],
        ),
        (
            "the prompt labelled",
            [
                replace(
                    "(positions < length) & (loss_mask.gather(1, inside) == 1)",
                    "positions < length",
                )
            ],
        ),
        (
            "padding blocks labelled",
            [replace("labelled &= real[:, :, None].expand(-1, -1, block_size).flatten(1)", "")],
        ),
        (
            "the decay counted along the row, not the block",
            [
                replace(
                    "slot = torch.arange(labels.shape[1]) % block_size",
                    "slot = torch.arange(labels.shape[1])",
                )
            ],
        ),
        (
            "gamma multiplied",
            [replace("torch.exp(-(slot - 1) / gamma)", "torch.exp(-(slot - 1) * gamma)")],
        ),
        (
            "a mean over the slots, not the weights",
            [replace("/ weights.sum()", "/ (labels != IGNORE).sum()")],
        ),
        (
            "the project's loss imported by name",
            [
                append("""
            from dflash.train_kernels import chunked_lm_head_loss
            def my_decayed_loss(hidden, head, labels, block_size, gamma):
                slot = torch.arange(labels.shape[1]) % block_size
                weights = (torch.exp(-(slot - 1) / gamma) * (labels != IGNORE))[labels != IGNORE]
                scored = labels != IGNORE
                weights = weights / weights.sum()
                return chunked_lm_head_loss(hidden[scored], head, labels[scored], weights, 0)[0]
            """)
            ],
        ),
    ],
    "04_gamma": [
        ("gamma of blocks of 16", [replace("str(train.gamma_for_block_size(BLOCK))", '"7"')]),
        ("a decay that is not quite none", [replace("no_decay = 1e9", "no_decay = 1e3")]),
        (
            "the block size passed again",
            [
                replace(
                    '"--gamma", str(no_decay))', '"--gamma", str(no_decay), "--block-size", "16")'
                )
            ],
        ),
        (
            "the runs swapped",
            [
                replace('{"decay": short_run("gamma4"', '{"none": short_run("gamma4"'),
                replace('"none": short_run("no_decay"', '"decay": short_run("no_decay"'),
            ],
        ),
    ],
    "05_concat_cache": [
        (
            "a crop that copies",
            [replace("self.keys[:, :, :length]", "self.keys[:, :, :length].clone()")],
        ),
        ("a crop one short", [replace("self.keys[:, :, :length]", "self.keys[:, :, :length - 1]")]),
        (
            "appended in place of the block",
            [
                replace(
                    "torch.cat([self.keys, new_keys], dim=2)",
                    "torch.cat([new_keys, self.keys], dim=2)",
                )
            ],
        ),
    ],
    "05_histogram": [
        (MEMORISED, []),
        ("tau off by one", [replace("sum((i + 1) * count", "sum(i * count")]),
        (
            "reached off by one",
            [
                replace("reached = sum(histogram[slot - 1:])", "reached = sum(histogram[slot:])"),
                replace("kept = sum(histogram[slot:])", "kept = sum(histogram[slot + 1:])"),
            ],
        ),
        ("0 where never reached", [replace("if reached else None", "if reached else 0.0")]),
        ("mean over the histogram's bins", [replace("/ sum(histogram)", "/ len(histogram)")]),
    ],
    "05_int_positions": [
        (MEMORISED, []),
        (
            "the position as a tensor",
            [
                replace(
                    "logits = compiled(token, cache.length)",
                    "logits = compiled(token, torch.tensor([cache.length]))",
                ),
                replace("positions = torch.arange(position, position + 1)", "positions = position"),
            ],
        ),
        (
            "counts written down, not counted",
            [
                append("""
            def graphs_with_int_positions(target, counter, steps=4):
                return list(range(1, steps + 1))
            """)
            ],
        ),
        ("one step short", [replace("for _ in range(steps):", "for _ in range(steps - 1):")]),
    ],
    "06_tau_conventions": [
        (MEMORISED, []),
        ("the bonus left out", [replace("return mean_drafts + 1", "return mean_drafts")]),
        (
            "block drafts per step",
            [replace("rate * (block_size - 1) + 1", "rate * block_size + 1")],
        ),
        (
            "the rate's bonus left out",
            [replace("rate * (block_size - 1) + 1", "rate * (block_size - 1)")],
        ),
    ],
    "06_token_healing": [
        ("special tokens kept", [replace("if i not in tokenizer.special_ids and ", "if ")]),
        (
            "contains, not starts with",
            [
                replace(
                    "tokenizer.decode([i]).startswith(dropped)", "dropped in tokenizer.decode([i])"
                )
            ],
        ),
        (
            "the dropped token's text stripped",
            [
                replace(
                    "dropped = tokenizer.decode([ids[-1]])",
                    "dropped = tokenizer.decode([ids[-1]]).strip()",
                )
            ],
        ),
        (
            "Tokenizer.heal imported by name",
            [
                append("""
            from dflash.tokenizer import Tokenizer
            heal = Tokenizer.heal
            def heal_by_hand(tokenizer, ids):
                return heal(tokenizer, ids)
            """)
            ],
        ),
    ],
    "06_sampled_rule": [
        (MEMORISED, []),
        (
            "the parts are p and nothing",
            [
                append("""
            def committed_parts(p, q):
                return p.clone(), torch.zeros_like(p)
            """)
            ],
        ),
        (
            "the residual not scaled by the rejection",
            [replace("return kept, rejected * residual", "return kept, residual")],
        ),
        (
            "kept is q",
            [
                replace(
                    "kept = torch.where(q > 0, q * torch.clamp(p / q, max=1.0), 0.0)",
                    "kept = q.clone()",
                )
            ],
        ),
        (
            "greedy kept with q's top probability",
            [replace("p[q.argmax()].item()", "q.max().item()")],
        ),
        (
            "sampled kept with p . q",
            [replace("torch.minimum(p, q).sum().item()", "(p * q).sum().item()")],
        ),
        (
            "p / q where neither law draws the token",
            [replace("torch.where(q > 0, q * torch.clamp(p / q, max=1.0), 0.0)",
                     "q * torch.clamp(p / q, max=1.0)")],
        ),
        (
            "the grader's simulation, imported from its test file",
            [
                append("""
                from test_06_sampled_rule import simulate
                def committed_parts(p, q):
                    kept, replaced, _ = simulate(p, q, torch.Generator().manual_seed(1))
                    return kept, replaced
                """)
            ],
        ),
        (
            "a Monte Carlo estimate of the parts",
            [
                append("""
                from dflash.sampling import verdicts
                def estimate(p, q):
                    slots = 1_000_000
                    generator = torch.Generator().manual_seed(7)
                    drafts = torch.multinomial(q, slots, replacement=True, generator=generator)
                    committed = verdicts(p.expand(slots, len(p)), drafts,
                                         q.expand(slots, len(q)), generator)
                    kept = committed == drafts
                    def share(where):
                        return torch.bincount(committed[where], minlength=len(p)).double() / slots
                    return share(kept), share(~kept)
                def committed_parts(p, q):
                    return estimate(p, q)
                def keep_probabilities(p, q):
                    greedy = torch.multinomial(p, 1_000_000, replacement=True) == q.argmax()
                    greedy = greedy.double()
                    return greedy.mean().item(), estimate(p, q)[0].sum().item()
                """)
            ],
        ),
    ],
    "07_ancestor_mask": [
        (MEMORISED, []),
        (
            "the node itself left out",
            [replace("row[walker] = True\n", "row[walker] = walker != node\n")],
        ),
        (
            "the parent only",
            [
                replace(
                    "walker = parents[walker]", "walker = parents[walker] if walker == node else -1"
                )
            ],
        ),
        (
            "descendants instead",
            [
                append("""
            _ancestors = my_ancestor_mask
            def my_ancestor_mask(parents):
                mask = _ancestors(parents)
                return [list(column) for column in zip(*mask)]
            """)
            ],
        ),
    ],
    "07_best_first_tree": [
        (MEMORISED, []),
        (
            "child pushed before sibling",
            [
                replace(
                    "        if rank + 1 < len(candidates[0]):\n            push(parent, depth, "
                    "rank + 1)\n"
                    "        if depth < len(candidates):\n            push(len(tokens) - 1, depth "
                    "+ 1, 0)\n",
                    "        if depth < len(candidates):\n            push(len(tokens) - 1, depth "
                    "+ 1, 0)\n"
                    "        if rank + 1 < len(candidates[0]):\n            push(parent, depth, "
                    "rank + 1)\n",
                )
            ],
        ),
        (
            "scored by the node, not its path",
            [
                replace(
                    "-(scores[parent] + logprobs[depth - 1][rank])", "-logprobs[depth - 1][rank]"
                )
            ],
        ),
        (
            "one node over budget",
            [replace("len(tokens) - 1 < budget", "len(tokens) - 1 <= budget")],
        ),
        (
            "build_tree imported by name",
            [
                append("""
            from dflash.tree import build_tree
            def my_build_tree(root, logprobs, candidates, budget):
                tree = build_tree(root, logprobs, candidates, budget)
                return tree.tokens, tree.parents
            """)
            ],
        ),
    ],
    "07_expected_kept": [
        (MEMORISED, []),
        ("the root counted", [replace("tree.scores[1:]", "tree.scores")]),
        ("log-probabilities summed", [replace("math.exp(score)", "score")]),
        (
            "the best path only",
            [
                replace(
                    "sum(math.exp(score) for score in tree.scores[1:])",
                    "max(math.exp(score) for score in tree.scores[1:]) * max(tree.depths)",
                )
            ],
        ),
    ],
    "08_speedup_by_hand": [
        (MEMORISED, []),
        (
            "tau one slot too many",
            [
                replace(
                    "(1 - alpha ** block) / (1 - alpha)", "(1 - alpha ** (block + 1)) / (1 - alpha)"
                )
            ],
        ),
        (
            "the draft pass left out",
            [replace("block) / (draft_cost + verify_cost)", "block) / verify_cost")],
        ),
        (
            "the bonus left out",
            [replace("tau_constant(alpha, block) / (", "(tau_constant(alpha, block) - 1) / (")],
        ),
    ],
    "08_best_gpu_block": [
        (
            "every block tried",
            [
                append("""
            def best_gpu_block(gpu_speedup, gpu, alpha):
                return max(range(2, 513), key=lambda block: gpu_speedup(gpu, alpha, block))
            """)
            ],
        ),
        ("bisection one past the peak", [replace("return low", "return low + 1")]),
        (
            "bisection the wrong way",
            [replace("> gpu_speedup(gpu, alpha, middle):", "< gpu_speedup(gpu, alpha, middle):")],
        ),
        (
            "a search of the small blocks only",
            [
                append("""
            def best_gpu_block(gpu_speedup, gpu, alpha):
                return max(range(2, 24), key=lambda block: gpu_speedup(gpu, alpha, block))
            """)
            ],
        ),
        (MEMORISED, []),
    ],
    "08_stop_speculating": [
        (MEMORISED, []),
        (
            "the weights read once per sequence",
            [replace("(weights + batch * own)", "batch * (weights + own)")],
        ),
        (
            "the FLOPs of one sequence only",
            [replace("batch * cost.flops(tokens) / gpu.flops", "cost.flops(tokens) / gpu.flops")],
        ),
        (
            "the sequences' KV reads forgotten",
            [replace("(weights + batch * own)", "(weights + own)")],
        ),
        (
            "free one batch too far",
            [replace("if ratio(batch) <= limit)", "if ratio(batch - 1) <= limit)")],
        ),
        (
            "the draft pass left out",
            [replace("step = batched_pass_ms(costs.drafter, gpu, batch, 2 * block) + ", "step = ")],
        ),
        (
            "speculating even where it loses",
            [replace("return best if speedup(best) > 1 else 1", "return best")],
        ),
    ],
    "09_capstone": [
        ("commits the target's own token too", [replace("runner.commit(accepted + 1)", "runner.commit(accepted + 2)")]),
        ("commits the accepted drafts without last", [replace("runner.commit(accepted + 1)", "runner.commit(accepted)")]),
        ("every agreeing draft, not the agreeing prefix", [replace(
            "        while accepted < block - 1 and drafts[accepted] == target_tokens[accepted]:\n"
            "            accepted += 1",
            "        accepted = sum(d == t for d, t in zip(drafts, target_tokens))")]),
        ("the next block opens with the last draft", [replace(
            "last = target_tokens[accepted]", "last = drafts[accepted - 1] if accepted else target_tokens[0]")]),
        ("the project's loop called", [append("""
            def my_generate_dflash(runner, prompt_ids, max_new_tokens, stop_ids=()):
                import generate
                result = generate.generate_dflash(runner.target, runner.drafter, prompt_ids, max_new_tokens,
                                                  stop_ids=stop_ids, runner=runner)
                return result.new_ids, result.acceptance_lengths
            """)]),
        ("the stop token not looked for", [replace(
            "            if len(new_ids) == max_new_tokens or new_ids[-1] in stop_ids:",
            "            if len(new_ids) == max_new_tokens:")]),
        ("a host sync per token", [replace(
            "        both = torch.cat([drafts, target_tokens]).tolist()  # one host sync\n"
            "        drafts, target_tokens = both[:block - 1], both[block - 1:]",
            "        drafts = [token.item() for token in drafts]\n"
            "        target_tokens = [token.item() for token in target_tokens]")]),
        ("the prefill's token written when none is asked for", [replace(
            "    if max_new_tokens == 0:\n        return [], []", "")]),
        ("a stop token from the prefill not looked for", [replace(
            "while len(new_ids) < max_new_tokens and new_ids[-1] not in stop_ids:",
            "while len(new_ids) < max_new_tokens and (not lengths or new_ids[-1] not in "
            "stop_ids):")]),
        ("a step taken at max_new_tokens 1", [replace(
            "while len(new_ids) < max_new_tokens and new_ids[-1] not in stop_ids:",
            "while (not lengths or len(new_ids) < max_new_tokens) and new_ids[-1] not in "
            "stop_ids:")]),
        ("drafts of the wrong shape passed to verify", [replace(
            "runner.verify(drafts)", "runner.verify(drafts[None])")]),
        ("generate_dflash rebuilt from its __wrapped__.__code__", [append("""
            import generate
            def my_generate_dflash(runner, prompt_ids, max_new_tokens, stop_ids=()):
                code = generate.generate_dflash.__wrapped__.__code__
                loop = type(my_generate_dflash)(code, vars(generate))
                result = loop(runner.target, runner.drafter, prompt_ids, max_new_tokens,
                              stop_ids=stop_ids, runner=runner)
                return result.new_ids, result.acceptance_lengths
            """)]),
        ("the project's loop stashed in a list at import", [append("""
            import generate
            LOOPS = [generate.generate_dflash]
            def my_generate_dflash(runner, prompt_ids, max_new_tokens, stop_ids=()):
                result = LOOPS[0](runner.target, runner.drafter, prompt_ids, max_new_tokens,
                                  stop_ids=stop_ids, runner=runner)
                return result.new_ids, result.acceptance_lengths
            """)]),
        ("the project's loop reached through benchmarks/step_overheads", [append("""
            import step_overheads
            def my_generate_dflash(runner, prompt_ids, max_new_tokens, stop_ids=()):
                result = step_overheads.generate.generate_dflash(
                    runner.target, runner.drafter, prompt_ids, max_new_tokens, stop_ids=stop_ids,
                    runner=runner)
                return result.new_ids, result.acceptance_lengths
            """)]),
        ("the grader's helpers imported", [append("""
            import _lab_helpers
            _lab_helpers.forbidden = lambda *args: __import__("contextlib").nullcontext()
            """), replace("runner.commit(accepted + 1)", "runner.commit(accepted + 2)")]),
    ],
    "09_capstone_tree": [
        ("one step down the tree at most", [replace(
            "        while (path[-1], target_tokens[path[-1]]) in children:",
            "        if (path[-1], target_tokens[path[-1]]) in children:")]),
        ("the root committed alone", [replace("runner.commit_path(path)", "runner.commit_path(path[:1])")]),
        ("the next step opens with the last draft", [replace(
            "        last = kept[-1]", "        last = kept[-2] if len(kept) > 1 else kept[-1]")]),
        ("the project's walk imported", [
            prepend("from dflash.tree import walk"),
            replace("        path = [0]  # from the root", "        path = walk(tree, target_tokens)  # "),
            replace("        while (path[-1], target_tokens[path[-1]]) in children:\n"
                    "            path.append(children[path[-1], target_tokens[path[-1]]])\n", "")]),
    ],
    "08_ar_pass_budget": [
        (MEMORISED, []),
        ("block passes, not block - 1", [replace("room / (block - 1)", "room / block")]),
        ("the rest of the step forgotten", [replace(" - costs.rest  #", "  #")]),
        (
            "0 where free passes fall short",
            [replace("if room >= 0 else None", "if room >= 0 else 0.0")],
        ),
    ],
}


def mutated(lab: str, edits) -> str:
    source = (LABS / lab / "solution.py").read_text()
    for edit in edits:
        if edit[0] == "replace":
            _, old, new = edit
            assert source.count(old) == 1, (
                f"{lab}: the wrong answer's edit no longer fits solution.py: {old!r}"
            )
            source = source.replace(old, new)
        elif edit[0] == "append":
            source += "\n\n" + edit[1]
        else:
            lines = source.split("\n")
            after = next(i for i, line in enumerate(lines) if line.startswith(("import", "from")))
            source = "\n".join(lines[:after] + [edit[1]] + lines[after:])
    return source


def load_module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Recorder:
    """Wraps a lab module's functions to keep what they return: the answers a message must not
    print."""

    def __init__(self, module):
        self.answers: list = []
        self.by_function: dict[str, list] = {}
        for name, value in list(vars(module).items()):
            if (
                inspect.isfunction(value)
                and value.__module__ == module.__name__
                and not name.startswith("_")
            ):
                setattr(module, name, self.recording(name, value))

    def recording(self, name, function):
        def recorded(*args, **kwargs):
            answer = function(*args, **kwargs)
            self.answers.append(answer)
            self.by_function.setdefault(name, []).append(answer)
            return answer

        recorded.__wrapped__, recorded.__module__ = function, function.__module__
        return recorded


class Replayer:
    """A module whose functions replay, call by call, what the solution answered on another run."""

    def __init__(self, module, answers: dict):
        for name, value in list(vars(module).items()):
            if (
                inspect.isfunction(value)
                and value.__module__ == module.__name__
                and name in answers
            ):
                replay = self.replaying(list(answers[name]))
                replay.__module__ = module.__name__  # the student's own, as far as a grader sees
                setattr(module, name, replay)

    @staticmethod
    def replaying(answers: list):
        calls = itertools.count()

        def replay(*args, **kwargs):
            return answers[next(calls) % len(answers)]

        return replay


@pytest.fixture(scope="module")
def demo() -> DemoPair:
    return DemoPair()


def grade(lab: str, path: Path, demo: DemoPair, *, wrap=None) -> tuple[str | None, object]:
    """Run `lab`'s grader on the module at `path`, read and imported as the labs' conftest does it:
    (its failure message, or None if it passed; the module, None where it was refused unread)."""
    untouched = Untouched()
    try:
        module = load_submission(path, f"graded_{lab}_{path.parent.name}", lab)
    except RuleBroken as error:
        return str(error), None
    if wrap is not None:
        wrap(module)
    grader_path = next((LABS / lab).glob("test_*.py"))
    grader = load_module(grader_path, f"grader_{lab}")
    test = next(
        value
        for name, value in vars(grader).items()
        if name.startswith("test_") and callable(value)
    )
    arguments = {"lab": module, "demo": demo}
    wanted = {name: arguments[name] for name in inspect.signature(test).parameters}
    try:
        test(**wanted)
        untouched.check(lab)
    except AssertionError as error:  # a grader's verdict (RuleBroken is one too)
        return str(error).split("\nassert ")[0] or "(an assertion without a message)", module
    except Exception as error:  # a wrong answer may also crash the grader's use of it: rejected too
        return f"(raised {type(error).__name__}: {error})", module
    return None, module


def renderings(value) -> set[str]:
    """How a message could print `value`: whole lists, and numbers with enough digits to be an
    answer."""
    found = set()
    if isinstance(value, torch.Tensor):
        if value.numel() > 64:
            return found  # a whole tensor is no value a message prints
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        if len(value) >= 2:
            found.add(str(list(value)))
        for item in value[:64]:  # the first ones: a message names an entry or two, not hundreds
            found |= renderings(item)
    elif isinstance(value, dict):
        for item in value.values():
            found |= renderings(item)
    elif isinstance(value, bool) or value is None:
        pass
    elif isinstance(value, int):
        if abs(value) >= 100:
            found.add(str(value))
    elif isinstance(value, float) and math.isfinite(value) and abs(value - round(value)) > 5e-5:
        found |= {f"{value:.3f}", f"{value:.4f}", f"{value:.6f}", repr(value)}
    return {text for text in found if len(text) >= 4}


NAMED_BUGS = {  # wrong answers whose message must name them
    "labels shifted by one slot": "shifted by one slot",
    "keys and values copied by indexing": "once per query group",
    "keys and values copied by broadcasting against ones": "once per query group",
    "keys and values copied into a new tensor": "once per query group",
    "a softmax that overflows": "overflow",
    "torch.allclose replaced through another name, inside the function": "changed torch.allclose",
    "a host sync per token": "reach the host once",
    "drafts of the wrong shape passed to verify": "runner.verify raised",
    "the grader's simulation, imported from its test file": "import of test_06_sampled_rule",
    "p / q where neither law draws the token": "0 / 0",
    "speculating even where it loses": "under 1",
}
SOLUTION_RUNS: dict[str, tuple[int, list]] = {}


def solution_run(lab: str, demo: DemoPair, monkeypatch) -> tuple[int, list]:
    """(seed, [Recorder]) of the reference solution graded once per lab and session, on inputs drawn
    with seed: the run the wrong answers replay, and whose answers their messages may not print."""
    if lab not in SOLUTION_RUNS:
        seed = int.from_bytes(os.urandom(4), "little")
        monkeypatch.setenv("DFLASH_LABS_SEED", str(seed))
        recorder = []
        right, _ = grade(
            lab, LABS / lab / "solution.py", demo, wrap=lambda m: recorder.append(Recorder(m))
        )
        assert right is None, (
            f"{lab}: the reference solution fails its grader here (seed {seed}): {right}"
        )
        SOLUTION_RUNS[lab] = seed, recorder
    return SOLUTION_RUNS[lab]


def printed_in(text: str, message: str) -> bool:
    """`text` stands in `message` as a whole number or list, not as the start of a longer number."""
    if text not in message:  # most renderings: a quick no
        return False
    return re.search(r"(?<![\d.])" + re.escape(text) + r"(?!\d)", message) is not None


CASES = [(lab, name, edits) for lab in LAB_FOLDERS for name, edits in WRONG.get(lab, [])]


def test_every_lab_has_three_wrong_answers():
    short = [lab for lab in LAB_FOLDERS if len(WRONG.get(lab, [])) < 3]
    assert not short, f"labs with fewer than three wrong answers here: {short}"
    assert set(WRONG) <= set(LAB_FOLDERS), (
        f"wrong answers for labs that do not exist: {set(WRONG) - set(LAB_FOLDERS)}"
    )


@pytest.mark.parametrize("lab,name,edits", CASES, ids=[f"{lab}:{name}" for lab, name, _ in CASES])
def test_the_grader_rejects_a_wrong_answer(lab, name, edits, demo, tmp_path, monkeypatch):
    seed, recorder = solution_run(lab, demo, monkeypatch)
    monkeypatch.setenv("DFLASH_LABS_SEED", str(seed))
    folder = tmp_path / lab
    folder.mkdir()
    answers = recorder[0].answers
    if (
        name == MEMORISED
    ):  # the solution's answers from this run, replayed on a run with other draws
        (folder / "solution.py").write_text((LABS / lab / "solution.py").read_text())
        monkeypatch.setenv("DFLASH_LABS_SEED", str(seed + 1))
        message, _ = grade(
            lab, folder / "solution.py", demo, wrap=lambda m: Replayer(m, recorder[0].by_function)
        )
    else:
        (folder / "solution.py").write_text(mutated(lab, edits))
        mine = []
        message, _ = grade(
            lab, folder / "solution.py", demo, wrap=lambda m: mine.append(Recorder(m))
        )
    assert message is not None, f"{lab}: the grader accepts a wrong answer: {name}"
    if name in NAMED_BUGS:
        assert NAMED_BUGS[name] in message, (
            f"{lab}: the message for '{name}' does not name the bug: {message}"
        )
    if name != MEMORISED:
        printed = set().union(*map(renderings, answers)) if answers else set()
        own = set().union(*map(renderings, mine[0].answers)) if mine and mine[0].answers else set()
        leaked = sorted(text for text in printed - own if printed_in(text, message))
        assert not leaked, (
            f"{lab}: the failure message for '{name}' prints the expected {leaked}: {message}"
        )


def test_a_plug_in_check_computes_its_reference_before_the_students_piece_is_in():
    """01_rope's plug-in, graded alone (a fresh demo pair, no cached plain answers): a RoPE that
    does not rotate must fail it. Were the plain loop's tokens computed with the student's RoPE
    already patched in, both runs would agree and the check would pass whatever the RoPE."""
    grader = load_module(LABS / "01_rope" / "test_01_rope.py", "grader_01_rope_alone")
    fresh = DemoPair()
    with pytest.raises(AssertionError, match="with your RoPE"):
        fresh.assert_plugged_in_matches(grader.plugged_in(lambda x, positions, theta: x),
                                        grader.plain_loop(fresh), "01_rope: with your RoPE")


LOOPS_FOREVER = {"at import": "while True:\n    pass\n",
                 "when called": "def tau_from_histogram(histogram):\n"
                                "    while True:\n"
                                "        pass\n"}


@pytest.mark.parametrize("where", LOOPS_FOREVER)
def test_a_grader_that_runs_too_long_fails_in_one_line(where, tmp_path):
    """A submission that never returns (a forgotten increment) fails its lab at the time limit, in
    one line, at import or when called: the graders' own run is not stuck on it. The lab is copied,
    with the labs' conftest and helpers, into a folder where its starter loops."""
    labs = tmp_path / "tutorials" / "labs"
    (labs / "05_histogram").mkdir(parents=True)
    for name in ("conftest.py", "_lab_helpers.py", "05_histogram/test_05_histogram.py"):
        (labs / name).write_text((LABS / name).read_text())
    (labs / "05_histogram" / "starter.py").write_text(LOOPS_FOREVER[where])
    root = LABS.parents[1]
    env = {**os.environ, "DFLASH_LABS_TIMEOUT": "2", "DFLASH_LABS": "starters",
           "PYTHONPATH": os.pathsep.join(str(root / part)
                                         for part in ("", "tutorials", "benchmarks"))}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          str(labs)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 1, run.stdout + run.stderr
    verdict = [line for line in run.stdout.splitlines() if "stopped after" in line]
    assert verdict and verdict[0].startswith("05_histogram: stopped after 2 s"), run.stdout
    assert "Traceback" not in run.stdout, run.stdout


def test_forbidden_calls_are_seen_whatever_name_they_go_by():
    """The watch behind `forbidden`: a forbidden function is seen by what it runs, called from a
    list, a closure, or rebuilt from its code; a C function by identity, a tensor method by its
    name on a tensor. Only the watched calls are seen."""
    import types

    import dflash.qwen3
    import dflash.tree
    from _lab_helpers import calls_watched

    places = {dflash.tree: ["ancestor_mask"], torch: ["repeat_interleave"],
              torch.Tensor: ["repeat"]}
    parents = [-1, 0, 0, 1]
    stash = [dflash.tree.ancestor_mask]
    rebuilt = types.FunctionType(dflash.tree.ancestor_mask.__code__, vars(dflash.tree))
    closure = (lambda function: lambda: function(parents))(dflash.tree.ancestor_mask)
    ways = {"a list": lambda: stash[0](parents), "a closure": closure,
            "its code, rebuilt": lambda: rebuilt(parents),
            "a C function": lambda: torch.repeat_interleave(torch.ones(2), 2),
            "a tensor method": lambda: torch.ones(2).repeat(2)}
    for way, call in ways.items():
        hits = []
        with calls_watched(places, hits):
            call()
        assert hits, f"a forbidden call through {way} was not seen"
    hits = []
    with calls_watched(places, hits):
        torch.ones(2).sum()
        dflash.tree.build_tree(0, [[-0.1]], [[1]], 1)
    assert not hits, hits


def test_the_replayed_run_is_generate_dflash_s(demo):
    """What a grader runs in the student copy, where generate_dflash is the capstone's stub: the
    same greedy run, its tokens and step lengths read off the plain loop's text, on both pairs,
    stopping at a stop token or the limit, and with a runner of a lab's class (03's pooled tau)."""
    import generate
    from _lab_helpers import fixture_pair, replayed_dflash

    class Blind(generate.ModelRunner):  # 03_zero_context's runner: the drafter keeps few drafts
        def draft(self, features, last):
            return super().draft(torch.zeros_like(features), last)

    other = fixture_pair()
    runs = [(demo, ids, choices, limit, demo.stop_ids, None)
            for (ids, choices), limit in zip(demo.prompts(3), (96, 1, 29))]
    runs += [(demo, demo.prompts(1)[0][0], None, 40, (), Blind),
             (other, other.prompts(1)[0][0], None, 24, (), None)]
    for pair, ids, choices, limit, stops, runner_class in runs:
        def runner():
            return runner_class and runner_class(pair.target, pair.drafter,
                                                 max_length=len(ids) + limit + pair.block)

        real = generate.generate_dflash(pair.target, pair.drafter, ids, limit, stop_ids=stops,
                                        first_token_choices=choices, runner=runner())
        replayed = replayed_dflash(pair.target, pair.drafter, ids, limit, stop_ids=stops,
                                   first_token_choices=choices, runner=runner())
        assert replayed.new_ids == real.new_ids, (limit, runner_class)
        assert replayed.acceptance_lengths == real.acceptance_lengths, (limit, runner_class)


def test_run_dflash_replays_only_where_the_loop_is_the_student_copy_s_stub(demo, monkeypatch):
    """`run_dflash` turns to the replay on the copy's stub alone: another NotImplementedError (a
    student's unwritten piece) is the student's."""
    import generate
    from _lab_helpers import run_dflash

    ids, choices = demo.prompts(1)[0]
    real = run_dflash(demo.target, demo.drafter, ids, 40, first_token_choices=choices)
    assert max(real.acceptance_lengths) > 1  # drafts kept: the two routes are told apart by steps

    def stub(*args, **kwargs):
        raise NotImplementedError("generate_dflash is lab 09_capstone's answer, not in the student "
                                  "copy: write it in tutorials/labs/09_capstone/starter.py")

    monkeypatch.setattr(generate, "generate_dflash", stub)
    replayed = run_dflash(demo.target, demo.drafter, ids, 40, first_token_choices=choices)
    assert (replayed.new_ids, replayed.acceptance_lengths) == (real.new_ids,
                                                               real.acceptance_lengths)

    def unwritten(*args, **kwargs):
        raise NotImplementedError

    monkeypatch.setattr(generate, "generate_dflash", unwritten)
    with pytest.raises(NotImplementedError):
        run_dflash(demo.target, demo.drafter, ids, 40, first_token_choices=choices)
