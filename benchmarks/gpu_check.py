"""The GPU check: is the CUDA path correct, what ran, what does a step cost at real Qwen3 shapes?

    python benchmarks/gpu_check.py --out runs/gpu_check                # on a CUDA machine
    python benchmarks/gpu_check.py --out /tmp/gpu_smoke --cpu-smoke     # tiny sizes, on the CPU
    python benchmarks/gpu_check.py --out runs/flex --sections flex_reads,flex_costs   # the rest

A report that always comes back: the check runs in sections, each in its own try/except,
and `report.json` (with `report.md`) is rewritten after every section, so a section that
fails (its exception type and traceback are recorded) or a command killed at its time limit
still leaves every figure measured so far. `--deadline` (seconds from the start) skips the
sections left once it has passed, and says so for each. Between sections dynamo is reset
(a recompile made an error in one section cannot stop the next) and TF32 is restored.

Sections, in the default order (`--sections` picks others):
- `parity`: the fixtures' logits against the reference implementation's (float32, TF32 off).
- `lossless`: greedy DFlash equal to greedy plain decoding on the demo pair in float32, eager
  and compiled (CUDA graphs: `mode="reduce-overhead"`), recompilation made an error; on a
  mismatch, the first differing token and the gap between the target's top two logits there
  (decode and verify run different kernels, so a near-tie may flip).
- `sdpa`: every pass's q/k/v shapes, dtype and mask form at the Qwen3-8B shape (bf16), eager
  and with the fixed-shape reads compiled passes make, and which SDPA kernel torch picks.
- `host_loop`: a compiled DFlash loop at the Qwen3-8B shape; host milliseconds per step are its
  wall time minus the device time of its passes (CUDA events around each pass).
- `step_costs`: decode, verify (4, 8, 16) and draft costs at the shapes of Qwen3-0.6B, 4B
  and 8B (bf16, random weights; each pass replayed from a CUDA graph, without the compiler's
  fusion), and what they imply: tokens/s, bandwidth, verify/decode, oracle and projected speedups.
- `training`: one drafter training step at the Qwen3-8B shape and the paper's settings for one
  sequence, fast path (FlexAttention, chunked loss) and dense: first-step loss, peak, time, the
  q/k/v dtypes that reach the attention; FlexAttention's values and gradients against dense.
- `lossless_bf16`: the same as `lossless` in bfloat16, where agreement is not guaranteed.
Not in the default (the first run's time): `flex_reads` (`lossless` through FlexAttention
reads) and `flex_costs` (decode and verify 16 at the 8B shape through FlexAttention, compiled).

Every section also reports its wall time, peak memory (`max_memory_allocated` on a GPU, the
process's resident peak on the CPU), graphs compiled, compile seconds, recompiles and their
reasons, and CUDA-graph skips and their reasons (torch's own counters and compile metrics).

Expected time on one H100 or H200: an estimate scaled from the CPU, not a GPU measurement.
Graphs each section compiles, counted by `--cpu-smoke` (the demo-pair sections use the GPU
run's prompts and bucket layout; a count depends on neither the device nor the width):
`lossless` 7 (decode and verify for 2 buckets of cache slots, draft for 3), `lossless_bf16` 7,
`flex_reads` 7 (FlexAttention inside them), `host_loop` 2 (a 36-layer verify, a 5-layer draft:
one bucket at context 2048), `flex_costs` 4; `training` none on the CPU (its attention is SDPA
there), about 2 on a GPU (FlexAttention forward and backward); `parity`, `sdpa`, `step_costs`
none. Inductor's compile time per graph on this project's CPU (2 shared cores; wall about 2.5x
CPU time): 11-53 s for a demo-pair pass, 110 s for the 36-layer verify
(docs/results/gpu_check_compile_counts.md). Assuming a GPU host builds a graph in about the
CPU time measured here (7 s a demo-pair pass, 45 s a 36-layer one), the default sections take
about 15 s of start-up, then parity 3, lossless 55, sdpa 15, host_loop 60, step_costs 20,
training 100, lossless_bf16 55: 320 s, 5.5 minutes (7.5 if compiles are 1.5x slower). The
default `--deadline` of 360 s starts nothing after 6 minutes, so a run ends by then plus its
slowest section (training, about 2 minutes).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import os
import platform
import statistics
import sys
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch.overrides import TorchFunctionMode

import train
from bench_common import peak_memory, reset_peak_memory
from bench_train import SHAPES as TRAIN_SHAPES, VOCAB, projected_peak_bytes
from dflash.cli import (HelpWithDefaults, OneLineErrors, UsageError,
                        check_output, checked, non_negative, positive_int, run_cli)
from dflash.drafter import Drafter, DrafterConfig, default_target_layer_ids
from dflash.compiled import FIXED_READS, FLEX_READS
from dflash.measure import Timed
from dflash.qwen3 import KVCache, Qwen3, Qwen3Config
from dflash.train_kernels import AnchoredBlocks
from dflash.training import init_weights, optimizer_step
from generate import (ModelRunner, decode_pass, draft_pass, generate_autoregressive,
                      generate_dflash, generate_dflash_tree, verify_pass)

ROOT = Path(__file__).resolve().parents[1]

FIXTURES = ROOT / "tests" / "fixtures"
WEIGHTS = ROOT / "weights"

# Real shapes (config.json of the official checkpoints, kept in bench_train.py); the drafter: 5
# layers of the target's width.
SHAPES = {name: TRAIN_SHAPES[name.lower()] for name in ("Qwen3-0.6B", "Qwen3-4B", "Qwen3-8B")}
SMOKE_SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                   tie_word_embeddings=True)
PUBLISHED_TAU = {"GSM8K": 6.55, "MATH-500": 7.87, "HumanEval": 6.55, "MT-Bench": 4.25}  # 8B, greedy
PEAK_BANDWIDTH = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.0e12, "B200": 8.0e12,
                  "L40S": 0.864e12}  # bytes/s
DEMO_PROMPT_LENGTHS, DEMO_NEW_TOKENS = (3, 17, 60), 48  # the demo pair's: 2 buckets of cache slots
BLOCK = 16


@dataclass
class Check:
    """What every section shares: the device, the sizes of this run, one model pair at a time."""

    device: torch.device
    smoke: bool
    shapes: dict[str, dict]
    context: int  # prompt tokens before the timed passes
    repeats: int
    extra_buffer: int  # empty cache slots after the filled part
    compile_backend: str
    models: dict = field(default_factory=dict)  # shape name -> (target, drafter): the last built

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def dtype(self) -> torch.dtype:  # the real shapes': bf16 on a GPU, float32 in the CPU smoke
        return torch.bfloat16 if self.cuda else torch.float32

    @property
    def largest(self) -> tuple[str, dict]:
        return list(self.shapes.items())[-1]

    @property
    def compiled(self) -> dict:
        """How runners compile: CUDA graphs on a GPU; on the CPU, `--compile-backend` (eager)."""
        return dict(backend=self.compile_backend, mode="reduce-overhead" if self.cuda else None)

    def pair(self, name: str, shape: dict) -> tuple[Qwen3, Drafter]:
        """A random pair of this shape, kept for the next section that asks (one at a time)."""
        if name not in self.models:
            self.free()
            self.models[name] = random_pair(shape, self.device, self.dtype)
        return self.models[name]

    def free(self) -> None:
        self.models.clear()
        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()


# ------------------------------------------------------------------ what ran: the environment


def environment(device: torch.device) -> dict:
    """Versions and the device: what a reader needs to reproduce or compare the figures."""
    cuda = device.type == "cuda"
    return {"torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available()
            else None,
            "device": torch.cuda.get_device_name(device) if cuda else platform.processor() or "CPU",
            "capability": torch.cuda.get_device_capability(device) if cuda else None,
            "cpu capability": torch.backends.cpu.get_cpu_capability(),
            "threads": torch.get_num_threads(), "python": platform.python_version()}


def tf32_switches() -> dict[str, tuple[object, str, object]]:
    """Where this torch keeps its TF32 switches, with each one's full-precision value: the
    per-backend `fp32_precision` where it exists (reading the older `allow_tf32` after a mix of
    the two APIs raises there, in torch 2.13), else `allow_tf32` (an older torch on a GPU)."""
    backends = torch.backends
    if hasattr(backends.cuda.matmul, "fp32_precision"):
        return {name: (place, "fp32_precision", "ieee") for name, place in (
            ("cuda.matmul", backends.cuda.matmul), ("cudnn.conv", backends.cudnn.conv),
            ("cudnn.rnn", backends.cudnn.rnn))}
    return {"cuda.matmul.allow_tf32": (backends.cuda.matmul, "allow_tf32", False),
            "cudnn.allow_tf32": (backends.cudnn, "allow_tf32", False)}


def tf32_state() -> dict:
    state = {name: getattr(place, attribute)
             for name, (place, attribute, _) in tf32_switches().items()}
    return state | {"float32_matmul_precision": torch.get_float32_matmul_precision()}


def restore_tf32(state: dict) -> None:
    torch.set_float32_matmul_precision(state["float32_matmul_precision"])  # first: it sets matmul's
    for name, (place, attribute, _) in tf32_switches().items():
        setattr(place, attribute, state[name])


def tf32_off() -> None:
    """Float32 matmuls and convolutions in full precision: the lossless check compares argmaxes."""
    for place, attribute, full_precision in tf32_switches().values():
        setattr(place, attribute, full_precision)


# ------------------------------------------------------------- what ran: attention kernels


def sdpa_backend(q, k, v, mask, is_causal: bool, enable_gqa: bool) -> dict:
    """Which kernel `scaled_dot_product_attention` picks for these inputs (torch's own choice) and,
    on CUDA, which fused kernels would take them. A `CausalBias` mask dispatches itself: flash,
    then memory-efficient, else the math kernel over the materialized mask."""
    from torch.nn.attention.bias import CausalBias

    cuda = q.device.type == "cuda"
    if isinstance(mask, CausalBias):
        mask, is_causal = None, True  # what its own dispatch asks the fused kernels
    choice = torch._fused_sdp_choice(q, k, v, attn_mask=mask, dropout_p=0.0, is_causal=is_causal,
                                     enable_gqa=enable_gqa)
    picked = {"chosen": torch.nn.attention.SDPBackend(choice).name.lower()}
    if not cuda:
        # On the CPU the fused kernel is a C++ flash-attention loop ("flash_attention"), else math.
        return picked | {"where": "cpu"}
    params = torch.backends.cuda.SDPAParams(q, k, v, mask, 0.0, is_causal, enable_gqa)
    can_use = {kernel: getattr(torch.backends.cuda, f"can_use_{kernel}_attention", None)
               for kernel in ("flash", "efficient", "cudnn")}  # cudnn's: not in every torch
    return picked | {kernel: check(params, False) if check else None
                     for kernel, check in can_use.items()}


def dtype_name(dtype) -> str | None:
    return None if dtype is None else str(dtype).removeprefix("torch.")


def autocast_dtype(device: torch.device) -> torch.dtype | None:
    """The dtype autocast casts to on `device` right now, None when it is off."""
    on = torch.is_autocast_enabled(device.type)
    return torch.get_autocast_dtype(device.type) if on else None


def mask_form(mask, is_causal: bool) -> str:
    if mask is None:
        return "causal (is_causal)" if is_causal else "none"
    if not isinstance(mask, torch.Tensor) or type(mask) is not torch.Tensor:
        return f"{type(mask).__name__} {getattr(mask, 'variant', '')}".strip()
    return f"{str(mask.dtype).removeprefix('torch.')} {tuple(mask.shape)}"


class SdpaCalls(TorchFunctionMode):
    """Records every `scaled_dot_product_attention` call made eagerly inside it, labelled with the
    pass it belongs to (`phase`, which `Timed` sets around each of a runner's passes): one row per
    pass and form of call, with the number of keys read (which grows in an eager loop) as a range."""

    def __init__(self, unclocked: str = "prefill"):
        super().__init__()
        self.unclocked = unclocked  # what the calls outside a clocked pass are
        self.loop, self.phase, self.calls = "", unclocked, {}  # which loop, which of its passes

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            self.record(*args, **kwargs)
        return func(*args, **kwargs)

    def record(self, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
               enable_gqa=False):
        mask, keys = mask_form(attn_mask, is_causal), k.shape[2]
        key = (f"{self.loop}{self.phase}", tuple(q.shape), str(q.dtype), mask.split(" (")[0])
        if key not in self.calls:  # the kernel torch picks for the first call of this form
            autocast = autocast_dtype(q.device)
            if autocast is not None:  # SDPA runs in autocast's dtype, whatever it is handed
                q, k, v = (t.to(autocast) for t in (q, k, v))
            try:
                backend = sdpa_backend(q, k, v, attn_mask, is_causal, enable_gqa)
            except Exception as error:  # torch's private kernel choice may change: say so, go on
                backend = {"error": f"{type(error).__name__}: {error}"}
            self.calls[key] = {"pass": key[0], "q": list(q.shape), "k": list(k.shape),
                               "v": list(v.shape), "dtype": dtype_name(key[2]),
                               "autocast to": dtype_name(autocast), "mask": mask,
                               "enable_gqa": enable_gqa, "calls": 0, "keys read": [keys, keys],
                               "backend": backend}
        row = self.calls[key]
        row["calls"] += 1
        row["keys read"] = [min(row["keys read"][0], keys), max(row["keys read"][1], keys)]

    @contextlib.contextmanager
    def __call__(self, phase: str):  # `Timed` enters `with clock(phase):` around each pass
        self.phase = phase
        try:
            yield
        finally:
            self.phase = self.unclocked  # the prefill: the one pass a runner does not clock

    def table(self) -> list[dict]:
        return list(self.calls.values())


# ------------------------------------------------------- what ran: compiles, memory, time


class CudagraphSkips(logging.Handler):
    """Collects inductor's "skipping cudagraphs due to ..." messages (its `cudagraphs` log)."""

    LOGGER = "torch._inductor.cudagraph_utils.__cudagraphs"

    def __init__(self):
        super().__init__(logging.WARNING)
        self.reasons = []

    def emit(self, record):
        self.reasons.append(record.getMessage())

    def __enter__(self):
        import torch._inductor.cudagraph_utils  # noqa: F401  (creates the logger)
        logging.getLogger(self.LOGGER).addHandler(self)
        return self

    def __exit__(self, *exc):
        logging.getLogger(self.LOGGER).removeHandler(self)


class CompileWatch:
    """Dynamo's counters and compile metrics over one section: graphs, compile time, recompiles
    (and their reasons), CUDA-graph skips (and theirs)."""

    def __init__(self):
        from torch._dynamo.utils import clear_compilation_metrics, counters

        self.counters = counters
        self.before = self.snapshot()
        clear_compilation_metrics()

    def snapshot(self) -> Counter:
        return Counter({"graphs": self.counters["stats"]["unique_graphs"],
                        "cudagraph skips": self.counters["inductor"]["cudagraph_skips"]})

    def report(self, skip_reasons: list[str]) -> dict:
        from torch._dynamo.utils import get_compilation_metrics

        metrics = get_compilation_metrics()
        grown = self.snapshot()
        grown.subtract(self.before)
        names = ("co_name", "entire_frame_compile_time_s", "recompile_reason",
                 "cudagraph_skip_reason")  # a field this torch lacks reads as None
        frames = [{name: getattr(m, name, None) for name in names} for m in metrics]
        seconds = [frame["entire_frame_compile_time_s"] or 0.0 for frame in frames]
        recompiles = [frame["recompile_reason"] for frame in frames if frame["recompile_reason"]]
        skips = skip_reasons + [frame["cudagraph_skip_reason"] for frame in frames
                                if frame["cudagraph_skip_reason"]]
        return {"graphs": grown["graphs"], "frames compiled": len(frames),
                "compile seconds": sum(seconds),
                "per frame": [f"{frame['co_name']}: {t:.1f} s"
                              for frame, t in zip(frames, seconds)],
                "recompiles": len(recompiles), "recompile reasons": sorted(set(recompiles))[:5],
                "cudagraph skips": grown["cudagraph skips"],
                "cudagraph skip reasons": sorted(set(skips))[:5]}


def mebibytes(count: int | None) -> float | None:
    return None if count is None else count / 2**20


class PassClock:
    """A clock for `Timed` that times each pass on the device without waiting for it: CUDA events
    around the pass, read after the loop's own syncs; on the CPU, where passes run synchronously,
    the wall time of the pass."""

    def __init__(self, device: torch.device):
        self.device, self.spans = device, []  # (phase, start, end)

    @contextlib.contextmanager
    def __call__(self, phase: str):
        cuda = self.device.type == "cuda"
        start = torch.cuda.Event(enable_timing=True) if cuda else None
        if cuda:
            start.record()
        began = time.perf_counter()
        yield
        if cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.spans.append((phase, start, end))
        else:
            self.spans.append((phase, began, time.perf_counter()))

    def seconds(self) -> dict[str, float]:
        """Device seconds per phase, all calls added up."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        cuda, total = self.device.type == "cuda", Counter()
        for phase, start, end in self.spans:
            total[phase] += start.elapsed_time(end) / 1000 if cuda else end - start
        return dict(total)


# -------------------------------------------------------------------------- the models


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    """Parameters created inside are created in `dtype`: a bf16 model is never built in float32."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def random_pair(shape: dict, device, dtype, block_size: int = BLOCK) -> tuple[Qwen3, Drafter]:
    """A target of the given shape and a 5-layer drafter for it, random weights (std 0.02), built
    on the meta device in `dtype`, then given memory on `device`: one copy, in its final dtype."""
    config = Qwen3Config(vocab_size=VOCAB, **shape, dtype=str(dtype).removeprefix("torch."))
    drafter_layers = Qwen3Config(**{**config.__dict__, "num_hidden_layers": 5})
    layer_ids = default_target_layer_ids(config.num_hidden_layers, 5)
    drafter_config = DrafterConfig(drafter_layers, block_size, config.num_hidden_layers,
                                   config.vocab_size - 1, layer_ids)
    models = []
    for build in (lambda: Qwen3(config), lambda: Drafter(drafter_config)):
        with default_dtype(dtype), torch.device("meta"):
            model = build()
        model = model.to_empty(device=device)  # RotaryEmbedding recomputes its float32 inv_freq
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.normal_(0.0, 0.02) if parameter.dim() == 2 else parameter.fill_(1.0)
        models.append(model.eval().requires_grad_(False))
    return models[0], models[1]


def random_prompt(length: int, vocab: int, seed: int = 0) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab - 1, (length,), generator=generator).tolist()  # no mask token


# ------------------------------------------------------------------------ correctness


def logits_of(model: Qwen3, input_ids: torch.Tensor) -> torch.Tensor:
    return model.logits(model(input_ids)[0])  # (batch, seq, vocab)


def section_parity(check: Check) -> dict:
    """Largest logit difference to the reference implementation's, float32 (TF32 off)."""
    tf32_off()
    device = check.device
    target = Qwen3.from_pretrained(FIXTURES / "qwen3-tiny", device=device)
    reference = load_file(FIXTURES / "qwen3-tiny" / "reference.safetensors")
    tied = (logits_of(target, reference["input_ids"].to(device)).cpu() - reference["logits"]).abs()
    sharded = Qwen3.from_pretrained(FIXTURES / "qwen3-tiny-sharded", device=device)
    loaded = load_file(FIXTURES / "qwen3-tiny-sharded" / "loaded_reference.safetensors")
    bf16_file = (logits_of(sharded, loaded["input_ids"].to(device)).cpu() - loaded["logits"]).abs()
    tied, bf16_file = tied.max().item(), bf16_file.max().item()
    return {"qwen3-tiny max |logit diff|": tied, "qwen3-tiny-sharded max |logit diff|": bf16_file,
            "passed": max(tied, bf16_file) <= 1e-4}


@torch.no_grad()
def first_mismatch(target: Qwen3, prompt: list[int], plain: list[int], fast: list[int]):
    """Where two greedy outputs part, and how close the target's choice was there: the gap between
    its two largest logits after the common prefix (one eager pass, no cache). None: they agree."""
    index = next((i for i, (a, b) in enumerate(zip(plain, fast)) if a != b), None)
    if index is None:
        return None
    ids = torch.tensor([prompt + plain[:index]], device=target.embed_tokens.weight.device)  # (1, n)
    top = logits_of(target, ids)[0, -1].float().topk(2)
    return {"first differing new token": index, "plain": plain[index], "dflash": fast[index],
            "target's top two": top.indices.tolist(),
            "top-two logit gap": (top.values[0] - top.values[1]).item()}


def greedy_agreement(target, drafter, prompts, new_tokens: int, **runner_options) -> dict:
    """Greedy DFlash against greedy plain decoding, both through one runner: equal outputs?"""
    max_length = max(map(len, prompts)) + new_tokens + BLOCK
    runner = ModelRunner(target, drafter, max_length=max_length, block_size=BLOCK, **runner_options)
    equal, prefix, mismatches = 0, [], []
    for prompt in prompts:
        plain = generate_autoregressive(target, prompt, new_tokens, runner=runner).new_ids
        fast = generate_dflash(target, drafter, prompt, new_tokens, runner=runner).new_ids
        equal += plain == fast
        mismatch = first_mismatch(target, prompt, plain, fast)
        prefix.append(len(plain) if mismatch is None else mismatch["first differing new token"])
        if mismatch is not None:
            mismatches.append({"prompt length": len(prompt), **mismatch})
    return {"prompts": len(prompts), "identical": equal, "mismatches": mismatches,
            "mean matching prefix": sum(prefix) / new_tokens / len(prompts)}


def demo_agreement(check: Check, dtype: torch.dtype, flex_attention: bool = False,
                   eager: bool = True) -> dict:
    """The demo pair in `dtype`, eager then compiled (a recompile is an error: it would be a
    slowdown at every step), each loop against the plain one."""
    target = Qwen3.from_pretrained(WEIGHTS / "tiny-qwen3", device=check.device, dtype=dtype)
    drafter = Drafter.from_pretrained(WEIGHTS / "tiny-qwen3-dflash", target=target,
                                      device=check.device, dtype=dtype)
    vocab = target.config.vocab_size
    prompts = [random_prompt(n, vocab, seed) for seed, n in enumerate(DEMO_PROMPT_LENGTHS)]
    report = {"prompt lengths": list(DEMO_PROMPT_LENGTHS), "new tokens": DEMO_NEW_TOKENS}
    if eager:
        report["eager"] = greedy_agreement(target, drafter, prompts, DEMO_NEW_TOKENS)
    torch._dynamo.config.error_on_recompile = True  # the section runner turns it off again
    name = "compiled, flex attention" if flex_attention else "compiled"
    report[name] = greedy_agreement(target, drafter, prompts, DEMO_NEW_TOKENS, compile=True,
                                    flex_attention=flex_attention, **check.compiled)
    report["all identical"] = all(r["identical"] == r["prompts"] for r in report.values()
                                  if isinstance(r, dict))
    return report


def section_lossless(check: Check) -> dict:
    tf32_off()
    return demo_agreement(check, torch.float32)


def section_lossless_bf16(check: Check) -> dict:
    return demo_agreement(check, torch.bfloat16)


def section_flex_reads(check: Check) -> dict:
    tf32_off()
    return demo_agreement(check, torch.float32, flex_attention=True, eager=False)


# ------------------------------------------------------------- attention kernels per pass


def section_sdpa(check: Check) -> dict:
    """Each loop (plain, chain, tree) run eagerly for a few steps at the largest shape, every
    attention call recorded with the kernel torch picks: once reading the committed slots
    (eager), once a bucket of slots under a position mask (the reads of compiled passes)."""
    name, shape = check.largest
    target, drafter = check.pair(name, shape)
    prompt = random_prompt(check.context, VOCAB)
    tables = {}
    for reads in ("eager", "fixed shape"):
        runner = ModelRunner(target, drafter, max_length=check.context + 3 * BLOCK,
                             block_size=BLOCK, tree_budget=BLOCK, fixed_shape=reads == "fixed shape")
        calls = SdpaCalls()
        timed = Timed(runner, calls)  # the runner's passes, each inside `with calls(phase):`
        with calls:
            calls.loop = "plain: "
            generate_autoregressive(target, prompt, 2, runner=timed)
            calls.loop = "chain: "
            generate_dflash(target, drafter, prompt, 2 * BLOCK, runner=timed)
            calls.loop = "tree: "
            generate_dflash_tree(target, drafter, prompt, 2, budget=BLOCK, runner=timed)
        tables[reads] = calls.table()
    return {"shape": name, "context": check.context, "calls": tables}


# ----------------------------------------------------------- host time in a compiled loop


def section_host_loop(check: Check) -> dict:
    """A compiled DFlash loop at the largest shape (random weights: about one token per step).
    Host milliseconds per step: the loop's wall time after the prefill, less the device time of its
    passes, per step: launches, guards, graph bookkeeping, acceptance and syncs."""
    name, shape = check.largest
    target, drafter = check.pair(name, shape)
    new_tokens, prompt = 64, random_prompt(check.context, VOCAB)
    runner = ModelRunner(target, drafter, max_length=check.context + new_tokens + BLOCK,
                         block_size=BLOCK, compile=True, **check.compiled)
    began = time.perf_counter()
    generate_dflash(target, drafter, prompt, new_tokens, runner=runner)  # compiles, records graphs
    warm_up = time.perf_counter() - began
    clock = PassClock(check.device)
    timed = generate_dflash(target, drafter, prompt, new_tokens, runner=Timed(runner, clock))
    device = clock.seconds()
    steps = timed.steps
    wall_ms = 1000 * (timed.seconds - timed.first_token_seconds) / steps
    device_ms = {phase: 1000 * seconds / steps for phase, seconds in device.items()}
    return {"shape": name, "context": check.context, "new tokens": timed.new_tokens, "steps": steps,
            "tau": timed.mean_acceptance, "warm-up seconds": warm_up, "wall ms per step": wall_ms,
            "device ms per step": device_ms, "host ms per step": wall_ms - sum(device_ms.values())}


# ------------------------------------------------------------------------- step costs


def seconds_per_call(run, device, repeats: int) -> float:
    """Mean seconds of one `run()`: replayed from a CUDA graph on a GPU, plainly on the CPU."""
    if device.type != "cuda":
        run()
        began = time.perf_counter()
        for _ in range(repeats):
            run()
        return (time.perf_counter() - began) / repeats
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up off the default stream, as graph capture requires
        for _ in range(3):
            run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    start.record()
    for _ in range(repeats):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1000 / repeats


@dataclass
class Filled:
    """A pair's caches after a `context`-token prompt, read the way compiled passes read them."""

    target: Qwen3
    drafter: Drafter
    target_cache: KVCache
    drafter_cache: KVCache
    context: int

    @classmethod
    @torch.no_grad()
    def after_prompt(cls, target: Qwen3, drafter: Drafter, context: int, slots: int) -> Filled:
        weight, device = target.embed_tokens.weight, target.embed_tokens.weight.device
        target_cache = KVCache.for_layers(target.config, weight, slots)
        drafter_cache = KVCache.for_layers(drafter.config.layers, weight, slots + BLOCK)
        prompt = torch.randint(0, 1000, (1, context), device=device)  # (1, context)
        layer_ids = drafter.config.target_layer_ids
        _, features = target(prompt, cache=target_cache, capture_layers=layer_ids)
        target_cache.commit(context)
        positions = torch.arange(context, device=device)
        draft_pass(target, drafter, drafter_cache, features, prompt[:, :BLOCK],
                   context_positions=positions, context_slots=positions,
                   block_positions=context + torch.arange(BLOCK, device=device))
        drafter_cache.commit(context)
        for cache in (target_cache, drafter_cache):
            cache.read_limit = cache.max_length  # the whole buffer, under a position mask
        return cls(target, drafter, target_cache, drafter_cache, context)

    def decode(self, decode=decode_pass, reads=FIXED_READS):
        token, position = self.ids(1), self.positions(1)
        return lambda: decode(self.target, self.target_cache, token, position, reads=reads)

    def verify(self, block: int, verify=verify_pass, reads=FIXED_READS):
        ids, positions = self.ids(block), self.positions(block)
        layer_ids = self.drafter.config.target_layer_ids
        return lambda: verify(self.target, self.target_cache, ids, positions, layer_ids,
                              reads=reads)

    def draft(self):
        width = len(self.drafter.config.target_layer_ids) * self.target.config.hidden_size
        features = self.target.embed_tokens.weight.new_zeros(1, BLOCK, width)  # the last block's
        ids, positions = self.ids(BLOCK), self.positions(BLOCK)
        context = positions - BLOCK  # the last block's positions; the new block's are `positions`
        return lambda: draft_pass(self.target, self.drafter, self.drafter_cache, features, ids,
                                  context_positions=context, context_slots=context,
                                  block_positions=positions, reads=FIXED_READS)

    def ids(self, count: int) -> torch.Tensor:
        return torch.ones(1, count, dtype=torch.long, device=self.target_cache.keys[0].device)

    def positions(self, count: int) -> torch.Tensor:
        device = self.target_cache.keys[0].device
        return torch.arange(self.context, self.context + count, device=device)


@torch.no_grad()
def step_costs(check: Check, name: str, shape: dict) -> dict:
    """Decode, verify (blocks 4, 8, 16) and draft costs after a `context`-token prompt, with
    `extra_buffer` empty slots after it (a cache sized for a long generation, read whole)."""
    target, drafter = check.pair(name, shape)
    slots = check.context + 64 + check.extra_buffer
    filled = Filled.after_prompt(target, drafter, check.context, slots)
    jobs = {"decode": filled.decode(), "verify 4": filled.verify(4), "verify 8": filled.verify(8),
            "verify 16": filled.verify(16), "draft 16": filled.draft()}
    costs = {job: seconds_per_call(run, check.device, check.repeats) for job, run in jobs.items()}
    weight_bytes = sum(p.numel() * p.element_size() for p in target.parameters())
    cache = filled.target_cache
    cache_bytes = sum(t.numel() * t.element_size() for t in cache.keys + cache.values)  # read whole
    peak = next((value for chip, value in PEAK_BANDWIDTH.items()
                 if check.cuda and chip in torch.cuda.get_device_name()), None)
    decode = costs["decode"]
    step = costs["draft 16"] + costs["verify 16"]  # one DFlash step, block 16, without the host
    bandwidth = (weight_bytes + cache_bytes) / decode
    return {"shape": name, "parameters (B)": sum(p.numel() for p in target.parameters()) / 1e9,
            "context": check.context, "cache slots": slots, "seconds per pass": costs,
            "plain tokens/s": 1 / decode, "achieved bandwidth (GB/s)": bandwidth / 1e9,
            "share of peak bandwidth": bandwidth / peak if peak else None,
            "verify/decode": {block: costs[f"verify {block}"] / decode for block in (4, 8, 16)},
            "draft/decode": costs["draft 16"] / decode,
            "oracle speedup (tau 16)": 16 * decode / step,
            "projected speedup": {bench: tau * decode / step
                                  for bench, tau in PUBLISHED_TAU.items()}}


def section_step_costs(check: Check) -> dict:
    how = ("bf16, batch 1, each pass replayed from a CUDA graph" if check.cuda
           else "float32, batch 1, eager passes timed on the CPU")
    # The largest first: the sections before this one built it.
    rows = [step_costs(check, name, shape) for name, shape in reversed(check.shapes.items())]
    return {"timing": how, "rows": rows[::-1]}


@torch.no_grad()
def section_flex_costs(check: Check) -> dict:
    """Decode and verify 16 at the largest shape, compiled, reading the whole buffer under a mask
    and reading only the filled key blocks through FlexAttention (fused only when compiled)."""
    name, shape = check.largest
    target, drafter = check.pair(name, shape)
    slots = check.context + 64 + check.extra_buffer
    filled = Filled.after_prompt(target, drafter, check.context, slots)
    options = dict(backend=check.compile_backend, fullgraph=True, dynamic=False)
    decode, verify = torch.compile(decode_pass, **options), torch.compile(verify_pass, **options)
    costs = {}
    for reads_name, reads in (("mask", FIXED_READS), ("flex", FLEX_READS)):
        torch._dynamo.reset()  # `reads` is a new function: new graphs, not recompiles
        jobs = {"decode": filled.decode(decode, reads), "verify 16": filled.verify(16, verify, reads)}
        for job, run in jobs.items():
            costs[f"{job}, {reads_name}"] = seconds_per_call(run, check.device, check.repeats)
    ratios = {job: costs[f"{job}, flex"] / costs[f"{job}, mask"] for job in ("decode", "verify 16")}
    return {"shape": name, "context": check.context, "cache slots": slots,
            "seconds per pass": costs, "flex/mask": ratios}


# ---------------------------------------------------------------------- training step


@contextlib.contextmanager
def attention_inputs(seen: dict):
    """Records the q/k/v that reach training's attention (`AnchoredBlocks.attend`): FlexAttention
    on CUDA, SDPA over chunks of blocks on the CPU."""
    attend = AnchoredBlocks.attend

    def recording(self, q, k, v):
        seen.setdefault("path", "flex attention" if q.is_cuda else "SDPA in chunks (CPU)")
        seen.setdefault("q, k, v dtypes", [dtype_name(t.dtype) for t in (q, k, v)])
        seen.setdefault("autocast to", dtype_name(autocast_dtype(q.device)))
        seen.setdefault("q, k, v shapes", [list(t.shape) for t in (q, k, v)])
        return attend(self, q, k, v)

    AnchoredBlocks.attend = recording
    try:
        yield seen
    finally:
        AnchoredBlocks.attend = attend


def training_settings(smoke: bool) -> dict:
    if smoke:
        return dict(shape="tiny-vocab-151936", batch=1, seq_len=64, anchors=8, drafter_layers=1)
    return dict(shape="qwen3-8b", batch=1, seq_len=3072, anchors=512, drafter_layers=5)


def training_path(check: Check, target: Qwen3, settings: dict, path: str, steps: int = 2) -> dict:
    """One warm-up step and `steps` measured ones of `path` ("fast" or "dense"), as train.py runs
    them: a float32 drafter under bf16 autocast on CUDA, AdamW."""
    device, dense = check.device, path == "dense"
    cfg = train.TrainConfig(drafter_layers=settings["drafter_layers"], block_size=BLOCK)
    config = train.build_drafter_config(cfg, target.config, None)
    with torch.device(device):
        drafter = init_weights(Drafter(config)).train()
    drafter.recompute_layers = not dense
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(0)
    batch, seq_len = settings["batch"], settings["seq_len"]
    input_ids = torch.randint(0, VOCAB, (batch, seq_len), generator=generator).to(device)
    loss_mask = torch.ones_like(input_ids)
    loss_mask[:, : seq_len // 8] = 0  # a prompt, then the answer
    weights = train.slot_weights(BLOCK, train.gamma_for_block_size(BLOCK))
    row, times, seen, before = {"path": path}, [], {}, None
    for step in range(steps + 1):
        if step == 1:
            reset_peak_memory(device)
            before = peak_memory(device)
        anchors, real = train.batch_anchors(loss_mask, settings["anchors"], [generator] * batch)
        began = time.perf_counter()
        record = SdpaCalls("target, then drafter") if dense else attention_inputs(seen)
        with record if step == 0 else contextlib.nullcontext(), \
                torch.autocast("cuda", dtype=torch.bfloat16, enabled=check.cuda):
            features = train.target_features(target, input_ids, config)  # (batch, S, F)
            batch_blocks = train.MicroBatch(input_ids, loss_mask, anchors, real)
            loss, _, _ = train.drafter_loss(target, drafter, features, batch_blocks,
                                            config=config, weights=weights, dense_attention=dense,
                                            loss_chunk_size=0 if dense else 512)
        optimizer_step(loss, drafter, optimizer, grad_clip=1.0)
        if check.cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - began)
        if step == 0:
            row["first-step loss"] = loss.item()
            row["attention"] = record.table() if dense else seen
    step_seconds = statistics.median(times[1:])
    growth = peak_memory(device) - before if before is not None else None
    return row | {"peak growth (MiB)": mebibytes(growth), "step seconds": step_seconds,
                  "tokens/s": batch * seq_len / step_seconds}


def flex_gradients_match(device) -> dict:
    """`AnchoredBlocks`' FlexAttention against dense masked attention: values and gradients."""
    generator = torch.Generator().manual_seed(0)
    anchors = torch.stack([torch.randperm(255, generator=generator)[:24].sort().values + 1
                           for _ in range(2)])
    block = 10  # does not divide Flex's 128-row tile: blocks straddle query tiles
    pattern = AnchoredBlocks(anchors.to(device), 256, block)  # at context 256 keys straddle tiles
    shape_q, shape_kv = (2, 8, 24 * block, 64), (2, 4, 256 + 24 * block, 64)
    q, k, v = (torch.randn(s, generator=generator).to(device).requires_grad_()
               for s in (shape_q, shape_kv, shape_kv))
    weights = torch.randn(shape_q, generator=generator).to(device)
    dense = pattern.dense_mask()
    results = []
    for attend in (lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=dense,
                                                          enable_gqa=True),
                   lambda: pattern.attend_flex(q, k, v)):
        out = attend()
        results.append((out, *torch.autograd.grad((out * weights).sum(), (q, k, v))))
    errors = [float((a - b).abs().max()) for a, b in zip(*results)]
    return {"max abs error (out, dq, dk, dv)": errors, "passed": max(errors) < 1e-3}


