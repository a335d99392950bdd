"""How a build backend ends: an expected failure with its message alone, a bug
with its traceback and a line saying to report it (engine/errors.py). The
frontends' side, under `python -m build`, `pip wheel`, setuptools and
`hatch build`, is in test_failing_builds.py, test_setuptools.py and
test_example_wheel.py."""

from __future__ import annotations

import pytest

from hatch_precompile.engine.config import ConfigError
from hatch_precompile.engine.errors import ModelBuildError, failures_said_plainly, said_plainly


@pytest.mark.parametrize(
    "failure",
    [ConfigError(["tool.hatch.build.hooks.precompile.jobs: expected an integer >= 1, found 0"]), ModelBuildError("m", "capturing", "no")],
)
def test_an_expected_failure_ends_with_its_message_alone(failure: Exception, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ended, failures_said_plainly():
        raise failure
    assert ended.value.code == f"\n{failure}"  # Python prints it to stderr and exits with status 1
    assert ended.value.__suppress_context__ and capsys.readouterr().err == ""


def test_a_bug_keeps_its_traceback_and_says_where_it_belongs(capsys: pytest.CaptureFixture[str]) -> None:
    @said_plainly
    def hook() -> None:
        raise KeyError("entry")

    with pytest.raises(KeyError):
        hook()
    said = capsys.readouterr().err
    assert "an unexpected error, a bug in hatch-precompile rather than in this project" in said
    assert "please report it, with the traceback below, to hatch-precompile's issue tracker" in said
