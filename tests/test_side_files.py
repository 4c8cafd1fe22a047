"""The one reader for side files (caches, logs, locks, indexes, manifests) and the JSON parser under it:
every way such a file can be wrong is one line, never a traceback, a hang or a silent wrong value."""

import os

import pytest

from dflash.checkpoint import CheckpointError, parse_json, read_json, read_jsonl, read_side_file


def accept_dict(value):
    return None if isinstance(value, dict) else "expected an object"


def test_deep_nesting_is_one_error_not_a_recursion_error():
    with pytest.raises(CheckpointError, match="nested too deeply"):
        parse_json("[" * 100_000 + "]" * 100_000, "deep.json")


def test_a_key_given_twice_is_refused():
    with pytest.raises(CheckpointError, match='"a" comes twice'):
        parse_json('{"a": 1, "b": {"a": 2}, "a": 3}', "twice.json")


def test_a_number_of_thousands_of_digits_is_one_error():
    with pytest.raises(CheckpointError, match="huge.json: not valid JSON"):
        parse_json("1" * 5000, "huge.json")


def test_non_utf8_and_oversized_files_are_one_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_bytes(b'{"a": "\xff\xfe"}')
    with pytest.raises(CheckpointError, match="cannot read"):
        read_json(bad)
    big = tmp_path / "big.json"
    big.write_text("[" + "0," * 600 + "0]")
    with pytest.raises(CheckpointError, match="larger than 1000 bytes"):
        read_json(big, limit=1000)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_is_refused_without_opening_it(tmp_path):
    fifo = tmp_path / "cache.json"
    os.mkfifo(fifo)
    with pytest.raises(CheckpointError, match="not a regular file"):
        read_json(fifo)  # opening it would wait for a writer for ever
    assert read_side_file(fifo, "calibration cache", accept_dict) is None


def test_a_log_cut_mid_line_counts_up_to_its_last_whole_line(tmp_path):
    log = tmp_path / "train_log.jsonl"
    log.write_text('{"step": 1}\n{"step": 2}\n{"step": 3, "lo')
    records = read_jsonl(log, "training log", whole_lines_only=True)
    assert [record["step"] for _, record in records] == [1, 2]
    assert read_side_file(log, "log", lambda _: None, lines=True)[-1][1] == {"step": 2}


@pytest.mark.parametrize("content", [b"\xff\xfe", b"[1, 2", b'{"k": 1, "k": 2}', b"[" * 50_000, b"[]"])
def test_a_bad_side_file_counts_as_absent_with_one_note(tmp_path, capsys, content):
    cache = tmp_path / "block_costs.json"
    cache.write_bytes(content)
    assert read_side_file(cache, "calibration cache", accept_dict) is None
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"note: {cache}: the calibration cache is ignored")


def test_a_missing_side_file_is_absent_without_a_word(tmp_path, capsys):
    assert read_side_file(tmp_path / "none.json", "calibration cache", accept_dict) is None
    assert capsys.readouterr().err == ""


def test_a_good_side_file_is_returned(tmp_path):
    cache = tmp_path / "c.json"
    cache.write_text('{"key": {"decode_ms": 1.5}}')
    assert read_side_file(cache, "calibration cache", accept_dict) == {"key": {"decode_ms": 1.5}}


def test_run_cli_turns_ctrl_c_and_os_errors_into_one_line(capsys):
    import argparse

    from dflash.cli import run_cli

    def interrupted(args):
        raise KeyboardInterrupt

    def disk_full(args):
        raise OSError(28, "No space left on device", "/out/model.safetensors")

    assert run_cli(argparse.ArgumentParser(), interrupted, []) == 130
    assert capsys.readouterr().err == "error: interrupted (Ctrl-C)\n"
    assert run_cli(argparse.ArgumentParser(), disk_full, []) == 2
    assert capsys.readouterr().err == "error: /out/model.safetensors: No space left on device\n"
