"""Every docstring example in the package runs and gives what it shows (doctest)."""
from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

from tests.conftest import NO_PATH_HERE, NO_PATH_REASON, met_no_path

PACKAGES = ("jit", "primitives", "runtime", "tools")


def _modules() -> list[str]:
    names = []
    for package in PACKAGES:
        path = importlib.import_module(package).__path__
        names += [f"{package}.{info.name}" for info in pkgutil.iter_modules(path)]
    return names


class _Runner(doctest.DocTestRunner):
    """Keeps, per docstring, what its first failing example raised (None: wrong output)."""

    def __init__(self):
        super().__init__(optionflags=doctest.ELLIPSIS)
        self.first_failure: dict[str, BaseException | None] = {}

    def report_failure(self, out, test, example, got):
        self.first_failure.setdefault(test.name, None)
        super().report_failure(out, test, example, got)

    def report_unexpected_exception(self, out, test, example, exc_info):
        self.first_failure.setdefault(test.name, exc_info[1])
        super().report_unexpected_exception(out, test, example, exc_info)


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples(name):
    module = importlib.import_module(name)
    runner = _Runner()
    for test in doctest.DocTestFinder().find(module):
        runner.run(test, out=lambda text: None)
    failures = runner.failures
    # On a CPU where no path runs, docstrings whose examples stop at running a kernel
    # (the examples after it fail for want of its result) are skipped; any other fails.
    if (failures and NO_PATH_HERE
            and all(met_no_path(exc) for exc in runner.first_failure.values())):
        pytest.skip(NO_PATH_REASON)
    assert failures == 0, f"{name}: {failures} docstring example(s) failed (run: python -m doctest -v)"
