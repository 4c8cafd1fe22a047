"""Fast tests of train.py and make_data.py: the mask, the labels, the loss weights, the anchors, the
known traps, train/inference consistency, the chat template, data generation, resumability, the
CLI's errors, and the bugs found in review (each test named after its bug)."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import generate
import make_data
import train
from dflash import data, evaluation, training
from dflash.cli import UsageError
from dflash.drafter import Drafter, DrafterConfig
from dflash.prompts import Prompt, encode_for_generation, encode_prompt, read_prompts
from dflash.qwen3 import KVCache, Qwen3, Qwen3Config
from dflash.tokenizer import load_tokenizer
from dflash.train_kernels import AnchoredBlocks

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
TINY = FIXTURES / "qwen3-tiny"
DEMO = ROOT / "weights" / "tiny-qwen3"  # the demo target: a real chat tokenizer, trained on word problems


# ----------------------------------------------------------------- mask and labels


def test_mask_pinned_on_a_hand_worked_case():
    """S=6 context, anchors [1, 3], B=3: keys are [context 0..5 ; block 0 ; block 1]."""
    mask = AnchoredBlocks(torch.tensor([[1, 3]]), context_length=6, block_size=3).dense_mask()
    #            context 0..5        block 0   block 1
    expected = [[1, 0, 0, 0, 0, 0,   1, 1, 1,  0, 0, 0],  # block 0 (a=1): only c=0 < 1
                [1, 0, 0, 0, 0, 0,   1, 1, 1,  0, 0, 0],
                [1, 0, 0, 0, 0, 0,   1, 1, 1,  0, 0, 0],
                [1, 1, 1, 0, 0, 0,   0, 0, 0,  1, 1, 1],  # block 1 (a=3): c=0,1,2 < 3
                [1, 1, 1, 0, 0, 0,   0, 0, 0,  1, 1, 1],
                [1, 1, 1, 0, 0, 0,   0, 0, 0,  1, 1, 1]]
    assert mask.shape == (1, 1, 6, 12)
    assert mask[0, 0].tolist() == [[bool(v) for v in row] for row in expected]


def test_labels_same_position_no_shift_and_ignored_slots():
    ids = torch.tensor([[10, 11, 12, 13, 14, 15]])
    loss_mask = torch.tensor([[0, 0, 1, 1, 1, 0]])
    anchors, real = torch.tensor([[1, 3, 0]]), torch.tensor([[True, True, False]])
    labels = train.block_labels(ids, loss_mask, anchors, real, block_size=3).view(3, 3)
    assert labels.tolist() == [[-100, 12, 13],  # positions 1,2,3: slot k is x_{a+k}
                               [-100, 14, -100],  # position 5 is outside the loss mask
                               [-100, -100, -100]]  # a padding block


def test_labels_past_the_end_are_ignored():
    ids, loss_mask = torch.tensor([[10, 11, 12, 13, 14, 15]]), torch.tensor([[0, 0, 1, 1, 1, 1]])
    labels = train.block_labels(ids, loss_mask, torch.tensor([[4]]), torch.tensor([[True]]), block_size=3)
    assert labels.tolist() == [[-100, 15, -100]]  # position 6 does not exist


def test_block_inputs_and_positions():
    ids = torch.tensor([[10, 11, 12, 13, 14, 15]])
    anchors = torch.tensor([[1, 3]])
    assert train.block_input_ids(ids, anchors, 3, mask_token_id=99).tolist() == [[11, 99, 99, 13, 99, 99]]
    assert train.block_positions(anchors, 3).tolist() == [[1, 2, 3, 3, 4, 5]]


def test_decay_weights_for_block_16():
    weights = train.slot_weights(16, train.gamma_for_block_size(16))
    assert weights[0] == 0  # slot 0 is the known token
    assert weights[1] == pytest.approx(1.0)
    assert weights[2] == pytest.approx(math.exp(-1 / 7))
    assert weights[15] == pytest.approx(math.exp(-2))
    assert torch.all(weights[2:] < weights[1:-1])


def test_gamma_per_block_size():
    assert [train.gamma_for_block_size(b) for b in (8, 10, 16)] == [4.0, 5.0, 7.0]
    assert 5.0 < train.gamma_for_block_size(12) < 7.0


def test_tau_estimate():
    correct, counted = torch.tensor([0.0, 5, 5, 0]), torch.tensor([0.0, 10, 10, 10])
    assert training.estimated_tau(correct, counted) == pytest.approx(1 + 0.5 + 0.25 + 0)


# -------------------------------------------------------------------------- anchors


def test_anchors_valid_distinct_bounded_and_fresh():
    loss_mask = torch.tensor([0, 0, 0, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 0])
    valid = set(train.valid_anchor_positions(loss_mask).tolist())
    assert valid == {3, 4, 7, 8, 9, 10, 11, 12}  # x_a and x_{a+1} are both answer tokens
    generator = torch.Generator().manual_seed(0)
    draws = [train.sample_anchors(loss_mask, 4, generator).tolist() for _ in range(2000)]
    for anchors in draws:
        assert len(anchors) == 4 and len(set(anchors)) == 4 and set(anchors) <= valid
        assert anchors == sorted(anchors)
    assert len({tuple(a) for a in draws}) > 20  # fresh each step
    counts = Counter(a for anchors in draws for a in anchors)
    expected = 2000 * 4 / len(valid)
    assert all(abs(counts[a] - expected) < 0.1 * expected for a in valid)  # uniform-ish
    assert sorted(train.sample_anchors(loss_mask, 100, generator).tolist()) == sorted(valid)  # capped by what exists


def test_batch_anchors_pad_short_rows():
    loss_mask = torch.tensor([[0, 1, 1, 1, 1, 1], [0, 0, 0, 1, 1, 0]])
    anchors, real = train.batch_anchors(loss_mask, 3, [torch.Generator().manual_seed(seed) for seed in (0, 1)])
    assert anchors.shape == real.shape == (2, 3)
    assert real.tolist() == [[True] * 3, [True, False, False]]
    assert anchors[1, 0] == 3


# ----------------------------------------------------------- the traps, by behaviour


def tiny_drafter(block_size=4, seed=0) -> Drafter:
    layers = Qwen3Config(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    drafter = Drafter(DrafterConfig(layers, block_size, num_target_layers=4, mask_token_id=49,
                                    target_layer_ids=[1, 2]))
    train.init_drafter(drafter, seed)
    return drafter.eval()


def draft_all_blocks(drafter, features, embeddings, anchors):
    """All blocks in one forward, under the pattern training uses (it skips masked work; see test_train_kernels)."""
    block = drafter.config.block_size
    pattern = AnchoredBlocks(anchors, features.shape[1], block, blocks_per_chunk=1)
    return drafter(features, embeddings, torch.arange(features.shape[1]), train.block_positions(anchors, block),
                   attend=pattern.attend)


@pytest.fixture
def traps_setup():
    torch.manual_seed(0)
    drafter = tiny_drafter()
    features = torch.randn(1, 12, 64)
    embeddings = torch.randn(1, 8, 32)  # two blocks of 4
    anchors = torch.tensor([[5, 9]])
    return drafter, features, embeddings, anchors


def changed(before, after, rows):
    return not torch.allclose(before[0, rows], after[0, rows], atol=1e-6)


@torch.no_grad()
def test_trap_context_is_strictly_before_the_anchor(traps_setup):
    """With <= instead of <, block 0 would see the target's feature of x_5 itself."""
    drafter, features, embeddings, anchors = traps_setup
    base = draft_all_blocks(drafter, features, embeddings, anchors)
    at_anchor = features.clone()
    at_anchor[0, 5] += 1.0
    assert not changed(base, draft_all_blocks(drafter, at_anchor, embeddings, anchors), slice(0, 4))
    before_anchor = features.clone()
    before_anchor[0, 4] += 1.0
    assert changed(base, draft_all_blocks(drafter, before_anchor, embeddings, anchors), slice(0, 4))


