"""What the notebooks share that is not the lesson itself: the roofline model, the timeline, the figures.

A notebook cell should teach one thing in a screenful, so the code that only draws or tabulates
lives here, once, and every notebook calls the same function: one roofline with one stated set of
assumptions, one timeline of a loop's passes, one picture of a DFlash step. The notebooks run with
`tutorials/` as their working directory and import it as `import teaching`.

matplotlib is an optional extra (`pip install -e ".[plots]"`): it is imported inside the functions
that draw, so the roofline and the clock work without it.

Regenerate the picture of one DFlash step (docs/dflash_step.png), from the repository root:

    python tutorials/teaching.py
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
STEP_PICTURE = ROOT / "docs" / "dflash_step.png"


def pyplot():
    """matplotlib's pyplot, imported only when a figure is drawn (it is an optional extra)."""
    import matplotlib.pyplot as plt

    return plt


# ------------------------------------------------------------------ the roofline model

ROOFLINE_CONTEXT = 2048  # tokens already in the KV cache when a pass runs: a prompt and an answer so far
BYTES_PER_NUMBER = 2  # bfloat16

ROOFLINE_ASSUMPTIONS = """\
The roofline model of one forward pass (batch 1, bfloat16, 2 bytes a number):
  - bytes read: every matrix-multiplication weight once (the LM head included), the norms' weights,
    the embedding rows of the new tokens only (a lookup, not the whole table), and the KV cache:
    the keys and values of the cached tokens and of the new ones, in every layer that has a cache;
  - FLOPs: 2 per matrix weight per new token, plus attention: 2 x 2 x head_dim per query head per
    key it sees (every cached key, then causally among the new tokens);
  - time: the longer of bytes / memory bandwidth and FLOPs / peak dense bf16 FLOP rate, at published
    peak figures: perfect kernels, no launch overhead, no host work; a lower bound for a real pass;
  - unless said otherwise, 2048 tokens are already cached."""


@dataclass(frozen=True)
class Accelerator:
    """A GPU's two published peak figures: all the roofline needs."""

    name: str
    bandwidth: float  # bytes/s read from its memory (HBM)
    flops: float  # FLOP/s, dense bf16 on the tensor cores (no sparsity)

    @property
    def ridge(self) -> float:
        """FLOPs it can do in the time it reads one byte: passes of fewer tokens than this are memory-bound."""
        return self.flops / self.bandwidth


H100 = Accelerator("NVIDIA H100 SXM", bandwidth=3.35e12, flops=989e12)
H200 = Accelerator("NVIDIA H200", bandwidth=4.8e12, flops=989e12)  # the H100's chip with faster memory


@dataclass(frozen=True, kw_only=True)
class PassCost:
    """What one forward pass of a model reads and computes, counted from the model's shapes.

    Build it from a model made on the `meta` device (shapes, no memory): `PassCost.of(model, config)`.
    """

    matmul_weights: int  # numbers in the matrix multiplications: read once a pass, 2 FLOPs each per token
    other_weights: int  # numbers read whole every pass that do no matrix work: the norms
    hidden_size: int  # an embedding row: what each new token's lookup reads
    kv_layers: int  # layers with a KV cache
    kv_heads: int
    query_heads: int
    head_dim: int

    @classmethod
    def of(cls, model: torch.nn.Module, config, *, borrowed_matmul: int = 0) -> PassCost:
        """`config` the model's Qwen3Config (for a drafter, its layers' config); `borrowed_matmul` counts the
        weights it reads from another model (a DFlash drafter uses its target's LM head)."""
        linear = {id(m.weight): m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear)}
        embedding = {id(m.weight): m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Embedding)}
        every = {id(p): p.numel() for p in model.parameters()}
        other = sum(n for key, n in every.items() if key not in linear and key not in embedding)
        return cls(matmul_weights=sum(linear.values()) + borrowed_matmul, other_weights=other,
                   hidden_size=config.hidden_size, kv_layers=config.num_hidden_layers,
                   kv_heads=config.num_key_value_heads, query_heads=config.num_attention_heads, head_dim=config.head_dim)

    def bytes_read(self, tokens: int, context: int = ROOFLINE_CONTEXT) -> float:
        """Bytes one pass over `tokens` new tokens reads, after `context` cached ones."""
        weights = self.matmul_weights + self.other_weights + tokens * self.hidden_size  # the embedding rows used
        kv_per_token = 2 * self.kv_layers * self.kv_heads * self.head_dim  # keys + values, numbers per token
        return BYTES_PER_NUMBER * (weights + kv_per_token * (context + tokens))

    def flops(self, tokens: int, context: int = ROOFLINE_CONTEXT) -> float:
        """FLOPs of that pass: the matrix products, then the attention scores and weighted sums."""
        keys_seen = tokens * context + tokens * (tokens + 1) / 2  # every cached key, then causal among the new
        attention = 2 * 2 * self.kv_layers * self.query_heads * self.head_dim * keys_seen
        return 2 * self.matmul_weights * tokens + attention

    def ms(self, gpu: Accelerator, tokens: int, context: int = ROOFLINE_CONTEXT) -> float:
        """The roofline time of that pass in milliseconds: the slower of reading and computing."""
        return 1e3 * max(self.bytes_read(tokens, context) / gpu.bandwidth, self.flops(tokens, context) / gpu.flops)


def batched_pass_ms(cost: PassCost, gpu: Accelerator, batch: int, tokens: int) -> float:
    """The roofline time (ms) of one pass over `tokens` new tokens for each of `batch` sequences at
    once (notebook 8, section 5, "When to stop speculating"; lab 08_stop_speculating rebuilds
    it)."""
    shared = BYTES_PER_NUMBER * (
        cost.matmul_weights + cost.other_weights
    )  # read once for the whole batch
    own = cost.bytes_read(tokens) - shared  # each sequence: its KV cache and its embedding rows
    return 1e3 * max((shared + batch * own) / gpu.bandwidth, batch * cost.flops(tokens) / gpu.flops)


def qwen3_8b_pass() -> PassCost:
    """The pass of Qwen3-8B (the defaults of `Qwen3Config`), counted on the `meta` device: no memory used."""
    from dflash.qwen3 import Qwen3, Qwen3Config

    config = Qwen3Config()
    with torch.device("meta"):
        return PassCost.of(Qwen3(config), config)


# ------------------------------------------------------------------ drawing primitives


def _cells(ax, x, y, labels, colours, *, width=0.36, height=0.36, fontsize=7):
    """A row of square cells from (x, y), one per label."""
    from matplotlib.patches import Rectangle

    for i, (label, colour) in enumerate(zip(labels, colours)):
        ax.add_patch(Rectangle((x + i * width, y), width, height, facecolor=colour, edgecolor="black", lw=0.6))
        ax.text(x + (i + 0.5) * width, y + height / 2, label, ha="center", va="center", fontsize=fontsize)


def _box(ax, x, y, text, colour, *, size=(2.3, 0.5), fontsize=8, weight="normal"):
    """A rounded box of `size` (width, height) from (x, y), its text centred."""
    from matplotlib.patches import FancyBboxPatch

    width, height = size
    ax.add_patch(FancyBboxPatch((x, y), width, height, boxstyle="round,pad=0.02,rounding_size=0.08",
                                facecolor=colour, edgecolor="black", linewidth=0.8))
    ax.text(x + width / 2, y + height / 2, text, ha="center", va="center", fontsize=fontsize, weight=weight)


def _arrow(ax, start, end, colour="black", text="", *, rad=0.0, fontsize=7):
    """An arrow from `start` to `end`, bent by `rad`, its text above its middle."""
    ax.annotate("", xy=end, xytext=start, arrowprops=dict(arrowstyle="-|>", color=colour, lw=1.3,
                                                          connectionstyle=f"arc3,rad={rad}"))
    if text:
        ax.text((start[0] + end[0]) / 2, (start[1] + end[1]) / 2 + 0.12, text, color=colour, fontsize=fontsize,
                ha="center")


# ------------------------------------------------------------------ notebook 1: the static KV cache


