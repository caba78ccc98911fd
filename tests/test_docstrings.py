"""Every docstring example in the package runs and gives what it shows (doctest)."""
from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

PACKAGES = ("jit", "primitives", "runtime", "tools")


def _modules() -> list[str]:
    names = []
    for package in PACKAGES:
        path = importlib.import_module(package).__path__
        names += [f"{package}.{info.name}" for info in pkgutil.iter_modules(path)]
    return names


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples(name):
    module = importlib.import_module(name)
    failures, _ = doctest.testmod(module, optionflags=doctest.ELLIPSIS, report=False)
    assert failures == 0, f"{name}: {failures} docstring example(s) failed (run: python -m doctest -v)"
