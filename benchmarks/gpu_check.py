"""The GPU check: is the CUDA path correct, and what does a step cost at real Qwen3 shapes?

    python benchmarks/gpu_check.py --out runs/gpu_check              # on a CUDA machine (about 5-8 minutes)
    python benchmarks/gpu_check.py --out /tmp/gpu_smoke --cpu-smoke   # the same code, tiny sizes, on the CPU (CI)

Two parts, one report (`report.json` and `report.md` in `--out`):

1. **Correctness.** The fixtures' logits against the reference implementation's;
   greedy DFlash equal to greedy plain decoding in float32, eager and compiled
   (CUDA graphs: `mode="reduce-overhead"`), with recompilation made an error; and,
   in bfloat16, how often the two agree anyway (the 16-token verify and the 1-token
   decode run different kernels, so a near-tie in an argmax can flip).
2. **Step costs** with random weights in the real shapes of Qwen3-0.6B, 4B and 8B
   (bf16) and a 5-layer drafter of the released kind (the target's width, block
   16): each fixed-shape pass is captured once in a CUDA graph and replayed, which
   is what the compiled loop does minus the compiler's kernel fusion (so these
   costs are, if anything, pessimistic). From them: plain-loop tokens/s and its
   share of the device's peak memory bandwidth, the verify/decode cost ratio for
   blocks of 4, 8 and 16, the drafter's cost, and the speedup with every draft
   accepted (the oracle) and at the authors' published acceptance lengths.
3. **A drafter training step** at the Qwen3-8B shape and the paper's settings for one
   sequence (3,072 tokens, 512 anchors, blocks of 16): peak memory and time of the
   fast path (FlexAttention, chunked loss) and of the dense one, with the formula's
   projection beside them; and FlexAttention's values and gradients against dense
   masked attention.

No GPU had run this script when it was written; `--cpu-smoke` runs every line of
it at tiny sizes on the CPU, and CI runs that.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from dflash.cli import OneLineErrors, UsageError, run_cli  # noqa: E402
from dflash.drafter import Drafter, DrafterConfig, default_target_layer_ids  # noqa: E402
from dflash.qwen3 import Qwen3, Qwen3Config  # noqa: E402
from generate import (ModelRunner, decode_pass, draft_pass, generate_autoregressive, generate_dflash,  # noqa: E402
                      verify_pass)
import bench_train  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures"
WEIGHTS = ROOT / "weights"

# Real shapes (config.json of the official checkpoints, kept in bench_train.py); the drafter: 5 layers of the
# target's width.
SHAPES = {name: bench_train.SHAPES[name.lower()] for name in ("Qwen3-0.6B", "Qwen3-4B", "Qwen3-8B")}
SMOKE_SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, tie_word_embeddings=True)
PUBLISHED_TAU = {"GSM8K": 6.55, "MATH-500": 7.87, "HumanEval": 6.55, "MT-Bench": 4.25}  # Qwen3-8B, greedy, B=16
PEAK_BANDWIDTH = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.0e12, "B200": 8.0e12, "L40S": 0.864e12}  # bytes/s


# ------------------------------------------------------------------------ correctness


def logits_of(model: Qwen3, input_ids: torch.Tensor) -> torch.Tensor:
    return model.logits(model(input_ids)[0])  # (batch, seq, vocab)


def fixture_parity(device) -> dict:
    """Largest logit difference to the reference implementation's, float32 (TF32 off)."""
    target = Qwen3.from_pretrained(FIXTURES / "qwen3-tiny", device=device)
    reference = load_file(FIXTURES / "qwen3-tiny" / "reference.safetensors")
    tied = (logits_of(target, reference["input_ids"].to(device)).cpu() - reference["logits"]).abs().max().item()
    sharded = Qwen3.from_pretrained(FIXTURES / "qwen3-tiny-sharded", device=device)
    loaded = load_file(FIXTURES / "qwen3-tiny-sharded" / "loaded_reference.safetensors")
    bf16_file = (logits_of(sharded, loaded["input_ids"].to(device)).cpu() - loaded["logits"]).abs().max().item()
    return {"qwen3-tiny max |logit diff|": tied, "qwen3-tiny-sharded max |logit diff|": bf16_file,
            "passed": max(tied, bf16_file) <= 1e-4}


