"""Greedy DFlash decoding must reproduce greedy autoregressive decoding, token for token."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dflash.drafter import Drafter, DrafterConfig
from dflash.qwen3 import Qwen3
from generate import Steps, generate_autoregressive, generate_dflash

FIXTURES = Path(__file__).parent / "fixtures"
torch.set_num_threads(1)  # these models are tiny: a second thread only adds contention


def random_drafter(target: Qwen3, block_size: int, seed: int = 0, num_layers: int = 2) -> Drafter:
    """A fresh drafter that fits `target`, with small deterministic random weights."""
    c = target.config
    layers = type(c)(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=2 * c.hidden_size,
                     num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                     max_position_embeddings=c.max_position_embeddings)
    config = DrafterConfig(layers, block_size=block_size, num_target_layers=c.num_hidden_layers,
                           mask_token_id=c.vocab_size - 1, target_layer_ids=[1, c.num_hidden_layers - 1])
    torch.manual_seed(seed)
    drafter = Drafter(config)
    for name, parameter in drafter.named_parameters():
        if parameter.dim() == 2:  # projections; norms keep their ones
            torch.nn.init.normal_(parameter, std=0.05)
    return drafter.eval()


def oracle(steps: Steps, truth: list[int], wrong_at=lambda position: False) -> list[list[bool]]:
    """Make `steps` draft the target's own greedy continuation `truth` (prompt included).

    The real draft pass still runs (it keeps the drafter cache in step); its guesses
    are then replaced by the truth, except at positions where `wrong_at` says to
    guess wrong. Returns the list that records which slots were right, per step.
    """
    real_draft, record, vocab = steps.draft, [], steps.target.config.vocab_size

    def draft(context_features, context_start, last_token, start):
        real_draft(context_features, context_start, last_token, start)
        guesses, right = [], []
        for position in range(start + 1, start + steps.block_size):
            true = truth[position]
            guesses.append((true + 1) % vocab if wrong_at(position) else true)
            right.append(guesses[-1] == true)
        record.append(right)
        return torch.tensor(guesses)

    steps.draft = draft
    return record


@pytest.fixture(scope="module")
def sharded_pair():
    target = Qwen3.from_pretrained(FIXTURES / "qwen3-tiny-sharded")
    return target, Drafter.from_pretrained(FIXTURES / "dflash-tiny", target=target)


@pytest.fixture(scope="module")
def tiny_pair():
    target = Qwen3.from_pretrained(FIXTURES / "qwen3-tiny")
    return target, random_drafter(target, block_size=16)


def prompt_of(length: int, vocab: int, seed: int = 1) -> list[int]:
    return torch.randint(0, vocab - 1, (length,), generator=torch.Generator().manual_seed(seed + length)).tolist()


def test_matches_the_authors_speculative_output(sharded_pair):
    target, drafter = sharded_pair
    reference = load_file(FIXTURES / "dflash-tiny" / "reference.safetensors")
    prompt = reference["prompt"][0].tolist()
    result = generate_dflash(target, drafter, prompt, 48, block_size=8)
    assert prompt + result.new_ids == reference["spec_output"][0].tolist()
    assert result.acceptance_lengths == reference["acceptance_lengths"].tolist()


def test_autoregressive_matches_the_reference_greedy_output(sharded_pair):
    target, _ = sharded_pair
    reference = load_file(FIXTURES / "qwen3-tiny-sharded" / "reference.safetensors")
    prompt = reference["greedy_prompt"][0].tolist()
    result = generate_autoregressive(target, prompt, 40)
    assert prompt + result.new_ids == reference["greedy_output"][0].tolist()
    assert result.acceptance_lengths == [1] * 40 and result.mean_acceptance == 1.0


SWEEP = [("sharded", length, block) for length in (1, 7, 40) for block in range(2, 9)] + [
    ("tiny", length, block) for length in (1, 7, 40) for block in (9, 16)]


@pytest.mark.parametrize("pair_name, prompt_length, block_size", SWEEP)
def test_dflash_equals_autoregressive(request, pair_name, prompt_length, block_size):
    target, drafter = request.getfixturevalue(f"{pair_name}_pair")
    prompt = prompt_of(prompt_length, target.config.vocab_size)
    expected = generate_autoregressive(target, prompt, 16).new_ids
    assert generate_dflash(target, drafter, prompt, 16, block_size=block_size).new_ids == expected


@pytest.mark.parametrize("block_size", [2, 5, 16])
def test_oracle_drafts_commit_many_tokens_and_change_nothing(tiny_pair, block_size):
    target, drafter = tiny_pair
    prompt, new = prompt_of(7, target.config.vocab_size), 30
    truth = prompt + generate_autoregressive(target, prompt, new + block_size).new_ids
    steps = Steps(target, drafter, max_length=len(prompt) + new + block_size, block_size=block_size)
    oracle(steps, truth, wrong_at=lambda position: position % 7 == 3)
    flags = []
    result = generate_dflash(target, drafter, prompt, new, steps=steps,
                             on_token=lambda token, drafted: flags.append(drafted))
    assert result.new_ids == truth[len(prompt):len(prompt) + new]
    assert max(result.acceptance_lengths) > 1 and len(set(result.acceptance_lengths)) > 1
    assert result.mean_acceptance == sum(result.acceptance_lengths) / result.steps
    assert sum(flags) > 0 and len(flags) == new


def test_perfect_drafts_commit_whole_blocks(tiny_pair):
    target, drafter = tiny_pair
    prompt, new, block_size = prompt_of(7, target.config.vocab_size), 32, 8
    truth = prompt + generate_autoregressive(target, prompt, new + block_size).new_ids
    steps = Steps(target, drafter, max_length=len(prompt) + new + block_size, block_size=block_size)
    oracle(steps, truth)
    flags = []
    result = generate_dflash(target, drafter, prompt, new, steps=steps,
                             on_token=lambda token, drafted: flags.append(drafted))
    assert result.new_ids == truth[len(prompt):len(prompt) + new]
    assert result.acceptance_lengths == [block_size] * 4  # 1 prefill token + 4 blocks of 8, cut to 32
    assert flags == [False] + ([True] * 7 + [False]) * 3 + [True] * 7


def test_stops_mid_block_at_a_stop_token(sharded_pair):
    target, drafter = sharded_pair  # its greedy output is varied enough to pick a fresh token from
    prompt, block_size = prompt_of(7, target.config.vocab_size), 8
    truth = prompt + generate_autoregressive(target, prompt, 24 + block_size).new_ids
    new_ids = truth[len(prompt):len(prompt) + 24]
    cut = next(i for i in range(len(new_ids)) if new_ids[i] not in new_ids[:i] and i % block_size in range(2, 7))
    stop = new_ids[cut]  # first seen at a drafted slot, inside a block
    steps = Steps(target, drafter, max_length=len(prompt) + 24 + block_size, block_size=block_size)
    oracle(steps, truth)
    streamed = []
    result = generate_dflash(target, drafter, prompt, 24, steps=steps, stop_ids=[stop],
                             on_token=lambda token, drafted: streamed.append(token))
    assert result.new_ids == new_ids[:cut + 1] == streamed
    assert result.steps == 1 + (cut - 1) // block_size
    assert generate_autoregressive(target, prompt, 24, stop_ids=[stop]).new_ids == new_ids[:cut + 1]


@torch.no_grad()
def test_trimming_never_leaks_a_rejected_token(sharded_pair):
    target, drafter = sharded_pair
    prompt = prompt_of(9, target.config.vocab_size)
    steps = Steps(target, drafter, max_length=40)
    logits, features = steps.prefill(torch.tensor([prompt]))
    first = logits[0].argmax()
    n = len(prompt)
    steps.draft(features, 0, first, n)
    logits, _ = steps.verify(torch.full((steps.block_size - 1,), 5), n)  # garbage drafts at n+1...
    bonus = logits[0].argmax()  # the target's token after `first`: drafts all rejected
    steps.target_cache.trim(n + 1)
    cached = steps.decode(bonus, n + 1)  # (1, vocab)
    committed = torch.tensor([prompt + [first.item(), bonus.item()]])  # (1, n + 2)
    fresh = target(committed)[:, -1]  # (1, vocab): no cache at all
    assert (cached - fresh).abs().max() <= 1e-5


@pytest.mark.parametrize("call", [
    lambda t, d: generate_dflash(t, d, [], 5),
    lambda t, d: generate_dflash(t, d, [1, 2], 0),
    lambda t, d: generate_dflash(t, d, [1, 2], 5, temperature=-1),
    lambda t, d: generate_dflash(t, d, [1, 2], 5, block_size=1),
    lambda t, d: generate_dflash(t, d, [1, 2], 5, block_size=9),
    lambda t, d: generate_dflash(t, d, [1, 10_000], 5),
    lambda t, d: generate_autoregressive(t, [1, 2], 5000),
    lambda t, d: generate_dflash(t, d, [1, 2], 50, steps=Steps(t, d, max_length=20)),
])
def test_bad_requests_raise_one_clear_value_error(sharded_pair, call):
    with pytest.raises(ValueError):
        call(*sharded_pair)
