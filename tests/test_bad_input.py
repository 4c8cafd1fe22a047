"""Bad input, tried as a hostile user would: each is refused in one `error:` line naming the option, file or line,
with exit status 2, before any work (building the runner, generating, training, benchmarking) starts.

The programs run in this process (a subprocess each would spend its time importing torch); `no_work` replaces
the work itself by a call that fails the test, so a refusal that comes too late shows as that failure.
"""

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import bench
import generate
import make_data
import train
from dflash import measure
from dflash.checkpoint import CheckpointError, write_atomically
from dflash.cli import UsageError, check_output
from tests.test_walk_options import time_limit
from dflash.drafter import Drafter
from dflash.prompts import read_prompts
from dflash.qwen3 import Qwen3
from dflash.results import Generation
from dflash.sampling import Sampling, sampling_of
from dflash.tokenizer import TokenizerError, apply_qwen3_chat_template
from dflash.training import forget_log_after, prepare_run_folder

ROOT = Path(__file__).parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
TARGET, DRAFTER, TINY = FIXTURES / "qwen3-tiny-sharded", FIXTURES / "dflash-tiny", FIXTURES / "qwen3-tiny"
PAIR = ["--model", str(TARGET), "--draft", str(DRAFTER), "--device", "cpu"]  # no tokenizer: --prompt-ids only
DEMO = ["--model", str(ROOT / "weights" / "tiny-qwen3"), "--draft", str(ROOT / "weights" / "tiny-qwen3-dflash"),
        "--device", "cpu"]  # a chat tokenizer: text prompts
G = ["--max-new-tokens", "8", *DEMO]


@pytest.fixture
def no_work(monkeypatch):
    """Every program's work replaced by a failure: a refusal must come before it."""
    def started(*args, **kwargs):
        raise AssertionError("the work started before the input was refused")

    monkeypatch.setattr(generate, "ModelRunner", started)
    monkeypatch.setattr(bench, "benchmark", started)
    monkeypatch.setattr(make_data, "generate_batch", started)
    monkeypatch.setattr(train, "drafter_loss", started)


def refused(main, argv, capsys, *fragments) -> str:
    """Run `main(argv)`; it must exit 2 with one `error:` line holding every fragment. Returns the line."""
    capsys.readouterr()
    try:
        status = main(argv)
    except SystemExit as exit:  # argparse's own refusals
        status = exit.code
    lines = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(lines) == 1 and lines[0].startswith("error: "), lines
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def prompt_file(path: Path, *lines: str) -> Path:
    path.write_text('{"prompt": "fine"}\n' + "".join(line + "\n" for line in lines))
    return path


# ------------------------------------------------------------------------ 1, 2: text a tokenizer cannot take


def test_prompt_text_that_is_not_utf8_is_refused(capsys, no_work):
    """Bug: bytes that are not UTF-8 on the command line (Python keeps them as lone surrogates) reached the Rust
    tokenizer: TypeError."""
    refused(generate.main, [*G, "--prompt", "\udcff\udcfe x"], capsys, "--prompt", "not valid UTF-8")


def test_a_lone_surrogate_in_a_prompt_file_names_file_and_line(tmp_path, capsys, no_work):
    path = prompt_file(tmp_path / "p.jsonl", '{"prompt": "a \\ud800 b"}')
    with pytest.raises(UsageError, match=f"{path}:2: .*not valid UTF-8"):
        read_prompts(path)
    messages = prompt_file(tmp_path / "m.jsonl", '{"messages": [{"role": "user", "content": "\\udfff"}]}')
    with pytest.raises(UsageError, match=f"{messages}:2: message 0.*not valid UTF-8"):
        read_prompts(messages)
    out = tmp_path / "data.jsonl"
    refused(make_data.main, ["--target", str(ROOT / "weights" / "tiny-qwen3"), "--prompts", str(path), "--out",
                             str(out), "--device", "cpu"], capsys, f"{path}:2")
    refused(bench.main, [*DEMO, "--prompts", str(path)], capsys, f"{path}:2")
    with pytest.raises(TokenizerError, match="not valid UTF-8"):  # the library's own callers, too
        from dflash.tokenizer import load_tokenizer
        load_tokenizer(ROOT / "weights" / "tiny-qwen3").encode("\ud800")


