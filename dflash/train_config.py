"""A training run's configuration: every option of `train.py` as a field of `TrainConfig` (build one
directly, or from the command line through `build_parser`, which shows the same defaults), the
drafter's shape the options imply, and the sizes checked before any memory is taken."""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from dflash.checkpoint import total_memory
from dflash.cli import (HelpWithDefaults, OneLineErrors, UsageError, add_device_options, checked,
                        int_list, positive, positive_int)
from dflash.data import CUTS
from dflash.dflash2 import DFlash2Config, DFlash2Drafter, load_drafter
from dflash.drafter import Drafter, DrafterConfig, check_fits, default_target_layer_ids
from dflash.kept_checkpoints import training_states
from dflash.prompts import PROMPT_FORMAT
from dflash.qwen3 import Qwen3, Qwen3Config
from dflash.training import STATE_FILE, init_weights

DEFAULT_DRAFTER_LAYERS, DEFAULT_BLOCK_SIZE = 5, 16  # a new drafter's; --init-from: the drafter's
ARCHITECTURES = ("dflash", "dflash2")
# What --resume may change: when to stop, what to log and evaluate, where to run, where the folder
# and the data now are (the data's contents are compared), how the global batch is shared out
# (its size is compared). The rest must be as saved.
MAY_CHANGE_ON_RESUME = ("resume", "force", "minutes", "stop_at", "eval_prompts", "eval_every",
                        "eval_max_new_tokens", "save_every", "save_every_minutes", "log_every",
                        "device", "out", "data", "auto_resume", "batch_size", "grad_accum",
                        "save_dtype", "threads", "keep")


@dataclass
class TrainConfig:
    """A run's whole configuration, saved with it: `TrainConfig(target=..., data=..., out=...)` is
    a run at the defaults, which `build_parser` shows (--help says what each option does)."""
    target: str = ""  # the frozen target's checkpoint folder
    data: str = ""  # make_data.py's JSONL
    out: str = ""  # the run's folder
    tokenizer: str | None = None
    init_from: str | None = None  # a trained drafter to fine-tune
    arch: str = "dflash"  # or "dflash2": convolutions and the candidate selector (dflash2.py)
    # the drafter's shape; None: the --init-from drafter's, else the defaults or the target's
    drafter_layers: int | None = None
    block_size: int | None = None
    target_layer_ids: list[int] | None = None
    mask_token_id: int | None = None
    intermediate_size: int | None = None
    num_heads: int | None = None
    num_kv_heads: int | None = None
    head_dim: int | None = None
    # the recipe: the paper's and SpecForge's settings
    num_anchors: int = 512
    batch_size: int = 4
    grad_accum: int = 1
    max_seq_len: int = 3072
    cut: str = "answer-end"  # which end of a longer sequence goes: or "prompt-start"
    heldout: int = 0  # sequences set aside (a fixed draw), never trained on: held-out loss
    lr: float = 6e-4
    warmup: float = 0.04
    grad_clip: float = 1.0
    gamma: float | None = None
    distill_weight: float = 0.0  # 0: the target's tokens (hard labels); 1: its distributions
    selector_weight: float = 1.0  # dflash2: the selector's loss, beside the head's
    epochs: int = 6
    steps: int | None = None
    seed: int = 0
    # how a step computes, not what
    loss_chunk_size: int = 512
    keep_activations: bool = False
    dense_attention: bool = False
    fsdp: bool = False
    # evaluation, checkpoints, the log, stopping
    eval_prompts: str | None = None
    eval_every: int = 0
    eval_max_new_tokens: int = 128
    no_token_healing: bool = False
    save_every: int = 0
    keep: int = 1  # checkpoints kept: the newest in --out, and the last `keep` in checkpoints/
    save_every_minutes: float = 10.0
    log_every: int = 10
    minutes: float | None = None
    stop_at: int | None = None
    resume: bool = False
    force: bool = False
    auto_resume: bool = False  # resume if --out holds a checkpoint, else start
    device: str = "auto"
    threads: int | None = None  # CPU threads for torch (dflash.cli's default: cores minus one)
    dtype: str = "auto"  # the frozen target's: the drafter trains in float32
    save_dtype: str = "auto"  # the saved drafter's: the target's, as engines serve it