def cache_slot_states(cache) -> torch.Tensor:
    """Each slot of a cache, read from its first layer's keys: 0 empty, 1 written but not committed, 2 committed.
    A slot counts as written once any pass has put a key there (a fresh cache is zeros)."""
    written = cache.keys[0][0, 0, :, 0] != 0  # (max_length,): slots that hold something
    committed = torch.arange(cache.max_length) < cache.length  # (max_length,)
    return (written & ~committed).int() + 2 * committed.int()  # (max_length,)


def draw_cache_stages(stages: list[tuple[str, torch.Tensor]]):
    """One row per stage (label, cache_slot_states), one column per slot: green committed, grey stale."""
    from matplotlib.colors import ListedColormap

    plt = pyplot()
    slots = len(stages[0][1])
    fig, ax = plt.subplots(figsize=(8, 0.6 * len(stages)))
    ax.imshow(torch.stack([state for _, state in stages]), cmap=ListedColormap(["white", "lightgrey", "tab:green"]),
              vmin=0, vmax=2)
    ax.set_yticks(range(len(stages)), [label for label, _ in stages])
    ax.set_xticks(range(slots))
    ax.set_xticks([i - 0.5 for i in range(slots)], minor=True)
    ax.set_yticks([i - 0.5 for i in range(len(stages))], minor=True)
    ax.grid(which="minor", color="black", linewidth=0.5)
    ax.tick_params(which="minor", length=0)
    ax.set(xlabel="cache slot (= position)", title="green: committed (< length)   grey: written, not committed")
    plt.tight_layout()
    plt.show()


# ------------------------------------------------------------------ notebook 2: sampled continuations


def draw_top_continuations(exact: torch.Tensor, frequencies: dict, *, top: int = 20, title: str):
    """Bars of the `top` likeliest outcomes of `exact` (any shape, flattened), beside each sampler's
    frequency of them: `frequencies` name -> a tensor of exact's shape."""
    plt = pyplot()
    order = exact.flatten().argsort(descending=True)[:top]  # the likeliest outcomes, likeliest first
    labels = [str(tuple(int(t) for t in torch.unravel_index(i, exact.shape))) for i in order]
    x, width = torch.arange(top), 0.8 / (1 + len(frequencies))
    fig, ax = plt.subplots(figsize=(12, 3.6))
    ax.bar(x - width, exact.flatten()[order], width, label="exact probability", color="black")
    for k, (name, frequency) in enumerate(frequencies.items()):
        ax.bar(x + k * width, frequency.flatten()[order], width, label=f"{name}: frequency")
    ax.set_xticks(x, labels, rotation=60, fontsize=8)
    ax.set(xlabel="the outcome", ylabel="probability", title=title)
    ax.legend()
    plt.tight_layout()
    plt.show()


