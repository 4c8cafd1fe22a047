"""Sampling with DFlash draws from exactly the target's distribution, as plain sampling does.

A tiny target (8-token vocabulary) lets us compute the exact joint distribution of
its first three sampled tokens. A drafter that guesses the greedy continuation gets
many drafts accepted, so the accept-or-replace rule is really exercised. A
chi-square test at fixed seeds compares thousands of samples with the exact law;
deterministic, so it cannot flake, and a control shows it would notice a wrong law.
"""

import itertools

import pytest
import torch

from dflash.qwen3 import Qwen3, Qwen3Config
from dflash.sampling import Sampling, draw, sampling_of
from dflash.measure import Wrapped, certain_logits
from generate import ModelRunner, generate_autoregressive, generate_dflash, sample
from tests.reference import logits_of
from tests.test_generate import random_drafter

torch.set_num_threads(1)
VOCAB, PROMPT, SAMPLES, TEMPERATURE, BLOCK = 8, [1, 5, 2, 6], 1200, 1.0, 4


@pytest.fixture(scope="module")
def target():
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    model = Qwen3(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(4)  # peaked distributions: some continuations are likely, many are rare
    return model


@torch.no_grad()
def next_token_probabilities(target, prefixes, sampling):
    """p(next | PROMPT + prefix) for each prefix: (len(prefixes), VOCAB), in float64; a number is a temperature."""
    ids = torch.tensor([PROMPT + list(prefix) for prefix in prefixes])  # (prefixes, len): all one length
    sampling = sampling if isinstance(sampling, Sampling) else Sampling(sampling)
    return sampling.probs(logits_of(target, ids)[:, -1])


def exact_joint(target, sampling):
    """P(t1, t2, t3) of the first three sampled tokens: (VOCAB, VOCAB, VOCAB)."""
    p1 = next_token_probabilities(target, [()], sampling)[0]  # (V,)
    p2 = next_token_probabilities(target, [(a,) for a in range(VOCAB)], sampling)  # (V, V)
    pairs = list(itertools.product(range(VOCAB), repeat=2))
    p3 = next_token_probabilities(target, pairs, sampling).view(VOCAB, VOCAB, VOCAB)  # (V, V, V)
    return p1[:, None, None] * p2[:, :, None] * p3


def chi_square_p_value(counts: torch.Tensor, probabilities: torch.Tensor) -> float:
    """Pearson's test of counts against probabilities; cells expecting < 5 are pooled into one."""
    expected = probabilities.flatten() * counts.sum()
    observed = counts.flatten().double()
    if observed[expected == 0].any():  # a draw the law forbids: no test needed
        return 0.0
    expected, observed = expected[expected > 0], observed[expected > 0]  # filters leave impossible cells
    small = expected < 5
    if small.any():  # pooled only when there is something to pool: an empty pool would be 0 / 0
        expected = torch.cat([expected[~small], expected[small].sum()[None]])
        observed = torch.cat([observed[~small], observed[small].sum()[None]])
    statistic = ((observed - expected) ** 2 / expected).sum()
    degrees = len(expected) - 1
    return torch.special.gammaincc(torch.tensor(degrees / 2.0), statistic / 2).item()


def greedy_oracle(runner, target):
    """`runner`, wrapped to draft the greedy continuation of what was committed so far; and the list
    the caller fills with the committed tokens."""
    committed, greedy = [], {}
    for length in (1, 2):  # the greedy next token after every possible 1- and 2-token start
        prefixes = list(itertools.product(range(VOCAB), repeat=length))
        best = next_token_probabilities(target, prefixes, 1.0).argmax(dim=-1).tolist()
        greedy.update(zip(prefixes, best))

    class Greedy(Wrapped):
        def draft(self, features, last_token):
            logits = self.runner.draft(features, last_token)
            guess = tuple(committed)
            for _ in range(BLOCK - 1):
                guess += (greedy.get(guess, 0),)
            return certain_logits(torch.tensor(guess[len(committed):]), logits.shape[-1])

    return Greedy(runner), committed


def sample_counts(generate, samples=SAMPLES):
    counts = torch.zeros(VOCAB, VOCAB, VOCAB, dtype=torch.long)
    for _ in range(samples):
        first_three = generate()
        counts[tuple(first_three)] += 1
    return counts


def test_plain_sampling_follows_the_target(target):
    generator = torch.Generator().manual_seed(1)
    runner = ModelRunner(target, max_length=len(PROMPT) + 4)
    counts = sample_counts(lambda: generate_autoregressive(
        target, PROMPT, 3, sampling=Sampling(TEMPERATURE), generator=generator, runner=runner).new_ids, SAMPLES // 2)
    assert chi_square_p_value(counts, exact_joint(target, TEMPERATURE)) > 1e-3


def test_dflash_sampling_follows_the_target(target):
    drafter = random_drafter(target, block_size=BLOCK, num_layers=1)
    generator = torch.Generator().manual_seed(2)
    runner = ModelRunner(target, drafter, max_length=len(PROMPT) + 3 + BLOCK)
    runner, committed = greedy_oracle(runner, target)
    lengths = []

    def generate():
        committed.clear()
        result = generate_dflash(target, drafter, PROMPT, 3, sampling=Sampling(TEMPERATURE), generator=generator,
                                 runner=runner, on_token=lambda token, drafted: committed.append(token))
        lengths.extend(result.acceptance_lengths)
        return result.new_ids

    counts = sample_counts(generate)
    assert sum(lengths) / len(lengths) > 1.3  # drafts were accepted often: the rule was exercised
    assert chi_square_p_value(counts, exact_joint(target, TEMPERATURE)) > 1e-3
    assert chi_square_p_value(counts, exact_joint(target, 1.25 * TEMPERATURE)) < 1e-3  # and it has power


def test_sample_draws_each_row_from_its_softmax_and_never_a_zero_probability_token():
    """`sample` itself, on rows whose law is known: inverse-CDF draws, checked by chi-square."""
    logits = torch.tensor([[2.0, 0.0, float("-inf"), 1.0, -1.0, float("-inf")],
                           [float("-inf"), 0.5, 0.5, float("-inf"), 3.0, -2.0]])  # (2, 6)
    generator = torch.Generator().manual_seed(3)
    draws = torch.stack([sample(logits[None].expand(1000, -1, -1), 0.8, generator) for _ in range(4)])  # (4, 1000, 2)
    assert draws.shape == (4, 1000, 2) and draws.dtype == torch.long
    for row in range(2):
        law = torch.softmax(logits[row].double() / 0.8, dim=-1)
        counts = torch.bincount(draws[..., row].flatten(), minlength=6)
        possible = law > 0
        assert counts[~possible].sum() == 0
        assert chi_square_p_value(counts[possible], law[possible]) > 1e-3
    flattened = torch.softmax(logits[0].double() / 2.0, dim=-1)  # a different temperature's law is refused
    counts = torch.bincount(draws[..., 0].flatten(), minlength=6)
    assert chi_square_p_value(counts[flattened > 0], flattened[flattened > 0]) < 1e-3
    assert sample(logits, 0.0).tolist() == [0, 4]


QWEN3_VOCAB = 151_936


def qwen3_sized_logits(rows: int, seed: int = 0) -> torch.Tensor:
    """Logits (rows, 151,936) shaped like a language model's: a few likely tokens over a long tail."""
    logits = torch.randn(rows, QWEN3_VOCAB, generator=torch.Generator().manual_seed(seed)) * 3
    logits[:, :5] += 12
    return logits


def test_at_qwen3s_vocabulary_the_probabilities_are_the_float64_softmaxs():
    """`Sampling.probs` at Qwen3's vocabulary and temperatures 0.6 and 1: each probability within a relative 1e-5 of
    the float64 softmax of the same logits (float32 logits carry no more), summing to 1 in float64."""
    logits = qwen3_sized_logits(2)
    for temperature in (0.6, 1.0):
        exact = torch.softmax(logits.double() / temperature, dim=-1)  # (2, vocab)
        probs = Sampling(temperature).probs(logits)
        assert probs.dtype == torch.float64
        assert torch.allclose(probs, exact, rtol=1e-5, atol=0.0)
        assert (probs.sum(-1) - 1).abs().max() < 1e-12


def test_at_qwen3s_vocabulary_every_tail_token_keeps_its_share_of_the_draws(monkeypatch):
    """The running sum `draw` searches is float64: a uniform draw in the middle of a token's interval picks it, for
    the 200 least likely tokens too (about 1e-9 each). A float32 running sum over 151,936 tokens rounds most such
    intervals to nothing, which the same probe sees."""
    probs = Sampling(1.0).probs(qwen3_sized_logits(1))[0]  # (vocab,)
    ends = probs.cumsum(dim=0)  # (vocab,): where each token's interval ends, float64
    tail = probs.argsort()[:200]  # the least likely tokens
    middles = (ends[tail] - probs[tail] / 2) / ends[-1]  # (200,): the middle of each tail token's interval, in [0, 1)
    picked = {}
    for precision in (torch.float64, torch.float32):
        picks = []
        for middle in middles:
            monkeypatch.setattr(torch, "rand", lambda size, u=middle, **like: u.to(like["dtype"]).expand(size))
            picks.append(draw(probs.to(precision), None).item())
        picked[precision] = picks
    assert picked[torch.float64] == tail.tolist()
    assert sum(a != b for a, b in zip(picked[torch.float32], tail.tolist())) > 100  # the probe has power


# ---------------------------------------------------------- filters and draft policies


def test_filters_keep_what_transformers_keeps_top_k_then_top_p_then_min_p():
    """Hand-computed cases; top-p is taken on what top-k left, renormalised, as transformers' warpers do."""
    probs = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05], dtype=torch.float64)
    logits = probs.log()

    def kept(**filters):
        return (Sampling(1.0, **filters).probs(logits) > 0).nonzero().flatten().tolist()

    assert kept(top_k=2) == [0, 1]
    assert kept(top_p=0.8) == [0, 1, 2]  # 0.5 + 0.2 < 0.8, so the third is needed to pass 0.8
    assert kept(top_p=0.45) == [0]  # the likeliest token alone passes 0.45
    assert kept(min_p=0.25) == [0, 1, 2]  # at least a quarter of 0.5
    assert kept(top_k=3, top_p=0.8) == [0, 1]  # after top-k: 0.59 + 0.24 = 0.82 already passes 0.8
    assert torch.allclose(Sampling(1.0, top_k=2).probs(logits), torch.tensor([5 / 7, 2 / 7, 0, 0, 0]).double())
    assert torch.allclose(Sampling(2.0).probs(logits), torch.softmax(logits / 2, dim=-1))