def save_dtype(cfg: TrainConfig, target_dtype: torch.dtype) -> str:
    """--save-dtype made concrete: auto is the target's dtype, which serving engines run drafters
    in (bfloat16 for real targets on CUDA)."""
    return str(target_dtype).removeprefix("torch.") if cfg.save_dtype == "auto" else cfg.save_dtype


def starting_or_resuming(cfg: TrainConfig) -> TrainConfig:
    """--auto-resume made concrete: --resume where --out holds a checkpoint, else --force (over
    what a run left before its first save), so that one command starts and restarts a run."""
    if not cfg.auto_resume:
        return cfg
    resumable = bool(training_states(Path(cfg.out), STATE_FILE))
    return replace(cfg, resume=resumable, force=not resumable)


# ------------------------------------------------------------------ the drafter it implies


def build_drafter_config(cfg: TrainConfig, target: Qwen3Config, tokenizer) -> DrafterConfig:
    """The drafter's shape: the target's width (its features and embeddings feed it), its depth
    our choice."""
    if cfg.mask_token_id is not None and not 0 <= cfg.mask_token_id < target.vocab_size:
        raise UsageError(f"--mask-token-id {cfg.mask_token_id} is outside the target's vocabulary "
                         f"(0..{target.vocab_size - 1})")
    mask_token_id = cfg.mask_token_id if cfg.mask_token_id is not None \
        else getattr(tokenizer, "mask_token_id", None)
    if mask_token_id is None:  # the first id past the tokenizer's, as released drafters; else last
        mask_token_id = min(getattr(tokenizer, "vocab_size", target.vocab_size),
                            target.vocab_size - 1)
    depth = cfg.drafter_layers or DEFAULT_DRAFTER_LAYERS
    layers = replace(target, num_hidden_layers=depth, tie_word_embeddings=False,
                     attention_bias=False, dtype="float32",
                     intermediate_size=cfg.intermediate_size or target.intermediate_size,
                     num_attention_heads=cfg.num_heads or target.num_attention_heads,
                     num_key_value_heads=cfg.num_kv_heads or target.num_key_value_heads,
                     head_dim=cfg.head_dim or target.head_dim)  # the rest is the target's
    if layers.head_dim % 2:  # what --head-dim refuses, for a TrainConfig built in Python
        raise UsageError(f"--head-dim {layers.head_dim}: must be even (RoPE turns pairs)")
    if layers.num_attention_heads % layers.num_key_value_heads:
        raise UsageError(f"--num-heads {layers.num_attention_heads} is not a multiple of "
                         f"--num-kv-heads {layers.num_key_value_heads}")
    check_drafter_size(layers, len(cfg.target_layer_ids or ()) or depth)
    layer_ids = cfg.target_layer_ids or default_target_layer_ids(target.num_hidden_layers, depth)
    config = DrafterConfig(layers, cfg.block_size or DEFAULT_BLOCK_SIZE, target.num_hidden_layers,
                           mask_token_id, list(layer_ids))
    check_fits(config, target, "drafter")
    return dflash2_config(config) if cfg.arch == "dflash2" else config


def dflash2_config(config: DrafterConfig) -> DFlash2Config:
    """A new DFlash2 drafter's extra fields: the released drafter's two taps, groups of 16
    channels (or fewer, to divide the width), top-16 candidates and a selector rank of at most
    256. The head is the target's as is (multiplier 1, no cap) and every layer attends to the
    whole context (no window), so the training code's block mask holds."""
    hidden, vocab = config.layers.hidden_size, config.layers.vocab_size
    group = next(size for size in (16, 8, 4, 2, 1) if hidden % size == 0)
    return DFlash2Config(**vars(config), conv_kernel_size=2, conv_group_size=group,
                         selector_rank=min(256, hidden), selector_top_k=min(16, vocab))


def check_arch(cfg: TrainConfig) -> None:
    """Refuse what the DFlash2 recipe does not do yet, in one line, before anything is loaded."""
    if cfg.arch not in ARCHITECTURES:
        raise UsageError(f"--arch must be one of {', '.join(ARCHITECTURES)}, got {cfg.arch!r}")
    if cfg.arch != "dflash2":
        return
    if cfg.distill_weight:
        raise UsageError("--distill-weight is not supported with --arch dflash2 (the selector "
                         "trains on the data's tokens)")
    if cfg.eval_prompts:
        raise UsageError("--eval-prompts is not supported with --arch dflash2 (it measures the "
                         "head's argmax, not the selector's walk); measure with generate.py or "
                         "bench.py after training")