def section_training(check: Check) -> dict:
    """One drafter training step at the Qwen3-8B shape, the paper's settings for one sequence; the
    target built directly in bf16 on the device (float32 in the CPU smoke)."""
    check.free()
    settings = training_settings(check.smoke)
    config = Qwen3Config(vocab_size=VOCAB, **TRAIN_SHAPES[settings["shape"]])
    with default_dtype(check.dtype), torch.device(check.device):
        target = train.freeze(init_weights(Qwen3(config)))
    rows = {}
    for path in ("fast", "dense"):
        try:
            rows[path] = training_path(check, target, settings, path)
        except torch.OutOfMemoryError:
            rows[path] = {"path": path, "out of memory": True}
        gc.collect()
        if check.cuda:
            torch.cuda.empty_cache()
    parts = projected_peak_bytes(settings["shape"], settings["batch"], settings["seq_len"],
                                 settings["anchors"], BLOCK, settings["drafter_layers"], 512)
    flex = flex_gradients_match(check.device) if check.cuda else "CUDA only"
    return {"settings": settings, "paths": rows, "flex attention vs dense": flex,
            "projected peak (GiB)": sum(parts.values()) / 2**30}


# ------------------------------------------------------------------------- the sections


SECTIONS = {"parity": section_parity, "lossless": section_lossless, "sdpa": section_sdpa,
            "host_loop": section_host_loop, "step_costs": section_step_costs,
            "training": section_training, "lossless_bf16": section_lossless_bf16,
            "flex_reads": section_flex_reads, "flex_costs": section_flex_costs}
