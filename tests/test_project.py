"""The project holds together: dependency lists agree, book.toml matches the notebooks, the package is exported."""

import tomllib
from pathlib import Path

import nbformat
import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from rosellm_edu import export

ROOT = Path(__file__).resolve().parent.parent


def requirement_names(specs: list[str]) -> set[str]:
    return {canonicalize_name(Requirement(spec).name) for spec in specs}


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
    stale = [str(p.relative_to(ROOT)) for p in export.stale_modules()]
    assert stale == [], "run `make export` (python -m rosellm_edu.export)"


# The exporter itself, on a tiny project built in a temporary directory.

FOO_CELL = "def foo():\n    return 42"


def make_project(root: Path, modules: list[str], cells: list[str]) -> Path:
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# x")]
                                        + [nbformat.v4.new_code_cell(c) for c in cells])
    (root / "notebooks").mkdir()
    nbformat.write(notebook, root / "notebooks" / "x.ipynb")
    listed = ", ".join(f'"{m}"' for m in modules)
    (root / "book.toml").write_text(f'title = "t"\n\n[[chapters]]\nnotebook = "x.ipynb"\ntitle = "x"\n'
                                    f"modules = [{listed}]\n")
    return root


def test_generate_writes_the_exported_cell_under_a_header_naming_its_notebook(tmp_path):
    root = make_project(tmp_path, ["foo"], [f"#| export foo\n{FOO_CELL}", "print('not exported')"])
    files = export.generate(root)
    assert list(files) == [root / "rosellm_edu" / "foo.py"]
    header, body = files[root / "rosellm_edu" / "foo.py"].split("\n\n", 1)
    assert "notebooks/x.ipynb" in header
    assert body == FOO_CELL + "\n"


def test_generate_joins_cells_of_one_module_and_nests_dotted_names(tmp_path):
    root = make_project(tmp_path, ["pkg.bar"], ["#| export pkg.bar\na = 1", "#| export pkg.bar\nb = 2"])
    text = export.generate(root)[root / "rosellm_edu" / "pkg" / "bar.py"]
    assert text.index("a = 1") < text.index("b = 2")


@pytest.mark.parametrize("listed", [[], ["foo", "bar"], ["bar"]])
def test_generate_rejects_book_toml_modules_that_differ_from_the_exports(tmp_path, listed):
    root = make_project(tmp_path, listed, [f"#| export foo\n{FOO_CELL}"])
    with pytest.raises(ValueError, match="x.ipynb"):
        export.generate(root)


def test_stale_modules_reports_missing_and_edited_modules_only(tmp_path):
    root = make_project(tmp_path, ["foo"], [f"#| export foo\n{FOO_CELL}"])
    path = root / "rosellm_edu" / "foo.py"
    assert export.stale_modules(root) == [path]

    path.parent.mkdir()
    path.write_text(export.generate(root)[path])
    assert export.stale_modules(root) == []

    path.write_text(path.read_text() + "# edited by hand\n")
    assert export.stale_modules(root) == [path]