@pytest.mark.parametrize("message, complaint", [
    ({"role": "user", "content": 5}, "message 0 needs a 'content' string"),
    ({"role": "user"}, "message 0 needs a 'content' string"),
    ({"role": "robot", "content": "hi"}, "message 0 needs a 'role' of system, user, assistant"),
    ({"content": "hi"}, "message 0 needs a 'role'"),
])
def test_a_chat_message_the_template_cannot_render_names_file_and_line(tmp_path, capsys, no_work, message,
                                                                         complaint):
    """Bug: content 5 was an AttributeError inside the template; a bad role a TokenizerError without file:line."""
    path = prompt_file(tmp_path / "p.jsonl", json.dumps({"messages": [message]}))
    with pytest.raises(UsageError, match=f"^{path}:2: {complaint}"):
        read_prompts(path)
    refused(make_data.main, ["--target", str(ROOT / "weights" / "tiny-qwen3"), "--prompts", str(path), "--out",
                             str(tmp_path / "data.jsonl"), "--device", "cpu"], capsys, f"{path}:2: ")


def test_the_chat_template_refuses_content_that_is_not_text():
    with pytest.raises(TokenizerError, match="message 1 needs a 'content' string"):
        apply_qwen3_chat_template([{"role": "system", "content": "x"}, {"role": "user", "content": ["hi"]}])


# ------------------------------------------------------------------------ 3, 15: config.json, weights


def copy_of(folder: Path, tmp_path: Path) -> Path:
    copy = tmp_path / folder.name
    shutil.copytree(folder, copy)
    return copy


def edit_config(folder: Path, **changes) -> Path:
    config = json.loads((folder / "config.json").read_text())
    for name, value in changes.items():
        if "." in name:  # a nested field: "dflash_config.mask_token_id"
            outer, inner = name.split(".")
            config[outer][inner] = value
        else:
            config[name] = value
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("field, value", [
    ("hidden_size", "128"), ("hidden_size", None), ("vocab_size", -5), ("num_hidden_layers", 8.5),
    ("num_attention_heads", 0), ("num_key_value_heads", True), ("intermediate_size", [512]), ("head_dim", None),
    ("max_position_embeddings", 0), ("rms_norm_eps", "1e-6"), ("rms_norm_eps", -1e-6), ("rope_theta", 0),
    ("tie_word_embeddings", "yes"), ("attention_bias", 1),
])
def test_every_config_field_the_model_reads_is_checked_by_name(tmp_path, field, value):
    """Bug: a value of the wrong type or range reached torch (`"hidden_size": "128"`, `"vocab_size": -5`...)."""
    folder = edit_config(copy_of(TINY, tmp_path), **{field: value})
    with pytest.raises(CheckpointError) as caught:
        Qwen3.from_pretrained(folder)
    message = str(caught.value)
    assert message.startswith(f"{folder / 'config.json'}: {field} must be ") and "\n" not in message, message
    assert json.dumps(value) in message


def test_rope_theta_inside_rope_parameters_is_checked_too(tmp_path):
    folder = edit_config(copy_of(TINY, tmp_path), rope_parameters={"rope_type": "default", "rope_theta": "big"})
    with pytest.raises(CheckpointError, match="rope_theta must be a finite number above 0"):
        Qwen3.from_pretrained(folder)


@pytest.mark.parametrize("field, value", [
    ("block_size", "8"), ("block_size", 0), ("num_target_layers", None), ("dflash_config.mask_token_id", -1),
    ("dflash_config.mask_token_id", 5.0), ("dflash_config.target_layer_ids", []),
    ("dflash_config.target_layer_ids", [1, "2"]), ("dflash_config", "none"),
])
def test_every_drafter_field_is_checked_by_name(tmp_path, field, value):
    """Bug: `target_layer_ids: []` was silently replaced by the default layers."""
    folder = edit_config(copy_of(DRAFTER, tmp_path), **{field: value})
    with pytest.raises(CheckpointError) as caught:
        Drafter.from_pretrained(folder)
    assert str(caught.value).startswith(f"{folder / 'config.json'}: {field} must be "), str(caught.value)


def test_an_integer_weight_tensor_is_refused_not_cast(tmp_path):
    folder = copy_of(TINY, tmp_path)
    tensors = load_file(folder / "model.safetensors")
    tensors["model.norm.weight"] = tensors["model.norm.weight"].to(torch.int32)
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(CheckpointError, match="'model.norm.weight' is stored as I32, not as floating point"):
        Qwen3.from_pretrained(folder)