DEFAULT_SECTIONS = ("parity", "lossless", "sdpa", "host_loop", "step_costs", "training",
                    "lossless_bf16")
DEFAULT_DEADLINE = 360.0  # seconds: see the docstring's estimate


def run_section(name: str, check: Check, tf32: dict) -> dict:
    """One section, whatever happens in it: its figures, or its exception and traceback; always
    its time, peak memory and compile counts. Dynamo starts afresh, and TF32 is restored after."""
    torch._dynamo.reset()
    watch = CompileWatch()
    reset_peak_memory(check.device)
    entry, began = {"status": "ok"}, time.perf_counter()
    with CudagraphSkips() as skips:
        try:
            entry["result"] = SECTIONS[name](check)
        except Exception as error:  # a failed section is reported, and the next one runs
            kind = type(error)
            entry.update(status="failed", error_type=f"{kind.__module__}.{kind.__qualname__}",
                         error=str(error)[:2000], traceback=traceback.format_exc())
        finally:
            torch._dynamo.config.error_on_recompile = False
            restore_tf32(tf32)
    entry["seconds"] = time.perf_counter() - began
    entry["peak memory (MiB)"] = mebibytes(peak_memory(check.device))
    try:
        entry["compile"] = watch.report(skips.reasons)
    except Exception as error:  # torch's compile metrics differ between versions: say so, go on
        entry["compile"] = {"error": f"{type(error).__name__}: {error}"}
    torch._dynamo.reset()
    gc.collect()
    return entry


