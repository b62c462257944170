"""Every chapter has three exercises; each checker accepts the worked solution, reports a function that is not
written yet without raising, and is called by the chapter's notebook. Each chapter's tests of wrong answers
(that a checker names what is wrong) are in tests/test_exercises_chNN.py."""

import importlib
import json
from pathlib import Path

import pytest

from rosellm_edu.book.export import load_book

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = [chapter.notebook for chapter in load_book()[1] if not chapter.appendix]


def chapter_modules(notebook: str):
    number = notebook[:2]
    return (importlib.import_module(f"rosellm_edu.exercises.ch{number}"),
            importlib.import_module(f"rosellm_edu.exercises.solutions.ch{number}"))


def checkers(module) -> dict:
    return {name: getattr(module, name) for name in dir(module) if name.startswith("check_")}


@pytest.mark.parametrize("notebook", CHAPTERS)
def test_each_chapter_has_three_checkers_and_a_solution_for_each(notebook, capsys):
    exercises, solutions = chapter_modules(notebook)
    found = checkers(exercises)
    assert len(found) == 3, f"{notebook}: {sorted(found)}"
    for name, check in found.items():
        assert check(solutions.SOLUTIONS[name]), f"{name} rejects its worked solution: {capsys.readouterr().out}"
        assert capsys.readouterr().out.startswith("✓ ")


@pytest.mark.parametrize("notebook", CHAPTERS)
def test_an_unwritten_exercise_is_reported_not_raised(notebook, capsys):
    def unwritten(*args, **kwargs):
        raise NotImplementedError

    for name, check in checkers(chapter_modules(notebook)[0]).items():
        assert not check(unwritten)
        assert "not attempted yet" in capsys.readouterr().out, name


@pytest.mark.parametrize("notebook", CHAPTERS)
def test_the_notebook_calls_each_of_its_checkers(notebook):
    cells = json.loads((ROOT / "notebooks" / notebook).read_text())["cells"]
    code = "\n".join("".join(cell["source"]) for cell in cells if cell["cell_type"] == "code")
    for name in checkers(chapter_modules(notebook)[0]):
        assert f"{name}(" in code, f"{notebook} never calls {name}"


@pytest.mark.parametrize("notebook", CHAPTERS)
def test_a_prediction_far_from_the_measurement_is_rejected(notebook, capsys):
    exercises, solutions = chapter_modules(notebook)
    for name, check in checkers(exercises).items():
        if getattr(check, "predicts", False):
            right = solutions.SOLUTIONS[name]
            wrong = (lambda *a, **k: 10 * right(*a, **k)) if callable(right) else 10 * right
            assert not check(wrong), f"{name} accepts ten times its worked solution"
            assert capsys.readouterr().out.startswith("✗ "), name
