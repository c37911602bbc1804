"""The mesh benchmark on the tiny model: rows for every shape and spec, tokens identical, the
model axis halving per-device weights and KV."""

import pytest

from benchmarks import mesh


def test_parse_meshes():
    assert mesh.parse_meshes("none,1x1,2x3") == [None, (1, 1), (2, 3)]
    with pytest.raises(ValueError, match="'2by3'"):
        mesh.parse_meshes("2by3")


@pytest.mark.extended      # the meshes' tokens and bytes: tests/e2e/mesh_test.py in CI
def test_tiny_run_prints_a_table(capsys):
    assert mesh.main(["--tiny", "--meshes", "none,1x2", "--repeats", "1",
                      "--max-new-tokens", "6"]) == 0
    table = capsys.readouterr().out
    rows = [line for line in table.splitlines() if line.startswith("| none") or
            line.startswith("| 1x2")]
    assert len(rows) == 2 * len(mesh.SPECS)
    assert all("identical" in row for row in rows)
    halved = [row for row in rows if row.startswith("| 1x2")]
    for row in halved:
        cells = [c.strip() for c in row.split("|")]
        assert float(cells[6]) <= 0.5 + 0.05 and cells[8] == "0.500", row   # weights, KV