def write_atomically(path: Path, text: str) -> None:
    """Write beside `path`, then rename over it: a reader (or a kill) never sees half a report."""
    partial = path.with_name(path.name + ".partial")
    try:
        partial.write_text(text)
        os.replace(partial, path)
    finally:  # stopped mid-write (Ctrl-C, a full disk): no half report left beside the whole one
        partial.unlink(missing_ok=True)


def write_report(out: Path, report: dict) -> None:
    write_atomically(out / "report.json", json.dumps(report, indent=2, default=str) + "\n")
    write_atomically(out / "report.md", markdown(report))


def passed(report: dict) -> bool:
    """No section failed, and the correctness checks that ran held (bf16 may differ: not one)."""
    entries = report["sections"]
    if any(entry["status"] == "failed" for entry in entries.values()):
        return False
    results = {name: entry.get("result") or {} for name, entry in entries.items()}
    held = [results.get("parity", {}).get("passed", True)]
    held += [results.get(name, {}).get("all identical", True)
             for name in ("lossless", "flex_reads")]
    return all(held)


# ----------------------------------------------------------------------------- report


def markdown(report: dict) -> str:
    plan = report["plan"]
    lines = [f"# GPU check\n\n{report['conditions']}\n",
             f"- environment: {json.dumps(report['environment'])}",
             f"- TF32 at start: {json.dumps(report['tf32 at start'])}",
             f"- sections: {', '.join(plan['sections'])}; deadline {plan['deadline']} s", ""]
    for name, entry in report["sections"].items():
        lines.append(f"## {name}: {entry['status']}\n")
        if "seconds" in entry:
            compiled, peak = entry["compile"], entry["peak memory (MiB)"] or 0
            lines.append(f"- {entry['seconds']:.1f} s, peak memory {peak:.0f} MiB, "
                         f"{compiled['graphs']} graphs compiled in "
                         f"{compiled['compile seconds']:.1f} s, "
                         f"{compiled['recompiles']} recompiles, "
                         f"{compiled['cudagraph skips']} cudagraph skips")
        if entry["status"] == "failed":
            lines += [f"- {entry['error_type']}: {entry['error']}", "",
                      "```", entry["traceback"].rstrip(), "```"]
        elif entry["status"] == "ok":
            lines += RENDER.get(name, render_items)(entry["result"])
        lines.append("")
    return "\n".join(lines) + "\n"