def greedy_agreement(target, drafter, prompts, new_tokens: int, block_size: int, compile: bool,
                     mode: str | None, backend: str, flex_attention: bool = False) -> dict:
    """Greedy DFlash against greedy plain decoding, both through one runner: equal outputs per prompt."""
    max_length = max(map(len, prompts)) + new_tokens + block_size
    runner = ModelRunner(target, drafter, max_length=max_length, block_size=block_size, compile=compile,
                         mode=mode, backend=backend, flex_attention=flex_attention)
    equal, prefix = 0, []
    for prompt in prompts:
        plain = generate_autoregressive(target, prompt, new_tokens, runner=runner).new_ids
        fast = generate_dflash(target, drafter, prompt, new_tokens, runner=runner).new_ids
        equal += plain == fast
        prefix.append(next((i for i, (a, b) in enumerate(zip(plain, fast)) if a != b), len(plain)) / len(plain))
    return {"prompts": len(prompts), "identical": equal, "mean matching prefix": sum(prefix) / len(prefix)}


def correctness(device, smoke: bool) -> dict:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    report = {"fixture parity": fixture_parity(device)}
    compiled = dict(mode="reduce-overhead", backend="inductor") if device.type == "cuda" else dict(mode=None,
                                                                                                   backend="eager")
    generator = torch.Generator().manual_seed(0)
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        target = Qwen3.from_pretrained(WEIGHTS / "tiny-qwen3", device=device, dtype=dtype)
        drafter = Drafter.from_pretrained(WEIGHTS / "tiny-qwen3-dflash", target=target, device=device, dtype=dtype)
        prompts = [torch.randint(0, target.config.vocab_size - 1, (length,), generator=generator).tolist()
                   for length in ((3, 17) if smoke else (3, 17, 60, 200))]
        new_tokens = 24 if smoke else 96
        torch._dynamo.reset()
        torch._dynamo.config.error_on_recompile = True  # a recompile is a failure, not a slowdown
        try:
            report[f"demo pair {name}, eager"] = greedy_agreement(target, drafter, prompts, new_tokens, 16,
                                                                  compile=False, mode=None, backend="eager")
            report[f"demo pair {name}, compiled"] = greedy_agreement(target, drafter, prompts, new_tokens, 16,
                                                                     compile=True, **compiled)
            if name == "float32":  # FlexAttention reads, opt-in until this has run on a GPU
                torch._dynamo.reset()  # new graphs, not recompiles of the ones above
                report["demo pair float32, compiled, flex attention"] = greedy_agreement(
                    target, drafter, prompts, new_tokens, 16, compile=True, flex_attention=True, **compiled)
        finally:
            torch._dynamo.config.error_on_recompile = False
            torch._dynamo.reset()
    fp32 = [value for key, value in report.items() if key.startswith("demo pair float32")]
    report["lossless in float32"] = all(r["identical"] == r["prompts"] for r in fp32)
    return report


# ------------------------------------------------------------------------- step costs


def random_pair(shape: dict, device, dtype, block_size: int = 16) -> tuple[Qwen3, Drafter]:
    """A target of the given shape and a 5-layer drafter for it, random weights (std 0.02), on the device."""
    config = Qwen3Config(vocab_size=151936, **shape, dtype=str(dtype).removeprefix("torch."))
    drafter_layers = Qwen3Config(**{**config.__dict__, "num_hidden_layers": 5})
    drafter_config = DrafterConfig(drafter_layers, block_size, config.num_hidden_layers, config.vocab_size - 1,
                                   default_target_layer_ids(config.num_hidden_layers, 5))
    models = []
    for build in (lambda: Qwen3(config), lambda: Drafter(drafter_config)):
        with torch.device("meta"):
            model = build()
        model = model.to_empty(device=device).to(dtype)
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                parameter.normal_(0.0, 0.02) if parameter.dim() == 2 else parameter.fill_(1.0)
        model.rotary.inv_freq = model.rotary.inverse_frequencies(device)
        models.append(model.eval().requires_grad_(False))
    return models[0], models[1]