# ------------------------------------------------------------------------ 4: generation_config.json


@pytest.mark.parametrize("field, value, rule", [
    ("temperature", "hot", "a finite number >= 0"), ("top_k", 20.5, "an integer in 0..2147483647 (0: no limit)"),
    ("top_k", -3, "an integer in 0..2147483647 (0: no limit)"), ("top_p", 1.5, "a number in (0, 1]"), ("do_sample", "yes", "true or false"),
    ("min_p", -0.1, "a number in [0, 1]"),
])
def test_generation_config_values_are_checked_naming_the_file(tmp_path, field, value, rule):
    """Bug: TypeErrors, `top_k -3` blamed on a --top-k the user never passed, `do_sample: "yes"` read as true."""
    folder = copy_of(TINY, tmp_path)
    config = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**config, "do_sample": True, field: value}))
    args = generate.build_parser().parse_args(["--prompt-ids", "1", "--sample-from-config"])
    with pytest.raises(UsageError) as caught:
        sampling_of(args, folder)
    assert str(caught.value) == f"{folder / 'generation_config.json'}: {field} must be {rule}, got {json.dumps(value)}"


def test_a_null_generation_field_counts_as_unset(tmp_path):
    """transformers reads null as "not set": so do we, where the old code raised TypeError."""
    folder = copy_of(TINY, tmp_path)
    fields = {"do_sample": True, "temperature": 0.6, "top_k": None, "top_p": None, "min_p": None}
    (folder / "generation_config.json").write_text(json.dumps(fields))
    args = generate.build_parser().parse_args(["--prompt-ids", "1", "--sample-from-config"])
    assert sampling_of(args, folder) == Sampling(0.6)


# ------------------------------------------------------------------------ 5, 6, 7, 14, 15: generate.py


@pytest.mark.parametrize("extra, fragments", [
    (["--block-size", "0"], ["--block-size", "at least 2"]),  # bug: silently the drafter's size
    (["--block-size", "-3"], ["--block-size", "at least 2"]),  # bug: RuntimeError from torch.arange
    (["--block-size", "17"], ["block size must be in 2..16"]),  # bug: refused only after the runner was built
    (["--tree", "1000000"], ["a tree of 1000000 nodes does not fit"]),  # bug: hung in ancestor_mask
    (["--tree", "2000"], ["max_position_embeddings (1024)"]),  # bug: accepted
    (["--temperature", "nan"], ["--temperature", "finite"]),  # bug: eight copies of token 1023
    (["--temperature", "inf"], ["--temperature", "finite"]),
    (["--top-p", "nan"], ["top-p"]),
    (["--prompt", ""], ["--prompt: the prompt is empty"]),  # bug: generated from an empty user message
    (["--prompt", "  \n"], ["--prompt: the prompt is empty"]),
    (["--prompt", "hi", "--prompt-ids", "1,2"], ["not allowed with argument"]),  # bug: one was ignored
    (["--prompt-ids", "1,,3"], ["--prompt-ids", "'1,,3'"]),  # bug: became [1, 3]
    (["--no-draft", "--compare"], ["--no-draft", "--compare"]),  # bug: ran DFlash anyway, reported a speedup
    (["--no-draft", "--tree", "8"], ["--no-draft", "--tree"]),  # bug: the tree was ignored
    (["--no-draft", "--block-size", "4"], ["--no-draft", "--block-size"]),
    (["--chat", "--raw"], ["not allowed with argument"]),  # bug: the last one won
])
def test_generate_refuses_before_building_the_runner(capsys, no_work, extra, fragments):
    argv = [*G, *extra] if any(option in extra for option in ("--prompt", "--prompt-ids")) else [*G, "--prompt", "hi",
                                                                                              *extra]
    refused(generate.main, argv, capsys, *fragments)


def test_a_prompt_too_long_for_the_model_is_blamed_on_the_prompt(capsys, no_work):
    """Bug: the message said max_new_tokens was wrong, whatever it was."""
    ids = ",".join(["5"] * 2048)  # the fixture's max_position_embeddings
    error = refused(generate.main, [*PAIR, "--prompt-ids", ids, "--max-new-tokens", "1"], capsys)
    assert "--prompt-ids: the prompt's 2048 tokens leave no room" in error and "max_new_tokens" not in error