def render_items(result: dict) -> list[str]:
    return [f"- {key}: {json.dumps(value, default=str)}" for key, value in result.items()]


def render_sdpa(result: dict) -> list[str]:
    lines = [f"At {result['shape']}, context {result['context']}.", ""]
    for reads, calls in result["calls"].items():
        lines += [f"Reads: {reads}\n",
                  "| pass | q | k (first call) | keys read | dtype | mask | calls | SDPA backend |",
                  "|---" * 8 + "|"]
        lines += [f"| {c['pass']} | {c['q']} | {c['k']} | {c['keys read']} | {c['dtype']} | "
                  f"{c['mask']} | {c['calls']} | {json.dumps(c['backend'])} |" for c in calls]
        lines.append("")
    return lines


def render_step_costs(result: dict) -> list[str]:
    lines = [f"{result['timing']}\n", "| shape | plain tok/s | bandwidth GB/s | share of peak | "
             "verify/decode 4, 8, 16 | draft/decode | oracle speedup | projected speedup (GSM8K, "
             "MATH-500, HumanEval, MT-Bench) |", "|---" * 8 + "|"]
    for row in result["rows"]:
        share = row["share of peak bandwidth"]
        ratios = ", ".join(f"{r:.2f}" for r in row["verify/decode"].values())
        projected = ", ".join(f"{s:.2f}x" for s in row["projected speedup"].values())
        lines.append(f"| {row['shape']} | {row['plain tokens/s']:.1f} | "
                     f"{row['achieved bandwidth (GB/s)']:.0f} | "
                     f"{'n/a' if share is None else f'{share:.0%}'} | {ratios} | "
                     f"{row['draft/decode']:.2f} | {row['oracle speedup (tau 16)']:.2f}x | "
                     f"{projected} |")
    return lines