def draw_roofline_by_tokens(ks: list[int], pass_ms: list[float], *, ridge: float, title: str):
    """A pass's roofline time against the tokens it handles (left) and the time per token (right)."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 3.8))
    left.semilogx(ks, pass_ms, "o-", ms=3)
    left.axvline(ridge, color="grey", ls="--", label=f"{ridge:.0f} tokens: memory = compute")
    left.set(xlabel="tokens in one pass (k)", ylabel="ms per pass", title=title)
    left.legend()
    right.loglog(ks, [ms / k for ms, k in zip(pass_ms, ks)], "o-", ms=3, color="tab:green")
    right.set(xlabel="tokens in one pass (k)", ylabel="ms per token", title="...and per token")
    plt.tight_layout()
    plt.show()


def draw_pass_regimes(tokens: list[int], measured: dict[str, list[float]], fits: dict[str, tuple[float, float]],
                      gpu: tuple[str, list[float]]):
    """A verify pass's cost in decode passes against its tokens: measured points and the fitted line of each CPU
    mode (`measured`: mode -> cost per token count; `fits`: mode -> (overhead, per token) over the decode's cost),
    and the roofline model's curve for a GPU (`gpu`: name, costs)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.8))
    for (mode, costs), colour in zip(measured.items(), ("tab:blue", "tab:orange")):
        overhead, per_token = fits[mode]
        ax.plot(tokens, costs, "o", color=colour, label=f"{mode}, measured")
        ax.plot([1, tokens[-1]], [overhead + per_token, overhead + per_token * tokens[-1]], "--", color=colour,
                label=f"{mode}: {overhead:.2f} + {per_token:.3f} n")
    ax.plot(tokens, gpu[1], "s-", color="tab:green", label=f"{gpu[0]} roofline, Qwen3-8B")
    ax.axhline(1, color="grey", lw=0.8)
    ax.set(xlabel="tokens in one verify pass (n)", ylabel="cost, in decode passes",
           title="What checking n tokens costs: overhead-, compute- and memory-bound passes")
    ax.legend(fontsize=8)
    plt.tight_layout()
    plt.show()


def draw_cpu_regimes(rows: list[dict]):
    """A verify pass's cost in decode passes against its tokens for real Qwen3 shapes on a CPU
    (`benchmarks/cpu_study.py`'s rows: measured points and the fitted line, one colour a row)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.8))
    for row, colour in zip(rows, ("tab:green", "tab:olive", "tab:cyan", "tab:red", "tab:purple")):
        decode, fit = row["decode_ms"], row["verify_fit_ms"]
        tokens = sorted(int(n) for n in row["verify_ms"])
        ax.plot(tokens, [row["verify_ms"][str(n)] / decode for n in tokens], "o", color=colour,
                label=f"{row['shape']} {row['dtype']}, measured")
        ax.plot([1, tokens[-1]], [(fit["overhead"] + fit["per_token"] * n) / decode
                                  for n in (1, tokens[-1])], "--", color=colour)
    ax.axhline(1, color="grey", lw=0.8)
    ax.set(xlabel="tokens in one verify pass (n)", ylabel="cost, in decode passes",
           title="Real Qwen3 shapes on one CPU core: bf16 nearly flat, float32 not")
    ax.legend(fontsize=8)
    plt.tight_layout()
    plt.show()


# ------------------------------------------------------------------ notebook 3: KV injection, attention maps


def draw_kv_injection(dc):
    """The target's chosen layers feeding the drafter: the features are concatenated, fused by fc and
    hidden_norm into one context vector per token, and enter every drafter layer as keys and values
    in front of the block's; only the block flows through the drafter. `dc` a DrafterConfig."""
    plt = pyplot()
    L, taps, D, step = dc.num_target_layers, dc.target_layer_ids, dc.layers.num_hidden_layers, 0.6
    fig, ax = plt.subplots(figsize=(13, 7))
    ax.set(xlim=(0, 13.5), ylim=(-0.4, L * step + 1.6))
    ax.axis("off")
    # The target, bottom to top: embedding, its layers (the ones read highlighted), LM head.
    _box(ax, 0.3, 0, "target: embed_tokens", "whitesmoke", size=(2.4, 0.45), fontsize=9)
    layer_y = {i: 0.6 + i * step for i in range(L)}
    for i, y in layer_y.items():
        _box(ax, 0.3, y, f"target layer {i}", "gold" if i in taps else "whitesmoke", size=(2.4, 0.45), fontsize=9)
    _box(ax, 0.3, 0.6 + L * step, "norm, LM head", "whitesmoke", size=(2.4, 0.45), fontsize=9)
    ax.text(1.5, 0.6 + L * step + 0.75, "target\n(run over the context)", ha="center", fontsize=10, weight="bold")
    # Features: concatenated, fused by fc + hidden_norm into the context.
    fuse_y = 0.6 + (L // 2) * step
    _box(ax, 3.8, fuse_y - 0.05, f"concatenate\n(n, {len(taps)} × hidden)", "lightyellow", size=(2.0, 0.55),
         fontsize=9)
    for i in taps:
        _arrow(ax, (2.7, layer_y[i] + 0.22), (3.8, fuse_y + 0.22))
    _box(ax, 3.8, fuse_y - 1.0, "fc, hidden_norm\ncontext (n, hidden)", "lightyellow", size=(2.0, 0.55), fontsize=9)
    _arrow(ax, (4.8, fuse_y - 0.05), (4.8, fuse_y - 0.45))
    # The drafter, bottom to top: the block's embedding, its layers, the final norm and the target's LM head.
    x0, width = 7.6, 5.4
    _box(ax, x0, 0, "block [last, MASK, ..., MASK] → target's embed_tokens", "lightblue", size=(width, 0.45),
         fontsize=9)
    height = (L * step - 0.3) / D
    drafter_y = [0.6 + d * (height + 0.15) for d in range(D)]
    for d, y in enumerate(drafter_y):
        _box(ax, x0, y, "", "aliceblue", size=(width, height))
        ax.text(x0 + 0.1, y + height - 0.2, f"drafter layer {d}", fontsize=9, weight="bold")
        inner = (height - 0.65) / 2  # two stacked boxes on the left, attention on the right
        _box(ax, x0 + 0.2, y + 0.15, "k, v of the context\n(this layer's k_proj, v_proj)", "lightyellow",
             size=(2.5, inner))
        _box(ax, x0 + 0.2, y + 0.3 + inner, "q, k, v of the block", "lightblue", size=(2.5, inner))
        _box(ax, x0 + 3.2, y + 0.15, "attention: the block's\nqueries over the keys\nand values of\n"
             "[context ; block]\n(no mask), then MLP", "white", size=(2.0, height - 0.5))
        _arrow(ax, (x0 + 2.7, y + 0.15 + inner / 2), (x0 + 3.2, y + 0.15 + inner / 2))
        _arrow(ax, (x0 + 2.7, y + 0.3 + 1.5 * inner), (x0 + 3.2, y + 0.3 + 1.5 * inner))
        _arrow(ax, (5.8, fuse_y - 0.72), (x0 + 0.2, y + 0.15 + inner / 2), "darkgoldenrod")
        if d:
            _arrow(ax, (x0 + width / 2, drafter_y[d - 1] + height), (x0 + width / 2, y))
    _arrow(ax, (x0 + width / 2, 0.45), (x0 + width / 2, drafter_y[0]))
    top = drafter_y[-1] + height
    _box(ax, x0, top + 0.15, f"norm → target's LM head → {dc.block_size - 1} guesses", "lightblue",
         size=(width, 0.45), fontsize=9)
    _arrow(ax, (x0 + width / 2, top), (x0 + width / 2, top + 0.15))
    ax.text(x0 + width / 2, top + 0.95, "drafter\n(run over the block only)", ha="center", fontsize=10, weight="bold")
    ax.text(4.8, fuse_y - 2.0, "the same context,\ninjected into every layer\nas keys and values", ha="center",
            fontsize=8, color="darkgoldenrod")
    plt.show()


def draw_attention_maps(weights: list[torch.Tensor], context: int):
    """One row per drafter layer: its attention weights (heads, block, context + block), averaged over the
    heads, on the context (left) and on the block (right, drawn wider), on a compressed colour scale
    (a power of 0.4) so that small weights stay visible."""
    from matplotlib.colors import PowerNorm

    plt = pyplot()
    block = weights[0].shape[1]
    fig, axes = plt.subplots(len(weights), 2, figsize=(13, 3.2 * len(weights)), squeeze=False,
                             gridspec_kw=dict(width_ratios=[context, 2.5 * block]))
    scale = PowerNorm(0.4, vmin=0, vmax=1)
    for index, (row, w) in enumerate(zip(axes, weights)):
        mean = w.mean(dim=0)  # (block, context + block): averaged over the query heads
        row[0].imshow(mean[:, :context], aspect="auto", cmap="viridis", norm=scale)
        image = row[1].imshow(mean[:, context:], aspect="auto", cmap="viridis", norm=scale)
        row[0].set(title=f"drafter layer {index}: attention on the context", ylabel="query: block slot")
        row[1].set(title="...and on the block")
        row[1].set_yticks([])
        row[1].set_xticks(range(0, block, 3))
        fig.colorbar(image, ax=row[1], pad=0.02, label="attention weight")
    axes[-1][0].set_xlabel(f"key: context position (0 .. {context - 1})")
    axes[-1][1].set_xlabel("key: block slot")
    plt.tight_layout()
    plt.show()


# ------------------------------------------------------------------ notebook 4: training curves


def draw_training_curves(steps, losses, accuracy, shipped_steps, shipped_accuracy, *, uniform: float,
                         shipped_title: str):
    """Three panels: this run's loss (log scale, with ln(vocab) dashed), its per-slot accuracy, and the
    shipped drafter's run for a few slots with a dotted line where this run stops. `accuracy` is
    (log lines, B-1), `shipped_accuracy` (shipped log lines, its B-1)."""
    from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter

    plt = pyplot()
    fig, (loss_ax, slots_ax, shipped_ax) = plt.subplots(1, 3, figsize=(14, 3.6))
    loss_ax.plot(steps, losses, marker=".")
    loss_ax.plot(0, losses[0], "o", color="tab:red", label="step 0: the untrained drafter")
    loss_ax.axhline(uniform, color="grey", linestyle="--", label="ln(vocab): a uniform guess")
    loss_ax.set(xlabel="step", ylabel="weighted loss (log scale)", yscale="log", title="this run: loss")
    loss_ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    loss_ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    loss_ax.yaxis.set_minor_formatter(NullFormatter())
    loss_ax.legend(fontsize=7)
    colours = plt.cm.viridis(torch.linspace(0, 0.9, accuracy.shape[1]).tolist())
    for slot in range(accuracy.shape[1]):
        slots_ax.plot(steps, accuracy[:, slot], color=colours[slot], label=f"slot {slot + 1}")
    slots_ax.set(xlabel="step", ylabel="accuracy (training batches)", ylim=(0, 1), title="this run: per-slot accuracy")
    slots_ax.legend(fontsize=7, ncol=2)
    last = shipped_accuracy.shape[1] - 1
    for slot in sorted({0, last // 4, last // 2, last}):
        shipped_ax.plot(shipped_steps, shipped_accuracy[:, slot], label=f"slot {slot + 1}")
    shipped_ax.axvline(steps[-1], color="grey", linestyle=":", label="where this run stops")
    shipped_ax.set(xlabel="step", ylabel="accuracy (training batches)", ylim=(0, 1), title=shipped_title)
    shipped_ax.legend(fontsize=7)
    plt.tight_layout()
    plt.show()


def draw_reach_curves(curves):
    """Per drafter, the chance a draft gets through slot k: the product of slot accuracies at every anchor
    and at the block starts, against the real share of steps that kept slot k (with binomial error bars).
    `curves`: (name, every-anchor curve, block-start curve, kept, steps) per drafter."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(curves), figsize=(11, 3.4), sharey=True)
    for ax, (name, every_curve, start_curve, kept, count) in zip(axes, curves):
        slots = range(1, len(kept) + 1)
        ax.plot(slots, every_curve, "--", marker=".", label="product of accuracies, every anchor")
        ax.plot(slots, start_curve, marker=".", label="product of accuracies, block starts")
        error = (kept * (1 - kept) / count).sqrt()  # (B-1,): binomial standard error over the steps
        ax.errorbar(slots, kept, yerr=error, color="black", marker="o", capsize=3,
                    label=f"real: steps that kept slot k ({count} steps)")
        ax.set(xlabel="slot k", title=f"{name}: tau = 1 + the sum of a curve", ylim=(0, 1))
        ax.legend(fontsize=7)
    axes[0].set_ylabel("chance a draft gets through slot k")
    plt.tight_layout()
    plt.show()


# ------------------------------------------------------------------ notebook 5: colours, acceptance, benchmark bars


def coloured_html(tokenizer, result, drafts_per_step, committed, block: int) -> str:
    """HTML of one answer: accepted drafts green, the target's own tokens plain, and after each step that
    rejected a draft, that draft small, red and struck out. `committed`: (token, drafted) per committed token,
    as the loop's `on_token` sees them; `drafts_per_step`: each step's drafts as the drafter proposed them."""
    import html

    piece = lambda ids: html.escape(tokenizer.decode(ids))  # noqa: E731
    out = [piece([committed[0][0]])]  # the prefill's token
    position = 1
    for length, drafts in zip(result.acceptance_lengths, drafts_per_step):
        for token, drafted in committed[position:position + length]:
            style = "background:#c6f0c2;color:#05400a" if drafted else ""
            out.append(f'<span style="{style}">{piece([token])}</span>')
        if length < block and position + length <= len(committed):  # a draft was rejected in this step
            rejected = tokenizer.decode([drafts[length - 1]]).replace("\n", "⏎")
            out.append(f'<span style="color:#c00;font-size:70%;text-decoration:line-through">'
                       f'{html.escape(rejected)}</span>')
        position += length
    return "<pre style='line-height:1.5'>" + "".join(out) + "</pre>"


def wilson(rate: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95 % Wilson interval of a rate measured on n trials: (low, high). Unlike rate ± 2 standard errors
    it stays inside [0, 1] and is honest for small n, where the late draft slots live."""
    centre = (rate + z * z / (2 * n)) / (1 + z * z / n)
    half = z * (rate * (1 - rate) / n + z * z / (4 * n * n)) ** 0.5 / (1 + z * z / n)
    return centre - half, centre + half


def draw_acceptance(histogram: list[int], rates: list, reached: list[int], tau: float):
    """Left: the acceptance histogram (share of steps committing 1..B tokens, counts above the bars, tau
    dashed). Right: each slot's rate of being kept given the slot before it was, with 95 % Wilson intervals
    and, above each bar, how many steps reached that slot."""
    plt = pyplot()
    steps, block = sum(histogram), len(histogram)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 3.8))
    left.bar(range(1, block + 1), [count / steps for count in histogram], color="tab:green")
    left.axvline(tau, color="black", linestyle="--", label=f"tau = {tau:.2f}")
    for size, count in enumerate(histogram, start=1):
        if count:
            left.text(size, count / steps, str(count), ha="center", va="bottom", fontsize=7)
    left.set(xlabel="tokens committed in one step (number above: steps)", ylabel="share of steps",
             title=f"acceptance histogram ({steps} steps)")
    left.legend()
    slots = [k for k in range(1, block) if reached[k - 1]]
    values = [rates[k - 1] for k in slots]
    intervals = [wilson(rates[k - 1], reached[k - 1]) for k in slots]
    errors = [[v - low for v, (low, _) in zip(values, intervals)], [high - v for v, (_, high) in zip(values, intervals)]]
    right.bar(slots, values, color="tab:blue", yerr=errors, capsize=2, ecolor="black")
    for k in slots:
        right.text(k, 1.02, str(reached[k - 1]), ha="center", fontsize=7)
    right.set(xlabel="draft slot k (number above: steps that reached it)", ylabel="P(slot k kept | slot k-1 kept)",
              ylim=(0, 1.1), title="per-position acceptance, 95 % intervals")
    plt.tight_layout()
    plt.show()


def draw_bench_bars(rows: dict, blocks: list[int]):
    """benchmarks/bench.py's rows, (kind, block) -> its pooled figures: tau of DFlash and of the oracle per
    block (left); the measured speedups and DFlash's ideal one at its tau (right)."""
    plt = pyplot()
    fig, (taus, speedups) = plt.subplots(1, 2, figsize=(12, 3.6))
    width = 0.27
    for i, block in enumerate(blocks):
        dflash, oracle = rows[("DFlash", block)], rows[("oracle", block)]
        first = i == 0  # label each series once
        taus.bar(i - width / 2, dflash["tau"], width, color="tab:green", label="DFlash" if first else None)
        taus.bar(i + width / 2, oracle["tau"], width, color="tab:grey",
                 label="oracle (every draft right)" if first else None)
        speedups.bar(i - width, dflash["speedup"], width, color="tab:green", label="DFlash, measured" if first else None)
        speedups.bar(i, dflash["ideal_speedup"], width, color="tab:olive",
                     label="DFlash, ideal at its tau" if first else None)
        speedups.bar(i + width, oracle["speedup"], width, color="tab:grey", label="oracle, measured" if first else None)
    for ax, what in zip((taus, speedups), ("tau (mean step length)", "speedup over the plain loop")):
        ax.set_xticks(range(len(blocks)), [f"block {b}" for b in blocks])
        ax.set(xlabel=f"block size ({rows[('DFlash', blocks[0])]['prompts']} prompts each)", ylabel=what)
        ax.legend(fontsize=8)
    speedups.axhline(1.0, color="black", linewidth=0.8)
    plt.tight_layout()
    plt.show()


# ------------------------------------------------------------------ notebook 6: pitfalls


def draw_tau_against_repetition(points: dict, *, degenerate_below: float):
    """τ of each run against its distinct-4-gram ratio: `points` label -> (colour, [(ratio, tau), ...])."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, (colour, xy) in points.items():
        ax.scatter(*zip(*xy), color=colour, label=label)
    ax.axvline(degenerate_below, color="black", linestyle=":", label="degenerate below this")
    ax.set(xlabel="distinct-4-gram ratio of the output", ylabel="tau of the run (tokens per step)", xlim=(0, 1.05),
           ylim=(0, None), title=f"tau against repetition, {sum(len(xy) for _, xy in points.values())} runs")
    ax.legend(fontsize=8, loc="center left")
    plt.show()


def draw_gap_histogram(gaps: list[float], error: float, *, prompts: int):
    """How far the top logit leads the second at each greedy position (log scale), against the bfloat16 error."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.4))
    ax.hist(gaps, bins=torch.logspace(-4, 1.5, 40).tolist(), color="tab:blue")
    ax.axvline(error, color="tab:red", label=f"largest |float32 - bfloat16| logit difference here ({error:.2f})")
    ax.set(xscale="log", xlabel="top-1 minus top-2 logit (float32)", ylabel="positions",
           title=f"{len(gaps)} greedy positions on {prompts} prompts")
    ax.legend(fontsize=8)
    plt.show()


def draw_block_costs(figures: dict, decode_ms: float):
    """Left: a step's passes (verify, draft) in ms against the block size, beside one plain decode pass.
    Right: tau, the ideal speedup at that tau and the measured one. `figures`: block -> bench.py's row."""
    plt = pyplot()
    blocks = sorted(figures)
    fig, (cost, gain) = plt.subplots(1, 2, figsize=(12, 3.6))
    for phase, label in (("verify", "verify (B tokens)"), ("draft", "draft")):
        cost.plot(blocks, [figures[b]["per_step_ms"][phase] for b in blocks], marker="o", label=label)
    cost.axhline(decode_ms, color="black", linestyle="--", label="plain decode (1 token)")
    cost.set(xlabel="block size B", ylabel="ms per pass", title="what one step costs (this CPU)", xticks=blocks,
             ylim=(0, None))
    cost.legend(fontsize=8)
    for key, label in (("tau", "tau"), ("ideal_speedup", "ideal speedup at that tau"), ("speedup", "measured speedup")):
        gain.plot(blocks, [figures[b][key] for b in blocks], marker="o", label=label)
    gain.axhline(1, color="black", linewidth=0.8)
    gain.set(xlabel="block size B", ylabel="tau (tokens per step), speedup (x)", title="what it buys", xticks=blocks)
    gain.legend(fontsize=8)
    plt.tight_layout()
    plt.show()


def draw_keep_probabilities(temperatures: list[float], exact: dict, at_hot: list[torch.Tensor], *, contexts: int):
    """Left: each rule's exact keep probability against the temperature, unfiltered and filtered; `exact`:
    (T, filtered) -> (greedy, sampled). Right: per slot at T 1.5, unfiltered; `at_hot`: (greedy, sampled)."""
    plt = pyplot()
    fig, (by_t, by_slot) = plt.subplots(1, 2, figsize=(12, 3.6))
    for filtered, style, marker in ((False, "-", "o"), (True, "--", "s")):
        suffix = ", top-k 20, top-p 0.8" if filtered else ""
        by_t.plot(temperatures, [exact[t, filtered][0] for t in temperatures], marker=marker, linestyle=style,
                  color="tab:blue", label="greedy drafts: p(argmax q)" + suffix)
        by_t.plot(temperatures, [exact[t, filtered][1] for t in temperatures], marker=marker, linestyle=style,
                  color="tab:orange", label="sampled drafts: sum min(p, q)" + suffix)
    slots = range(1, len(at_hot[0]) + 1)
    by_t.set(xlabel="temperature T", ylabel="P(slot kept), mean over slots", ylim=(0, 1),
             title=f"keep probability, exact, {contexts} contexts x {len(slots)} slots")
    by_t.legend(fontsize=7)
    by_slot.plot(slots, at_hot[0], marker="o", color="tab:blue", label="greedy drafts")
    by_slot.plot(slots, at_hot[1], marker="o", color="tab:orange", label="sampled drafts")
    by_slot.set(xlabel="draft slot", ylabel="P(slot kept), mean over contexts", ylim=(0, 1), xticks=slots,
                title=f"per slot at T 1.5, no filters ({contexts} contexts each)")
    by_slot.legend(fontsize=8)
    plt.tight_layout()
    plt.show()


def draw_policy_taus(taus: dict, settings: list[str], policies: list[str], per_slot: dict, *, greedy_tau: float,
                     hot: str):
    """Left: tau per draft policy and sampling setting, with bootstrap standard errors; `taus`: (setting,
    policy) -> (tau, error). Right: per-slot acceptance at the setting `hot` with Wilson 95 % intervals;
    `per_slot`: policy -> (rates, reached) per slot 1..B-1."""
    plt = pyplot()
    fig, (bars, slots_ax) = plt.subplots(1, 2, figsize=(13, 3.8))
    width = 0.27
    for j, policy in enumerate(policies):
        xs = [i + (j - 1) * width for i in range(len(settings))]
        bars.bar(xs, [taus[name, policy][0] for name in settings], width,
                 yerr=[taus[name, policy][1] for name in settings], capsize=3, label=policy)
    bars.axhline(greedy_tau, color="black", linestyle=":", label="T 0 (greedy decoding)")
    bars.set_xticks(range(len(settings)), list(settings), fontsize=8)
    bars.set(ylabel="tau (tokens per step)", xlabel="sampling", ylim=(0, 9.5),
             title="tau per draft policy (bootstrap standard errors)")
    bars.legend(fontsize=7, ncol=4, loc="upper center")
    for j, policy in enumerate(policies):
        rates, reached = per_slot[policy]
        shown = [(slot, rate, n) for slot, (rate, n) in enumerate(zip(rates, reached), start=1) if n]
        intervals = [wilson(rate, n) for _, rate, n in shown]
        low = [rate - lo for (_, rate, _), (lo, _) in zip(shown, intervals)]
        high = [hi - rate for (_, rate, _), (_, hi) in zip(shown, intervals)]
        slots_ax.errorbar([slot + (j - 1) * 0.2 for slot, _, _ in shown], [rate for _, rate, _ in shown],
                          yerr=[low, high], marker="o", capsize=2, linestyle="-",
                          label=f"{policy} (steps reaching slot 1, 8, 15: {reached[0]}, {reached[7]}, {reached[14]})")
    slots_ax.set(xlabel="draft slot", ylabel="kept / reached", ylim=(0, 1.05), xticks=range(1, len(rates) + 1),
                 title=f"per-slot acceptance at {hot}, Wilson 95 % intervals")
    slots_ax.legend(fontsize=7, loc="lower left")
    plt.tight_layout()
    plt.show()


# ------------------------------------------------------------------ notebook 7: draft trees


def token_label(tokenizer, token: int) -> str:
    """A token, short enough for a figure: ⏎ for a newline, ␣11 for a run of 11 spaces, · for one space."""
    import re

    text = tokenizer.decode([token]).replace("\n", "⏎")
    text = re.sub(r" {2,}", lambda run: f"␣{len(run.group())}", text)
    return text.replace(" ", "·")


def draw_top_choices(probs: torch.Tensor, truth_rank: list, chain_kept: int):
    """The drafter's top choices per slot as stacked bars, `probs` (slots, top); the truth outlined in green
    where `truth_rank[d]` names its rank among them, a red cross where it is not among them; a dashed line
    where the chain stops."""
    plt = pyplot()
    slots, top = probs.shape
    fig, ax = plt.subplots(figsize=(12, 3.6))
    bottom = torch.zeros(slots)
    for rank, colour in enumerate(["tab:blue", "cornflowerblue", "lightsteelblue", "lavender"][:top]):
        ax.bar(range(1, slots + 1), probs[:, rank], bottom=bottom, color=colour, label=f"choice {rank + 1}")
        bottom += probs[:, rank]
    for d, rank in enumerate(truth_rank):
        if rank is not None:
            ax.bar(d + 1, probs[d, rank], bottom=probs[d, :rank].sum(), fill=False, edgecolor="tab:green", linewidth=2.5)
        else:
            ax.plot(d + 1, bottom[d] + 0.04, marker="x", color="tab:red", markersize=9, markeredgewidth=2)
    ax.axvline(chain_kept + 0.5, color="black", linestyle="--", linewidth=1)
    ax.text(chain_kept + 0.6, 1.02, "the chain stops here", fontsize=9, va="bottom")
    ax.set(xlabel="draft slot (depth)", ylabel="drafter's probability", xticks=list(range(1, slots + 1)),
           ylim=(0, 1.15), title=f"the drafter's top-{top} tokens per slot; green outline: the target's token")
    ax.legend(loc="upper right", fontsize=8, ncol=4)
    plt.show()


def draw_tree(tree, labels: list[str], *, title: str, path=(), bonus_label: str | None = None):
    """The tree left to right by depth, each node's token (`labels`, one per node), index and own probability;
    the root gold, the kept `path` green, and after it the target's bonus token. A leaf takes the next free
    row; a parent sits level with its first child, so the top row is the chain."""
    import math

    plt = pyplot()
    children = {node: [] for node in range(len(tree.tokens))}
    for node in range(1, len(tree.tokens)):
        children[tree.parents[node]].append(node)  # in joining order: likeliest child first
    row, rows = {}, iter(range(len(tree.tokens)))

    def place(node):
        for child in children[node]:
            place(child)
        row[node] = row[children[node][0]] if children[node] else next(rows)

    place(0)
    leaves = len(tree.tokens) - len(set(tree.parents[1:]))  # the rows used
    fig, ax = plt.subplots(figsize=(12, 0.55 * leaves + 1.5))
    for node in range(1, len(tree.tokens)):
        parent = tree.parents[node]
        ax.plot([tree.depths[parent], tree.depths[node]], [row[parent], row[node]], color="grey", zorder=1)
    for node, text in enumerate(labels):
        colour = "gold" if node == 0 else ("#9be59b" if node in path else "aliceblue")
        ax.text(tree.depths[node], row[node], text, ha="center", va="center", fontsize=9, zorder=2,
                bbox=dict(boxstyle="round", facecolor=colour, edgecolor="grey"))
        own = tree.scores[node] - (tree.scores[tree.parents[node]] if node else 0.0)
        note = f"#{node}  {math.exp(own):.2f}" if node else "#0"  # index, and the node's own probability
        ax.text(tree.depths[node], row[node] + 0.38, note, ha="center", va="center", fontsize=7, color="dimgrey")
    if bonus_label is not None:
        end = path[-1]
        ax.plot([tree.depths[end], tree.depths[end] + 1], [row[end], row[end]], color="tab:green", linestyle="--")
        ax.text(tree.depths[end] + 1, row[end], bonus_label, ha="center", va="center", fontsize=9,
                bbox=dict(boxstyle="round", facecolor="white", edgecolor="tab:green", linestyle="--"))
        ax.text(tree.depths[end] + 1, row[end] + 0.38, "bonus", ha="center", fontsize=7, color="tab:green")
    extra = 1 if bonus_label is not None else 0
    ax.set(xlim=(-0.6, max(tree.depths) + 0.6 + extra), ylim=(leaves - 0.3, -0.8),
           xticks=range(max(tree.depths) + 1 + extra), xlabel="depth (slot of the block)", title=title)
    ax.set_yticks([])
    for side in ("left", "right", "top"):
        ax.spines[side].set_visible(False)
    plt.show()


def draw_ancestor_mask(tree_mask: torch.Tensor, whole: torch.Tensor, labels: list[str], *, start: int, shown: int):
    """Left: the ancestor mask, node i may see node j. Right: what attention gets, the last `shown` committed
    slots then the tree's (`whole` is (nodes, keys) over the cache)."""
    plt = pyplot()
    nodes = len(labels)
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.2), gridspec_kw=dict(width_ratios=[nodes, shown + nodes]))
    left.imshow(tree_mask, cmap="Greens", vmin=0, vmax=1.4)
    left.set(title="ancestor_mask: node i may see node j", xlabel="key: node j", ylabel="query: node i")
    left.set_xticks(range(nodes))
    left.set_yticks(range(nodes), labels, fontsize=8)
    right.imshow(whole[:, start - shown:], cmap="Greens", vmin=0, vmax=1.4)
    right.axvline(shown - 0.5, color="black", linewidth=1.5)
    right.set(title="what attention gets: the committed slots, then the tree's", xlabel="key: cache slot",
              ylabel="query: node i (rows as on the left)")
    right.set_xticks(range(shown + nodes), [str(start - shown + j) for j in range(shown + nodes)], rotation=90,
                     fontsize=8)
    right.set_yticks([])
    plt.tight_layout()
    plt.show()