def test_the_drafters_mask_token_inside_a_prompt_is_refused(capsys, no_work):
    mask = json.loads((DRAFTER / "config.json").read_text())["dflash_config"]["mask_token_id"]
    refused(generate.main, [*PAIR, "--prompt-ids", f"1,{mask},3"], capsys, "--prompt-ids", f"token id {mask}",
            "mask token")


def test_the_mask_token_is_an_ordinary_token_without_a_drafter(capsys):
    assert generate.main([*PAIR, "--prompt-ids", "1,599,3", "--no-draft", "--max-new-tokens", "2"]) == 0


def test_tau_of_a_cut_run_says_the_last_step_counted_whole():
    """tau counts a step whole, also when --max-new-tokens cut it: where tau is printed, that is said."""
    cut = Generation(new_ids=[1, 2, 3], acceptance_lengths=[14], seconds=1.0)  # 1 prefill token, a step of 14 kept 2
    assert cut.past_the_end_note() == " (with 12 accepted tokens past the end of the output)"
    assert Generation([1, 2, 3], [2], 1.0).past_the_end_note() == ""


def test_bench_ideal_speedup_rests_on_the_tokens_a_step_added_not_tau():
    runs = [measure.Run(result, result, {"draft": 0.1, "verify": 0.3}, {"draft": 1, "verify": 1})
            for result in [Generation(list(range(4)), [16], 0.5, 0.0, 0.1)]]  # a step of 16 that kept 3 tokens
    plain = [measure.Run(result, result, {"decode": 0.3}, {"decode": 3})
             for result in [Generation(list(range(4)), [1, 1, 1], 0.4, 0.0, 0.1)]]  # 3 decodes of 100 ms
    figures = measure.summarize_row(runs, plain, 0.0, 16)["all"]
    assert figures["tau"] == 16 and figures["tokens_per_step"] == 3
    assert figures["ideal_speedup"] == pytest.approx(3 * 100 / 400)  # 3 tokens a step, 100 ms each plain; 400 ms


def test_bad_input_in_a_real_process_is_one_line_and_status_2(tmp_path):
    """End to end, as a shell sees it: status 2, one `error:` line, no traceback."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONIOENCODING": "utf-8"}
    done = subprocess.run([sys.executable, "generate.py", *G, "--prompt", b"\xff\xfe x".decode("utf-8",
                          "surrogateescape")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("error: --prompt: ") and len(done.stderr.strip().splitlines()) == 1, done.stderr


# ------------------------------------------------------------------------ 7, 8, 15: make_data.py and bench.py


def test_check_output_refuses_what_could_only_fail_at_the_end(tmp_path):
    (tmp_path / "file.txt").write_text("")
    with pytest.raises(UsageError, match="--json .*file.txt is a file, not a folder"):
        check_output(tmp_path / "file.txt" / "a.json", "--json")
    with pytest.raises(UsageError, match="is a folder, not a file"):
        check_output(tmp_path, "--out")
    with pytest.raises(UsageError, match="not a folder"):
        check_output(tmp_path / "file.txt", "--plots", folder=True)
    check_output(tmp_path / "no" / "such" / "dir" / "a.json", "--json")  # a missing folder is made


def test_bench_checks_its_outputs_and_options_before_benchmarking(tmp_path, capsys, no_work):
    """Bug: `--json` under a missing folder lost the whole benchmark to FileNotFoundError at the end."""
    (tmp_path / "file.txt").write_text("")
    prompts = str(ROOT / "weights" / "heldout_problems.jsonl")
    demo = [*DEMO, "--prompts", prompts]
    refused(bench.main, [*demo, "--json", str(tmp_path / "file.txt" / "a.json")], capsys, "--json")
    refused(bench.main, [*demo, "--plots", str(tmp_path / "file.txt")], capsys, "--plots")
    refused(bench.main, [*demo, "--temperatures", "0", "nan"], capsys, "--temperatures")
    refused(bench.main, [*demo, "--block-sizes", "1"], capsys, "--block-sizes")
    refused(bench.main, [*demo, "--trees", "100000"], capsys, "a tree of 100000 nodes")


def test_bench_names_the_line_of_a_prompt_the_model_cannot_take(tmp_path, capsys, no_work):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt_ids": [1, 2]}\n{"prompt_ids": [1, 600]}\n')
    refused(bench.main, [*PAIR, "--prompts", str(path)], capsys, f"{path}:2: token id 600")


def test_make_data_checks_out_and_temperature_before_generating(tmp_path, capsys, no_work):
    """Bug: `--out` under a file was a FileExistsError; `--temperature nan` wrote nonsense answers and exit 0."""
    prompts = prompt_file(tmp_path / "p.jsonl")
    (tmp_path / "file.txt").write_text("")
    argv = ["--target", str(TINY), "--prompts", str(prompts), "--device", "cpu"]
    refused(make_data.main, [*argv, "--out", str(tmp_path / "file.txt" / "d.jsonl")], capsys, "--out")
    refused(make_data.main, [*argv, "--out", str(tmp_path / "d.jsonl"), "--temperature", "nan"], capsys,
            "--temperature")


def test_make_data_never_mixes_answers_of_two_settings_in_one_file(tmp_path, capsys):
    """Bug: resumed with another --max-new-tokens, the file held answers of both lengths."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt_ids": [i + 1, 2, 3]}) + "\n" for i in range(3)))
    out = tmp_path / "d.jsonl"
    argv = ["--target", str(TINY), "--prompts", str(prompts), "--out", str(out), "--device", "cpu", "--batch-size", "3"]
    assert make_data.main([*argv, "--max-new-tokens", "4"]) == 0
    first_line = out.read_text().splitlines()[0]
    out.write_text(first_line + "\n")  # as if stopped after one prompt
    refused(make_data.main, [*argv, "--max-new-tokens", "6"], capsys, f"{out}:1: ", '"max_new_tokens": 4',
            '"max_new_tokens": 6')
    assert make_data.main([*argv, "--max-new-tokens", "4"]) == 0  # the same settings resume
    assert len(out.read_text().splitlines()) == 3


