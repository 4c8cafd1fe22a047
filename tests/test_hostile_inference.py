"""The inference side of a hostile pass (issue #50): checkpoints, configs, prompts and options a
careless or hostile user could hand to the loaders and generate.py. Each is refused in one `error:`
line with exit status 2, before any work, or loads as it should; none hangs, and none changes a file.

Bad checkpoints are built in tmp_path from the tiny fixtures: every file a link to the fixture's but
the one a test edits, so nothing here copies megabytes.
"""

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import generate
from dflash import checkpoint
from dflash.checkpoint import CheckpointError
from dflash.cli import UsageError, refuse_overlap
from dflash.drafter import Drafter
from dflash.prompts import read_prompts
from dflash.qwen3 import Qwen3
from dflash.sampling import Sampling
from tests.snapshots import assert_untouched, tree_bytes
from tests.test_walk_options import time_limit

ROOT = Path(__file__).resolve().parents[1]
FIXTURES, WEIGHTS = ROOT / "tests" / "fixtures", ROOT / "weights"
TARGET, DRAFTER = FIXTURES / "qwen3-tiny-sharded", FIXTURES / "dflash-tiny"  # a pair, no tokenizer
TIED = FIXTURES / "qwen3-tiny"  # one file, tie_word_embeddings true
DEMO_TARGET, DEMO_DRAFTER = WEIGHTS / "tiny-qwen3", WEIGHTS / "tiny-qwen3-dflash"  # a tokenizer
IDS = ["--prompt-ids", "1,2,3", "--max-new-tokens", "3", "--device", "cpu"]
TEXT = ["--prompt", "Mia has 3 apples.", "--max-new-tokens", "3", "--device", "cpu"]


@pytest.fixture
def no_work(monkeypatch):
    """generate.py's work replaced by a failure: a refusal must come before it."""
    def started(*args, **kwargs):
        raise AssertionError("the work started before the input was refused")

    monkeypatch.setattr(generate, "ModelRunner", started)


def refused(argv, capsys, *fragments) -> str:
    """generate.py on `argv` exits 2 with one `error:` line holding every fragment, within 30 s."""
    capsys.readouterr()
    with time_limit(30):
        status = generate.main([str(arg) for arg in argv])
    lines = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(lines) == 1 and lines[0].startswith("error: "), (status, lines)
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def linked(source: Path, folder: Path, *own: str) -> Path:
    """`source` in `folder`: its files links, but `own`, which are copies this test may change."""
    folder.mkdir(parents=True)
    for path in source.iterdir():
        if path.name in own:
            shutil.copyfile(path, folder / path.name)
        else:
            (folder / path.name).symlink_to(path)
    return folder


def edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def edit_tensor(folder: Path, file: str, name: str, change) -> None:
    """Rewrite tensor `name` of `folder/file` (a copy) as `change(tensor)`."""
    tensors = load_file(folder / file)
    tensors[name] = change(tensors[name])
    save_file(tensors, folder / file, metadata={"format": "pt"})


def set_raw(path: Path, field: str, text: str) -> None:
    """Set `field` of a JSON object file to `text` as written, a number Python's json would not
    write (400 digits)."""
    config = {key: value for key, value in json.loads(path.read_text()).items() if key != field}
    path.write_text(json.dumps(config)[:-1] + f', "{field}": {text}}}')