def draw_compaction(labels: list[str], held_after: list[int], path: list[int], *, start: int):
    """The tree's cache slots after verify_tree (node i at start + i) and after commit_path (the path first,
    then stale nodes); `held_after[j]` is the node whose keys slot start + j holds after the move."""
    plt = pyplot()
    nodes = len(labels)
    fig, axes = plt.subplots(2, 1, figsize=(12, 2.6))
    stages = ((range(nodes), "after verify_tree: node i at slot start + i", False),
              (held_after, "after commit_path: the path at start, start + 1, ...; the rest is stale", True))
    for ax, (held, title, after) in zip(axes, stages):
        for j, node in enumerate(held):
            kept = node in path and (not after or j < len(path))
            colour = "#9be59b" if kept else ("whitesmoke" if after else "aliceblue")
            ax.text(j, 0, f"#{node}\n{labels[node]}", ha="center", va="center", fontsize=8,
                    bbox=dict(boxstyle="square", facecolor=colour, edgecolor="grey"))
        if after:
            ax.axvline(len(path) - 0.5, color="black", linewidth=1.5)
            ax.text(len(path) - 0.4, 0.55, "cache.length", fontsize=8)
        ax.set(xlim=(-0.6, nodes - 0.4), ylim=(-0.7, 0.9), title=title, xlabel="cache slot")
        ax.set_yticks([])
        ax.set_xticks(range(nodes), [str(start + j) for j in range(nodes)], fontsize=8)
        for side in ("left", "right", "top"):
            ax.spines[side].set_visible(False)
    plt.tight_layout()
    plt.show()


