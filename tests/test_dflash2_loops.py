"""DFlash2 in the speculative loop (generate.py, dflash/dflash2.py's `draft_block`).

Greedy, the selector's walk only changes which drafts are proposed: the output is the plain
loop's, token for token, eagerly and compiled. Sampled, a drawn draft is judged against the
distribution the walk drew it from (over its slot's candidates, given the token before it): the
reference's `draft_indices` rule. A chi-square test, as tests/test_sampling.py's for DFlash,
shows the committed tokens follow the target's law, and that reading q the wrong way is caught.
"""

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dflash.cli import UsageError
from dflash.dflash2 import DFlash2Config, DFlash2Drafter, load_drafter
from dflash.drafter import DrafterConfig
from dflash.measure import Wrapped
from dflash.qwen3 import Qwen3
from dflash.sampling import Sampling
from generate import (ModelRunner, generate_autoregressive, generate_dflash,
                      generate_dflash_tree, main)
from tests.test_compile import CountingBackend, no_recompiles  # noqa: F401 (a fixture)
from tests.test_generate import prompt_of
from tests.test_line_width import wide_lines
from tests.test_sampling import (BLOCK, PROMPT, SAMPLES, TEMPERATURE, VOCAB, chi_square_p_value,
                                 exact_joint, next_token_probabilities, sample_counts)
from tests.test_sampling import target as small_target  # noqa: F401 (a fixture)

FIXTURES = Path(__file__).parent / "fixtures"
REFERENCE = FIXTURES / "dflash2-reference"
torch.set_num_threads(1)


@pytest.fixture(scope="module")
def pair():
    target = Qwen3.from_pretrained(FIXTURES / "qwen3-tiny")
    return target, load_drafter(FIXTURES / "dflash2-tiny", target)


# ------------------------------------------------------------------------------------ greedy


def test_greedy_equals_the_plain_loop_and_the_reference(pair):
    """The reference's prompt: its speculative output, which equals its target's own."""
    target, drafter = pair
    ref = load_file(REFERENCE / "reference.safetensors")
    prompt = ref["prompt"][0].tolist()
    result = generate_dflash(target, drafter, prompt, 24)
    assert result.new_ids == generate_autoregressive(target, prompt, 24).new_ids
    assert result.new_ids == ref["spec_output"][0, len(prompt):].tolist()
    assert result.acceptance_lengths == ref["acceptance_lengths"].tolist()


@pytest.mark.parametrize("prompt_length", [1, 9, 30])
def test_greedy_equals_the_plain_loop_past_the_window(pair, prompt_length):
    """Contexts longer than the window (6): the cache is read through the window's mask."""
    target, drafter = pair
    prompt = prompt_of(prompt_length, target.config.vocab_size)
    plain = generate_autoregressive(target, prompt, 40).new_ids
    assert generate_dflash(target, drafter, prompt, 40).new_ids == plain


def test_greedy_accepts_drafts_when_the_selector_agrees_with_the_target(pair):
    """Steer the head so that the target's greedy continuation is every slot's likeliest token
    and the selector's pair scores are off: every draft is accepted, and the output is still the
    plain loop's. (The random fixture accepts nothing, which tests losslessness only.)"""
    target, drafter = pair
    prompt = prompt_of(7, target.config.vocab_size)
    truth = prompt + generate_autoregressive(target, prompt, 40).new_ids
    steered = steer_to(drafter, target, truth)
    result = generate_dflash(target, steered, prompt, 32)
    assert result.new_ids == truth[len(prompt):][:32]
    assert result.acceptance_lengths == [8] * 4


def steer_to(drafter: DFlash2Drafter, target: Qwen3, truth: list[int]) -> DFlash2Drafter:
    """A copy of `drafter` whose head makes the next tokens of `truth` each slot's likeliest,
    with the selector's codebooks at zero (its walk is then the argmax)."""
    steered = DFlash2Drafter(drafter.config)
    steered.load_state_dict(drafter.state_dict())
    with torch.no_grad():
        steered.candidate_selector.predecessor_codebook.zero_()
    start = {}  # the block's start position, read off the positions the pass is given

    def logits(states, target_):
        first = start["position"] + 1
        tokens = torch.tensor(truth[first:first + len(states)])
        return torch.nn.functional.one_hot(tokens, target_.config.vocab_size).float() * 10

    forward = steered.forward

    def remember(features, block, context_positions, block_positions, **options):
        start["position"] = int(block_positions[0])
        return forward(features, block, context_positions, block_positions, **options)

    steered.logits, steered.forward = logits, remember
    return steered.eval()


def test_compiled_greedy_equals_the_plain_loop_and_compiles_once(pair, no_recompiles):  # noqa: F811
    """The DFlash2 draft pass has static shapes: one graph per pass and bucket, whatever the
    prompt length; the walk runs after it, on the pass's outputs."""
    target, drafter = pair
    backend, new = CountingBackend(), 24
    runner = ModelRunner(target, drafter, max_length=40 + new + 8, compile=True, backend=backend)
    counts = []
    for prompt_length in (5, 23):
        prompt = prompt_of(prompt_length, target.config.vocab_size)
        plain = generate_autoregressive(target, prompt, new).new_ids
        assert generate_dflash(target, drafter, prompt, new, runner=runner).new_ids == plain
        counts.append(backend.graphs)
    assert counts == [2, 2]  # verify and draft2, one graph each, both in the first bucket