def render_training(result: dict) -> list[str]:
    lines = [f"{json.dumps(result['settings'])}\n",
             "| path | first-step loss | peak growth (MiB) | step (s) | tokens/s | attention |",
             "|---" * 6 + "|"]
    for row in result["paths"].values():
        if row.get("out of memory"):
            lines.append(f"| {row['path']} | out of memory | | | | |")
            continue
        growth = row["peak growth (MiB)"]
        lines.append(f"| {row['path']} | {row['first-step loss']:.4f} | "
                     f"{'n/a' if growth is None else f'{growth:.0f}'} | "
                     f"{row['step seconds']:.2f} | "
                     f"{row['tokens/s']:.0f} | {json.dumps(row['attention'])} |")
    return lines + ["", f"- projected peak with the weights and AdamW: "
                        f"{result['projected peak (GiB)']:.1f} GiB",
                    "- FlexAttention against dense: "
                    f"{json.dumps(result['flex attention vs dense'])}"]


RENDER = {"sdpa": render_sdpa, "step_costs": render_step_costs, "training": render_training}


# ------------------------------------------------------------------------ the command line


def section_list(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in SECTIONS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown section(s) {', '.join(unknown) or '(none)'}; "
                                         f"choose from {', '.join(SECTIONS)}")
    return names


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrors(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                           formatter_class=HelpWithDefaults)
    parser.add_argument("--out", type=Path, required=True,
                        help="folder for report.json and report.md")
    parser.add_argument("--cpu-smoke", action="store_true",
                        help="tiny sizes on the CPU: checks the script runs")
    parser.add_argument("--sections", type=section_list, default=list(DEFAULT_SECTIONS),
                        help=f"comma-separated, run in this order (default: "
                             f"{','.join(DEFAULT_SECTIONS)}; all: {','.join(SECTIONS)})")
    parser.add_argument("--deadline", type=non_negative, default=DEFAULT_DEADLINE,
                        help="seconds from the start after which the sections left are skipped")
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES),
                        help="step costs at these; `sdpa`, `host_loop`, `flex_costs` at the last")
    parser.add_argument("--context", type=positive_int, default=2048,
                        help="prompt tokens before the timed passes")
    parser.add_argument("--repeats", type=positive_int, default=50, help="replays per timed pass")
    parser.add_argument("--extra-buffer", type=checked(int, "0 or more", lambda x: x >= 0),
                        default=2048,
                        help="empty cache slots after the filled part (a cache sized for more)")
    parser.add_argument("--compile-backend", default=None,
                        help="torch.compile backend (default: inductor on CUDA, eager on the CPU)")
    return parser