def seconds_per_call(run, device, repeats: int) -> float:
    """Mean seconds of one `run()`: replayed from a CUDA graph on a GPU, timed plainly on the CPU."""
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


@torch.no_grad()
def step_costs(name: str, shape: dict, device, context: int, repeats: int, extra_buffer: int = 0) -> dict:
    """Decode, verify (blocks 4, 8, 16) and draft costs after a `context`-token prompt.

    `extra_buffer` empty slots after the filled part: what a cache sized for a long
    generation looks like early on, where reading only the filled blocks pays (on
    CUDA, the decode and verify 16 are also timed through FlexAttention).
    """
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    target, drafter = random_pair(shape, device, dtype)
    prompt = torch.randint(0, 1000, (1, context), device=device)
    runners = {}
    for flex in (False, True):  # plain masked reads, and reads of the filled key blocks only (FilledBlocks)
        runner = runners[flex] = ModelRunner(target, drafter, max_length=context + 64 + extra_buffer, block_size=16,
                                             flex_attention=flex)
        for cache in runner.caches():
            cache.fixed_shape = True  # the compiled loop's reads: the whole buffer under a position mask
        first, features = runner.prefill(prompt, 0.0, None)
        runner.draft(features, first, context)  # fills the drafter's cache with the prompt's
    runner, layer_ids, cache = runners[False], runners[False].layer_ids, runners[False].target_cache
    position = torch.tensor([context], device=device)
    token = prompt[:, -1:]
    costs = {"decode": seconds_per_call(lambda: decode_pass(target, cache, token, position, True), device, repeats)}
    for block in (4, 8, 16):
        ids, positions = prompt[:, :block], torch.arange(context, context + block, device=device)
        costs[f"verify {block}"] = seconds_per_call(
            lambda: verify_pass(target, cache, ids, positions, True, layer_ids=layer_ids), device, repeats)
    # The same two passes compiled, reading only the filled key blocks: FlexAttention is used inside
    # compiled passes only, where it becomes one fused kernel.
    backend = "inductor" if device.type == "cuda" else "eager"
    decode = torch.compile(decode_pass, backend=backend, fullgraph=True, dynamic=False)
    verify = torch.compile(verify_pass, backend=backend, fullgraph=True, dynamic=False)
    flex_cache, flex = runners[True].target_cache, runners[True].reads
    costs["decode, flex"] = seconds_per_call(lambda: decode(target, flex_cache, token, position, True, reads=flex),
                                             device, repeats)
    ids, positions = prompt[:, :16], torch.arange(context, context + 16, device=device)
    costs["verify 16, flex"] = seconds_per_call(
        lambda: verify(target, flex_cache, ids, positions, True, reads=flex, layer_ids=layer_ids), device, repeats)
    block_positions = torch.arange(context, context + 16, device=device)
    costs["draft 16"] = seconds_per_call(
        lambda: draft_pass(target, drafter, runner.drafter_cache, runner.features, runner.block_ids, True,
                           context_positions=block_positions - 16, context_slots=block_positions - 16,
                           block_positions=block_positions), device, repeats)
    weight_bytes = sum(p.numel() * p.element_size() for p in target.parameters())
    cache_bytes = 2 * shape["num_hidden_layers"] * shape["num_key_value_heads"] * shape["head_dim"] * \
        (context + 64 + extra_buffer) * torch.finfo(dtype).bits // 8  # the compiled decode reads the whole buffer
    peak = next((value for chip, value in PEAK_BANDWIDTH.items()
                 if device.type == "cuda" and chip in torch.cuda.get_device_name()), None)
    decode = costs["decode"]
    row = {
        "shape": name, "parameters (B)": sum(p.numel() for p in target.parameters()) / 1e9,
        "context": context, "seconds per pass": costs,
        "plain tokens/s": 1 / decode,
        "achieved bandwidth (GB/s)": (weight_bytes + cache_bytes) / decode / 1e9,
        "share of peak bandwidth": (weight_bytes + cache_bytes) / decode / peak if peak else None,
        "verify/decode": {block: costs[f"verify {block}"] / decode for block in (4, 8, 16)},
        "draft/decode": costs["draft 16"] / decode,
        "flex/mask, decode and verify 16": [costs[f"{p}, flex"] / costs[p] for p in ("decode", "verify 16")]
        if "decode, flex" in costs else None,
    }
    step = costs["draft 16"] + costs["verify 16"]  # one DFlash step, block 16 (host bookkeeping not included)
    row["oracle speedup (tau 16)"] = 16 * decode / step
    row["projected speedup"] = {bench: tau * decode / step for bench, tau in PUBLISHED_TAU.items()}
    del target, drafter, runner
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


