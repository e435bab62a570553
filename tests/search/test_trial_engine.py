"""One ``TrialEngine`` protocol: it declares everything the Ray trainable and a staged trial
call on the engine, the trainable reaches nothing of it by ``getattr``, and the engine the
search builds (``TrialRunner``) has every member."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import raysearch
from raysearch.trial import StagedTrial, TrialEngine, TrialRunner, _staged

PACKAGE = Path(raysearch.__file__).parent


def _declared() -> set[str]:
    tree = ast.parse(inspect.getsource(TrialEngine))
    (cls,) = tree.body
    return {
        node.target.id if isinstance(node, ast.AnnAssign) else node.name
        for node in cls.body
        if isinstance(node, (ast.AnnAssign, ast.FunctionDef))
    }


def _used(source: str, owner: str) -> set[str]:
    """The attributes read of ``owner`` (``self._engine``, ``self.runner``) in ``source``."""
    return {
        node.attr
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Attribute) and ast.unparse(node.value) == owner
    }


def test_there_is_one_trial_engine_protocol():
    defined = [
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*.py")
        if "class TrialEngine" in path.read_text()
    ]
    assert defined == ["trial/_staged.py"]


def test_the_protocol_declares_what_the_trainable_and_a_staged_trial_call():
    trainable = (PACKAGE / "search" / "tune" / "trainable.py").read_text()
    assert "getattr(self._engine" not in trainable and "hasattr(self._engine" not in trainable
    used = _used(trainable, "self._engine") | _used(inspect.getsource(_staged), "self.runner")
    assert used and used <= _declared(), used - _declared()
    # the engine the search builds has each member (an attribute set in its constructor)
    runner_source = inspect.getsource(TrialRunner)
    missing = {
        m
        for m in _declared()
        if not hasattr(TrialRunner, m)
        and f"self.{m} " not in runner_source
        and f"self.{m}:" not in runner_source
    }
    assert not missing
    assert inspect.signature(TrialRunner.start).return_annotation == "StagedTrial"
    assert StagedTrial.__init__.__annotations__["runner"] == "TrialEngine"
