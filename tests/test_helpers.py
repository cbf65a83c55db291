"""The test harness's own behaviour where a wrong guess would hide a failure or fail a good run."""

import warnings

import pytest
from helpers import run_ranks


def test_a_native_crash_is_run_again_once_and_said(tmp_path):
    with pytest.warns(UserWarning, match="crashed in native code, run again"):
        assert run_ranks("crash_once_run.py", [str(tmp_path)], tmp_path, ranks=1) == [{"ran": "again"}]


def test_a_python_error_fails_at_once_with_its_traceback(tmp_path):
    (tmp_path / "file").touch()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no rerun: a warning would fail here
        with pytest.raises(AssertionError, match="Traceback(.|\n)*(FileExistsError|NotADirectoryError)"):
            run_ranks("crash_once_run.py", [str(tmp_path / "file" / "out")], tmp_path, ranks=1)