@torch.no_grad()
def test_trap_block_is_bidirectional_and_blocks_are_isolated(traps_setup):
    drafter, features, embeddings, anchors = traps_setup
    base = draft_all_blocks(drafter, features, embeddings, anchors)
    last_slot = embeddings.clone()
    last_slot[0, 3] += 1.0  # the last slot of block 0
    after = draft_all_blocks(drafter, features, last_slot, anchors)
    assert changed(base, after, slice(0, 1))  # a causal mask would hide slot 3 from slot 0
    assert not changed(base, after, slice(4, 8))  # block 1 never sees block 0


def test_trap_labels_not_shifted_and_slot_zero_unscored():
    ids = torch.arange(100, 120)[None]
    loss_mask = torch.ones_like(ids)
    anchors = torch.tensor([[3, 10]])
    labels = train.block_labels(ids, loss_mask, anchors, torch.ones_like(anchors, dtype=torch.bool), 4).view(2, 4)
    assert labels[:, 0].tolist() == [-100, -100]  # slot 0 scored would teach copying the input
    assert labels[0, 1:].tolist() == [104, 105, 106]  # shifted by one would be 105, 106, 107
    assert labels[1, 1:].tolist() == [111, 112, 113]


@torch.no_grad()
def test_training_forward_matches_the_inference_draft():
    """Each block of the one-forward training pass computes what generate.py's cached draft computes."""
    torch.manual_seed(1)
    drafter = tiny_drafter(block_size=4)
    features, embeddings = torch.randn(1, 12, 64), torch.randn(1, 8, 32)
    anchors = torch.tensor([[5, 9]])
    together = draft_all_blocks(drafter, features, embeddings, anchors)
    for j, a in enumerate(anchors[0].tolist()):
        cache = KVCache.for_layers(drafter.config.layers, drafter.fc.weight, 16)
        alone = drafter(features[:, :a], embeddings[:, 4 * j:4 * j + 4], torch.arange(a), torch.arange(a, a + 4),
                        cache=cache)
        torch.testing.assert_close(together[:, 4 * j:4 * j + 4], alone, atol=1e-5, rtol=1e-5)