def poisoned(tensor: torch.Tensor, value: float) -> torch.Tensor:
    tensor = tensor.clone()
    tensor.view(-1)[tensor.numel() // 2] = value
    return tensor


# ------------------------------------------------------------------ 1: weights are finite


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_a_target_weight_that_is_not_finite_is_refused_naming_tensor_and_file(tmp_path, value):
    folder = linked(TARGET, tmp_path / "target", "model-00002-of-00003.safetensors")
    file = folder / "model-00002-of-00003.safetensors"
    name = next(iter(load_file(file)))
    edit_tensor(folder, file.name, name, lambda t: poisoned(t, value))
    with pytest.raises(CheckpointError) as caught:
        Qwen3.from_pretrained(folder)
    assert str(caught.value) == f"{file}: tensor {name!r} holds NaN or Inf values"


def test_a_drafter_weight_that_is_not_finite_is_refused(tmp_path):
    folder = linked(DRAFTER, tmp_path / "drafter", "model.safetensors")
    edit_tensor(folder, "model.safetensors", "fc.weight", lambda t: poisoned(t, float("nan")))
    target = Qwen3.from_pretrained(TARGET)
    with pytest.raises(CheckpointError, match="'fc.weight' holds NaN or Inf"):
        Drafter.from_pretrained(folder, target=target)


def test_a_weight_finite_when_stored_but_not_once_cast_says_so(tmp_path):
    """A float32 weight of 1e30 is finite; in float16 it is Inf, and the message says why."""
    folder = linked(TIED, tmp_path / "target", "model.safetensors")
    name = "model.norm.weight"
    edit_tensor(folder, "model.safetensors", name, lambda t: poisoned(t, 1e30))
    assert Qwen3.from_pretrained(folder) is not None  # float32: fine
    with pytest.raises(CheckpointError) as caught:
        Qwen3.from_pretrained(folder, dtype=torch.float16)
    assert str(caught.value).endswith(f"{name!r} holds NaN or Inf values once cast to float16")


def test_huge_finite_float16_weights_whose_sum_overflows_load(tmp_path):
    """The quick test sums in float32: float16 weights summing past 65504 are no false alarm."""
    folder = linked(TIED, tmp_path / "target", "model.safetensors")
    edit_tensor(folder, "model.safetensors", "model.embed_tokens.weight",
                lambda t: torch.full_like(t, 60000.0))
    model = Qwen3.from_pretrained(folder, dtype=torch.float16)
    assert model.embed_tokens.weight.float().sum() > 65504


def test_generate_with_nan_weights_exits_2_not_an_empty_answer(tmp_path, capsys, no_work):
    folder = linked(TARGET, tmp_path / "target", "model-00001-of-00003.safetensors")
    edit_tensor(folder, "model-00001-of-00003.safetensors", "model.embed_tokens.weight",
                lambda t: poisoned(t, float("nan")))
    refused(["--model", folder, "--draft", DRAFTER, *IDS], capsys, "model.embed_tokens.weight",
            "NaN or Inf", "model-00001-of-00003.safetensors")


# ------------------------------------------------------------------ 2: ranges and types


@pytest.mark.parametrize("head_dim", [1, 3, 63])
def test_an_odd_head_dim_is_refused_in_a_target_and_a_drafter(tmp_path, head_dim):
    for source, load in ((TARGET, Qwen3.from_pretrained), (DRAFTER, Drafter.from_pretrained)):
        folder = linked(source, tmp_path / source.name, "config.json")
        edit_json(folder / "config.json", head_dim=head_dim)
        with pytest.raises(CheckpointError) as caught:
            load(folder)
        assert str(caught.value) == (f"{folder / 'config.json'}: head_dim must be even (RoPE "
                                     f"rotates pairs of dimensions), got {head_dim}")


def test_an_odd_implicit_head_dim_is_refused(tmp_path):
    folder = linked(TARGET, tmp_path / "target", "config.json")
    config = json.loads((folder / "config.json").read_text())
    del config["head_dim"]
    config["hidden_size"] = config["num_attention_heads"] * 3  # 3 per head
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"head_dim \(hidden_size / num_attention_heads\) "
                       r"must be even .* got 3"):
        Qwen3.from_pretrained(folder)


def test_vocab_size_0_names_config_json_not_generation_config(tmp_path, capsys, no_work):
    folder = linked(DEMO_TARGET, tmp_path / "target", "config.json")
    edit_json(folder / "config.json", vocab_size=0)
    line = refused(["--model", folder, "--no-draft", *TEXT], capsys,
                   f"{folder / 'config.json'}: vocab_size must be")
    assert "generation_config" not in line


@pytest.mark.parametrize("field", ["vocab_size", "hidden_size", "rms_norm_eps", "rope_theta",
                                   "max_position_embeddings"])
def test_a_400_digit_integer_in_a_config_is_refused_before_it_meets_a_float(tmp_path, field):
    folder = linked(TARGET, tmp_path / "target", "config.json")
    set_raw(folder / "config.json", field, "9" * 400)
    with pytest.raises(CheckpointError, match=f"{field} must be"):
        Qwen3.from_pretrained(folder)


@pytest.mark.parametrize("field", ["temperature", "top_k", "top_p", "min_p"])
def test_a_400_digit_integer_in_generation_config_is_refused(tmp_path, capsys, no_work, field):
    folder = linked(DEMO_TARGET, tmp_path / "target", "generation_config.json")
    set_raw(folder / "generation_config.json", field, "9" * 400)
    refused(["--model", folder, "--no-draft", "--sample-from-config", *TEXT], capsys,
            "generation_config.json", f"{field} must be")