def shape_of(config: DrafterConfig) -> dict:
    """The options that shape a drafter, as this drafter has them."""
    layers = config.layers
    return {"drafter_layers": layers.num_hidden_layers, "block_size": config.block_size,
            "target_layer_ids": config.target_layer_ids, "mask_token_id": config.mask_token_id,
            "intermediate_size": layers.intermediate_size, "num_heads": layers.num_attention_heads,
            "num_kv_heads": layers.num_key_value_heads, "head_dim": layers.head_dim}


def check_drafter_size(layers: Qwen3Config, features: int) -> None:
    """Refuse, before it is built, a drafter whose training state (float32 weights, gradients and
    AdamW's two moments: 16 bytes a parameter) cannot fit this machine's memory."""
    h, heads, kv, hd = (layers.hidden_size, layers.num_attention_heads, layers.num_key_value_heads,
                        layers.head_dim)
    per_layer = 2 * h * heads * hd + 2 * h * kv * hd + 3 * h * layers.intermediate_size
    parameters = layers.num_hidden_layers * per_layer + features * h * h  # and `fc`
    needed, available = 16 * parameters, total_memory(torch.device("cpu"))
    if available is not None and needed > available:  # None: the machine cannot tell
        raise UsageError(f"a drafter of {layers.num_hidden_layers} layers (--drafter-layers), "
                         f"{heads} heads of {hd} (--num-heads, --head-dim) and an MLP of "
                         f"{layers.intermediate_size} (--intermediate-size) has {parameters:.3g} "
                         f"parameters: about {needed / 2**30:.3g} GiB to train, more than this "
                         f"machine's {available / 2**30:.0f} GiB")


def starting_drafter(cfg: TrainConfig, target: Qwen3, tokenizer) -> Drafter:
    """A new drafter drawn at random, or, with --init-from, a trained one to fine-tune (in float32,
    trainable): its shape is then the run's, so one made for another target, or an option that
    would reshape it, is refused."""
    check_arch(cfg)
    if not cfg.init_from:
        config = build_drafter_config(cfg, target.config, tokenizer)
        if isinstance(config, DFlash2Config):
            return init_weights(DFlash2Drafter(config), cfg.seed).start_training()
        return init_weights(Drafter(config), cfg.seed)
    drafter = load_drafter(cfg.init_from, target, trainable=True)  # fits the target
    if isinstance(drafter, DFlash2Drafter) != (cfg.arch == "dflash2"):
        raise UsageError(f"--init-from {cfg.init_from} is a {type(drafter).__name__}, not what "
                         f"--arch {cfg.arch} trains")
    for name, weight in drafter.named_parameters():  # else the first step fails, far from here
        if not torch.isfinite(weight).all():
            raise UsageError(f"--init-from {cfg.init_from}: the weight {name} holds NaN or "
                             f"infinite values (a diverged or damaged drafter)")
    for option, theirs in shape_of(drafter.config).items():
        ours = getattr(cfg, option)
        if ours is not None and ours != theirs:
            raise UsageError(f"--{option.replace('_', '-')} {ours} does not fit the --init-from "
                             f"drafter's {option} {theirs} (leave the option out: the drafter's "
                             f"shape is the run's)")
    return drafter


def check_sizes(cfg: TrainConfig, config: DrafterConfig, target: Qwen3Config, sequences,
                device: torch.device) -> None:
    """Refuse, before any batch is built, a block the target has no positions for, or a step that
    cannot fit this machine: its block activations (one float32 hidden state per block slot and
    drafter layer, kept for the backward), the target's features, and on the CPU the attention
    mask over the blocks, for `sequences` (dflash.data.Sequences) as long as the longest."""
    longest = int(sequences.lengths.max())
    named = "--block-size" if not cfg.init_from else "the --init-from drafter's block_size"
    if config.block_size > target.max_position_embeddings:
        raise UsageError(f"{named} {config.block_size} does not fit the target's "
                         f"{target.max_position_embeddings} positions (max_position_embeddings)")
    slots = min(cfg.num_anchors, longest) * config.block_size  # block slots per sequence
    per_sequence = slots * config.layers.hidden_size * 4 * (config.layers.num_hidden_layers + 1)
    per_sequence += longest * len(config.target_layer_ids) * target.hidden_size * 4
    if device.type != "cuda":  # AnchoredBlocks' CPU path holds its mask: one byte per score
        per_sequence += slots * (longest + slots)
    if cfg.batch_size * cfg.grad_accum > len(sequences.starts):
        raise UsageError(f"--batch-size {cfg.batch_size} x --grad-accum {cfg.grad_accum} "
                         f"sequences a step: more than the data's {len(sequences.starts)}")
    needed, available = cfg.batch_size * per_sequence, total_memory(device)
    if available is not None and needed > available:
        raise UsageError(f"{named} {config.block_size} with --num-anchors {cfg.num_anchors}, "
                         f"--batch-size {cfg.batch_size} and sequences of {longest} tokens: one "
                         f"step would need about {needed / 2**30:.0f} GiB, more than the "
                         f"{available / 2**30:.0f} GiB of this machine's {device.type} memory")