def test_loss_ignores_unscored_slots_and_reports_per_slot_counts():
    target = train.freeze(Qwen3.from_pretrained(TINY))
    cfg = train.TrainConfig(drafter_layers=1, block_size=4)
    config = train.build_drafter_config(cfg, target.config, None)
    drafter = Drafter(config)
    train.init_drafter(drafter, 0)
    ids = torch.randint(0, 500, (1, 16), generator=torch.Generator().manual_seed(0))
    loss_mask = torch.tensor([[0] * 8 + [1] * 8])
    anchors, real = torch.tensor([[8, 13]]), torch.tensor([[True, True]])
    weights = train.slot_weights(4, 2.0)
    features = train.target_features(target, ids, config)
    loss, correct, counted = train.drafter_loss(target, drafter, features, train.MicroBatch(ids, loss_mask, anchors, real),
                                                 config=config, weights=weights)
    assert counted.tolist() == [0, 2, 2, 1]  # slot 0 never; 13+3 = 16 is past the end
    loss.backward()
    assert all(p.grad is not None for p in drafter.parameters())
    assert all(p.grad is None for p in target.parameters())


# --------------------------------------------------------------- the chat template


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(FIXTURES / "qwen3-tokenizer")


def prompts_file(path: Path, *records) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def prompt_ids(path: Path, tokenizer, chat, thinking, token_healing=False) -> list[list[int]]:
    """What make_data.py feeds the target for each prompt of the file (its ids only)."""
    return [ids for ids, _ in data.encode_prompts(path, tokenizer, chat, thinking, token_healing, 10**6)]


@pytest.mark.parametrize("thinking", [False, True])
def test_data_prompts_match_the_inference_cli(tmp_path, tokenizer, thinking):
    """make_data.py renders a conversation as generate.py renders `--chat --prompt QUESTION`."""
    question = "What is a KV cache?"
    cli_ids = encode_prompt(Prompt("--prompt", text=question), tokenizer, chat=True, thinking=thinking)
    turn = {"role": "user", "content": question}
    answer = {"role": "assistant", "content": "The dataset's answer."}
    path = prompts_file(tmp_path / "p.jsonl", {"messages": [turn]}, {"messages": [turn, answer]}, {"prompt": question})
    ids = prompt_ids(path, tokenizer, None, thinking, token_healing=True)
    assert ids == [cli_ids] * 3  # the dataset's own answer is dropped: the target writes its own; no healing in chat


def test_thinking_mode_changes_the_prompt(tmp_path, tokenizer):
    path = prompts_file(tmp_path / "p.jsonl", {"messages": [{"role": "user", "content": "hi"}]})
    assert prompt_ids(path, tokenizer, None, False) != prompt_ids(path, tokenizer, None, True)


def test_plain_text_and_ids_prompts(tmp_path, tokenizer):
    expected = [tokenizer.encode("hello world"), tokenizer.encode("second")]
    jsonl = prompts_file(tmp_path / "p.jsonl", {"prompt_ids": [1, 2]}, {"prompt": "hello world"}, {"prompt": "second"})
    assert prompt_ids(jsonl, tokenizer, False, False) == [[1, 2], *expected]


@pytest.mark.parametrize("line", ['"hello world"', '{"text": "hello world"}', "hello world",
                                  '{"prompt": "hello", "prompt_ids": [1, 2]}'])
