"""Generate text with a Qwen3 target, alone or sped up by a DFlash drafter.

Two loops share everything but their inner step:

- `generate_autoregressive`: one target forward pass per new token.
- `generate_dflash`: the drafter guesses a whole block of tokens in one pass, the
  target checks the block in one pass, and every guess up to the first wrong one is
  kept, plus the target's own token at that point (the "bonus"). A step therefore
  commits between 1 and `block_size` tokens for one target pass.

Reading order: sampling, the result type, the fixed-shape steps (with their caches),
the two loops, and the command line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch

from dflash.drafter import Drafter
from dflash.qwen3 import CheckpointError, Qwen3
from dflash.tokenizer import TokenizerError, load_tokenizer

WEIGHTS = Path(__file__).parent / "weights"
OnToken = Callable[[int, bool], None]  # (token id, came from an accepted draft)


# ------------------------------------------------------------------------- sampling


def sample(logits: torch.Tensor, temperature: float = 0.0, generator: torch.Generator | None = None) -> torch.Tensor:
    """Pick one token per row of logits (..., vocab) -> (...): argmax at temperature 0, else softmax(logits / T).

    Both loops call this one function, so the speculative loop samples from exactly
    the distribution the plain loop samples from.
    """
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    rows = probs.reshape(-1, probs.shape[-1])  # (rows, vocab): multinomial wants 2-D
    picks = torch.multinomial(rows, 1, generator=generator)  # (rows, 1)
    return picks.view(probs.shape[:-1])  # (...)


# ---------------------------------------------------------------------- the result


@dataclass
class Generation:
    """What one call produced and how fast. `seconds` covers prefill and decoding, not compilation."""

    new_ids: list[int]
    acceptance_lengths: list[int]  # tokens committed per target pass after the prefill
    seconds: float

    @property
    def new_tokens(self) -> int:
        return len(self.new_ids)

    @property
    def steps(self) -> int:
        return len(self.acceptance_lengths)

    @property
    def mean_acceptance(self) -> float:
        """tau: the mean number of tokens one verification pass commits (1.0 without a drafter)."""
        return sum(self.acceptance_lengths) / self.steps if self.steps else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    def histogram(self, block_size: int) -> list[int]:
        """How many steps committed 1, 2, ..., block_size tokens."""
        return [self.acceptance_lengths.count(length) for length in range(1, block_size + 1)]


class Output:
    """The committed new tokens: at most `limit`, and nothing after the first stop token (which is kept)."""

    def __init__(self, limit: int, stop_ids: Sequence[int], on_token: OnToken | None):
        self.limit, self.stop_ids, self.on_token = limit, set(stop_ids), on_token
        self.ids: list[int] = []
        self.stopped = False

    @property
    def full(self) -> bool:
        return len(self.ids) == self.limit

    def commit(self, tokens: list[int], drafted: list[bool]) -> None:
        for token, from_draft in zip(tokens, drafted):
            if self.stopped or self.full:
                return
            self.ids.append(token)
            if self.on_token is not None:
                self.on_token(token, from_draft)
            self.stopped = token in self.stop_ids


# ------------------------------------------------------------------ the fixed steps


class Steps:
    """The caches and the forward passes of both loops, built once and reusable across calls.

    After the prefill, every step has a shape that does not depend on where in the
    sequence it runs: one token (decode), one block (verify), one block plus one block
    of context (draft). Positions travel as tensors, so each compiled step compiles
    once, whatever the prompt length or the acceptance pattern. Compiled steps read the
    whole cache buffer (a fixed shape; masking by position hides the slots ahead);
    eager steps read only the filled prefix, which is less work.
    """

    def __init__(self, target: Qwen3, drafter: Drafter | None = None, *, max_length: int,
                 block_size: int | None = None, compile: bool = False, backend="inductor", mode: str | None = None):
        self.target, self.drafter, self.max_length = target, drafter, max_length
        self.block_size = block_size or (drafter.config.block_size if drafter is not None else 1)
        device = target.embed_tokens.weight.device
        self.target_cache = target.new_cache(max_length)
        self.drafter_cache = drafter.new_cache(max_length) if drafter is not None else None
        self.layer_ids = tuple(drafter.config.target_layer_ids) if drafter is not None else ()
        self.mask_token_id = drafter.config.mask_token_id if drafter is not None else 0
        self.block_offsets = torch.arange(self.block_size, device=device)
        self.block_ids = torch.zeros(1, self.block_size, dtype=torch.long, device=device)  # reused every step
        self.compiled = compile
        if compile:
            self.mark_caches_static()
            fixed = lambda fn: torch.compile(fn, backend=backend, mode=mode, fullgraph=True)  # noqa: E731
        else:
            fixed = lambda fn: fn  # noqa: E731
        self.decode_step = fixed(self.decode_forward)
        self.verify_step = fixed(self.verify_forward)
        self.draft_step = fixed(self.draft_forward)

    def mark_caches_static(self) -> None:
        """Tell the compiler the cache buffers never move, so CUDA graphs can write into them."""
        for cache in (self.target_cache, self.drafter_cache):
            for tensor in ([] if cache is None else cache.keys + cache.values):
                torch._dynamo.mark_static_address(tensor)

    def keys_to_read(self, end: int) -> int | None:
        """How many cache slots attention reads: all of them when compiled (None), else the filled `end`."""
        return None if self.compiled else end

    # The three forward passes. Only tensors vary between calls.

    def decode_forward(self, token, position, num_keys):
        return self.target(token, position, self.target_cache, num_keys)[:, -1]  # (1, vocab)

    def verify_forward(self, block_ids, positions, num_keys):
        logits, features = self.target(block_ids, positions, self.target_cache, num_keys,
                                       capture_layers=self.layer_ids)
        return logits[0], features  # (block, vocab), (1, block, n_layers * hidden)

    def draft_forward(self, context_features, context_positions, block_ids, block_positions, num_keys):
        hidden = self.drafter(context_features, self.target.embed_tokens(block_ids), context_positions,
                              block_positions, cache=self.drafter_cache, num_keys=num_keys)
        return self.target.logits(hidden[0, 1:]).argmax(dim=-1)  # (block - 1,): the drafter drafts greedily

    # What the loops call.

    def prefill(self, prompt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run the prompt (1, n) through the target, eagerly (its shape changes with every prompt)."""
        n = prompt.shape[1]
        positions = torch.arange(n, device=prompt.device)
        self.target_cache.trim(0)
        out = self.target(prompt, positions, self.target_cache, n, capture_layers=self.layer_ids,
                          logits_at=slice(n - 1, n))
        logits, features = out if self.layer_ids else (out, None)
        self.target_cache.trim(n)
        return logits[:, -1], features  # (1, vocab), (1, n, n_layers * hidden) or None

    def decode(self, token: torch.Tensor, position: int) -> torch.Tensor:
        """Logits (1, vocab) after the token (1,) at `position`."""
        logits = self.decode_step(token.view(1, 1), self.block_offsets[:1] + position,
                                  self.keys_to_read(position + 1))
        self.target_cache.trim(position + 1)
        return logits

    def draft(self, context_features: torch.Tensor, context_start: int, last_token: torch.Tensor,
              start: int) -> torch.Tensor:
        """Guess the block after `last_token` (at position `start`): (block - 1,) token ids.

        `context_features` (1, ctx, F) are the target's features from `context_start`
        on that the drafter has not seen. After the first step they are always the
        previous verify pass's block: its rejected tail lies at slots the new block
        overwrites, so the drafter never sees it. That keeps the shape fixed; only the
        prompt's features (any length) go through the eager pass.
        """
        self.block_ids[0, 0] = last_token
        self.block_ids[0, 1:] = self.mask_token_id
        context_positions = torch.arange(context_features.shape[1], device=self.block_ids.device) + context_start
        block_positions = self.block_offsets + start
        fixed = context_features.shape[1] == self.block_size
        step = self.draft_step if fixed else self.draft_forward
        num_keys = self.keys_to_read(start + self.block_size) if fixed else start + self.block_size
        drafts = step(context_features, context_positions, self.block_ids, block_positions, num_keys)
        self.drafter_cache.trim(start)
        return drafts

    def verify(self, drafts: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Target logits (block, vocab) and features (1, block, F) for [last token, drafts] at `start`."""
        self.block_ids[0, 1:] = drafts
        return self.verify_step(self.block_ids, self.block_offsets + start, self.keys_to_read(start + self.block_size))

    def check_room(self, prompt_length: int, max_new_tokens: int) -> None:
        """The last verify block may reach `block_size` slots past the last new token."""
        needed = prompt_length + max_new_tokens + self.block_size
        if needed > self.max_length:
            raise ValueError(f"prompt ({prompt_length}) + max_new_tokens ({max_new_tokens}) + block "
                             f"({self.block_size}) needs {needed} cache slots, the cache has {self.max_length}")


# ------------------------------------------------------------------------ the loops


def check_request(target: Qwen3, prompt_ids: Sequence[int], max_new_tokens: int, temperature: float) -> None:
    """Refuse, with one line, a request the model cannot serve."""
    if len(prompt_ids) == 0:
        raise ValueError("the prompt is empty")
    if max_new_tokens <= 0:
        raise ValueError(f"max_new_tokens must be positive, got {max_new_tokens}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    vocab, limit = target.config.vocab_size, target.config.max_position_embeddings
    outside = [token for token in prompt_ids if not 0 <= token < vocab]
    if outside:
        raise ValueError(f"prompt token id {outside[0]} is outside the vocabulary (0..{vocab - 1})")
    if len(prompt_ids) + max_new_tokens > limit:
        raise ValueError(f"prompt ({len(prompt_ids)} tokens) + max_new_tokens ({max_new_tokens}) exceeds "
                         f"the model's max_position_embeddings ({limit})")


def check_block_size(drafter: Drafter, block_size: int) -> None:
    if not 2 <= block_size <= drafter.config.block_size:
        raise ValueError(f"block size must be between 2 and the drafter's {drafter.config.block_size}, "
                         f"got {block_size}")


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so the clock measures the work and not its launch."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def generate_autoregressive(target: Qwen3, prompt_ids: Sequence[int], max_new_tokens: int, *,
                            temperature: float = 0.0, stop_ids: Sequence[int] = (),
                            generator: torch.Generator | None = None, on_token: OnToken | None = None,
                            steps: Steps | None = None) -> Generation:
    """The baseline: prefill the prompt, then one target pass per new token."""
    check_request(target, prompt_ids, max_new_tokens, temperature)
    device = target.embed_tokens.weight.device
    steps = steps or Steps(target, max_length=len(prompt_ids) + max_new_tokens + 1)
    steps.check_room(len(prompt_ids), max_new_tokens)
    output = Output(max_new_tokens, stop_ids, on_token)
    synchronize(device)
    began = time.perf_counter()
    prompt = torch.tensor([list(prompt_ids)], device=device)  # (1, n)
    logits, _ = steps.prefill(prompt)
    token = sample(logits[0], temperature, generator)  # ()
    output.commit([token.item()], [False])
    position = len(prompt_ids)
    while not (output.stopped or output.full):
        token = sample(steps.decode(token, position)[0], temperature, generator)
        output.commit([token.item()], [False])
        position += 1
    synchronize(device)
    return Generation(output.ids, [1] * len(output.ids), time.perf_counter() - began)


@torch.no_grad()
def generate_dflash(target: Qwen3, drafter: Drafter, prompt_ids: Sequence[int], max_new_tokens: int, *,
                    block_size: int | None = None, temperature: float = 0.0, stop_ids: Sequence[int] = (),
                    generator: torch.Generator | None = None, on_token: OnToken | None = None,
                    steps: Steps | None = None) -> Generation:
    """Speculative decoding with a DFlash drafter: draft a block, verify it, keep the agreeing prefix.

    A draft is kept exactly when it equals the token the target itself samples at
    that slot. That is rejection sampling with a one-hot draft distribution
    (accept with probability p_target(draft)), and the bonus token is the target's own
    sample, so every committed token follows the target's distribution: the output is
    distributed exactly as `generate_autoregressive`'s, and equal to it at temperature 0.
    """
    check_request(target, prompt_ids, max_new_tokens, temperature)
    block_size = block_size or (steps.block_size if steps else drafter.config.block_size)
    check_block_size(drafter, block_size)
    n, device = len(prompt_ids), target.embed_tokens.weight.device
    steps = steps or Steps(target, drafter, max_length=n + max_new_tokens + block_size, block_size=block_size)
    if steps.block_size != block_size:
        raise ValueError(f"block size {block_size} differs from the steps' {steps.block_size}")
    steps.check_room(n, max_new_tokens)
    output = Output(max_new_tokens, stop_ids, on_token)
    synchronize(device)
    began = time.perf_counter()
    prompt = torch.tensor([list(prompt_ids)], device=device)  # (1, n)
    logits, context = steps.prefill(prompt)
    last = sample(logits[0], temperature, generator)  # (): the token at `start`, committed but not yet verified
    output.commit([last.item()], [False])
    start, context_start, acceptance_lengths = n, 0, []
    while start < n + max_new_tokens and not output.stopped:  # as the authors' loop
        drafts = steps.draft(context, context_start, last, start)  # (block - 1,)
        logits, context = steps.verify(drafts, start)  # (block, vocab), (1, block, F)
        target_tokens = sample(logits, temperature, generator)  # (block,): the target's token after each slot
        accepted = int((drafts == target_tokens[:-1]).cumprod(dim=0).sum())  # longest agreeing prefix
        last = target_tokens[accepted]
        output.commit(drafts[:accepted].tolist() + [last.item()], [True] * accepted + [False])
        acceptance_lengths.append(accepted + 1)
        context_start, start = start, start + accepted + 1
        steps.target_cache.trim(start)  # O(1): the rejected tail is masked, then overwritten
    synchronize(device)
    return Generation(output.ids, acceptance_lengths, time.perf_counter() - began)


# ------------------------------------------------------------------ the command line


EXAMPLES = """\
examples:
  python generate.py --prompt "def fibonacci(n):"
  python generate.py --prompt "def fibonacci(n):" --compare
  python generate.py --prompt "Explain KV caches." --chat --temperature 0.7 --seed 0
  python generate.py --prompt-ids 1,2,3 --model tests/fixtures/qwen3-tiny-sharded \\
      --draft tests/fixtures/dflash-tiny --json

On a terminal, tokens that came from accepted drafts are green, the target's own
tokens are in the default colour. --json prints one object: output_ids (the new
tokens only), text, acceptance_lengths, mean_acceptance, tokens_per_second,
new_tokens, steps (and with --compare baseline_output_ids,
baseline_tokens_per_second, speedup). Bad input exits with status 2.
"""


class OneLineErrors(argparse.ArgumentParser):
    """argparse, but a bad argument is one `error:` line (no usage dump), exit status 2."""

    def error(self, message: str):
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    p = OneLineErrors(description="Generate with a Qwen3 target, sped up by a DFlash drafter.",
                      epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompt", help="the prompt text")
    p.add_argument("--prompt-ids", help="the prompt as token ids, e.g. 1,2,3 (needs no tokenizer)")
    p.add_argument("--model", type=Path, default=WEIGHTS / "tiny-qwen3", help="target checkpoint folder")
    p.add_argument("--draft", type=Path, default=WEIGHTS / "tiny-qwen3-dflash", help="drafter checkpoint folder")
    p.add_argument("--no-draft", action="store_true", help="plain autoregressive decoding only")
    p.add_argument("--compare", action="store_true", help="run the baseline, then DFlash, and report the speedup")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--block-size", type=int, help="tokens per draft block (2..the drafter's; default the drafter's)")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:1...")
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto",
                   help="auto: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="torch.compile the fixed-shape steps (default: on for CUDA, off for CPU)")
    p.add_argument("--chat", action="store_true", default=None,
                   help="wrap the prompt in the chat template (default: when the tokenizer has one)")
    p.add_argument("--raw", dest="chat", action="store_false", help="feed the prompt as it is")
    p.add_argument("--thinking", action="store_true", help="let a chat model think first")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the text")
    return p


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"unknown device {name!r} (use cpu, cuda or auto)") from None
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device {name!r} is not supported (use cpu, cuda or auto)")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available")
    return device


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


def parse_prompt_ids(text: str) -> list[int]:
    try:
        return [int(piece) for piece in text.split(",") if piece.strip()]
    except ValueError:
        raise ValueError(f"--prompt-ids must be comma-separated integers, got {text!r}") from None


def load_text_tokenizer(folder: Path):
    """The target's tokenizer, or None when the folder has none (fine with --prompt-ids)."""
    if not any((folder / name).exists() for name in ("tokenizer.json", "tokenizer.json.xz")):
        return None
    return load_tokenizer(folder)


def model_stop_ids(folder: Path, tokenizer) -> list[int]:
    """End-of-sequence ids: the tokenizer's, or without one those of generation_config.json."""
    if tokenizer is not None:
        return list(tokenizer.stop_token_ids)
    config = folder / "generation_config.json"
    eos = json.loads(config.read_text()).get("eos_token_id") if config.exists() else None
    return [eos] if isinstance(eos, int) else list(eos or [])


def encode_prompt(args, tokenizer) -> list[int]:
    if args.prompt_ids is not None:
        return parse_prompt_ids(args.prompt_ids)
    if args.prompt is None:
        raise ValueError("give a prompt with --prompt TEXT or --prompt-ids 1,2,3")
    if tokenizer is None:
        raise ValueError(f"{args.model}: no tokenizer.json, so pass the prompt as --prompt-ids")
    chat = tokenizer.has_chat_template if args.chat is None else args.chat  # a raw code model has none
    if chat:
        messages = [{"role": "user", "content": args.prompt}]
        return tokenizer.encode_chat(messages, add_generation_prompt=True, enable_thinking=args.thinking)
    return tokenizer.encode(args.prompt)


class Printer:
    """Streams committed tokens as text; on a terminal, accepted drafts are green.

    Each token's text is the growth of the decoded whole, so a character split over
    several tokens appears once it is complete. Without a tokenizer it prints the ids.
    """

    GREEN, RESET = "\033[32m", "\033[0m"

    def __init__(self, tokenizer, colour: bool):
        self.tokenizer, self.colour = tokenizer, colour
        self.ids: list[int] = []
        self.shown = ""

    def __call__(self, token: int, drafted: bool) -> None:
        self.ids.append(token)
        if self.tokenizer is None:
            piece = f"{token} "
        else:
            text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
            if text.endswith("\ufffd"):  # an unfinished multi-byte character: wait for the rest
                return
            piece, self.shown = text[len(self.shown):], text
        if self.colour and drafted:
            piece = self.GREEN + piece + self.RESET
        sys.stdout.write(piece)
        sys.stdout.flush()


def summary(name: str, result: Generation, block_size: int | None) -> str:
    line = f"{name}: {result.new_tokens} new tokens in {result.seconds:.2f} s, {result.tokens_per_second:.1f} tokens/s"
    if block_size:
        line += (f", {result.steps} steps, tau {result.mean_acceptance:.2f}, "
                 f"acceptance histogram (1..{block_size}) {result.histogram(block_size)}")
    return line


def run(args) -> int:
    device = pick_device(args.device)
    dtype = pick_dtype(args.dtype, device)
    use_draft = not args.no_draft or args.compare
    if args.max_new_tokens <= 0:
        raise ValueError(f"--max-new-tokens must be positive, got {args.max_new_tokens}")
    if args.temperature < 0:
        raise ValueError(f"--temperature must be >= 0, got {args.temperature}")
    target = Qwen3.from_pretrained(args.model, device=device, dtype=dtype)
    drafter = Drafter.from_pretrained(args.draft, target=target, device=device, dtype=dtype) if use_draft else None
    tokenizer = load_text_tokenizer(args.model)
    prompt_ids = encode_prompt(args, tokenizer)
    check_request(target, prompt_ids, args.max_new_tokens, args.temperature)
    block_size = None
    if drafter is not None:
        block_size = args.block_size or drafter.config.block_size
        check_block_size(drafter, block_size)
    compile = device.type == "cuda" if args.compile is None else args.compile
    steps = Steps(target, drafter, max_length=len(prompt_ids) + args.max_new_tokens + (block_size or 1),
                  block_size=block_size, compile=compile, mode="reduce-overhead" if device.type == "cuda" else None)
    stop_ids = model_stop_ids(args.model, tokenizer)
    options = dict(temperature=args.temperature, stop_ids=stop_ids, steps=steps)

    def baseline(on_token=None, max_new_tokens=args.max_new_tokens):
        generator = torch.Generator(device).manual_seed(args.seed)
        return generate_autoregressive(target, prompt_ids, max_new_tokens, generator=generator,
                                       on_token=on_token, **options)

    def dflash(on_token=None, max_new_tokens=args.max_new_tokens):
        generator = torch.Generator(device).manual_seed(args.seed)
        return generate_dflash(target, drafter, prompt_ids, max_new_tokens, block_size=block_size,
                               generator=generator, on_token=on_token, **options)

    loops = ([baseline] if args.compare or drafter is None else []) + ([dflash] if drafter is not None else [])
    conditions = f"device {device}, {str(dtype).removeprefix('torch.')}, batch 1, compile {'on' if compile else 'off'}"
    if compile:  # compile (and record CUDA graphs) on a short run, timed apart from generation
        began = time.perf_counter()
        for loop in loops:
            loop(max_new_tokens=min(args.max_new_tokens, 4 * (block_size or 1) + 4))
        conditions += f", warm-up {time.perf_counter() - began:.1f} s"
    colour = sys.stdout.isatty() and not args.json
    results = {}
    for loop in loops:
        printer = None if args.json else Printer(tokenizer, colour)
        if printer is not None and args.compare:
            print(f"--- {'DFlash' if loop is dflash else 'baseline'}")
        results[loop] = loop(on_token=printer)
        if printer is not None:
            print()
    final = results[loops[-1]]
    if args.json:
        report = {
            "output_ids": final.new_ids,
            "text": tokenizer.decode(final.new_ids, skip_special_tokens=True) if tokenizer is not None else "",
            "acceptance_lengths": final.acceptance_lengths,
            "mean_acceptance": final.mean_acceptance,
            "tokens_per_second": final.tokens_per_second,
            "new_tokens": final.new_tokens,
            "steps": final.steps,
        }
        if args.compare:
            report["baseline_output_ids"] = results[baseline].new_ids
            report["baseline_tokens_per_second"] = results[baseline].tokens_per_second
            report["speedup"] = final.tokens_per_second / max(results[baseline].tokens_per_second, 1e-9)
        print(json.dumps(report))
        return 0
    print(f"[{conditions}]", file=sys.stderr)
    for loop, result in results.items():
        name = "DFlash" if loop is dflash else "baseline"
        print(summary(name, result, block_size if loop is dflash else None), file=sys.stderr)
    if args.compare:
        speedup = final.tokens_per_second / max(results[baseline].tokens_per_second, 1e-9)
        print(f"speedup: {speedup:.2f}x", file=sys.stderr)
    return 0


def run_cli(parser: argparse.ArgumentParser, run_args, argv: Sequence[str] | None) -> int:
    """Parse, run, and turn every expected failure into one `error:` line and exit status 2."""
    args = parser.parse_args(argv)
    try:
        return run_args(args)
    except (CheckpointError, TokenizerError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