# ------------------------------------------------------------------------ 9 - 13: train.py


def write_data(path: Path, count: int = 6, length: int = 16) -> Path:
    generator = torch.Generator().manual_seed(0)
    path.write_text("".join(json.dumps({"input_ids": torch.randint(0, 512, (length,), generator=generator).tolist(),
                                        "loss_mask": [0] * 4 + [1] * (length - 4)}) + "\n" for _ in range(count)))
    return path


def train_argv(tmp_path: Path, out: Path, *extra: str) -> list[str]:
    data = tmp_path / "data.jsonl"
    if not data.exists():
        write_data(data)
    return ["--target", str(TINY), "--data", str(data), "--out", str(out), "--drafter-layers", "1", "--block-size",
            "4", "--num-anchors", "4", "--batch-size", "2", "--steps", "6", "--log-every", "1", "--device", "cpu",
            *extra]


@pytest.mark.parametrize("extra, option", [
    (["--num-kv-heads", "-2"], "--num-kv-heads"), (["--num-kv-heads", "0"], "--num-kv-heads"),
    (["--head-dim", "-8"], "--head-dim"), (["--intermediate-size", "-1"], "--intermediate-size"),
    (["--num-heads", "0"], "--num-heads"), (["--warmup", "-1"], "--warmup"), (["--warmup", "nan"], "--warmup"),
    (["--eval-every", "-1"], "--eval-every"), (["--save-every", "-1"], "--save-every"),
    (["--lr", "inf"], "--lr"), (["--lr", "nan"], "--lr"), (["--grad-clip", "nan"], "--grad-clip"),
    (["--grad-clip", "0"], "--grad-clip"), (["--eval-max-new-tokens", "0"], "--eval-max-new-tokens"),
    (["--target-layer-ids", "1,,2"], "--target-layer-ids"),
])
def test_train_options_out_of_range_are_refused_at_the_door(tmp_path, capsys, no_work, extra, option):
    refused(train.main, train_argv(tmp_path, tmp_path / "run", *extra), capsys, option)
    assert not (tmp_path / "run").exists()