def test_prompt_variants_outside_the_one_format_are_refused_in_one_line(tmp_path, capsys, line):
    """A prompt file has one format: JSONL objects with exactly one of "prompt", "messages", "prompt_ids".
    Bare strings, {"text"} and plain-text (.txt) lines, once read too, are refused, naming file and line."""
    for name in ("p.jsonl", "p.txt"):
        path = tmp_path / name
        path.write_text(json.dumps({"prompt": "first"}) + "\n\n" + line + "\n")
        with pytest.raises(UsageError) as caught:
            read_prompts(path)
        assert str(caught.value).startswith(f"{path}:3: ") and "\n" not in str(caught.value)
    error = one_error_line(capsys, make_data_argv(path, tmp_path / "data.jsonl"), make_data.main)
    assert f"{path}:3: " in error and not (tmp_path / "data.jsonl").exists()


# ------------------------------------------------------------------ data generation


def write_prompts(path: Path, count: int, seed: int, length: int = 6) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, 512, (length + i % 3,), generator=generator).tolist() for i in range(count)]
    path.write_text("".join(json.dumps({"prompt_ids": p}) + "\n" for p in prompts))
    return prompts


def make_data_argv(prompts: Path, out: Path, *extra: str, target: Path = TINY) -> list[str]:
    return ["--target", str(target), "--prompts", str(prompts), "--out", str(out), "--max-new-tokens", "10",
            "--batch-size", "3", "--device", "cpu", *extra]


def test_make_data_batched_equals_one_by_one_and_resumes(tmp_path):
    prompts = write_prompts(tmp_path / "prompts.jsonl", 5, seed=0)
    out = tmp_path / "data.jsonl"
    argv = make_data_argv(tmp_path / "prompts.jsonl", out)
    assert make_data.main(argv) == 0
    full = out.read_text().splitlines()
    target = Qwen3.from_pretrained(TINY)
    for line in full:
        record = json.loads(line)
        prompt = prompts[record["index"]]
        alone = generate.generate_autoregressive(target, prompt, 10).new_ids
        assert record["input_ids"] == prompt + alone  # left padding changes nothing
        assert record["loss_mask"] == [0] * len(prompt) + [1] * len(alone)
    out.write_text("\n".join(full[:2]) + "\n" + full[2][:15])  # a crash mid-line
    assert make_data.main(argv) == 0
    assert sorted(out.read_text().splitlines()) == sorted(full)


def test_make_data_heals_raw_prompts_as_inference_does(tmp_path):
    """A raw prompt ending mid-token (a final "\n", half a word) loses that token, and the answer's
    first token writes it again, as generate.py heals it; batched rows, healed or not, equal one by one."""
    texts = ["Mia has 14 apples.\n", "Leo buys 3 pens. He pays 20 dollars.\n", "How many apples does Mia ha"]
    path = prompts_file(tmp_path / "prompts.jsonl", {"prompt": texts[0]}, {"prompt_ids": [5, 6, 7, 8]},
                        *({"prompt": text} for text in texts[1:]))
    out = tmp_path / "data.jsonl"
    assert make_data.main(make_data_argv(path, out, "--raw", target=DEMO)) == 0  # batches of 3: healed and not
    tokenizer, target = load_tokenizer(DEMO), Qwen3.from_pretrained(DEMO)
    records = sorted((json.loads(line) for line in out.read_text().splitlines()), key=lambda r: r["index"])
    for record, prompt in zip(records, read_prompts(path), strict=True):
        ids, choices = encode_for_generation(prompt, tokenizer, chat=False)
        alone = generate.generate_autoregressive(target, ids, 10, stop_ids=tokenizer.stop_token_ids,
                                                 first_token_choices=choices).new_ids
        assert record["input_ids"] == ids + alone
        assert record["loss_mask"] == [0] * len(ids) + [1] * len(alone)
        assert (choices is None) == (prompt.text is None)  # every raw prompt here ends mid-token
    healed = tokenizer.encode(texts[0])[:-1]  # the prompt without its "\n"
    assert records[0]["input_ids"][:len(healed)] == healed and records[0]["loss_mask"][len(healed)] == 1
    assert tokenizer.decode(records[0]["input_ids"][len(healed):][:1]).startswith("\n")
    assert tokenizer.decode(records[0]["input_ids"]).startswith(texts[0])
    unhealed = tmp_path / "unhealed.jsonl"
    assert make_data.main(make_data_argv(path, unhealed, "--raw", "--no-token-healing", target=DEMO)) == 0
    first = json.loads(unhealed.read_text().splitlines()[0])
    assert first["input_ids"][:len(healed) + 1] == tokenizer.encode(texts[0]) and first["loss_mask"][len(healed)] == 0