# ------------------------------------------------------------------ the command line


zero_or_more = checked(int, "0 or more", lambda x: x >= 0)
seed_value = checked(int, "in 0..2**32 - 1", lambda x: 0 <= x < 2**32)


def build_parser() -> argparse.ArgumentParser:
    """Every option of a run, named as `TrainConfig`'s fields, with its defaults."""
    parser = OneLineErrors(description="Train a DFlash drafter for a frozen Qwen3 target.", epilog=(
        f"--eval-prompts: {PROMPT_FORMAT}\n\nCtrl-C or SIGTERM saves and exits (130 / 143). "
        "Examples, torchrun, memory, the log: docs/training.md."), formatter_class=HelpWithDefaults)
    add = parser.add_argument
    add("--target", required=True, help="the frozen target's checkpoint folder")
    add("--data", required=True, help="JSONL written by make_data.py (input_ids and loss_mask "
        "per line), or the folder its --pack wrote (memory-mapped: never read whole)")
    add("--out", required=True, help="folder for the drafter, training_state.pt and "
        "train_log.jsonl; one run at a time (train.lock holds its process id)")
    add("--tokenizer", help="tokenizer folder (default: the target's, if it has one)")
    add("--init-from", help="fine-tune this trained drafter (ours or the authors' layout) "
        "instead of drawing a new one: its shape (layers, block size, target layers, mask token) "
        "is the run's")
    add("--arch", choices=ARCHITECTURES, help="the drafter: DFlash, or DFlash2 (convolutions "
        "around each sublayer and a candidate selector, trained by its own loss too)")
    add("--drafter-layers", type=positive_int,
        help=f"decoder layers of the drafter (default: {DEFAULT_DRAFTER_LAYERS})")
    add("--block-size", type=checked(int, "at least 2", lambda x: x >= 2),
        help=f"B, tokens per block: slot 0 is the known token, slots 1..B-1 guessed (default: "
             f"{DEFAULT_BLOCK_SIZE}; at most the target's positions)")
    add("--target-layer-ids", type=int_list, help="target layers whose outputs feed the drafter, "
        "e.g. 1,9,17,25,33 (default: spread over the target)")
    add("--mask-token-id", type=int, help="the unknown slots' token (default: <|mask|>, else "
                                          "len(tokenizer))")
    add("--intermediate-size", type=positive_int, help="drafter MLP width (default: the target's)")
    add("--num-heads", type=positive_int, help="drafter query heads (default: the target's)")
    add("--num-kv-heads", type=positive_int, help="drafter key/value heads (default: the target's)")
    add("--head-dim", type=checked(int, "even and at least 2 (RoPE turns pairs of dimensions)",
                                   lambda x: x >= 2 and x % 2 == 0),
        help="drafter head width (default: the target's)")
    add("--num-anchors", type=positive_int,
        help="blocks per sequence per step, at most one per anchor")
    add("--batch-size", type=positive_int, help="sequences per forward pass and per process")
    add("--grad-accum", type=positive_int, help="forward passes per optimizer step: a step trains "
        "on batch-size x processes x grad-accum sequences")
    add("--max-seq-len", type=positive_int, help="longer sequences are cut, and so are those "
        "longer than the target's positions (said when it happens)")
    add("--cut", choices=CUTS, help="what a cut removes: the answer's end, or the prompt's start "
        "(then, if still too long, the end) so that the answer's tokens are kept")
    add("--heldout", type=zero_or_more, help="sequences set aside, never trained on (the same "
        "ones for the same data and limits): each evaluation logs their loss and per-slot accuracy "
        "(heldout_loss, heldout_slot_accuracy), and best/ keeps the checkpoint of the lowest loss")
    add("--lr", type=positive, help="peak learning rate (AdamW)")
    add("--warmup", type=checked(float, "in [0, 1]", lambda x: 0 <= x <= 1),
        help="fraction of the steps warming up, then cosine down to 0")
    add("--grad-clip", type=positive, help="gradient norm clip")
    add("--gamma", type=positive,
        help="loss decay over the slots (default: 7 for B=16, 5 for B=10, 4 for B=8)")
    add("--distill-weight", type=checked(float, "in [0, 1]", lambda x: 0 <= x <= 1),
        help="0: cross-entropy with the data's tokens (hard labels); 1: distillation, KL(target "
             "|| drafter) with the target's own distribution at each slot (the whole target "
             "runs); between: a mix of the two")
    add("--selector-weight", type=checked(float, "0 or more", lambda x: x >= 0),
        help="--arch dflash2: the weight of the selector's loss beside the head's")
    add("--epochs", type=positive_int, help="passes over the data")
    add("--steps", type=positive_int, help="train this many steps (overrides --epochs)")
    add("--seed", type=seed_value, help="seeds the drafter's initialisation, the data order and "
                                        "the anchors")
    add("--loss-chunk-size", type=zero_or_more,
        help="slots per chunk of the LM-head loss (0: all at once)")
    add("--keep-activations", action="store_true", help="keep each drafter layer's activations for "
        "the backward pass, not recompute them (faster, much more memory)")
    add("--dense-attention", action="store_true",
        help="attend under a dense mask, not skipping masked blocks")
    add("--eval-prompts", help="held-out prompt file: tau and per-slot acceptance as greedy DFlash "
                               "serves them (on the target's greedy answers, made at the start; "
                               "thinking on or off as make_data.py made --data)")
    add("--eval-every", type=zero_or_more, help="steps between evaluations (--eval-prompts, "
        "--heldout; 0: only at the end)")
    add("--eval-max-new-tokens", type=positive_int, help="tokens decoded per held-out prompt")
    add("--no-token-healing", action="store_true",
        help="evaluate raw-text prompts unhealed (as the data was made)")
    add("--save-every", type=zero_or_more,
        help="steps between checkpoints (0: at the end and by the clock)")
    add("--keep", type=positive_int, help="checkpoints kept: the newest in --out and, past 1, the "
        "last KEEP in --out/checkpoints/step-N (older ones deleted once a new one is complete)")
    add("--save-every-minutes", type=checked(float, "0 or more", lambda x: x >= 0),
        help="also checkpoint when this many minutes have passed since the last one (0: off)")
    add("--log-every", type=positive_int, help="steps between log lines")
    add("--minutes", type=positive, help="stop (and save) after this much wall-clock time")
    add("--stop-at", type=positive_int, help="stop (and save) after this step, e.g. to split a run "
                                             "across jobs")
    either = parser.add_mutually_exclusive_group()
    either.add_argument("--resume", action="store_true", help="continue the run in --out exactly "
                        "(the folder may have moved; the data's contents must be the same)")
    either.add_argument("--auto-resume", action="store_true", help="resume if --out holds a "
                        "checkpoint, else start (over what a run left before its first save): "
                        "one command for the first start and every restart")
    either.add_argument("--force", action="store_true", help="start over even though --out is "
                        "not empty, removing the old run's files: only in a run folder of "
                        "train.py (with training_state.pt or train.lock, or only its files)")
    add("--fsdp", action="store_true",
        help="under torchrun: shard the drafter (FSDP2) instead of replicating it")
    add_device_options(parser)  # --dtype is the frozen target's: the drafter trains in float32
    add("--save-dtype", choices=["auto", "float32", "bfloat16", "float16"], help="the saved "
        "drafter's weights (model.safetensors), as an engine serves them; auto: the target's "
        "dtype (bfloat16 on CUDA); the training state keeps float32 whatever this is")
    defaults = asdict(TrainConfig())
    parser.set_defaults(**{name: value for name, value in defaults.items()
                           if name not in ("target", "data", "out")})  # required: no default
    return parser