def test_a_400_digit_top_k_option_is_refused(capsys, no_work):
    refused(["--model", DEMO_TARGET, "--no-draft", "--temperature", "1", "--top-k", "9" * 400,
             *TEXT], capsys, "top-k must be an integer in 0..2147483647")
    with pytest.raises(UsageError):
        Sampling(1.0, top_k=True)


@pytest.mark.parametrize("eos", ["true", "[2, true]", "[false]"])
def test_a_boolean_is_no_eos_token_id(tmp_path, capsys, no_work, eos):
    folder = linked(DEMO_TARGET, tmp_path / "target", "generation_config.json")
    config = json.loads((folder / "generation_config.json").read_text())
    config["eos_token_id"] = json.loads(eos)
    (folder / "generation_config.json").write_text(json.dumps(config))
    refused(["--model", folder, "--no-draft", *TEXT], capsys, "generation_config.json",
            "eos_token_id must be a token id or a list of them")


@pytest.mark.parametrize("ids", ["[true, 2]", "[1, false]", "[1.0, 2]"])
def test_a_boolean_is_no_token_id_in_a_prompt_file(tmp_path, ids):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt_ids": [1, 2]}\n{"prompt_ids": %s}\n' % ids)
    with pytest.raises(UsageError) as caught:
        read_prompts(path)
    assert str(caught.value) == f"{path}:2: 'prompt_ids' must be a non-empty list of int"


@pytest.mark.parametrize("ids", ["true", "1,true", "1,2.0", "1,,2"])
def test_prompt_ids_on_the_command_line_are_integers(capsys, no_work, ids):
    refused(["--model", TARGET, "--draft", DRAFTER, "--prompt-ids", ids, "--device", "cpu"],
            capsys, "--prompt-ids")


def test_a_tied_checkpoint_with_a_different_stored_lm_head_is_refused(tmp_path):
    """transformers' tie_weights and vLLM both use the embedding as a tied model's head: a stored
    head that differs contradicts the config."""
    folder = linked(TIED, tmp_path / "target", "model.safetensors")
    tensors = load_file(folder / "model.safetensors")
    embedding = tensors["model.embed_tokens.weight"]
    save_file({**tensors, "lm_head.weight": embedding.clone()}, folder / "model.safetensors")
    Qwen3.from_pretrained(folder)  # a copy of the embedding: no contradiction
    save_file({**tensors, "lm_head.weight": embedding + 1}, folder / "model.safetensors")
    with pytest.raises(CheckpointError) as caught:
        Qwen3.from_pretrained(folder)
    assert str(caught.value) == (f"{folder / 'config.json'}: tie_word_embeddings is true, but the "
                                 "stored lm_head.weight differs from model.embed_tokens.weight "
                                 "(which a tied model uses)")


# ------------------------------------------------------------------ 3: messages


def test_a_missing_model_folder_or_a_file_says_so(tmp_path, capsys, no_work):
    refused(["--model", tmp_path / "nowhere", *TEXT], capsys,
            f"{tmp_path / 'nowhere'}: no such model folder")
    file = tmp_path / "file"
    file.write_text("x")
    refused(["--model", file, *TEXT], capsys, f"{file}: is a file, not a model folder")
    refused(["--model", DEMO_TARGET, "--draft", tmp_path / "nowhere", *TEXT], capsys,
            f"{tmp_path / 'nowhere'}: no such drafter folder")
    with pytest.raises(CheckpointError, match="is a file, not a drafter checkpoint folder"):
        Drafter.from_pretrained(file)


def test_a_target_given_as_the_drafter_is_named_for_what_it_is(capsys, no_work):
    refused(["--model", TARGET, "--draft", TARGET, *IDS], capsys,
            f"{TARGET}: this is a target (Qwen3) checkpoint, not a DFlash drafter checkpoint")
    with pytest.raises(CheckpointError, match="this is a target"):  # train.py --init-from's loader
        Drafter.from_pretrained(TIED, trainable=True)


def test_a_drafter_given_as_the_target_is_named_for_what_it_is(capsys, no_work):
    refused(["--model", DRAFTER, "--draft", DRAFTER, *IDS], capsys,
            f"{DRAFTER}: this is a DFlash drafter checkpoint, not a target (Qwen3) checkpoint")


def test_a_chat_record_with_no_user_turn_names_the_file_and_line(tmp_path):
    path = tmp_path / "prompts.jsonl"
    turns = [{"role": "system", "content": "Be brief."}, {"role": "assistant", "content": "4"}]
    path.write_text('{"prompt": "fine"}\n' + json.dumps({"messages": turns}) + "\n")
    with pytest.raises(UsageError) as caught:
        read_prompts(path)
    assert str(caught.value).startswith(f"{path}:2: the conversation has no user turn")