def draw_tree_taus(budgets: list[int], taus: dict, *, split: bool):
    """tau of trees against the budget, the chain's as a line; `taus` name -> (all prompts, non-degenerate);
    the non-degenerate subset drawn dashed when `split`."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for which, style, subset in [(0, "-", "all prompts")] + ([(1, "--", "non-degenerate")] if split else []):
        ax.plot(budgets, [taus[n][which] for n in budgets], marker="o", linestyle=style, color="tab:green",
                label=f"trees, {subset}")
        ax.axhline(taus["chain"][which], color="tab:blue", linestyle=style, label=f"chain, {subset}")
    ax.set_xscale("log", base=2)
    ax.set(xticks=budgets, xticklabels=budgets, xlabel="tree budget N (drafted nodes)",
           ylabel="tau (tokens per target pass)", title="tau: trees against the chain")
    ax.minorticks_off()
    ax.legend(fontsize=8)
    plt.show()


def draw_per_depth(series: dict, *, title: str):
    """Per depth, the share of steps that reached it and kept a draft there, with Wilson 95 % intervals and
    the count of steps that reached it. `series`: name -> (colour, {depth: (kept, reached)})."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(12, 3.8))
    for shift, (name, (colour, counts)) in zip((-0.15, 0.15), series.items()):
        depths = sorted(counts)
        rates = [counts[d][0] / counts[d][1] for d in depths]
        bounds = [wilson(rate, counts[d][1]) for rate, d in zip(rates, depths)]
        ax.errorbar([d + shift for d in depths], rates, yerr=[[r - lo for r, (lo, _) in zip(rates, bounds)],
                                                              [hi - r for r, (_, hi) in zip(rates, bounds)]],
                    marker="o", capsize=2, color=colour, label=name)
        for d in depths:
            ax.text(d + shift, 0.02 if shift < 0 else 0.09, str(counts[d][1]), ha="center", fontsize=7, color=colour)
    ax.set(xlabel="depth (draft slot)", ylabel="kept / reached", ylim=(0, 1.2), title=title,
           xticks=range(1, 1 + max(max(counts) for _, counts in series.values())))
    ax.legend(fontsize=8, loc="upper center", ncol=2)
    plt.show()


