"""The command line's dispatch and error handling (the real-model runs are in e2e tests)."""

import pytest

from jaxspec import cli


def test_bench_dispatches_to_the_harness(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["bench", "--help"])
    assert exit_info.value.code == 0
    assert "--workload" in capsys.readouterr().out


def test_missing_prompt_file_is_a_clear_error(tmp_path, capsys):
    missing = tmp_path / "nope.txt"
    assert cli.main(["generate", "--prompt-file", str(missing)]) == 2
    assert f"prompt file not found: {missing}" in capsys.readouterr().err


def test_unknown_model_path_is_a_clear_error(tmp_path, capsys):
    missing = tmp_path / "model.gguf"
    assert cli.main(["generate", "--prompt", "hi", "--model", str(missing),
                     "--compile-cache", ""]) == 2
    assert "no model at" in capsys.readouterr().err


def test_auto_takes_no_draft_length(capsys):
    assert cli.main(["generate", "--prompt", "hi", "--spec", "auto", "--max-draft-len", "3",
                     "--compile-cache", ""]) == 2
    assert "auto" in capsys.readouterr().err