def test_an_evaluation_prompt_the_model_cannot_take_is_refused_before_training(tmp_path, capsys, no_work):
    """Bug: `--eval-max-new-tokens` too large for the prompts failed only after training, losing the last log line."""
    heldout = tmp_path / "heldout.jsonl"
    heldout.write_text('{"prompt_ids": [1, 2, 3]}\n')
    argv = train_argv(tmp_path, tmp_path / "run", "--eval-prompts", str(heldout), "--eval-max-new-tokens", "5000")
    refused(train.main, argv, capsys, f"{heldout}: prompt 1", "max_new_tokens 5000")


def test_a_non_finite_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path, capsys, monkeypatch):
    """Bug: `--lr inf` or `--grad-clip nan` ended with exit 0 and a NaN drafter saved over the good one."""
    out = tmp_path / "run"
    assert train.main(train_argv(tmp_path, out, "--stop-at", "2")) == 0
    good = load_file(out / "model.safetensors")
    real_loss = train.drafter_loss

    def diverging(*args, **kwargs):
        loss, correct, counted = real_loss(*args, **kwargs)
        return loss * math.inf, correct, counted

    monkeypatch.setattr(train, "drafter_loss", diverging)
    capsys.readouterr()
    assert train.main(train_argv(tmp_path, out, "--resume", "--save-every", "1")) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # after the progress bar's lines
    assert last.startswith("error: step 3: the loss or its gradient is not finite"), last
    kept = load_file(out / "model.safetensors")
    assert all(torch.equal(good[name], kept[name]) for name in good)
    assert torch.load(out / "training_state.pt", weights_only=True)["step"] == 2
    assert [json.loads(line)["step"] for line in (out / "train_log.jsonl").read_text().splitlines()] == [1, 2]


def test_resume_with_a_stop_before_the_checkpoint_is_refused(tmp_path, capsys, monkeypatch):
    """Bug: `--resume --stop-at 3` on a run at step 4 trained on to the end."""
    out = tmp_path / "run"
    assert train.main(train_argv(tmp_path, out, "--stop-at", "4")) == 0
    refused(train.main, train_argv(tmp_path, out, "--resume", "--stop-at", "3"), capsys, "--stop-at 3",
            "already at step 4")
    assert torch.load(out / "training_state.pt", weights_only=True)["step"] == 4


def test_a_torn_last_log_line_is_dropped_on_resume(tmp_path):
    """Bug: what a kill -9 during an append leaves made --resume fail with JSONDecodeError."""
    log = tmp_path / "train_log.jsonl"
    log.write_text('{"step": 1}\n{"step": 2}\n{"step": 3}\n{"st')
    forget_log_after(log, 2)
    assert log.read_text() == '{"step": 1}\n{"step": 2}\n'
    log.write_text('{"step": 1}\n{"step": \n{"step": 3}\n')  # torn in the middle: not ours to guess
    with pytest.raises(UsageError, match=f"{log}:2: not valid JSON"):
        forget_log_after(log, 2)


def test_partial_writes_are_removed_and_a_missing_run_is_not_created(tmp_path):
    """Bug: a kill -9 during a save left `training_state.pt*.tmp` forever; `--resume` into a missing folder made
    it before refusing."""
    out = tmp_path / "run"
    out.mkdir()
    for name in ("training_state.ptx1y2z3.tmp", "model.safetensorsabc.tmp", "notes.tmp"):
        (out / name).write_text("partial")
    prepare_run_folder(out, resume=True, force=False, outputs=("training_state.pt", "model.safetensors"))
    assert sorted(path.name for path in out.iterdir()) == ["notes.tmp"]  # not ours: kept
    with pytest.raises(UsageError, match="nothing to resume"):
        prepare_run_folder(tmp_path / "missing", resume=True, force=False, outputs=())
    assert not (tmp_path / "missing").exists()


def test_an_atomic_write_reaches_the_disk_before_the_rename(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda handle: (synced.append(os.readlink(f"/proc/self/fd/{handle}")),
                                                     real_fsync(handle)))
    target = tmp_path / "state.pt"
    write_atomically(target, lambda tmp: Path(tmp).write_text("data"))
    assert target.read_text() == "data" and list(tmp_path.iterdir()) == [target]
    assert len(synced) == 2 and synced[0].endswith(".tmp") and synced[1] == str(tmp_path)  # the file, then the folder


# --------------------------------------- issue 40: sizes bounded first, nothing dropped silently


