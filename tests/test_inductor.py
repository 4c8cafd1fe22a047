"""The passes a GPU compiles, compiled here by the real compiler: inductor, generating C++ for the CPU.

The other compile tests trace the passes with a counting backend, which runs the captured
graph as eager PyTorch: they prove one graph per shape, not that the code a GPU user runs
computes the right thing. Here inductor lowers, fuses and compiles every pass with the
settings the GPU path uses (static shapes, `dynamic=False`, as `ModelRunner(compile=True)`
asks), into C++ kernels where a GPU gets Triton ones, and each is compared with the eager
pass: greedy tokens identical, logits and features within float tolerance. One runner per
shape serves every test of the module, so each pass compiles once per bucket of cache slots
read (`keys_bucket`) in the whole run.
"""

from pathlib import Path

import pytest
import torch
from torch._inductor.exc import InductorError

from dflash.drafter import Drafter
from dflash.flex_reads import filled_blocks
from dflash.qwen3 import Qwen3, masked
from dflash.sampling import Sampling
from generate import PASSES, ModelRunner, generate_autoregressive, generate_dflash, generate_dflash_tree
from tests.test_generate import oracle, prompt_of

FIXTURES = Path(__file__).parent / "fixtures"
NEW = 24
# The buffer holds the longest prompt (40), the output and the widest chunk: past 64 slots, so the passes
# of the longest prompt read a second bucket (the whole buffer, 80) and compile a second copy.
MAX_LENGTH = 80
# Accepting after every draft, never, or every other slot: the acceptance lengths vary step to step.
WRONG_AT = [lambda position: position % 3 == 0, lambda _: False, lambda position: position % 2 == 0]

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # inductor's notes on CPU fallbacks


@pytest.fixture(scope="module")
def pair():
    torch._dynamo.reset()
    target = Qwen3.from_pretrained(FIXTURES / "qwen3-tiny-sharded")
    return target, Drafter.from_pretrained(FIXTURES / "dflash-tiny", target=target)


@pytest.fixture(scope="module")
def runners(pair):
    """Inductor-compiled runners, built once: a chain's, a tree's, and one reading through FlexAttention."""
    target, drafter = pair
    options = dict(max_length=MAX_LENGTH, compile=True, backend="inductor")
    return {"chain": ModelRunner(target, drafter, **options),
            "tree": ModelRunner(target, drafter, tree_budget=6, **options),
            "flex": ModelRunner(target, drafter, flex_attention=True, **options)}


def test_greedy_chain_and_plain_loop_equal_eager(pair, runners):
    target, drafter = pair
    runner, eager_runner = runners["chain"], ModelRunner(target, drafter, max_length=MAX_LENGTH)
    lengths = set()
    for length, wrong_at in zip((5, 23, 40), WRONG_AT):
        prompt = prompt_of(length, target.config.vocab_size)
        truth = prompt + generate_autoregressive(target, prompt, NEW + runner.block_size).new_ids
        assert generate_autoregressive(target, prompt, NEW, runner=runner).new_ids == truth[length:][:NEW]
        results = []
        for each in (runner, eager_runner):  # the real draft pass runs; the oracle then sets its guesses
            guessing, _ = oracle(each, truth, wrong_at)
            results.append(generate_dflash(target, drafter, prompt, NEW, runner=guessing))
        compiled, eager = results
        assert compiled.new_ids == eager.new_ids == truth[length:][:NEW]
        assert compiled.acceptance_lengths == eager.acceptance_lengths
        lengths |= set(compiled.acceptance_lengths)
    assert len(lengths) >= 3