def full_sort_nucleus(probs, top_p):
    """Top-p the textbook way: rank the whole vocabulary, keep while the mass ranked above is under top_p."""
    ranked, order = probs.sort(dim=-1, descending=True)  # (..., vocab) each
    likelier = ranked.cumsum(dim=-1) - ranked
    return torch.zeros_like(probs).scatter(-1, order, ranked.where(likelier < top_p * ranked.sum(-1, keepdim=True), 0))


@pytest.mark.parametrize("top_p", [0.5, 0.9])
def test_top_p_ranks_a_prefix_yet_keeps_what_a_full_sort_keeps(top_p):
    """`Sampling.nucleus` ranks only the likeliest 64, 256, ... tokens; over 5,000 tokens, rows whose nuclei hold from
    1 to 3,905 tokens keep exactly what the full sort keeps, after top-k too; tied probabilities keep as many."""
    generator = torch.Generator().manual_seed(0)
    spread = torch.tensor([[6.0], [3.0], [1.5], [0.5]], dtype=torch.float64)
    probs = torch.softmax(torch.randn(4, 5000, generator=generator, dtype=torch.float64) * spread, dim=-1)
    expected = full_sort_nucleus(probs, top_p)
    assert (expected > 0).sum(-1).max() > 4 * 256  # the prefix grows at least three times
    assert torch.equal(Sampling(1.0, top_p=top_p).nucleus(probs), expected)
    after_top_k = probs.where(probs >= probs.topk(300, dim=-1).values[:, -1:], 0.0)  # what top-k 300 leaves
    assert torch.equal(Sampling(1.0, top_k=300, top_p=top_p).nucleus(after_top_k), full_sort_nucleus(after_top_k, top_p))
    ties = torch.full((2, 1000), 1e-3, dtype=torch.float64)  # which tied tokens are kept is arbitrary; how many is not
    assert torch.equal((Sampling(1.0, top_p=top_p).nucleus(ties) > 0).sum(-1),
                       (full_sort_nucleus(ties, top_p) > 0).sum(-1))


