"""[tool.ddpdoctor] in the nearest pyproject.toml: found upwards, validated, paths resolved."""

from __future__ import annotations

import pytest

from ddpdoctor.supervisor import project_config
from ddpdoctor.supervisor.cli import DEFAULTS, _merged


def write(path, text):
    path.write_text(text)
    return path


def test_the_nearest_pyproject_upwards_is_used(tmp_path):
    write(tmp_path / "pyproject.toml", '[tool.ddpdoctor]\nnproc-per-node = 4\nignore = ["set-epoch"]\n'
                                       'junit = "reports/j.xml"\n')
    nested = tmp_path / "src" / "pkg"
    nested.mkdir(parents=True)
    path, settings = project_config.load(str(nested))
    assert path == str(tmp_path / "pyproject.toml")
    assert settings == {"nproc-per-node": 4, "ignore": ["set-epoch"], "junit": str(tmp_path / "reports/j.xml")}


def test_no_table_or_no_file_means_no_settings(tmp_path):
    write(tmp_path / "pyproject.toml", "[project]\nname = 'x'\n")
    assert project_config.load(str(tmp_path))[1] == {}


@pytest.mark.parametrize("body, fragment", [
    ("hang_timeoutt = 3", "unknown key 'hang_timeoutt'"),
    ("nproc-per-node = 'two'", "nproc-per-node must be a int"),
    ("exit-zero = 1", "exit-zero must be a bool"),
    ("max-steps = true", "max-steps must be a int"),
    ("select = ['gradient-sync', 3]", "list of check ids"),
])
def test_bad_settings_are_clear_errors(tmp_path, body, fragment):
    write(tmp_path / "pyproject.toml", f"[tool.ddpdoctor]\n{body}\n")
    with pytest.raises(ValueError, match=fragment):
        project_config.load(str(tmp_path))


def test_underscores_are_accepted_as_dashes(tmp_path):
    write(tmp_path / "pyproject.toml", "[tool.ddpdoctor]\nfail_on = 'error'\n")
    assert project_config.load(str(tmp_path))[1] == {"fail-on": "error"}


def test_the_command_line_wins_over_the_file_which_wins_over_defaults():
    cli = {**{k: None for k in DEFAULTS}, "fail-on": "info", "select": ["set-epoch"]}
    file = {"fail-on": "error", "nproc-per-node": 4}
    merged = _merged(cli, file, DEFAULTS)
    assert merged["fail-on"] == "info"
    assert merged["nproc-per-node"] == 4
    assert merged["select"] == ["set-epoch"]
    assert merged["nnodes"] == 1
