"""Greedy DFlash decoding must reproduce greedy autoregressive decoding, token for token."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dflash.drafter import Drafter, DrafterConfig
from dflash.qwen3 import Qwen3
from dflash.sampling import Sampling
from tests.reference import as_the_reference_was_made, logits_of
from dflash.measure import Wrapped, certain_logits
from generate import ModelRunner, argmax, decode_pass, generate_autoregressive, generate_dflash

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


def oracle(runner: ModelRunner, truth: list[int], wrong_at=lambda position: False):
    """`runner`, wrapped to draft the target's own greedy continuation `truth` (prompt included).

    The real draft pass still runs (it keeps the drafter cache in step); its guesses
    are then replaced by the truth, except at positions where `wrong_at` says to
    guess wrong. Returns the wrapped runner and the list that records which slots
    were right, per step.
    """
    record, vocab = [], runner.target.config.vocab_size

    class Guessing(Wrapped):
        def draft(self, features, last_token):
            self.runner.draft(features, last_token)
            start, guesses, right = self.runner.target_cache.length, [], []
            for position in range(start + 1, start + runner.block_size):
                true = truth[position]
                guesses.append((true + 1) % vocab if wrong_at(position) else true)
                right.append(guesses[-1] == true)
            record.append(right)
            return certain_logits(torch.tensor(guesses), vocab)

    return Guessing(runner), record


@pytest.fixture(scope="module")
def sharded_pair():
    target = as_the_reference_was_made(Qwen3.from_pretrained(FIXTURES / "qwen3-tiny-sharded"))
    return target, as_the_reference_was_made(Drafter.from_pretrained(FIXTURES / "dflash-tiny", target=target))


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
    # The authors' loop runs one more verification once the 48 tokens are in (the
    # prefill gave the first): ours stops, so its steps are theirs without the last.
    assert result.acceptance_lengths == reference["acceptance_lengths"].tolist()[:-1]


def test_autoregressive_matches_the_reference_greedy_output(sharded_pair):
    target, _ = sharded_pair
    reference = load_file(FIXTURES / "qwen3-tiny-sharded" / "reference.safetensors")
    prompt = reference["greedy_prompt"][0].tolist()
    result = generate_autoregressive(target, prompt, 40)
    assert prompt + result.new_ids == reference["greedy_output"][0].tolist()
    assert result.acceptance_lengths == [1] * 39 and result.mean_acceptance == 1.0  # the prefill gave one


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
    runner = ModelRunner(target, drafter, max_length=len(prompt) + new + block_size, block_size=block_size)
    runner, _ = oracle(runner, truth, wrong_at=lambda position: position % 7 == 3)
    flags = []
    result = generate_dflash(target, drafter, prompt, new, runner=runner,
                             on_token=lambda token, drafted: flags.append(drafted))
    assert result.new_ids == truth[len(prompt):len(prompt) + new]
    assert max(result.acceptance_lengths) > 1 and len(set(result.acceptance_lengths)) > 1
    assert result.mean_acceptance == sum(result.acceptance_lengths) / result.steps
    assert sum(flags) > 0 and len(flags) == new


def test_perfect_drafts_commit_whole_blocks(tiny_pair):
    target, drafter = tiny_pair
    prompt, new, block_size = prompt_of(7, target.config.vocab_size), 32, 8
    truth = prompt + generate_autoregressive(target, prompt, new + block_size).new_ids
    runner = ModelRunner(target, drafter, max_length=len(prompt) + new + block_size, block_size=block_size)
    runner, _ = oracle(runner, truth)
    flags = []
    result = generate_dflash(target, drafter, prompt, new, runner=runner,
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
    runner = ModelRunner(target, drafter, max_length=len(prompt) + 24 + block_size, block_size=block_size)
    runner, _ = oracle(runner, truth)
    streamed = []
    result = generate_dflash(target, drafter, prompt, 24, runner=runner, stop_ids=[stop],
                             on_token=lambda token, drafted: streamed.append(token))
    assert result.new_ids == new_ids[:cut + 1] == streamed
    assert result.steps == 1 + (cut - 1) // block_size
    assert generate_autoregressive(target, prompt, 24, stop_ids=[stop]).new_ids == new_ids[:cut + 1]


@torch.no_grad()
def test_trimming_never_leaks_a_rejected_token(sharded_pair):
    target, drafter = sharded_pair
    prompt = prompt_of(9, target.config.vocab_size)
    runner = ModelRunner(target, drafter, max_length=40)
    first, features = runner.prefill(torch.tensor([prompt]), 0.0, None)
    n = len(prompt)
    runner.draft(features, first)
    target_tokens, _ = runner.verify(torch.full((runner.block_size - 1,), 5))  # garbage drafts at n+1...
    bonus = target_tokens[0].item()  # the target's token after `first`: drafts all rejected
    runner.commit(1)  # commit `first` alone
    cached = decode_pass(target, runner.target_cache, torch.tensor([[bonus]]), torch.tensor([n + 1]))
    committed = torch.tensor([prompt + [first, bonus]])  # (1, n + 2)
    fresh = logits_of(target, committed)[:, -1]  # (1, vocab): no cache at all
    assert (cached - fresh).abs().max() <= 1e-5


@pytest.mark.parametrize("call", [
    lambda t, d: generate_dflash(t, d, [], 5),
    lambda t, d: generate_dflash(t, d, [1, 2], 0),
    lambda t, d: generate_dflash(t, d, [1, 2], 5, sampling=Sampling(-1)),
    lambda t, d: generate_dflash(t, d, [1, 2], 5, block_size=1),
    lambda t, d: generate_dflash(t, d, [1, 2], 5, block_size=9),
    lambda t, d: generate_dflash(t, d, [1, 10_000], 5),
    lambda t, d: generate_autoregressive(t, [1, 2], 5000),
    lambda t, d: generate_dflash(t, d, [1, 2], 50, runner=ModelRunner(t, d, max_length=20)),
])
def test_bad_requests_raise_one_clear_value_error(sharded_pair, call):
    with pytest.raises(ValueError):
        call(*sharded_pair)


@pytest.mark.parametrize("max_new_tokens", [1, 2, 5, 9, 17])
def test_no_step_runs_once_the_output_is_full(sharded_pair, max_new_tokens):
    """Both loops stop as soon as the output is full: no draft-and-verify pass for nothing."""
    target, drafter = sharded_pair
    prompt = prompt_of(7, target.config.vocab_size)
    fast = generate_dflash(target, drafter, prompt, max_new_tokens, block_size=4)
    plain = generate_autoregressive(target, prompt, max_new_tokens)
    assert fast.new_tokens == plain.new_tokens == max_new_tokens
    before_last_step = 1 + sum(fast.acceptance_lengths[:-1])  # tokens out before the last step began
    assert fast.steps == 0 if max_new_tokens == 1 else before_last_step < max_new_tokens
    assert plain.steps == max_new_tokens - 1  # one token from the prefill, one per step after it


class CountingTokenizer:
    """A byte-level stand-in that records how many ids every decode call was given."""

    def __init__(self):
        self.decoded_lengths = []

    def decode(self, ids, skip_special_tokens=False):
        self.decoded_lengths.append(len(ids))
        return bytes(ids).decode("utf-8", errors="replace")


def test_printer_decodes_incrementally_and_waits_for_whole_characters():
    import io

    from generate import Printer

    text = "déjà vu, " * 40 + "→ done"
    ids = list(text.encode("utf-8"))  # multi-byte characters span several ids
    tokenizer, out = CountingTokenizer(), io.StringIO()
    printer = Printer(tokenizer, colour=False, out=out)
    for token in ids:
        printer(token, drafted=False)
    assert out.getvalue() == text
    assert max(tokenizer.decoded_lengths) <= 4  # a few ids per call, not the whole text: linear, not quadratic


def test_printing_time_is_reported_apart(sharded_pair):
    import time

    target, drafter = sharded_pair
    prompt = prompt_of(5, target.config.vocab_size)
    slow_printer = lambda token, drafted: time.sleep(0.05)  # noqa: E731
    began = time.perf_counter()
    result = generate_dflash(target, drafter, prompt, 10, block_size=4, on_token=slow_printer)
    wall = time.perf_counter() - began
    assert result.callback_seconds >= 0.5  # ten sleeps of 50 ms: a sleep never ends early
    assert result.seconds <= wall - result.callback_seconds  # they are not in the measured time, however busy the CPU


def test_argmax_picks_the_first_maximum_as_tensor_argmax_does():
    torch.manual_seed(0)
    logits = torch.randn(16, 4096)
    logits[3, [7, 100, 4095]] = 50.0  # a three-way tie: the first index wins
    logits[5] = 0.0  # all tied
    logits[9, [0, 1]] = float("inf")
    assert torch.equal(argmax(logits), logits.argmax(dim=-1))
    assert argmax(logits)[3] == 7 and argmax(logits)[5] == 0
    assert argmax(logits[0]).shape == ()
