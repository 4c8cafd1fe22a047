"""tau as the greedy DFlash loop serves it, measured without running the loop: under greedy
decoding the loop commits exactly the target's greedy continuation, so each of its steps can be
replayed on that continuation. Anchor at the newest committed token, draft the block from the
target's features of everything before it, count the drafts equal to the continuation's next
tokens (the accepted prefix), move the anchor past them and the target's own token, repeat.

The continuation is made once, when training starts (the target is frozen: its answers never
change), `block_size - 1` tokens past each answer's end, since the loop's last step compares its
drafts with what the target would say after the answer. Every evaluation then costs one target
pass per prompt plus one drafter pass per step. The features come from that one full pass, where
the loop computes them in chunks through its cache: the two agree up to float rounding, so on a
near-tie a draft may count differently than in `generate.py` (rarely; the test compares them)."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple, Sequence

import torch

from dflash.data import encode_prompts, generate_batch
from dflash.drafter import Drafter, DrafterConfig
from dflash.prompts import check_no_mask_token, check_request
from dflash.qwen3 import Qwen3, argmax
from dflash.results import acceptance_histogram, slot_acceptance
from dflash.training import Distributed


def held_out(path: Path, target: Qwen3, drafter: Drafter, tokenizer, *, stop_ids: Sequence[int],
             max_new_tokens: int, token_healing: bool, place: Distributed,
             thinking: bool = False) -> list[Continuation]:
    """This process's share of the held-out prompts, rendered (and healed) as make_data.py renders
    its own (`thinking` on or off, as the training data was made) and checked as the loop checks
    them, each with the target's greedy continuation: what every evaluation replays."""
    vocab_size, block_size = target.config.vocab_size, drafter.config.block_size
    prompts = encode_prompts(path, tokenizer, chat=None, thinking=thinking,
                             token_healing=token_healing, vocab_size=vocab_size)
    prompts = prompts[place.rank::place.world]
    for index, (ids, _) in enumerate(prompts):  # what the loop would refuse, refused now
        where = f"{path}: prompt {place.rank + index * place.world + 1}"
        check_request(target, drafter, ids, max_new_tokens, block_size=block_size, where=where)
        check_no_mask_token(drafter, ids, where)
    return greedy_continuations(target, prompts, max_new_tokens, stop_ids, block_size)


class Continuation(NamedTuple):
    """A prompt, the target's greedy answer to it, and `block_size - 1` tokens it says next."""
    ids: list[int]  # prompt + answer + lookahead
    prompt_length: int
    answer_length: int  # the loop's output: up to the first stop token, at most max_new_tokens


def greedy_continuations(target: Qwen3, prompts: list, max_new_tokens: int,
                         stop_ids: Sequence[int], block_size: int,
                         batch_size: int = 16) -> list[Continuation]:
    """The target's greedy answer to each (ids, first token's choices or None) prompt, as
    `generate.py` would write it, and what the target says after it."""
    continuations = []
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start:start + batch_size]
        answers = generate_batch(target, [ids for ids, _ in batch], max_new_tokens + block_size - 1,
                                 0.0, (), None,
                                 first_token_choices=[choices for _, choices in batch])
        for (ids, _), answer in zip(batch, answers):
            stop = next((i for i, token in enumerate(answer[:max_new_tokens]) if token in stop_ids),
                        None)
            length = min(max_new_tokens, len(answer)) if stop is None else stop + 1
            continuations.append(Continuation(ids + answer, len(ids), length))
    return continuations


@torch.no_grad()
def acceptance_lengths(target: Qwen3, drafter: Drafter, continuation: Continuation) -> list[int]:
    """Tokens the greedy DFlash loop commits at each step (accepted drafts + the target's own) on
    this prompt, read off its continuation (`drafter` in the dtype it is served in)."""
    config, device = drafter.config, target.embed_tokens.weight.device
    ids = torch.tensor([continuation.ids], device=device)  # (1, T)
    _, features = target(ids, capture_layers=config.target_layer_ids,
                         last_layer=max(config.target_layer_ids))  # (1, T, layers * hidden)
    lengths, committed = [], 1  # the prefill commits the answer's first token
    while committed < continuation.answer_length:
        anchor = continuation.prompt_length + committed - 1  # the newest committed token
        block = torch.full((1, config.block_size), config.mask_token_id, device=device)  # (1, B)
        block[0, 0] = ids[0, anchor]
        hidden = drafter(features[:, :anchor], target.embed_tokens(block),
                         torch.arange(anchor, device=device),
                         torch.arange(anchor, anchor + config.block_size, device=device))  # (1,B,h)
        drafts = argmax(target.logits(hidden[0, 1:])).tolist()  # (B - 1,)
        truth = continuation.ids[anchor + 1:anchor + config.block_size]  # the target's next tokens
        accepted = next((k for k, (d, t) in enumerate(zip(drafts, truth)) if d != t), len(truth))
        lengths.append(accepted + 1)  # the kept drafts, then the target's own token
        committed += accepted + 1
    return lengths


def evaluate(target: Qwen3, config: DrafterConfig, state_dict: dict,
             continuations: list[Continuation], place: Distributed = Distributed()) -> dict:
    """tau and the per-slot acceptance greedy DFlash would serve, over every process's held-out
    prompts (a collective call), with the drafter (`config`, its whole `state_dict`, as
    `training.full_state_dict` gathers it) in the target's dtype and on its device, as it is
    served: its RoPE frequencies stay in float32, as loading keeps them."""
    drafter = Drafter(config).to(target.embed_tokens.weight).eval()
    drafter.load_state_dict(state_dict)  # cast to the target's dtype
    lengths = [length for continuation in continuations
               for length in acceptance_lengths(target, drafter, continuation)]
    histogram = acceptance_histogram(lengths, config.block_size)  # steps of 1..B tokens
    pooled = place.sum(torch.tensor(histogram, dtype=torch.float64, device=place.device))
    return served_figures(pooled.tolist())


def served_figures(histogram: Sequence[float]) -> dict:
    """tau and, per draft slot k = 1..B-1, how often slot k was kept once reached (what a serving
    engine reports per position), from how many steps committed 1, 2, ..., B tokens."""
    steps = sum(histogram)
    tokens = sum(length * count for length, count in enumerate(histogram, start=1))
    return {"eval_tau": round(tokens / steps, 4) if steps else None,
            "eval_slot_acceptance": [None if rate is None else round(rate, 4)
                                     for rate in slot_acceptance(histogram)]}