# ---------------------------------------------------------------------- training step


def flex_gradients_match(device) -> dict:
    """The FlexAttention path of `AnchoredBlocks` against dense masked attention: values and gradients."""
    from dflash.train_kernels import AnchoredBlocks

    generator = torch.Generator().manual_seed(0)
    anchors = torch.stack([torch.randperm(255, generator=generator)[:24].sort().values + 1 for _ in range(2)])
    block = 10  # does not divide Flex's 128-row tile: blocks straddle query tiles
    pattern = AnchoredBlocks(anchors.to(device), 256, block)  # ... and at context 256 their keys straddle key tiles
    shape_q, shape_kv = (2, 8, 24 * block, 64), (2, 4, 256 + 24 * block, 64)
    q, k, v = (torch.randn(s, generator=generator).to(device).requires_grad_() for s in (shape_q, shape_kv, shape_kv))
    weights = torch.randn(shape_q, generator=generator).to(device)
    results = []
    for attend in (lambda: torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=pattern.dense_mask(), enable_gqa=True), lambda: pattern.attend_flex(q, k, v)):
        out = attend()
        results.append((out, *torch.autograd.grad((out * weights).sum(), (q, k, v))))
    errors = [float((a - b).abs().max()) for a, b in zip(*results)]
    return {"max abs error (out, dq, dk, dv)": errors, "passed": max(errors) < 1e-3}


def training_step(device, smoke: bool) -> dict:
    """One drafter training step at the Qwen3-8B shape and the paper's settings per sequence, dense and fast."""
    settings = dict(shape="tiny-vocab-151936", batch=1, seq_len=64, anchors=8, drafter_layers=1) if smoke else \
        dict(shape="qwen3-8b", batch=1, seq_len=3072, anchors=512, drafter_layers=5)
    rows = {}
    for path in ("fast", "dense"):
        args = argparse.Namespace(**settings, block_size=16, loss_chunk_size=512, steps=2, one=path)
        try:
            rows[path] = bench_train.measure_one(args)
        except torch.OutOfMemoryError:
            rows[path] = {"path": path, "out of memory": True}
        if device.type == "cuda":
            torch.cuda.empty_cache()
    parts = bench_train.projected_peak_bytes(settings["shape"], settings["batch"], settings["seq_len"],
                                             settings["anchors"], 16, settings["drafter_layers"], 512)
    return {"settings": settings, "steps": rows, "projected peak (GiB)": sum(parts.values()) / 2**30,
            "flex attention vs dense": flex_gradients_match(device) if device.type == "cuda" else "CUDA only"}


# ----------------------------------------------------------------------------- report