def test_compiled_passes_compute_the_eager_logits_and_features(pair, runners):
    """Sampled passes return logits: compare them, and the verify's features, with the eager passes'."""
    target, drafter = pair
    runner = runners["chain"]
    prompt = prompt_of(30, target.config.vocab_size)
    runner.prefill(prompt, 0.0, None)
    block = torch.tensor([prompt[:runner.block_size]])  # (1, block): any tokens
    positions = runner.block_offsets + runner.target_cache.length  # (block,)
    arguments = (target, runner.target_cache, block, positions, runner.layer_ids)
    eager_logits, eager_features = PASSES["verify"](*arguments)
    logits, features = runner.run_pass("verify", runner.target_cache, *arguments)
    torch.testing.assert_close(logits, eager_logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(features, eager_features, rtol=1e-4, atol=1e-4)
    token, position = block[:, :1], positions[:1]  # (1, 1), (1,)
    arguments = (target, runner.target_cache, token, position)
    decode_logits = runner.run_pass("decode", runner.target_cache, *arguments)
    torch.testing.assert_close(decode_logits, PASSES["decode"](*arguments), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("policy", ["greedy", "sampled"])
def test_sampled_dflash_compiled_draws_the_eager_tokens(pair, runners, policy):
    """Same seed, same draws: the compiled passes' logits are the eager ones to float rounding, far inside
    the gaps between the uniform draws and the cumulative probabilities they are compared with."""
    target, drafter = pair
    prompt = prompt_of(17, target.config.vocab_size)
    runs = []
    for runner in (runners["chain"], ModelRunner(target, drafter, max_length=MAX_LENGTH)):
        generator = torch.Generator().manual_seed(3)
        runs.append(generate_dflash(target, drafter, prompt, NEW, sampling=Sampling(0.8), draft_policy=policy,
                                    generator=generator, runner=runner))
    assert runs[0].new_ids == runs[1].new_ids
    assert runs[0].acceptance_lengths == runs[1].acceptance_lengths


def test_greedy_tree_compiled_equals_the_plain_loop(pair, runners):
    target, drafter = pair
    for length in (9, 40):
        prompt = prompt_of(length, target.config.vocab_size)
        compiled = generate_dflash_tree(target, drafter, prompt, NEW, budget=6, runner=runners["tree"])
        assert compiled.new_ids == generate_autoregressive(target, prompt, NEW).new_ids
        eager = generate_dflash_tree(target, drafter, prompt, NEW, budget=6)
        assert compiled.acceptance_lengths == eager.acceptance_lengths


def test_runners_reused_across_prompts_of_shuffled_lengths_equal_the_plain_loop(pair, runners):
    """Long, short, long, short: each prompt's eager prefill and first draft read what that prompt needs,
    not the bucket of cache slots the last compiled pass read (64 or the whole buffer, 80). In this
    module's 80 slots no prefill outgrows the first bucket; tests/test_compile.py's reuse test crosses
    buckets up to 256 (with the eager backend) and fails where the reads follow the last pass."""
    target, drafter = pair
    for length in (40, 5, 60, 9):
        prompt, new = prompt_of(length, target.config.vocab_size), min(NEW, MAX_LENGTH - 16 - length)
        plain = generate_autoregressive(target, prompt, new).new_ids
        chain = generate_dflash(target, drafter, prompt, new, runner=runners["chain"])
        tree = generate_dflash_tree(target, drafter, prompt, new, budget=6, runner=runners["tree"])
        assert chain.new_ids == tree.new_ids == plain, length
        # A draft that read too few keys is still corrected by the target: its acceptance shows it.
        eager = generate_dflash(target, drafter, prompt, new)
        assert chain.acceptance_lengths == eager.acceptance_lengths, length
        eager = generate_dflash_tree(target, drafter, prompt, new, budget=6)
        assert tree.acceptance_lengths == eager.acceptance_lengths, length


@pytest.mark.parametrize("seq, keys", [(1, 80), (8, 80), (8, 300)])
def test_flex_reads_compiled_by_inductor_equal_masked_attention(seq, keys):
    """FlexAttention's block-sparse reads (`filled_blocks`), lowered by inductor's CPU template, against SDPA.

    The mask is an input of the compiled function here: in a whole pass it is computed inside the graph,
    and inductor's CPU flex template refuses a mask_mod that reads an intermediate buffer (the next test).
    """
    generator = torch.Generator().manual_seed(seq + keys)
    q = torch.randn(1, 4, seq, 16, generator=generator)  # (batch, heads, seq, head_dim)
    k, v = (torch.randn(1, 2, keys, 16, generator=generator) for _ in range(2))  # (batch, kv_heads, keys, head_dim)
    positions = torch.arange(seq) + keys // 3  # a cache a third full: the filled blocks are the first ones
    mask = torch.arange(keys)[None, :] <= positions[:, None]  # (seq, keys)

    @torch.compile(backend="inductor", fullgraph=True, dynamic=False)
    def attend(q, k, v, mask):
        assert torch.compiler.is_compiling()
        return filled_blocks(mask)(q, k, v)

    torch.testing.assert_close(attend(q, k, v, mask), masked(mask)(q, k, v), rtol=1e-5, atol=1e-5)


@pytest.mark.xfail(raises=InductorError, strict=True,
                   reason="torch 2.13's CPU flex template needs the mask_mod's tensors to be graph inputs")
def test_flex_reads_in_a_whole_pass_do_not_lower_on_the_cpu(pair, runners):
    """On a GPU, inductor lowers the same pass to Triton; this CPU limit is recorded so that a torch that
    lifts it fails here, and the flex runner's output can then be checked against the plain loop's."""
    target, drafter = pair
    prompt = prompt_of(12, target.config.vocab_size)
    plain = generate_autoregressive(target, prompt, NEW).new_ids
    assert generate_dflash(target, drafter, prompt, NEW, runner=runners["flex"]).new_ids == plain
