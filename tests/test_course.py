"""The book's standard, checked on every chapter: cells a reader can hold, a recap, a box on production engines,
exercises, a picture, the machine named beside any timing, and no measured figure copied into prose."""

import json
import re
from pathlib import Path

import pytest

from rosellm_edu.book.export import load_book

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = [chapter.notebook for chapter in load_book()[1]]
MAX_CELL_LINES = 40
# A number with a unit that only a measurement produces: a time, a rate, a speed-up.
MEASURED = re.compile(r"\b\d[\d,]*(?:\.\d+)? ?(?:ms|µs|us|ns|s|tok/s|tokens/s|GB/s|GFLOP/s|TFLOP/s)\b"
                      r"|\b\d+(?:\.\d+)? ?[x×] (?:faster|slower)\b")
TIMES = re.compile(r"perf_counter|timeit|benchmark\.Timer|benchmarks\.(?:mixed|decode|sampler)|\btimed\(")


def cells(notebook: str, kind: str) -> list[str]:
    nb = json.loads((ROOT / "notebooks" / notebook).read_text())
    return ["".join(cell["source"]) for cell in nb["cells"] if cell["cell_type"] == kind]


def outputs(notebook: str) -> list[dict]:
    nb = json.loads((ROOT / "notebooks" / notebook).read_text())
    return [out for cell in nb["cells"] if cell["cell_type"] == "code" for out in cell.get("outputs", [])]


@pytest.mark.parametrize("notebook", CHAPTERS)
def test_no_code_cell_is_longer_than_a_reader_can_hold(notebook):
    long = [(i, n) for i, src in enumerate(cells(notebook, "code")) if (n := len(src.splitlines())) > MAX_CELL_LINES]
    assert not long, f"{notebook}: code cells (index among code cells, lines) over {MAX_CELL_LINES}: {long}"


@pytest.mark.parametrize("notebook", CHAPTERS)
def test_each_chapter_closes_with_a_recap_a_production_box_and_exercises(notebook):
    prose = "\n".join(cells(notebook, "markdown"))
    assert re.search(r"^## Recap", prose, re.M), notebook
    assert "How vLLM and SGLang do it" in prose, notebook
    assert re.search(r"^## Exercises", prose, re.M), notebook


@pytest.mark.parametrize("notebook", CHAPTERS)
def test_each_chapter_has_a_picture(notebook):
    plotted = any("image/png" in out.get("data", {}) or "image/svg+xml" in out.get("data", {})
                  for out in outputs(notebook))
    drawn = any(re.search(r"!\[[^\]]*\]\(figures/[^)]+\.svg\)", src) for src in cells(notebook, "markdown"))
    assert plotted or drawn, notebook


@pytest.mark.parametrize("notebook", CHAPTERS)
def test_a_chapter_that_times_anything_names_the_machine(notebook):
    code = "\n".join(cells(notebook, "code"))
    if TIMES.search(code):
        assert "machine_line()" in code, f"{notebook} times something but never prints machine_line()"


@pytest.mark.parametrize("notebook", CHAPTERS)
def test_prose_quotes_no_measured_number(notebook):
    quoted = [m.group(0) for src in cells(notebook, "markdown") for m in MEASURED.finditer(src)]
    assert not quoted, f"{notebook}: prose copies measured figures {quoted}; point at the printed output instead"