def draw_tree_costs(sizes: list[int], budgets: list[int], ms: dict, ideal: dict, *, block: int):
    """Left: one pass's time against the tree budget (tree verify and draft), beside the chain's verify and
    a plain decode. Right: the estimated speedup of each budget and of the chain."""
    plt = pyplot()
    fig, (cost, gain) = plt.subplots(1, 2, figsize=(12, 3.8))
    cost.plot(sizes, [ms[f"verify {n}"] for n in sizes], marker="o", color="tab:green", label="tree verify (N + 1 tokens)")
    cost.axhline(ms["chain verify"], color="tab:blue", linestyle="--", label=f"chain verify ({block} tokens)")
    cost.axhline(ms["decode"], color="black", linestyle=":", label="plain decode (1 token)")
    cost.plot(sizes, [ms[f"draft {n}"] for n in sizes], marker=".", color="tab:orange", label="tree draft")
    cost.set(xticks=[1, 8, 16, 32, 64], xlabel="tree budget N (a linear axis)", ylabel="ms per pass", ylim=(0, None),
             title="what one pass costs (this CPU)")
    cost.legend(fontsize=8)
    gain.plot(budgets, [ideal[n] for n in budgets], marker="o", color="tab:green", label="trees")
    gain.axhline(ideal["chain"], color="tab:blue", linestyle="--", label="chain")
    gain.axhline(1, color="black", linewidth=0.8)
    gain.set_xscale("log", base=2)
    gain.set(xticks=budgets, xticklabels=budgets, xlabel="tree budget N", ylim=(0, None), ylabel="estimated speedup (x)",
             title="what it buys: tau x t_decode / (t_draft + t_verify)")
    gain.legend(fontsize=8)
    for ax in (cost, gain):
        ax.minorticks_off()
    plt.tight_layout()
    plt.show()


# ------------------------------------------------------------------ notebook 8: the cost model