def short_context_target(tmp_path: Path, context: int) -> Path:
    """The tiny target, with its max_position_embeddings cut down to `context`."""
    folder = tmp_path / f"tiny-{context}"
    folder.mkdir()
    config = json.loads((TINY / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": context}))
    (folder / "model.safetensors").symlink_to(TINY / "model.safetensors")
    return folder


def test_make_data_refuses_max_new_tokens_that_leave_no_room_for_the_prompt(tmp_path, capsys):
    """Bug: with max_new_tokens >= the context, `prompt[-(context - max_new_tokens):]` silently kept
    the whole prompt (or cut its *start* off) instead of leaving room for the answer."""
    target = short_context_target(tmp_path, context=16)
    prompts = write_prompts(tmp_path / "prompts.jsonl", 3, seed=0, length=8)
    for too_many in ("16", "20"):
        argv = make_data_argv(tmp_path / "prompts.jsonl", tmp_path / "data.jsonl", target=target)
        argv[argv.index("--max-new-tokens") + 1] = too_many
        assert "leaves no room for a prompt" in one_error_line(capsys, argv, make_data.main)
    assert not (tmp_path / "data.jsonl").exists()
    argv = make_data_argv(tmp_path / "prompts.jsonl", tmp_path / "data.jsonl", target=target)
    argv[argv.index("--max-new-tokens") + 1] = "12"
    capsys.readouterr()
    assert make_data.main(argv) == 0
    assert "note: 3 prompt(s) longer than 4 tokens (the target's 16 positions less " \
        "--max-new-tokens) keep their last 4: 15 tokens left out" in capsys.readouterr().err
    for line in (tmp_path / "data.jsonl").read_text().splitlines():
        record = json.loads(line)
        assert record["input_ids"][:4] == prompts[record["index"]][-4:]  # the prompt's last 16 - 12 tokens
        assert record["loss_mask"][:5] == [0, 0, 0, 0, 1] and len(record["input_ids"]) <= 16


def test_done_indices_is_pure(tmp_path):
    """Bug: reading which prompts were answered rewrote the file (cutting a half-written last line).
    Reading now only reads; the cut happens, explicitly, when appending resumes."""
    out = tmp_path / "data.jsonl"
    text = (json.dumps({"index": 3, "input_ids": [1, 2], "loss_mask": [0, 1]}) + "\n"
            + json.dumps({"index": 0, "input_ids": [1, 2], "loss_mask": [0, 1]}) + "\n"
            + '{"index": 5, "input_i')  # a crash mid-line
    out.write_text(text)
    assert make_data.done_indices(out) == {0, 3}
    assert out.read_text() == text
    make_data.cut_torn_line(out)
    assert out.read_text() == text[: text.rfind("\n") + 1]
    assert make_data.done_indices(tmp_path / "missing.jsonl") == set()


@pytest.mark.parametrize("line, message", [
    ('{"input_ids": [1, 2], "loss_mask": [0, 1]}', "no integer 'index'"),
    ('{"index": "7"}', "no integer 'index'"),
    ("[1, 2]", "no integer 'index'"),
    ('{"index": 1,', "not valid JSON"),
])
def test_done_indices_errors_are_one_line(tmp_path, capsys, line, message):
    """Bug: a record without "index" (or a line that is not JSON) crashed with a traceback."""
    out = tmp_path / "data.jsonl"
    out.write_text(json.dumps({"index": 0}) + "\n" + line + "\n")
    with pytest.raises(UsageError) as caught:
        make_data.done_indices(out)
    assert str(caught.value).startswith(f"{out}:2: ") and message in str(caught.value)
    assert "\n" not in str(caught.value)
    write_prompts(tmp_path / "prompts.jsonl", 2, seed=0)
    error = one_error_line(capsys, make_data_argv(tmp_path / "prompts.jsonl", out), make_data.main)
    assert f"{out}:2: " in error and message in error


# -------------------------------------------------------------------- resumability


def write_data(path: Path, count: int = 8, length: int = 20, seed: int = 0) -> None:
    generator = torch.Generator().manual_seed(seed)
    lines = []
    for _ in range(count):
        ids = torch.randint(0, 512, (length,), generator=generator).tolist()
        lines.append(json.dumps({"input_ids": ids, "loss_mask": [0] * 6 + [1] * (length - 6)}))
    path.write_text("\n".join(lines) + "\n")


def train_argv(data: Path, out: Path, *extra: str) -> list[str]:
    return ["--target", str(TINY), "--data", str(data), "--out", str(out), "--drafter-layers", "1",
            "--block-size", "4", "--num-anchors", "4", "--batch-size", "3", "--steps", "6", "--log-every", "1",
            "--device", "cpu", *extra]


def test_resume_is_bit_identical(tmp_path):
    data = tmp_path / "data.jsonl"
    write_data(data)  # 8 sequences, batch 3: 3 steps an epoch, so the run crosses an epoch boundary
    assert train.main(train_argv(data, tmp_path / "straight")) == 0
    assert train.main(train_argv(data, tmp_path / "split", "--stop-at", "3")) == 0
    halfway = load_file(tmp_path / "split" / "model.safetensors")
    assert train.main(train_argv(data, tmp_path / "split", "--resume")) == 0
    straight = load_file(tmp_path / "straight" / "model.safetensors")
    split = load_file(tmp_path / "split" / "model.safetensors")
    assert straight.keys() == split.keys()
    assert all(torch.equal(straight[name], split[name]) for name in straight)
    assert not all(torch.equal(straight[name], halfway[name]) for name in straight)  # it did train on
    log = [json.loads(line) for line in (tmp_path / "split" / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3, 4, 5, 6]
    state = torch.load(tmp_path / "split" / "training_state.pt", weights_only=True)
    assert state["step"] == 6
    assert Drafter.from_pretrained(tmp_path / "split", target=Qwen3.from_pretrained(TINY)).config.block_size == 4


def with_steps(argv: list[str], steps: int) -> list[str]:
    argv[argv.index("--steps") + 1] = str(steps)
    return argv


def start_training(data: Path, out: Path, steps: int, *extra: str) -> subprocess.Popen:
    argv = with_steps(train_argv(data, out, *extra), steps)
    return subprocess.Popen([sys.executable, "train.py", *argv], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})


def wait_for_logged_step(process: subprocess.Popen, log: Path, step: int) -> None:
    """Poll the run's log until it reaches `step` (the run must still be going then)."""
    deadline = time.time() + 120
    while time.time() < deadline:
        if log.is_file() and len(log.read_text().splitlines()) >= step:
            assert process.poll() is None, "the run ended before it could be interrupted"
            return
        time.sleep(0.01)
    raise AssertionError("the run never reached step {step}")


def final_weights(out: Path) -> dict:
    return load_file(out / "model.safetensors")


@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT", "SIGKILL"])
def test_a_stopped_run_resumes_to_the_uninterrupted_result(tmp_path, how):
    """Ctrl-C and SIGTERM save and exit with one line naming --resume; kill -9 loses at most
    the steps since the last checkpoint (every 2 steps here); --resume then ends where an
    uninterrupted run ends, bit for bit, with each step logged once."""
    data = tmp_path / "data.jsonl"
    write_data(data)
    steps = 400
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    assert train.main(with_steps(train_argv(data, straight), steps)) == 0
    extra = ("--save-every", "2") if how == "SIGKILL" else ()
    process = start_training(data, stopped, steps, *extra)
    wait_for_logged_step(process, stopped / "train_log.jsonl", 5)
    process.send_signal(getattr(signal, how))
    _, stderr = process.communicate(timeout=60)
    state = torch.load(stopped / "training_state.pt", weights_only=True)
    assert 2 <= state["step"] < steps
    if how == "SIGKILL":
        assert process.returncode == -signal.SIGKILL
    else:
        assert process.returncode == 128 + getattr(signal, how)
        assert stderr.strip().splitlines()[-1] == (
            f"stopped by {how} at step {state['step']}: checkpoint saved in {stopped}; "
            f"to continue, run the same command with --resume")
    assert train.main(with_steps(train_argv(data, stopped, "--resume"), steps)) == 0
    expected, got = final_weights(straight), final_weights(stopped)
    assert all(torch.equal(expected[name], got[name]) for name in expected)
    log = [json.loads(line)["step"] for line in (stopped / "train_log.jsonl").read_text().splitlines()]
    assert log == list(range(1, steps + 1))


def test_final_checkpoint_is_saved_before_the_final_evaluation(tmp_path, monkeypatch):
    """Bug: the last evaluation ran before the last checkpoint, so an error there lost the whole run."""
    data, heldout = tmp_path / "data.jsonl", tmp_path / "heldout.jsonl"
    write_data(data)
    write_prompts(heldout, 2, seed=1)

    def failing_evaluation(*args, **kwargs):
        raise RuntimeError("the evaluation failed")

    monkeypatch.setattr(train, "evaluate", failing_evaluation)
    with pytest.raises(RuntimeError, match="the evaluation failed"):
        train.main(train_argv(data, tmp_path / "run", "--eval-prompts", str(heldout)))
    state = torch.load(tmp_path / "run" / "training_state.pt", weights_only=True)
    assert state["step"] == 6  # the last step's checkpoint is on disk
    Drafter.from_pretrained(tmp_path / "run", target=Qwen3.from_pretrained(TINY))


def test_anchor_is_never_the_last_prompt_token(tmp_path):
    """Bug: a block could be anchored at the prompt's last token, a block inference never drafts (the
    prefill already yields the first answer token, and the first block starts at it)."""
    loss_mask = torch.tensor([0, 0, 0, 1, 1, 1, 0, 1])
    assert train.valid_anchor_positions(loss_mask).tolist() == [3, 4]
    draws = [train.sample_anchors(loss_mask, 3, torch.Generator().manual_seed(seed)) for seed in range(20)]
    assert set(torch.cat(draws).tolist()) == {3, 4}
    data_file = tmp_path / "data.jsonl"  # no two answer tokens in a row: nothing an inference block would draft
    data_file.write_text(json.dumps({"input_ids": [5, 6, 7, 8], "loss_mask": [0, 0, 1, 0]}) + "\n")
    with pytest.raises(UsageError, match="no valid block"):
        data.load_sequences(data_file, max_seq_len=16, vocab_size=512)


# ------------------------------------------------------------------ the CLI's errors


def one_error_line(capsys, argv, main=train.main) -> str:
    capsys.readouterr()
    try:
        status = main(argv)
    except SystemExit as exit:  # what the argument parser itself refuses
        status = exit.code
    assert status == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_cli_errors_are_one_line(tmp_path, capsys):
    data = tmp_path / "data.jsonl"
    write_data(data)
    assert "data file not found" in one_error_line(capsys, train_argv(tmp_path / "missing.jsonl", tmp_path / "a"))
    assert "no such checkpoint folder" in one_error_line(
        capsys, ["--target", str(tmp_path / "nope"), "--data", str(data), "--out", str(tmp_path / "b")])
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "file").write_text("x")
    assert "not empty" in one_error_line(capsys, train_argv(data, tmp_path / "busy"))
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({"input_ids": [1, 2, 3], "loss_mask": [1, 0, 0]}) + "\n")
    assert "no valid block" in one_error_line(capsys, train_argv(empty, tmp_path / "c"))
    prompts = prompts_file(tmp_path / "prompts.jsonl", {"prompt": "hello"})
    assert "need a tokenizer" in one_error_line(capsys, make_data_argv(prompts, tmp_path / "d"), make_data.main)
    assert "--block-size" in one_error_line(capsys, train_argv(data, tmp_path / "e", "--block-size", "1"))
    assert "--lr" in one_error_line(capsys, train_argv(data, tmp_path / "e", "--lr", "nan"))
    assert "--epochs" in one_error_line(capsys, train_argv(data, tmp_path / "e", "--epochs", "0"))
    assert "--force" in one_error_line(capsys, train_argv(data, tmp_path / "e", "--resume", "--force"))
    assert "nothing to resume" in one_error_line(capsys, train_argv(data, tmp_path / "f", "--resume"))
    assert "--target-layer-ids" in one_error_line(capsys, train_argv(data, tmp_path / "g", "--target-layer-ids", "1,x"))
    for outside in ("512", "-1"):  # the tiny target's vocabulary is 0..511
        assert f"--mask-token-id {outside}" in one_error_line(capsys, train_argv(data, tmp_path / "h",
                                                                                 "--mask-token-id", outside))


