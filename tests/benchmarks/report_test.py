"""BENCHMARKS.md sections: replaced in place, and commands recorded relative to the checkout."""

from benchmarks import report


def test_sections_are_replaced_in_place_and_others_kept(tmp_path):
    md = tmp_path / "BENCHMARKS.md"
    report.write_section("a", "first", command="python -m x", path=md)
    report.write_section("b", "other", command="python -m y", path=md)
    report.write_section("a", "second", command="python -m x --again", path=md)
    text = md.read_text()
    assert "first" not in text and "second" in text and "other" in text
    assert text.index("second") < text.index("other")
    assert "Command: `python -m x --again`" in text


def test_a_result_from_elsewhere_keeps_its_machine_and_date(tmp_path):
    md = tmp_path / "BENCHMARKS.md"
    report.write_section("gpu", "numbers", command="python -m z", path=md,
                         machine="NVIDIA H200", stamp="2026-12-01 10:00 UTC")
    assert "Command: `python -m z` — 2026-12-01 10:00 UTC, NVIDIA H200." in md.read_text()


def test_paths_inside_the_checkout_are_recorded_relative():
    assert report.checkout_relative(str(report.ROOT / "benchmarks" / "plots")) == "benchmarks/plots"
    assert report.checkout_relative("/elsewhere/plots") == "/elsewhere/plots"
    assert report.checkout_relative("--write") == "--write"


def test_publish_records_the_relative_command(tmp_path, monkeypatch, capsys):
    written = {}
    monkeypatch.setattr(report, "write_section",
                        lambda name, text, command: written.update(name=name, command=command))
    report.publish("s", "| table |", module="benchmarks.harness",
                   argv=["--plots", str(report.ROOT / "benchmarks" / "plots")], write=True)
    assert written == {"name": "s", "command": "python -m benchmarks.harness --plots "
                                              "benchmarks/plots"}
    assert "| table |" in capsys.readouterr().out