def markdown(report: dict) -> str:
    lines = [f"# GPU check\n\n{report['conditions']}\n", "## Correctness\n"]
    for key, value in report["correctness"].items():
        lines.append(f"- {key}: {json.dumps(value)}")
    how = report["timing"]
    lines += ["", f"## Step costs ({how})\n",
              "| shape | plain tok/s | bandwidth GB/s | share of peak | verify/decode 4, 8, 16 | draft/decode | "
              "oracle speedup | projected speedup (GSM8K, MATH-500, HumanEval, MT-Bench) | "
              "FlexAttention / mask, decode and verify 16 |",
              "|---|---|---|---|---|---|---|---|---|"]
    for row in report["step costs"]:
        share = "n/a" if row["share of peak bandwidth"] is None else f"{row['share of peak bandwidth']:.0%}"
        ratios = ", ".join(f"{r:.2f}" for r in row["verify/decode"].values())
        projected = ", ".join(f"{s:.2f}x" for s in row["projected speedup"].values())
        ratios_flex = row["flex/mask, decode and verify 16"]
        flex = "n/a" if ratios_flex is None else ", ".join(f"{r:.2f}" for r in ratios_flex)
        lines.append(f"| {row['shape']} | {row['plain tokens/s']:.1f} | {row['achieved bandwidth (GB/s)']:.0f} | "
                     f"{share} | {ratios} | {row['draft/decode']:.2f} | {row['oracle speedup (tau 16)']:.2f}x | "
                     f"{projected} | {flex} |")
    train = report.get("training step")
    if train:
        lines += ["", f"## Drafter training step ({json.dumps(train['settings'])})\n",
                  "| path | peak growth (MiB) | step (s) | tokens/s |", "|---|---|---|---|"]
        for row in train["steps"].values():
            if row.get("out of memory"):
                lines.append(f"| {row['path']} | out of memory | | |")
            else:
                lines.append(f"| {row['path']} | {row['peak_step_mb']:.0f} | {row['step_seconds']:.2f} | "
                             f"{row['tokens_per_second']:.0f} |")
        lines += ["", f"- projected peak with the weights and AdamW: {train['projected peak (GiB)']:.1f} GiB",
                  f"- FlexAttention against dense: {json.dumps(train['flex attention vs dense'])}"]
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrors(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for report.json and report.md")
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on the CPU: checks the script runs")
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    parser.add_argument("--context", type=int, default=2048, help="prompt tokens before the timed passes")
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--extra-buffer", type=int, default=2048,
                        help="empty cache slots after the filled part (a cache sized for a longer generation)")
    return parser


def main(args) -> int:
    if args.cpu_smoke:
        device, shapes, context, repeats = torch.device("cpu"), {"smoke": SMOKE_SHAPE}, 64, 3
        args.extra_buffer = 64
    else:
        if not torch.cuda.is_available():
            raise UsageError("no CUDA device here (use --cpu-smoke to check the script on the CPU)")
        device, shapes, context, repeats = torch.device("cuda"), {n: SHAPES[n] for n in args.shapes}, args.context, \
            args.repeats
    began = time.perf_counter()
    chip = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    report = {"conditions": f"{chip}, torch {torch.__version__}, batch 1; "
                            f"{'CPU smoke run at tiny sizes' if args.cpu_smoke else 'real shapes, random weights'}"}
    report["correctness"] = correctness(device, args.cpu_smoke)
    report["timing"] = ("bf16, batch 1, each pass replayed from a CUDA graph" if device.type == "cuda"
                        else "float32, batch 1, eager passes timed on the CPU")
    report["step costs"] = [step_costs(name, shape, device, context, repeats, args.extra_buffer)
                            for name, shape in shapes.items()]
    report["training step"] = training_step(device, args.cpu_smoke)
    report["seconds"] = time.perf_counter() - began
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "report.md").write_text(markdown(report))
    print(markdown(report))
    print(f"done in {report['seconds']:.0f} s; lossless in float32: {report['correctness']['lossless in float32']}")
    return 0 if report["correctness"]["lossless in float32"] and report["correctness"]["fixture parity"]["passed"] \
        else 1


if __name__ == "__main__":
    raise SystemExit(run_cli(build_parser(), main))