@pytest.mark.parametrize("filters", [{}, {"top_k": 3, "top_p": 0.9}], ids=["softmax", "top-k 3, top-p 0.9"])
@pytest.mark.parametrize("policy", ["greedy", "sampled", "mixed:1"])
def test_every_draft_policy_follows_the_filtered_target(target, policy, filters):
    """The first three tokens of DFlash, drafting as `policy` says, against the exact filtered law."""
    sampling = Sampling(TEMPERATURE, **filters)
    drafter = random_drafter(target, block_size=BLOCK, num_layers=1)
    generator = torch.Generator().manual_seed(4)
    runner = ModelRunner(target, drafter, max_length=len(PROMPT) + 3 + BLOCK)
    lengths = []

    def generate():
        result = generate_dflash(target, drafter, PROMPT, 3, sampling=sampling, draft_policy=policy,
                                 generator=generator, runner=runner)
        lengths.extend(result.acceptance_lengths)
        return result.new_ids

    counts = sample_counts(generate)
    assert sum(lengths) / len(lengths) > 1.15  # drafts were kept: the rule was exercised
    assert chi_square_p_value(counts, exact_joint(target, sampling)) > 1e-3
    if filters:  # and the test tells the filtered law from the bare softmax
        assert chi_square_p_value(counts, exact_joint(target, TEMPERATURE)) < 1e-3