def test_a_target_config_with_more_layers_than_its_tensors_is_refused_at_once(tmp_path, capsys,
                                                                                no_work):
    """Bug: `num_hidden_layers: 1e9` (the checkpoint has 8) hung building the layers; the shapes
    were compared only after."""
    folder = edit_config(copy_of(TINY, tmp_path), num_hidden_layers=1_000_000_000)
    with time_limit(20):
        with pytest.raises(CheckpointError, match="num_hidden_layers is 1000000000, but the "
                                                  "checkpoint's tensors hold 4 layers"):
            Qwen3.from_pretrained(folder)
        refused(generate.main, ["--model", str(folder), *PAIR[2:], "--prompt-ids", "1,2"], capsys,
                "num_hidden_layers is 1000000000")


def test_sizes_torch_cannot_count_are_refused_in_one_line(tmp_path):
    folder = edit_config(copy_of(TINY, tmp_path), hidden_size=2**31 - 1,
                         intermediate_size=2**31 - 1)
    with pytest.raises(CheckpointError, match="its sizes cannot be built"):
        Qwen3.from_pretrained(folder)


def test_weights_larger_than_the_free_memory_are_refused_before_loading(monkeypatch):
    from dflash import checkpoint

    monkeypatch.setattr(checkpoint, "available_memory", lambda device: 10_000)
    with pytest.raises(CheckpointError, match=r"its weights in float32 need about .* GB, and cpu "
                                              r"has .* GB free"):
        Qwen3.from_pretrained(TINY)


def test_a_drafter_block_past_its_positions_is_refused_before_any_cache(tmp_path, capsys, no_work):
    """Bug: `block_size: 10000000` got generate.py killed by the kernel after 64 s, no word."""
    drafter = edit_config(copy_of(DRAFTER, tmp_path), block_size=10_000_000)
    with pytest.raises(CheckpointError, match="block_size 10000000 is more than the drafter's "
                                              "max_position_embeddings"):
        Drafter.from_pretrained(drafter)
    with time_limit(30):
        refused(generate.main, [*PAIR[:2], "--draft", str(drafter), "--prompt-ids", "1,2",
                                "--device", "cpu"], capsys, "block_size 10000000")


def test_a_drafter_block_of_one_says_what_a_block_needs(tmp_path):
    """Bug: "block size must be in 2..1"."""
    drafter = edit_config(copy_of(DRAFTER, tmp_path), block_size=1)
    with pytest.raises(CheckpointError, match="block_size must be an integer of at least 2"):
        Drafter.from_pretrained(drafter)


def test_cache_slots_past_the_memory_are_refused_before_the_runner(tmp_path, capsys, no_work):
    """A target claiming 2**31 - 1 positions lets max_new_tokens ask for caches of terabytes."""
    target = edit_config(copy_of(TARGET, tmp_path), max_position_embeddings=2**31 - 1)
    with time_limit(30):
        line = refused(generate.main, ["--model", str(target), *PAIR[2:], "--prompt-ids", "1,2",
                                       "--max-new-tokens", "2000000000"], capsys,
                       "2000000010 cache slots", "max_new_tokens 2000000000", "GB in all")
    assert re.search(r"need about [\d.e+]+ GB", line), line


def test_a_request_is_measured_against_all_memory_not_what_its_own_caches_took(monkeypatch):
    """The loops check each request again once the runner holds its caches: against the free
    memory, the request the runner was built for would be refused for the runner's own caches."""
    from dflash import checkpoint
    from dflash.prompts import check_request

    target, drafter = Qwen3.from_pretrained(TARGET), Drafter.from_pretrained(DRAFTER)
    monkeypatch.setattr(checkpoint, "available_memory", lambda device: 0)
    check_request(target, drafter, [1, 2], 100, block_size=8)
    monkeypatch.setattr(checkpoint, "total_memory", lambda device: 10_000)
    with pytest.raises(UsageError, match=r"the 110 cache slots .* need about .* GB, and cpu has "
                                         r"1e-05 GB in all"):
        check_request(target, drafter, [1, 2], 100, block_size=8)