def test_resume_with_another_target_is_refused(tmp_path, capsys):
    data = tmp_path / "data.jsonl"
    write_data(data)
    assert train.main(train_argv(data, tmp_path / "run", "--stop-at", "1")) == 0
    capsys.readouterr()
    argv = train_argv(data, tmp_path / "run", "--resume")
    argv[argv.index(str(TINY))] = str(FIXTURES / "qwen3-tiny-sharded")
    assert "another target" in one_error_line(capsys, argv)


@pytest.mark.parametrize("change, named", [
    (["--target-layer-ids", "0,2"], "target_layer_ids"),
    (["--mask-token-id", "7"], "mask_token_id"),
    (["--tokenizer", str(FIXTURES / "qwen3-tokenizer")], "tokenizer"),
    (["--head-dim", "8"], "head_dim"),
])
def test_resume_refuses_a_change_to_what_the_drafter_is_conditioned_on(tmp_path, capsys, change, named):
    data = tmp_path / "data.jsonl"
    write_data(data)
    assert train.main(train_argv(data, tmp_path / "run", "--stop-at", "1")) == 0
    capsys.readouterr()
    assert named in one_error_line(capsys, train_argv(data, tmp_path / "run", "--resume", *change))
    assert train.main(train_argv(data, tmp_path / "run", "--resume", "--log-every", "2")) == 0  # logging may change


