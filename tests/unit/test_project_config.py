"""[tool.ddpdoctor] in the nearest pyproject.toml: found upwards, validated, paths resolved."""

from __future__ import annotations

import pytest

from ddpdoctor.supervisor import project_config
from ddpdoctor.supervisor import options


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
    given = {"fail_on": "info", "select": ["set-epoch"], "quiet": None, "no_quiet": False}
    file = {"fail-on": "error", "nproc-per-node": 4, "quiet": True}
    merged = options.resolve(options.CHECK, given, file)
    assert merged["fail_on"] == "info"
    assert merged["nproc_per_node"] == 4
    assert merged["select"] == ("set-epoch",)
    assert merged["nnodes"] == 1
    assert merged["quiet"] is True
    assert options.resolve(options.CHECK, {"no_quiet": True}, file)["quiet"] is False  # --no-quiet undoes the file


def test_keep_evidence_is_settable_and_relative_to_the_file(tmp_path):
    write(tmp_path / "pyproject.toml", '[tool.ddpdoctor]\nkeep-evidence = "evidence"\n')
    assert project_config.load(str(tmp_path))[1] == {"keep-evidence": str(tmp_path / "evidence")}


@pytest.mark.parametrize("body, fragment", [
    ("fail-on = 'sometimes'", "fail-on must be one of error, warning, info"),
    ("nproc-per-node = 0", "nproc-per-node must be at least 1"),
    ("hang-timeout = -1", "hang-timeout must be a positive number of seconds"),
    ("launch = 'mpirun'", "launch must be one of auto, torchrun, spawn"),
])
def test_values_are_validated_as_the_command_line_would(tmp_path, body, fragment):
    write(tmp_path / "pyproject.toml", f"[tool.ddpdoctor]\n{body}\n")
    with pytest.raises(ValueError, match=fragment):
        project_config.load(str(tmp_path))