def test_the_q_rule_on_argmax_drafts_is_biased_and_the_test_sees_it(target):
    """The control: judging argmax drafts by min(1, p/q) (the drafts were not drawn from q) is wrong."""
    sampling = Sampling(TEMPERATURE)
    drafter = random_drafter(target, block_size=BLOCK, num_layers=1)
    generator = torch.Generator().manual_seed(4)
    runner = ModelRunner(target, drafter, max_length=len(PROMPT) + 3 + BLOCK)

    class ArgmaxDrafts(Wrapped):
        def draft_sampled(self, *args):
            drafts, draft_probs = self.runner.draft_sampled(*args)
            return draft_probs.argmax(dim=-1), draft_probs  # the likeliest token, still judged against q

    runner = ArgmaxDrafts(runner)
    counts = sample_counts(lambda: generate_dflash(target, drafter, PROMPT, 3, sampling=sampling,
                                                   draft_policy="sampled", generator=generator, runner=runner).new_ids)
    assert chi_square_p_value(counts, exact_joint(target, sampling)) < 1e-3


BAD_SAMPLING = {
    "top-p above 1": ["--temperature", "0.7", "--top-p", "1.5"],
    "top-p zero": ["--temperature", "0.7", "--top-p", "0"],
    "negative top-k": ["--temperature", "0.7", "--top-k", "-1"],
    "negative min-p": ["--temperature", "0.7", "--min-p", "-0.1"],
    "sampled drafts at temperature 0": ["--draft-policy", "sampled"],
    "mixed past the block": ["--temperature", "0.7", "--draft-policy", "mixed:16"],
    "unknown policy": ["--temperature", "0.7", "--draft-policy", "typical"],
    "a tree of sampled drafts": ["--temperature", "0.7", "--draft-policy", "sampled", "--tree", "4"],
}