def make_check(args) -> Check:
    if args.cpu_smoke:
        # Context 100: the host loop's reads then fit one bucket, as at the GPU run's context.
        return Check(torch.device("cpu"), True, {"smoke": SMOKE_SHAPE}, context=100, repeats=3,
                     extra_buffer=64, compile_backend=args.compile_backend or "eager")
    if not torch.cuda.is_available():
        raise UsageError("no CUDA device here (use --cpu-smoke to check the script on the CPU)")
    return Check(torch.device("cuda"), False, {name: SHAPES[name] for name in args.shapes},
                 args.context, args.repeats, args.extra_buffer,
                 compile_backend=args.compile_backend or "inductor")


def main(args) -> int:
    began = time.perf_counter()
    check_output(args.out, "--out", folder=True)
    check = make_check(args)
    tf32 = tf32_state()
    args.out.mkdir(parents=True, exist_ok=True)
    sizes = "CPU smoke run at tiny sizes" if check.smoke else "real shapes, random weights"
    report = {"conditions": f"{sizes}, batch 1, {str(check.dtype).removeprefix('torch.')} at the "
                            f"real shapes", "environment": environment(check.device),
              "tf32 at start": tf32, "plan": {"sections": args.sections, "deadline": args.deadline},
              "sections": {}}
    for name in args.sections:
        if time.perf_counter() - began > args.deadline:
            report["sections"][name] = {"status": "skipped: deadline"}
            continue
        report["sections"][name] = {"status": "running"}  # what a killed run leaves behind
        write_report(args.out, report)
        report["sections"][name] = run_section(name, check, tf32)
        report["seconds"] = time.perf_counter() - began
        write_report(args.out, report)
        status = report["sections"][name]["status"]
        print(f"[{report['seconds']:6.0f} s] {name}: {status}", file=sys.stderr, flush=True)
    check.free()
    restore_tf32(tf32)
    report.update(seconds=time.perf_counter() - began, passed=passed(report))
    report["tf32 at end"] = tf32_state()
    write_report(args.out, report)
    print(markdown(report))
    print(f"done in {report['seconds']:.0f} s; passed: {report['passed']}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(run_cli(build_parser(), main))