# ------------------------------------------------------------------ 4: contradictions


@pytest.mark.parametrize("options", [
    ["--top-p", "0.9"], ["--top-k", "20"], ["--min-p", "0.1"], ["--temperature", "0", "--top-p", "0.9"],
    ["--temperature", "1e-9", "--top-k", "5"]])
def test_filters_at_temperature_0_are_refused(capsys, no_work, options):
    option = next(option for option in options if option != "--temperature" and "-" in option[:2])
    refused(["--model", DEMO_TARGET, "--no-draft", *options, *TEXT], capsys,
            f"{option} filters sampled tokens, and the run is greedy")


def test_filters_for_a_checkpoint_that_recommends_greedy_are_refused(tmp_path, capsys, no_work):
    folder = linked(DEMO_TARGET, tmp_path / "target", "generation_config.json")
    edit_json(folder / "generation_config.json", do_sample=False)
    refused(["--model", folder, "--no-draft", "--sample-from-config", "--top-p", "0.5", *TEXT],
            capsys, "--top-p", "do_sample off")


def test_filters_above_temperature_0_are_fine(capsys):
    assert generate.main(["--model", str(DEMO_TARGET), "--no-draft", "--temperature", "0.7",
                          "--top-p", "0.9", "--top-k", "5", *TEXT]) == 0


@pytest.mark.parametrize("options, fragments", [
    (["--flex-attention"], ["--flex-attention", "cpu", "--compile"]),
    (["--flex-attention", "--no-compile"], ["--flex-attention", "--no-compile"]),
    (["--compile", "--no-compile"], ["--no-compile", "not allowed with", "--compile"]),
    (["--no-compile", "--compile"], ["not allowed with"]),
    (["--raw", "--thinking"], ["--thinking", "--raw"]),
    (["--chat", "--raw"], ["not allowed with"])])
def test_contradicting_options_are_refused(capsys, no_work, options, fragments):
    refused(["--model", DEMO_TARGET, "--draft", DEMO_DRAFTER, *options, *TEXT], capsys,
            *fragments)


@pytest.mark.parametrize("option", ["--thinking", "--chat", "--raw"])
def test_rendering_options_on_token_ids_are_refused(capsys, no_work, option):
    refused(["--model", TARGET, "--draft", DRAFTER, option, *IDS], capsys,
            f"{option} renders text prompts")


def test_no_compile_alone_runs(capsys):
    assert generate.main(["--model", str(TARGET), "--draft", str(DRAFTER), "--no-compile",
                          *IDS]) == 0


# ------------------------------------------------------------------ 5: outputs over inputs


def test_an_output_equal_to_holding_or_inside_an_input_is_refused(tmp_path):
    prompts, model = tmp_path / "p.jsonl", tmp_path / "model"
    prompts.write_text("{}\n")
    model.mkdir()
    inputs = {"--prompts": prompts, "--model": model}
    cases = {prompts: "is --prompts", tmp_path / "sub" / ".." / "p.jsonl": "is --prompts",
             tmp_path: "holds --prompts", model / "out.json": "lies inside --model",
             model: "is --model"}
    for output, fragment in cases.items():
        with pytest.raises(UsageError) as caught:
            refuse_overlap({"--json": output}, inputs)
        assert str(caught.value).startswith(f"--json {output} {fragment}"), caught.value
    link = tmp_path / "link.jsonl"
    link.symlink_to(prompts)
    with pytest.raises(UsageError, match="is --prompts"):
        refuse_overlap({"--out": link}, inputs)
    refuse_overlap({"--json": tmp_path / "elsewhere.json"}, {**inputs, "--draft": None})
    refuse_overlap({"--json": tmp_path / "p.jsonl.out"}, inputs)  # a prefix is no parent


# ------------------------------------------------------------------ 6: the shard index


@pytest.mark.parametrize("weight_map, fragment", [
    ([1, 2], "no 'weight_map' object"),
    ({"lm_head.weight": 3}, 'weight_map["lm_head.weight"] must be a file name'),
    ({"lm_head.weight": "../model-00003-of-00003.safetensors"}, "in the checkpoint's folder"),
    ({"lm_head.weight": "/etc/passwd"}, "in the checkpoint's folder"),
    ({"lm_head.weight": "sub/x.safetensors"}, "in the checkpoint's folder"),
    ({"lm_head.weight": ".."}, "in the checkpoint's folder"),
    ({"lm_head.weight": None}, "must be a file name")])