@pytest.mark.parametrize("name", ["tokenizer_config.json", "generation_config.json"])
def test_a_config_that_is_a_json_list_is_one_error_line(tmp_path, capsys, no_work, name):
    """Bug: AttributeError ('list' object has no attribute 'get')."""
    model = copy_of(ROOT / "weights" / "tiny-qwen3", tmp_path)
    (model / name).write_text("[1, 2]\n")
    refused(generate.main, ["--model", str(model), *DEMO[2:], "--prompt", "Hi"], capsys, name,
            "expected a JSON object")


@pytest.mark.parametrize("eos, complaint", [
    ("x", 'must be a token id or a list of them, got "x"'),
    ([999999], "eos_token_id 999999 is outside the vocabulary (0..1023)"),
    ([2, 1.5], "must be a token id or a list of them"),
])
def test_a_stop_id_that_could_never_stop_is_refused(tmp_path, capsys, no_work, eos, complaint):
    """Bug: "x" was dropped and 999999 kept, both without a word: replies ran to their limit."""
    model = copy_of(ROOT / "weights" / "tiny-qwen3", tmp_path)
    config = json.loads((model / "generation_config.json").read_text())
    (model / "generation_config.json").write_text(json.dumps({**config, "eos_token_id": eos}))
    refused(generate.main, ["--model", str(model), *DEMO[2:], "--prompt", "Hi"], capsys,
            "generation_config.json", complaint)


def test_a_fifo_where_a_checkpoint_file_goes_is_refused_not_waited_on(tmp_path):
    """Bug: a `model.safetensors` that is a FIFO hung the load forever (open waits for a writer)."""
    folder = copy_of(TINY, tmp_path)
    (folder / "model.safetensors").unlink()
    os.mkfifo(folder / "model.safetensors")
    with time_limit(20):
        with pytest.raises(CheckpointError, match="model.safetensors: .*not a regular file"):
            Qwen3.from_pretrained(folder)
    config = copy_of(TINY, tmp_path / "other")
    (config / "config.json").unlink()
    os.mkfifo(config / "config.json")
    with time_limit(20):
        with pytest.raises(CheckpointError, match="config.json: .*not a regular file"):
            Qwen3.from_pretrained(config)


def test_a_seed_past_what_torch_takes_is_one_error_line(capsys, no_work):
    """Bug: "Overflow when unpacking long long", a traceback after the models were loaded."""
    refused(bench.main, [*DEMO, "--seed", "1180591620717411303424"], capsys, "--seed",
            "0..2**64 - 1")


def test_generate_refuses_a_seed_past_what_torch_takes(capsys, no_work):
    refused(generate.main, [*G, "--prompt", "Hi", "--seed", "1180591620717411303424"], capsys,
            "--seed")


@pytest.mark.parametrize("device", ["cpu:5", "cpu:-1", "cuda:99", "tpu"])
def test_a_device_this_machine_lacks_is_refused(capsys, no_work, device):
    """Bug: torch reads `cpu:5` as the cpu, so it was accepted."""
    refused(generate.main, [*G, "--prompt", "Hi", "--device", device], capsys,
            f"device {device!r}")


def drafter_check_not_run(monkeypatch):
    """benchmarks/drafter_check.py, its check replaced by a failure: a refusal must come first."""
    import drafter_check

    monkeypatch.setattr(drafter_check, "check_drafter",
                        lambda *args, **kwargs: pytest.fail("the check ran first"))
    return drafter_check


def test_drafter_check_refuses_a_json_path_under_a_file_before_the_run(tmp_path, capsys,
                                                                        monkeypatch):
    """Bug: NotADirectoryError, and only after the whole check had run."""
    drafter_check = drafter_check_not_run(monkeypatch)
    (tmp_path / "file").write_text("")
    prompts = prompt_file(tmp_path / "p.jsonl")
    refused(drafter_check.main, [*DEMO, "--prompts", str(prompts), "--json",
                                 str(tmp_path / "file" / "r.json")], capsys, "--json",
            "is a file, not a folder")


def test_drafter_check_refuses_a_mask_token_outside_the_vocabulary(tmp_path, capsys, monkeypatch):
    """Bug: `--mask-token-ids 999999` was quietly left out of the report."""
    drafter_check = drafter_check_not_run(monkeypatch)
    prompts = prompt_file(tmp_path / "p.jsonl")
    refused(drafter_check.main, [*DEMO, "--prompts", str(prompts), "--mask-token-ids", "5,999999"],
            capsys, "--mask-token-ids", "token id 999999 is outside the vocabulary")