@pytest.mark.parametrize("script", ["train.py", "make_data.py"])
def test_bad_arguments_exit_2_without_traceback(script):
    result = subprocess.run([sys.executable, script, "--bogus"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "Traceback" not in result.stderr


def test_the_parser_is_the_whole_config():
    """TrainConfig is every option at its default but for those given; a parsed command line is a config,
    and the defaults are the paper's recipe (6 epochs)."""
    args = train.build_parser().parse_args(["--target", "t", "--data", "d", "--out", "o", "--target-layer-ids", "1,3",
                                            "--gamma", "2.5", "--fsdp"])
    cfg = train.TrainConfig(**vars(args))
    defaults = train.TrainConfig(target="t", data="d", out="o")
    assert cfg == train.TrainConfig(**{**vars(defaults), "target_layer_ids": [1, 3], "gamma": 2.5, "fsdp": True})
    assert (defaults.epochs, defaults.lr) == (6, 6e-4)
    eight_layers = Qwen3Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=8,
                               num_attention_heads=2, num_key_value_heads=1, head_dim=8)
    drafter = train.build_drafter_config(defaults, eight_layers, None)  # block size and depth: None until resolved
    assert (drafter.block_size, drafter.layers.num_hidden_layers) == (16, 5)
    assert set(train.MAY_CHANGE_ON_RESUME) < set(vars(defaults))
    with pytest.raises(TypeError, match="bogus"):
        train.TrainConfig(bogus=1)


def test_default_mask_token_is_the_first_id_past_the_tokenizer():
    """As the released drafters do (Qwen3: 151,669 tokens, mask 151669), not the last embedding row."""
    target = Qwen3Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=4,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=8)

    class SixtyTokens:  # a tokenizer without <|mask|> whose 60 ids leave 4 padding rows
        mask_token_id, vocab_size = None, 60

    cfg = train.TrainConfig(drafter_layers=1, block_size=4)
    assert train.build_drafter_config(cfg, target, SixtyTokens()).mask_token_id == 60
    assert train.build_drafter_config(cfg, target, None).mask_token_id == 63  # no tokenizer: the last row