def test_a_bad_shard_index_is_refused(tmp_path, weight_map, fragment):
    folder = linked(TARGET, tmp_path / "target", "model.safetensors.index.json")
    index = folder / "model.safetensors.index.json"
    original = json.loads(index.read_text())["weight_map"]
    merged = {**original, **weight_map} if isinstance(weight_map, dict) else weight_map
    index.write_text(json.dumps({"weight_map": merged}))
    with pytest.raises(CheckpointError) as caught:
        Qwen3.from_pretrained(folder)
    assert str(caught.value).startswith(f"{index}: ") and fragment in str(caught.value)


def test_a_shard_index_too_large_or_too_deep_is_refused(tmp_path, monkeypatch):
    folder = linked(TARGET, tmp_path / "target", "model.safetensors.index.json")
    index = folder / "model.safetensors.index.json"
    index.write_text('{"weight_map": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(CheckpointError, match="nested too deeply"):
        Qwen3.from_pretrained(folder)
    monkeypatch.setattr(checkpoint, "SIDE_FILE_LIMIT", 100)
    with pytest.raises(CheckpointError, match="shard index is larger than 100 bytes"):
        Qwen3.from_pretrained(folder)


# ------------------------------------------------------------------ 7: no hang on a FIFO


@pytest.mark.parametrize("name, options", [
    ("config.json", []), ("tokenizer.json", []), ("tokenizer_config.json", []),
    ("generation_config.json", ["--sample-from-config"]), ("generation_config.json", []),
    ("model.safetensors", [])])
def test_a_fifo_in_the_model_folder_is_refused_without_waiting(tmp_path, capsys, no_work, name,
                                                               options):
    folder = linked(DEMO_TARGET, tmp_path / "target")
    (folder / name).unlink()
    os.mkfifo(folder / name)
    refused(["--model", folder, "--no-draft", *options, *TEXT], capsys, str(folder / name),
            "not a regular file")


def test_a_fifo_as_the_shard_index_or_a_shard_is_refused(tmp_path, capsys, no_work):
    for name in ("model.safetensors.index.json", "model-00002-of-00003.safetensors"):
        folder = linked(TARGET, tmp_path / name)
        (folder / name).unlink()
        os.mkfifo(folder / name)
        refused(["--model", folder, "--draft", DRAFTER, *IDS], capsys, str(folder / name),
                "not a regular file")


# ------------------------------------------------------------------ 8: Ctrl-C


def test_ctrl_c_while_loading_exits_130_in_one_line(monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(Qwen3, "from_pretrained", interrupted)
    assert generate.main(["--model", str(TARGET), "--draft", str(DRAFTER), *IDS]) == 130
    assert capsys.readouterr().err.strip().splitlines() == ["error: interrupted (Ctrl-C)"]


# ------------------------------------------------------------------ 9: nothing touched


def test_no_inference_program_touches_anything_on_bad_input(tmp_path, capsys):
    """Refused runs of generate.py (bad weights, a target as the drafter, contradicting options, a
    prompt file where a folder goes) leave every checkpoint and prompt file as it was, byte for
    byte, and write nothing beside them."""
    nan = linked(TARGET, tmp_path / "nan", "model-00003-of-00003.safetensors")
    edit_tensor(nan, "model-00003-of-00003.safetensors", "lm_head.weight",
                lambda t: poisoned(t, float("nan")))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt_ids": [1, 2, 3]}\n')
    watched = [nan, prompts, TARGET, DRAFTER, DEMO_TARGET, DEMO_DRAFTER]
    before = tree_bytes(*watched)
    runs = [["--model", nan, "--draft", DRAFTER, *IDS],
            ["--model", TARGET, "--draft", TARGET, *IDS],
            ["--model", DRAFTER, "--draft", DRAFTER, *IDS],
            ["--model", prompts, "--draft", DRAFTER, *IDS],
            ["--model", TARGET, "--draft", prompts, *IDS],
            ["--model", DEMO_TARGET, "--draft", DEMO_DRAFTER, "--raw", "--thinking", *TEXT],
            ["--model", DEMO_TARGET, "--draft", DEMO_DRAFTER, "--top-p", "0.5", *TEXT],
            ["--model", DEMO_TARGET, "--draft", DEMO_DRAFTER, "--block-size", "auto",
             "--flex-attention", *TEXT]]
    for argv in runs:
        refused(argv, capsys)
    assert_untouched(before, *watched)