def test_trees_are_refused_in_one_line(pair):
    target, drafter = pair
    with pytest.raises(UsageError, match="not supported with a DFlash2 drafter") as caught:
        generate_dflash_tree(target, drafter, [1, 2, 3], 4, budget=4)
    assert "\n" not in str(caught.value)


def test_generate_py_runs_a_dflash2_folder_and_refuses_its_tree(capsys):
    common = ["--model", str(FIXTURES / "qwen3-tiny"), "--draft", str(FIXTURES / "dflash2-tiny"),
              "--prompt-ids", "115,392,221,286", "--max-new-tokens", "6"]
    assert main(common + ["--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["new_tokens"] == len(report["output_ids"]) == 6
    assert main(common + ["--tree", "4"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "DFlash2" in err


# ------------------------------------------------------------------------------------ sampled


def small_dflash2(target: Qwen3, top_k: int) -> DFlash2Drafter:
    """A DFlash2 drafter for tests/test_sampling.py's 8-token target, random but for its head,
    which `oracle_head` sets: sizeable codebooks, so that the walk's q is not the logits'."""
    c = target.config
    layers = replace(c, intermediate_size=2 * c.hidden_size, num_hidden_layers=1,
                     num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    base = DrafterConfig(layers, block_size=BLOCK, num_target_layers=c.num_hidden_layers,
                         mask_token_id=c.vocab_size - 1, target_layer_ids=[0, 1])
    config = DFlash2Config(**vars(base), conv_kernel_size=2, conv_group_size=8,
                           selector_rank=4, selector_top_k=top_k, sliding_window=3)
    torch.manual_seed(4)
    drafter = DFlash2Drafter(config)
    with torch.no_grad():
        for parameter in drafter.parameters():
            if parameter.dim() >= 2:
                torch.nn.init.normal_(parameter, std=0.5)
    return drafter.eval()


def oracle_head(drafter: DFlash2Drafter, target: Qwen3, committed: list[int]) -> None:
    """Make the drafter's logits at each slot the target's log-probabilities along the greedy
    continuation of what was committed: drafts are often accepted, so the rule is exercised."""
    greedy = {}

    def best(prefix: tuple) -> int:
        if prefix not in greedy:
            probs = next_token_probabilities(target, [prefix], 1.0)[0]
            greedy[prefix] = int(probs.argmax())
        return greedy[prefix]

    def logits(states, target_):
        prefix, rows = tuple(committed), []
        for _ in range(len(states)):
            rows.append(next_token_probabilities(target, [prefix], 1.0)[0].log().float())
            prefix += (best(prefix),)
        return torch.stack(rows)  # (slots, vocab)

    drafter.logits = logits


def sampled_counts(target, drafter, seed, draft_block=None):
    """The first three tokens of SAMPLES sampled runs, drafts drawn by the selector's walk."""
    committed, lengths = [], []
    oracle_head(drafter, target, committed)
    if draft_block is not None:
        drafter.draft_block = draft_block
    generator = torch.Generator().manual_seed(seed)
    runner = ModelRunner(target, drafter, max_length=len(PROMPT) + 3 + BLOCK)

    def generate():
        committed.clear()
        result = generate_dflash(target, drafter, PROMPT, 3, sampling=Sampling(TEMPERATURE),
                                 draft_policy="sampled", generator=generator, runner=runner,
                                 on_token=lambda token, drafted: committed.append(token))
        lengths.extend(result.acceptance_lengths)
        return result.new_ids

    return sample_counts(generate), sum(lengths) / len(lengths)


@torch.no_grad()
def test_sampled_dflash2_follows_the_target(small_target):  # noqa: F811
    """Candidates are 4 of the 8 tokens: q is 0 off them, and the residual covers the rest."""
    drafter = small_dflash2(small_target, top_k=4)
    counts, mean_length = sampled_counts(small_target, drafter, seed=5)
    assert mean_length > 1.3  # drafts were accepted often: the rule was exercised
    assert chi_square_p_value(counts, exact_joint(small_target, TEMPERATURE)) > 1e-3
    assert chi_square_p_value(counts, exact_joint(small_target, 1.25 * TEMPERATURE)) < 1e-3


@torch.no_grad()
def test_judging_by_the_logits_instead_of_the_walk_is_caught(small_target):  # noqa: F811
    """The control: q read off the head's softmax over the candidates (as for DFlash), not the
    walk's scores, which the pair term moves. The same test fails it."""
    drafter = small_dflash2(small_target, top_k=4)
    honest = drafter.draft_block

    def by_the_logits(runner, features, last, sampling, sampled, generator):
        seen = {}

        class Recording(Wrapped):  # keeps the draft pass's logits (B - 1, vocab)
            def draft(self, features, last_token):
                seen["logits"], states = self.runner.draft(features, last_token)
                return seen["logits"], states

        drafts, _ = honest(Recording(runner), features, last, sampling, sampled, generator)
        logits = seen["logits"]
        top = logits.topk(drafter.config.selector_top_k, dim=-1)
        kept = torch.full_like(logits, float("-inf")).scatter_(-1, top.indices, top.values)
        return drafts, Sampling(sampling.temperature).probs(kept[:sampled])

    counts, _ = sampled_counts(small_target, drafter, seed=5, draft_block=by_the_logits)
    assert chi_square_p_value(counts, exact_joint(small_target, TEMPERATURE)) < 1e-3


def test_lines_fit_in_100_columns():
    root = Path(__file__).resolve().parents[1]
    assert wide_lines(root / "tests" / "test_dflash2_loops.py") == []
    assert wide_lines(root / "generate.py") == []