def test_the_tau_evaluation_keeps_ropes_frequencies_in_float32(monkeypatch):
    """A bf16 target: the drafter's copy runs in bf16, but its RoPE frequencies stay exact, as loading keeps them."""
    target = Qwen3.from_pretrained(TINY, dtype=torch.bfloat16)
    config = train.build_drafter_config(train.TrainConfig(drafter_layers=1, block_size=4), target.config, None)
    drafter = Drafter(config)
    train.init_drafter(drafter, 0)
    seen = []

    def record_drafter(target, drafter, continuation):
        seen.append(drafter)
        return [1]

    monkeypatch.setattr(evaluation, "acceptance_lengths", record_drafter)
    evaluation.evaluate(target, config, drafter.state_dict(), [evaluation.Continuation([1, 2, 3, 4], 3, 1)])
    rotary = seen[0].rotary
    assert seen[0].fc.weight.dtype == torch.bfloat16
    assert rotary.inv_freq.dtype == torch.float32 and torch.equal(rotary.inv_freq, rotary.inverse_frequencies())


@pytest.mark.parametrize("extra", [["--temperature", "0.7", "--top-p", "1.5"], ["--temperature", "0.7", "--top-k", "-3"],
                                   ["--temperature", "0.7", "--min-p", "-0.5"], ["--temperature", "-1"],
                                   ["--batch-size", "0"], ["--max-new-tokens", "0"]])
def test_make_data_refuses_bad_options_in_one_line(tmp_path, capsys, extra):
    write_prompts(tmp_path / "prompts.jsonl", 2, seed=0)
    argv = make_data_argv(tmp_path / "prompts.jsonl", tmp_path / "data.jsonl", *extra)
    assert "must be" in one_error_line(capsys, argv, make_data.main)
    assert not (tmp_path / "data.jsonl").exists()


def test_make_data_runs_with_the_checkpoints_sampling(tmp_path):
    """--sample-from-config takes the demo's temperature, top-k and top-p (the law itself: test_sampling.py)."""
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "Mia has 3 apples. She buys 4 more. "
                                                                          "How many apples are there now?"}]}) + "\n")
    out = tmp_path / "data.jsonl"
    assert make_data.main(make_data_argv(path, out, "--sample-from-config", target=DEMO)) == 0
    assert json.loads(out.read_text())["loss_mask"].count(1) > 0