def draw_tau_curves(tau_constant, alphas=(0.5, 0.7, 0.8, 0.9, 0.95), blocks=range(1, 33)):
    """tau(B) for a few constant acceptances, each with its limit 1 / (1 - alpha) dotted."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.8))
    for alpha, colour in zip(alphas, ("tab:grey", "tab:blue", "tab:green", "tab:orange", "tab:red")):
        ax.plot(blocks, [tau_constant(alpha, b) for b in blocks], "o-", ms=3, color=colour, label=f"alpha = {alpha}")
        ax.axhline(1 / (1 - alpha), color=colour, ls=":", lw=1)
    ax.set(xlabel="block size B (tokens per step, the first one the target's)", ylabel="tau: expected tokens per step",
           title="tau(B) = (1 - alpha^B) / (1 - alpha); dotted: the limit 1 / (1 - alpha)")
    ax.legend(fontsize=8)
    plt.tight_layout()
    plt.show()


def draw_slot_profile(profile: list, kept: list[int], reached: list[int]):
    """Each slot's acceptance given the slots before it were kept, with its 95 % Wilson interval and, on top,
    the count of steps that reached it."""
    plt = pyplot()
    slots = range(1, len(profile) + 1)
    values = [a if a is not None else float("nan") for a in profile]
    bounds = [wilson(k / r, r) if r else (float("nan"),) * 2 for k, r in zip(kept, reached)]
    fig, ax = plt.subplots(figsize=(9, 3.8))
    ax.bar(slots, values, color="tab:blue")
    ax.errorbar(slots, values, yerr=[[v - lo for v, (lo, _) in zip(values, bounds)],
                                     [hi - v for v, (_, hi) in zip(values, bounds)]], fmt="none", color="black", capsize=3)
    for k, r in zip(slots, reached):
        ax.text(k, 1.07, f"{r}", ha="center", fontsize=7)
    ax.set(xlabel="draft slot k", ylabel="P(slot k kept | slots before kept)", ylim=(0, 1.15), xticks=list(slots),
           title=f"per-slot acceptance, block {len(profile) + 1}, {reached[0]} steps "
                 f"(numbers: steps that reached the slot)")
    plt.tight_layout()
    plt.show()


def draw_block_curve(curve: dict, predicted: dict, measured: dict, best: int):
    """The modelled speedup against the block size (`curve`, block -> x), the model of whole runs and the
    measured speedup at the benchmark's blocks, and the model's best block dotted."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.8))
    ax.plot(list(curve), list(curve.values()), "o-", ms=4, color="tab:blue",
            label="model: block-16 profile cut at B, fitted step cost")
    ax.plot(list(predicted), list(predicted.values()), "s", ms=8, mfc="none", color="tab:green",
            label="model of §3 (each block's own run)")
    ax.plot(list(measured), list(measured.values()), "x", ms=10, mew=2, color="black", label="measured")
    ax.axvline(best, color="tab:blue", ls=":", lw=1)
    ax.set(xlabel="block size B", ylabel="speedup over the plain loop", xticks=list(curve),
           title=f"best block: where one more slot stops paying (model: {best})")
    ax.legend(fontsize=8)
    plt.tight_layout()
    plt.show()


def draw_gpu_model(tokens: list[int], verify_ratios: dict, ridges: dict, sizes: list[int], speedups: dict,
                   demo: tuple):
    """Left: a verify pass's cost in decode passes against its tokens, per GPU (`verify_ratios`), with each
    GPU's FLOP/byte ridge. Right: modelled speedups against the block size (`speedups`: label -> (colour,
    style, values)), and the demo pair's profile as points (`demo`: blocks, values)."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 3.8))
    for (gpu, ratios), style in zip(verify_ratios.items(), ("-", "--")):
        left.semilogx(tokens, ratios, "o" + style, ms=3, base=2, label=gpu)
        left.axvline(ridges[gpu], color="grey", ls=style, lw=0.8)
    left.set(xlabel="tokens in one verify pass (B)", ylabel="cost / one decode pass",
             title="Qwen3-8B verify pass, roofline model (grey: FLOP/byte ridge)")
    left.legend(fontsize=8)
    for label, (colour, style, values) in speedups.items():
        right.plot(sizes, values, style, color=colour, label=label)
    right.plot(*demo, "o", ms=3, color="tab:blue", label="DFlash, the demo pair's profile")
    right.set(xlabel="block size B", ylabel="modelled speedup (passes only)",
              title="H200, Qwen3-8B: the model, not a measurement")
    right.legend(fontsize=7)
    plt.tight_layout()
    plt.show()


def draw_drafter_costs(sizes: list[int], t_draft: dict, t_ar: dict, t_decode: float):
    """Time to draft a block: one DFlash pass against B - 1 autoregressive passes, beside one decode pass."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax.plot(sizes, [t_draft[b] for b in sizes], "o-", ms=4, color="tab:orange", label="DFlash: one pass")
    ax.plot(sizes, [t_ar[b] for b in sizes], "s-", ms=4, color="tab:purple", label="autoregressive: B - 1 one-token passes")
    ax.axhline(t_decode, color="tab:blue", ls=":", label="one decode pass of the target")
    ax.set(xlabel="block size B", ylabel="ms to draft a block (fastest of 15)", xticks=sizes,
           title="drafting a block on this CPU: 2-layer drafters of the same width")
    ax.legend(fontsize=8)
    plt.tight_layout()
    plt.show()


# ------------------------------------------------------------------ a timeline of a loop's passes


class TimelineClock:
    """A clock for `dflash.measure.Timed` that keeps every pass, where `dflash.measure.PhaseClock` keeps sums.

    Each pass becomes (phase, start, length), in milliseconds since the clock was made; on a GPU it waits
    for queued work before each reading, as PhaseClock does. `stamp` records when a token was committed
    (pass it as the loop's `on_token`).
    """

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.zero, self.spans, self.stamps = time.perf_counter(), [], []

    def now_ms(self) -> float:
        return 1e3 * (time.perf_counter() - self.zero)

    @contextmanager
    def __call__(self, phase: str):
        from dflash.results import synchronize

        synchronize(self.device)
        start = self.now_ms()
        yield
        synchronize(self.device)
        self.spans.append((phase, start, self.now_ms() - start))

    def stamp(self, token: int, drafted: bool) -> None:
        self.stamps.append(self.now_ms())


PHASE_COLOURS = {"prefill": "lightgrey", "decode": "tab:blue", "draft": "tab:orange", "verify": "tab:green"}


def draw_timeline(rows: dict, *, title: str, stamps: dict | None = None):
    """Every pass of each loop as a bar, one row per loop, each bar edged in white so that a row of
    45 one-token passes shows 45 bars and not one block. `rows`: name -> (spans, result), spans from a
    TimelineClock; the time before a loop's first pass is its prefill (and the call's setup). A DFlash
    row's verify bars carry the tokens that step committed. `stamps`: name -> commit times (ms), drawn
    below as the tokens committed over time."""
    plt = pyplot()
    panels = 2 if stamps else 1
    fig, axes = plt.subplots(panels, 1, figsize=(12, 2.4 + 2.6 * (panels - 1)), sharex=True, squeeze=False,
                             gridspec_kw=dict(height_ratios=[1, 1.6][:panels]))
    bars, end = axes[0][0], 0.0
    for y, (name, (spans, result)) in enumerate(rows.items()):
        bars.broken_barh([(0, spans[0][1])], (y - 0.35, 0.7), color=PHASE_COLOURS["prefill"])
        for phase, start, length in spans:
            bars.broken_barh([(start, length)], (y - 0.35, 0.7), color=PHASE_COLOURS[phase], edgecolor="white",
                             linewidth=0.6)
        verifies = [(start, length) for phase, start, length in spans if phase == "verify"]
        for (start, length), n in zip(verifies, result.acceptance_lengths):
            bars.text(start + length / 2, y + 0.42, str(n), ha="center", fontsize=7)
        total = spans[-1][1] + spans[-1][2]
        bars.text(total, y, f"  {result.new_tokens} tokens, {total:.0f} ms", va="center", fontsize=8)
        end = max(end, total)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colour) for colour in PHASE_COLOURS.values()]
    bars.legend(handles, list(PHASE_COLOURS), loc="upper right", fontsize=8, ncol=4)
    bars.set(yticks=range(len(rows)), yticklabels=list(rows), ylim=(-0.6, len(rows) + 0.3), xlim=(0, end * 1.2),
             title=title)
    if stamps:
        curve = axes[1][0]
        for name, times in stamps.items():
            curve.step([0.0, *times], range(len(times) + 1), where="post", label=name)
        curve.set(xlabel="time since the call began (ms)", ylabel="tokens committed")
        curve.legend()
    else:
        bars.set(xlabel="time since the call began (ms)")
    plt.tight_layout()
    plt.show()


# ------------------------------------------------------------------ one DFlash step, drawn


