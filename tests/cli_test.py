"""The command line's dispatch and error handling (the real-model runs are in e2e tests)."""

import pytest

from jaxspec import cli


def test_the_cli_has_no_bench_command(capsys):
    """The benchmarks live in a source checkout (`python -m benchmarks.harness`), not in the
    installed package, so the CLI does not offer them."""
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["bench"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'bench'" in capsys.readouterr().err


def test_summary_line_sets_compilation_apart():
    stats = {"generated_tokens": 128, "wall_time_s": 12.5, "tokens_per_s": 10.24,
             "first_call_time_s": 9.0, "steady_tokens_per_s": 34.1,
             "mean_acceptance_length": 3.7, "spec_steps": 30, "acceptance_rate": 0.77}
    line = cli._summary_line(stats)
    assert "first calls (compilation included) 9.00s" in line
    assert "steady 34.1 tok/s" in line and "10.24" not in line
    assert "mean acceptance length 3.70" in line


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


def test_mesh_flag_is_parsed_or_refused(capsys):
    assert cli.parse_mesh("data=2,model=3") == (2, 3)
    assert cli.main(["generate", "--prompt", "hi", "--mesh", "data=2", "--compile-cache", ""]) == 2
    assert "--mesh takes data=D,model=M, got 'data=2'" in capsys.readouterr().err
    # One CPU device here: a 2 x 1 mesh names the numbers.
    assert cli.main(["generate", "--prompt", "hi", "--mesh", "data=2,model=1",
                     "--compile-cache", ""]) == 2
    assert "data=2 x model=1 needs 2 devices, 1 are available" in capsys.readouterr().err