@pytest.mark.parametrize("case", BAD_SAMPLING)
def test_bad_sampling_options_are_one_error_line_and_exit_2(case, capsys):
    import generate

    pair = ["--model", "tests/fixtures/qwen3-tiny-sharded", "--draft", "tests/fixtures/dflash-tiny"]
    code = generate.main([*pair, "--prompt-ids", "1,2", "--max-new-tokens", "4", *BAD_SAMPLING[case]])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), lines


def test_sample_from_config_reads_what_the_checkpoint_recommends(tmp_path):
    from argparse import Namespace

    (tmp_path / "generation_config.json").write_text('{"do_sample": true, "temperature": 0.6, "top_k": 20, '
                                                     '"top_p": 0.95}')
    args = Namespace(sample_from_config=True)
    assert sampling_of(args, tmp_path) == Sampling(0.6, 20, 0.95)
    (tmp_path / "generation_config.json").write_text('{"do_sample": false, "temperature": 0.6}')
    assert sampling_of(args, tmp_path).greedy


@pytest.mark.parametrize("temperature", [1e-39, 1e-46, 1e-320])
def test_a_temperature_too_small_to_divide_by_is_greedy(temperature):
    """Bug: logits / 1e-39 overflow float32, and 1e-46 is float32's 0: NaN probabilities, every
    token id the last one."""
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(0)) * 10
    sampling = Sampling(temperature)
    assert sampling.greedy and sampling.temperature == 0.0
    drawn = sample(logits, temperature, torch.Generator().manual_seed(1))
    assert drawn.tolist() == logits.argmax(-1).tolist()


def test_generate_at_a_temperature_that_underflows_gives_the_greedy_output(capsys):
    import json

    import generate

    pair = ["--model", "tests/fixtures/qwen3-tiny-sharded", "--draft", "tests/fixtures/dflash-tiny",
            "--device", "cpu", "--prompt-ids", "1,2,3", "--max-new-tokens", "6", "--json"]
    outputs = []
    for temperature in ("0", "1e-39", "1e-320"):
        assert generate.main([*pair, "--temperature", temperature]) == 0
        outputs.append(json.loads(capsys.readouterr().out)["output_ids"])
    assert outputs[1] == outputs[2] == outputs[0]
    assert "counts as 0" in " ".join(generate.build_parser().format_help().split())


def test_an_option_given_explicitly_wins_over_the_generation_config():
    """Bug: `--sample-from-config --temperature 0.3` sampled at the config's 0.7."""
    import generate

    def sampling(*options: str) -> Sampling:
        model = "weights/tiny-qwen3"  # do_sample, temperature 0.7, top_k 20, top_p 0.8
        return sampling_of(generate.build_parser().parse_args(list(options)), model)

    assert sampling("--sample-from-config") == Sampling(0.7, 20, 0.8)
    assert sampling("--sample-from-config", "--temperature", "0.3") == Sampling(0.3, 20, 0.8)
    assert sampling("--sample-from-config", "--top-k", "0", "--top-p", "1") == Sampling(0.7)
    assert sampling("--top-k", "5") == Sampling(0.0, 5)
    assert "wins over the file's value" in " ".join(generate.build_parser().format_help().split())


def test_an_unknown_draft_policy_is_called_unknown(capsys):
    """Bug: `--draft-policy foo` at temperature 0 said the policy "samples drafts", not that it is
    unknown."""
    import generate

    from dflash.cli import UsageError
    from dflash.sampling import sampled_slots

    code = generate.main(["--prompt-ids", "1", "--draft-policy", "foo"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and lines == ["error: argument --draft-policy: unknown draft policy 'foo' "
                                   "(greedy, sampled or mixed:K with K >= 1)"]
    with pytest.raises(UsageError, match="draft policy must be greedy, sampled or mixed:K"):
        sampled_slots("foo", 8, Sampling())