# The example the picture draws: a 6-token prompt, blocks of 5 (the last token and 4 drafts), and a
# step that keeps 2 drafts. The numbers are small so that every cache slot can be drawn and named.
PROMPT, BLOCK, KEPT, SLOTS = 6, 5, 2, 13
COMMITTED, WRITTEN, EMPTY = "#5cb85c", "#d9d9d9", "white"  # a cache slot: counted / written, not counted / free
FEATURE_COLOUR, DRAFT_COLOUR, TARGET_COLOUR = "tab:orange", "#f5deb3", "#cfe2f3"


def _cache(ax, x, y, name, committed, written, *, labels=()):
    """A KV cache of SLOTS slots: `committed` slots counted (its `length`), then `written` slots that a pass
    wrote but nobody committed (the next pass overwrites them)."""
    colours = [COMMITTED] * committed + [WRITTEN] * written + [EMPTY] * (SLOTS - committed - written)
    texts = list(labels) + [""] * (SLOTS - len(labels))
    ax.text(x, y + 0.48, f"{name}: length {committed}", fontsize=7.5)
    _cells(ax, x, y, texts, colours, width=0.19, height=0.3, fontsize=5.5)


def draw_dflash_step(path: Path | str | None = None):
    """One step of `generate_dflash` (generate.py) in five panels: prefill, draft, verify, accept, commit.

    Each panel shows the pass's input and output tokens, the two KV caches after it (green: committed,
    counted in `length`; hatched grey: written by the pass but not committed), and where the target's
    features (its hidden states after the drafter's chosen layers) flow. Saved to `path` when given,
    shown otherwise.
    """
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(15, 6.2))
    ax.set(xlim=(-0.1, 15.1), ylim=(-0.9, 6.2))
    ax.axis("off")
    p = [f"p{i + 1}" for i in range(PROMPT)]  # the prompt
    d = [f"d{i + 1}" for i in range(BLOCK - 1)]  # the drafts
    y = [f"y{i}" for i in range(BLOCK)]  # the target's token after each slot of [t, d1, ..., d4]
    kept = ["t", *d[:KEPT]]  # what the commit adds to the target's cache: the last token and the kept drafts
    titles = ["1 · prefill", "2 · draft", "3 · verify", "4 · accept", "5 · commit"]
    notes = ["the target reads the prompt;\nit picks the first new token t",
             "the drafter fills [t, M, M, M, M]\nin one pass: 4 drafts",
             "the target reads [t, d1..d4] in one\npass: its own token after each slot",
             "keep drafts while d(i+1) = y(i);\nat the first miss take y there",
             f"target cache += kept + 1 = {KEPT + 1}\n(nothing trimmed, nothing copied)"]
    for i, (title, note) in enumerate(zip(titles, notes)):
        x = 3 * i
        ax.text(x, 5.95, title, fontsize=11, weight="bold")
        ax.text(x, 5.25, note, fontsize=7.5, va="bottom")
        if i < 4:
            _arrow(ax, (x + 2.45, 5.98), (x + 2.95, 5.98))

    # 1 · prefill: the prompt through the target; its features at every prompt position go to the drafter.
    _cells(ax, 0, 4.5, p, [TARGET_COLOUR] * PROMPT)
    _box(ax, 0, 3.6, "target (Qwen3)", TARGET_COLOUR, weight="bold")
    _cells(ax, 0, 2.85, ["t"], ["white"])
    ax.text(0.45, 2.93, "first new token", fontsize=7)
    _cache(ax, 0, 0.9, "target KV cache", PROMPT, 0, labels=p)
    _cache(ax, 0, -0.3, "drafter KV cache", 0, 0)
    ax.text(0, 2.45, "features: hidden states after the\ntarget's chosen layers, 6 positions", fontsize=7,
            color=FEATURE_COLOUR, va="top")

    # 2 · draft: the drafter reads the new context (6 feature rows) and the block of mask tokens.
    _cells(ax, 3, 4.5, ["t", "M", "M", "M", "M"], [DRAFT_COLOUR] * BLOCK)
    _cells(ax, 4.9, 4.5, ["f"] * 2 + ["…"], [FEATURE_COLOUR] * 2 + ["white"], width=0.3)
    _box(ax, 3, 3.6, "drafter (a few layers)", DRAFT_COLOUR, weight="bold")
    _cells(ax, 3.36, 2.85, d, [DRAFT_COLOUR] * (BLOCK - 1))
    _cache(ax, 3, 0.9, "target KV cache", PROMPT, 0, labels=p)
    scratch = ["f"] * PROMPT + ["t", "M", "M", "M", "M"]  # the context, kept; the block's slots, scratch
    _cache(ax, 3, -0.3, "drafter KV cache", PROMPT, BLOCK, labels=scratch)
    _arrow(ax, (1.8, 2.45), (5.0, 4.4), FEATURE_COLOUR, rad=0.25)

    # 3 · verify: the target reads [t, d1..d4] after the committed prompt; nothing is committed yet.
    _cells(ax, 6, 4.5, ["t", *d], [TARGET_COLOUR] * BLOCK)
    _box(ax, 6, 3.6, "target (Qwen3)", TARGET_COLOUR, weight="bold")
    _cells(ax, 6, 2.85, y, ["white"] * BLOCK)
    ax.text(6, 2.45, "+ features at the 5 slots", fontsize=7, color=FEATURE_COLOUR, va="top")
    _cache(ax, 6, 0.9, "target KV cache", PROMPT, BLOCK, labels=p + ["t", *d])
    _cache(ax, 6, -0.3, "drafter KV cache", PROMPT, BLOCK, labels=scratch)

    # 4 · accept: compare each draft with the target's token before it.
    verdicts = ["✓", "✓", "✗", "–"]
    for k, (draft, want, verdict) in enumerate(zip(d, y, verdicts)):
        row = 4.6 - 0.36 * k
        ax.text(9.0, row, f"{draft} vs {want}  {verdict}", fontsize=8.5,
                color="green" if verdict == "✓" else ("red" if verdict == "✗" else "grey"))
    ax.text(9.0, 3.3, f"accepted = {KEPT}: the output gains\n"
            f"{', '.join(d[:KEPT])}, then y{KEPT} (the target's token)\n= {KEPT + 1} tokens for one target pass;\n"
            "d4 is dropped: it followed a miss", fontsize=7.5, va="top")
    _cache(ax, 9, 0.9, "target KV cache", PROMPT, BLOCK, labels=p + ["t", *d])
    _cache(ax, 9, -0.3, "drafter KV cache", PROMPT, BLOCK, labels=scratch)

    # 5 · commit: the target's cache counts t and the kept drafts; the next block opens with y2.
    _cache(ax, 12, 0.9, "target KV cache", PROMPT + KEPT + 1, BLOCK - KEPT - 1, labels=p + kept + d[KEPT:])
    _cache(ax, 12, -0.3, "drafter KV cache", PROMPT, BLOCK, labels=scratch)
    ax.text(12, 4.6, f"next step: the block opens with\ny{KEPT} at position {PROMPT + KEPT + 1}; its draft first\n"
            f"takes in the features of the {KEPT + 1}\ncommitted positions (t, {', '.join(d[:KEPT])}):\n"
            f"drafter KV cache {PROMPT} → {PROMPT + KEPT + 1}", fontsize=7.5, va="top")
    _arrow(ax, (7.9, 2.1), (12.0, 2.1), FEATURE_COLOUR, "features of the kept positions, for the next draft",
           rad=0.1)

    legend = [(COMMITTED, "committed: counted in the cache's length"),
              (WRITTEN, "written by a pass, not committed: the next pass overwrites it"),
              (FEATURE_COLOUR, "f: the target's features (the drafter's context)")]
    for k, (colour, text) in enumerate(legend):
        _cells(ax, 0.2 + 5 * k, -0.85, [""], [colour], width=0.25, height=0.2)
        ax.text(0.55 + 5 * k, -0.8, text, fontsize=7.5)
    if path is None:
        plt.show()
    else:
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)


if __name__ == "__main__":
    import matplotlib

    matplotlib.use("Agg")
    STEP_PICTURE.parent.mkdir(exist_ok=True)
    draw_dflash_step(STEP_PICTURE)
    print(f"wrote {STEP_PICTURE.relative_to(ROOT)}")
