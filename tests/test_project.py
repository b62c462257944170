"""The project holds together: dependency lists agree, book.toml matches the notebooks, the package is exported."""

import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from rosellm_edu.book import export

ROOT = Path(__file__).resolve().parent.parent


def requirement_names(specs: list[str]) -> set[tuple[str, tuple[str, ...], str]]:
    """Each package with the extras and the environment marker it is installed with (lm-eval[hf] is not lm-eval)."""
    return {(canonicalize_name(r.name), tuple(sorted(r.extras)), str(r.marker or ""))
            for r in map(Requirement, specs)}


def test_environment_yml_installs_the_same_packages_as_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = project["dependencies"] + project["optional-dependencies"]["test"]
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_sections = [d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d]
    assert len(pip_sections) == 1
    assert requirement_names(pip_sections[0]) == requirement_names(declared)


def test_book_toml_lists_every_notebook_and_only_existing_ones():
    _, chapters = export.load_book()
    listed = [c.notebook for c in chapters]
    on_disk = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
    assert len(listed) == len(set(listed)), "a notebook is listed twice"
    assert sorted(listed) == on_disk


def test_every_promoted_module_exists_in_the_package():
    _, chapters = export.load_book()
    missing = [m for c in chapters for m in c.modules if not export.module_path(m).exists()]
    assert missing == []


def test_committed_package_equals_what_the_notebooks_export():
    found = export.differences(export.generate())
    differences = {str(path.relative_to(ROOT)): how for path, how in found.items()}
    assert differences == {}, "run `make export` (python -m rosellm_edu.book.export)"

