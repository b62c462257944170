"""The exporter folds every chapter's cells of a module into one file; chapter snapshots serve earlier versions.

Each test builds a tiny book in a temporary directory: every notebook starts with a markdown cell, so its n-th code
cell is "cell n + 1".
"""

import ast
import re
import subprocess
import sys
import textwrap
import traceback
from pathlib import Path

import nbformat
import pytest

from rosellm_edu.book import add_to_class
from rosellm_edu.book import changes, chapter, export
from rosellm_edu.book.fold import GENERATED

ADD = "from rosellm_edu.book import add_to_class\n\n"


def make_book(root: Path, chapters: dict[str, list[str]], modules: dict[str, list[str]] | None = None) -> Path:
    """A book of the given notebooks (name -> code cells), in order; book.toml lists what each one exports."""
    (root / "notebooks").mkdir(parents=True, exist_ok=True)
    toml = 'title = "t"\n'
    for name, cells in chapters.items():
        notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(f"# {name}")]
                                            + [nbformat.v4.new_code_cell(c) for c in cells])
        nbformat.write(notebook, root / "notebooks" / name)
        listed = modules[name] if modules else sorted({export.cell_module(c) for c in cells} - {None})
        toml += f'\n[[chapters]]\nnotebook = "{name}"\ntitle = "{name}"\nmodules = {listed!r}\n'.replace("'", '"')
    (root / "book.toml").write_text(toml)
    return root


def module_text(root: Path, module: str = "toy") -> str:
    return export.generate(root)[export.module_path(module, root)]


def run(text: str) -> dict:
    namespace = {}
    exec(compile(text, "generated", "exec"), namespace)
    return namespace


def top_level(text: str) -> list[str]:
    return [getattr(node, "name", None) or ast.unparse(node) for node in ast.parse(text).body]


def class_body(text: str, name: str) -> list[str]:
    cls = next(n for n in ast.parse(text).body if isinstance(n, ast.ClassDef) and n.name == name)
    return [getattr(node, "name", ast.unparse(node)) for node in cls.body]


def line_above(text: str, line: str) -> str:
    lines = text.split("\n")
    return lines[lines.index(line) - 1].strip()


TOY_CLASS = """#| export toy
class Toy:
    def __init__(self):
        self.n = 1

    # the old comment on f
    def f(self):
        return "old f"

    def h(self):
        return "h"
"""


def test_a_later_chapter_replaces_a_definition_where_it_stood(tmp_path):
    root = make_book(tmp_path, {"a.ipynb": ["#| export toy\ndef f():\n    return 1\n\n\nLIMIT = 3\n\n\ndef g():\n"
                                            "    return 2"],
                                "b.ipynb": ["#| export toy\nLIMIT = 4\n\n\ndef f():\n    return 10"]})
    text = module_text(root)
    assert top_level(text) == ["f", "LIMIT = 4", "g"]
    assert run(text)["f"]() == 10
    assert line_above(text, "def f():") == "# notebooks/b.ipynb, cell 2"
    assert line_above(text, "def g():") == "# notebooks/a.ipynb, cell 2"


def test_a_chapter_may_redefine_what_it_defined_itself_after_adding_more(tmp_path):
    root = make_book(tmp_path, {"a.ipynb": ["#| export toy\nX = 1", "#| export toy\ndef f():\n    return 1",
                                            "#| export toy\ndef g():\n    return 2",
                                            "#| export toy\ndef f():\n    return g() + 1"]})
    text = module_text(root)
    assert top_level(text) == ["X = 1", "f", "g"]
    assert run(text)["f"]() == 3
    assert line_above(text, "def f():") == "# notebooks/a.ipynb, cell 5"


def test_a_method_added_to_a_class_is_folded_into_the_class_body_with_its_other_decorators(tmp_path):
    method = ADD + "@add_to_class(Toy)\n@property\ndef doubled(self):\n    # why: a comment travels with it\n" \
                   "    return 2 * self.n"
    root = make_book(tmp_path, {"a.ipynb": [TOY_CLASS], "b.ipynb": ["#| export toy\n" + method]})
    text = module_text(root)
    assert "add_to_class" not in text
    assert top_level(text) == ["Toy"]
    assert class_body(text, "Toy") == ["__init__", "f", "h", "doubled"]
    assert "    @property\n    def doubled(self):\n        # why: a comment travels with it\n" in text
    assert run(text)["Toy"]().doubled == 2


def test_an_added_method_replaces_the_class_method_of_that_name_in_place(tmp_path):
    method = "#| export toy\n" + ADD + "# the new comment on f\n@add_to_class(Toy)\ndef f(self):\n    return 'new f'"
    root = make_book(tmp_path, {"a.ipynb": [TOY_CLASS, method]})
    text = module_text(root)
    assert class_body(text, "Toy") == ["__init__", "f", "h"]
    assert "the old comment on f" not in text and "    # the new comment on f\n    def f(self):" in text
    assert run(text)["Toy"]().f() == "new f"


def test_redefining_a_class_drops_the_methods_added_to_the_earlier_one(tmp_path):
    method = "#| export toy\n" + ADD + "@add_to_class(Toy)\ndef g(self):\n    return 'g'"
    redefined = "#| export toy\nclass Toy:\n    pass"
    root = make_book(tmp_path, {"a.ipynb": [TOY_CLASS, method], "b.ipynb": [redefined]})
    assert class_body(module_text(root), "Toy") == ["pass"]


def test_a_folded_method_keeps_its_multiline_strings_as_written(tmp_path):
    method = ('#| export toy\n' + ADD + '@add_to_class(Toy)\ndef doc(self):\n'
              '    return """first\nsecond\n    third""" + f"""\n{self.n}\n"""')
    root = make_book(tmp_path, {"a.ipynb": [TOY_CLASS, method]})
    assert run(module_text(root))["Toy"]().doc() == "first\nsecond\n    third\n1\n"


def test_a_folded_methods_docstring_is_indented_with_its_code(tmp_path):
    method = ('#| export toy\n' + ADD + '@add_to_class(Toy)\ndef doc(self):\n'
              '    """First line,\n    second line."""\n    return 1')
    root = make_book(tmp_path, {"a.ipynb": [TOY_CLASS, method]})
    text = module_text(root)
    assert '        """First line,\n        second line."""' in text
    assert run(text)["Toy"].doc.__doc__ == "First line,\n        second line."


def test_items_keep_the_book_order_across_chapters(tmp_path):
    root = make_book(tmp_path, {"a.ipynb": ["#| export toy\ndef a():\n    pass", "#| export other\nx = 1"],
                                "b.ipynb": ["#| export toy\ndef b():\n    pass\n\n\ndef c():\n    pass"],
                                "c.ipynb": ["#| export toy\ndef d():\n    pass\n\n\ndef a():\n    return 1",
                                            "#| export toy\ntry:\n    import fancy\nexcept ImportError:\n"
                                            "    fancy = None"]})
    text = module_text(root)
    assert top_level(text)[:4] == ["d", "a", "b", "c"]   # c.ipynb's new d goes before the a it redefines
    assert top_level(text)[4].startswith("try:")
    assert text.split("\n")[0] == (f"{GENERATED}a.ipynb, notebooks/b.ipynb, notebooks/c.ipynb by "
                                   "`python -m rosellm_edu.book.export`.")
    assert module_text(root, "other").startswith(f"{GENERATED}a.ipynb by ")


def test_imports_are_hoisted_deduplicated_in_pep8_groups_without_the_book_tooling(tmp_path):
    root = make_book(tmp_path, {"a.ipynb": ["#| export toy\nimport rosellm_edu\nimport pytest\nimport os\n\n\n"
                                            "def a():\n    return os.sep, pytest, rosellm_edu",
                                            "#| export toy\nfrom __future__ import annotations\nimport sys\n"
                                            "import os\nfrom rosellm_edu.book import add_to_class\n"
                                            "from rosellm_edu import book\nimport rosellm_edu.book.chapter\n\n\n"
                                            "def b() -> Undefined:\n    return sys.platform"]})
    text = module_text(root)
    assert top_level(text) == ["from __future__ import annotations", "import os", "import sys", "import pytest",
                               "import rosellm_edu", "a", "b"]
    assert "annotations\n\nimport os\nimport sys\n\nimport pytest\n\nimport rosellm_edu\n" in text
    assert "rosellm_edu.book" not in text.split("\n", 1)[1] and "import book" not in text
    assert run(text)["b"]() == sys.platform


def test_imports_the_folded_code_no_longer_uses_are_dropped_and_one_modules_names_merged(tmp_path):
    root = make_book(tmp_path, {"a.ipynb": ["#| export toy\nfrom collections import deque\nimport json\n\n\n"
                                            "def a():\n    return deque(), json"],
                                "b.ipynb": ["#| export toy\nfrom collections import OrderedDict\n\n\n"
                                            "def a():\n    return OrderedDict()"]})
    text = module_text(root)
    assert top_level(text) == ["from collections import OrderedDict", "a"]
    assert run(text)["a"]() == {}
    root = make_book(tmp_path / "merged", {"a.ipynb": ["#| export toy\nfrom os import sep\nfrom os import linesep"
                                                       "\n\n\ndef a():\n    return sep + linesep"]})
    assert top_level(module_text(root))[0] == "from os import linesep, sep"  # merged, names sorted


def test_a_cell_importing_from_its_own_module_is_not_a_self_import(tmp_path):
    root = make_book(tmp_path, {"a.ipynb": ["#| export toy\ndef helper():\n    return 2"],
                                "b.ipynb": ["#| export toy\nfrom rosellm_edu.toy import helper\n\n\n"
                                            "def a():\n    return helper()"]})
    text = module_text(root)
    assert "import" not in text.split("\n", 3)[3] and run(text)["a"]() == 2


def test_new_markers_tell_the_reader_what_changed_and_stay_out_of_the_package(tmp_path):
    root = make_book(tmp_path, {"a.ipynb": ["#| export toy\ndef a():\n    x = 1  # NEW: one\n    # NEW\n"
                                            "    y = 2  # NEW\n    return x + y  # why, not new"]})
    text = module_text(root)
    assert "NEW" not in text and "    x = 1  # one\n    y = 2\n    return x + y  # why, not new" in text


def test_docstrings_lose_new_marks_and_name_the_chapter_they_came_from(tmp_path):
    root = make_book(tmp_path, {"04_a.ipynb": ['#| export toy\ndef a():\n    """Logits (NEW: of drafts) and more (NEW). '
                                               'NEW: the rows. This chapter\'s kernel, as before this chapter."""']})
    text = module_text(root)
    assert '"""Logits (of drafts) and more. The rows. Chapter 04\'s kernel, as before chapter 04."""' in text


def test_the_generated_package_says_neither_new_nor_this_chapter():
    for path, text in export.generate().items():
        assert not re.search(r"\bNEW\b|\b[Tt]his (?:chapter|appendix)\b", text), path


def test_show_changes_diffs_a_definition_before_and_after_a_cell(tmp_path):
    root = make_book(tmp_path, {"a.ipynb": [TOY_CLASS],
                                "b.ipynb": ["#| export toy\n" + ADD + "@add_to_class(Toy)\ndef f(self):\n"
                                            "    return 'new f'", "#| export toy\ndef other():\n    pass"]})
    diff = changes.changes("b.ipynb", "Toy.f", root=root).splitlines()
    assert diff[:2] == ["--- Toy.f, as a.ipynb left it", "+++ Toy.f, as b.ipynb makes it"]
    assert [line for line in diff[3:] if line[0] in "+-"] == ['-    return "old f"', "+    return 'new f'"]
    with pytest.raises(ValueError, match="first defined in notebooks/b.ipynb, cell 3"):
        changes.changes("b.ipynb", "other", root=root)
    with pytest.raises(ValueError, match="no export cell of a.ipynb defines nothing"):
        changes.changes("a.ipynb", "nothing", root=root)


def test_a_method_added_to_a_class_no_earlier_cell_defines_is_an_error_naming_cell_and_class(tmp_path):
    method = ADD + "@add_to_class(Toy)\ndef g(self):\n    pass"
    root = make_book(tmp_path, {"a.ipynb": ["#| export other\n" + TOY_CLASS.partition("\n")[2],
                                            "#| export toy\n" + method]})
    with pytest.raises(ValueError, match=r"notebooks/a.ipynb, cell 3 adds method g to class Toy, "
                                         r"which no earlier cell of module toy defines"):
        export.generate(root)


def test_every_item_and_every_folded_method_is_preceded_by_its_notebook_and_cell(tmp_path):
    method = "#| export pkg.toy\n" + ADD + "@add_to_class(Toy)\ndef g(self):\n    pass"
    root = make_book(tmp_path, {"a.ipynb": ["print('not exported')", "#| export pkg.toy\n" +
                                            TOY_CLASS.partition("\n")[2] + "\n\nX = 1"],
                                "b.ipynb": [method]})
    text = module_text(root, "pkg.toy")
    assert line_above(text, "class Toy:") == "# notebooks/a.ipynb, cell 3"
    assert line_above(text, "X = 1") == "# notebooks/a.ipynb, cell 3"
    assert line_above(text, "    def g(self):") == "# notebooks/b.ipynb, cell 2"


def test_folded_text_that_is_not_valid_python_is_an_error_naming_the_module(tmp_path):
    root = make_book(tmp_path, {"a.ipynb": ["#| export toy\nreturn 1"]})
    with pytest.raises(ValueError, match="module toy"):
        export.generate(root)


@pytest.mark.parametrize("listed", [[], ["toy", "bar"], ["bar"]])
def test_book_toml_must_list_exactly_the_modules_a_notebook_exports(tmp_path, listed):
    root = make_book(tmp_path, {"a.ipynb": ["#| export toy\nx = 1"]}, modules={"a.ipynb": listed})
    with pytest.raises(ValueError, match="a.ipynb exports"):
        export.generate(root)


def test_export_is_deterministic_and_a_second_run_changes_nothing(tmp_path):
    root = make_book(tmp_path, {"a.ipynb": [TOY_CLASS, "#| export pkg.other\nimport os\nx = os.sep"],
                                "b.ipynb": ["#| export toy\n" + ADD + "@add_to_class(Toy)\ndef g(self):\n    pass"]})
    first = export.generate(root)
    assert export.generate(root) == first
    assert export.export(root) == ["wrote rosellm_edu/toy.py", "wrote rosellm_edu/pkg/other.py"]
    assert {p: p.read_bytes() for p in first} == {p: text.encode() for p, text in first.items()}
    assert export.export(root) == []


def test_check_reports_drift_and_orphaned_generated_files_and_export_repairs_them(tmp_path, capsys):
    root = make_book(tmp_path, {"a.ipynb": ["#| export toy\nx = 1", "#| export gone\ny = 2"]})
    export.export(root)
    make_book(root, {"a.ipynb": ["#| export toy\nx = 1"]})  # the notebook no longer exports gone
    toy, gone, handwritten = (root / "rosellm_edu" / name for name in ("toy.py", "gone.py", "handwritten.py"))
    toy.write_text(toy.read_text() + "# edited by hand\n")
    handwritten.write_text("x = 1\n")

    assert export.main(["--check"], root) == 1
    printed = capsys.readouterr().out
    assert "out of date: rosellm_edu/toy.py" in printed and "no longer exported: rosellm_edu/gone.py" in printed
    assert "handwritten" not in printed

    assert export.export(root) == ["wrote rosellm_edu/toy.py",
                                   "deleted rosellm_edu/gone.py: no notebook exports it any more"]
    assert not gone.exists() and handwritten.exists()
    assert export.main(["--check"], root) == 0



def test_cpp_cells_make_one_file_each_in_cell_order_under_a_generated_header(tmp_path):
    root = make_book(tmp_path, {"a.ipynb": ["%%cpp k.h\n#pragma once\nint a();", "#| export toy\nx = 1",
                                            "%%cpp k.cpp\n#include \"k.h\"", "%%cpp k.h\nint b();\n\n"]})
    files = export.generate(root)
    text = files[root / "rosellm_edu/kernels/csrc/k.h"]
    assert text.startswith("// Generated from notebooks/a.ipynb by `python -m rosellm_edu.book.export`.\n")
    assert text.endswith("\n\n// notebooks/a.ipynb, cell 2\n#pragma once\nint a();\n\n"
                         "// notebooks/a.ipynb, cell 5\nint b();\n")
    assert export.export(root)[-1] == "wrote rosellm_edu/kernels/csrc/k.cpp"
    make_book(root, {"a.ipynb": ["%%cpp k.h\nint a();"]})   # k.cpp is no longer written
    assert "deleted rosellm_edu/kernels/csrc/k.cpp: no notebook exports it any more" in export.export(root)


@pytest.mark.parametrize("cells, error", [(["%%cpp k.py\nx"], "cell 2: '%%cpp' takes one file name"),
                                          (["%%cpp a.h b.h\nx"], "cell 2: '%%cpp' takes one file name")])
def test_a_cpp_cell_must_name_one_cpp_file(tmp_path, cells, error):
    with pytest.raises(ValueError, match=error):
        export.generate(make_book(tmp_path, {"a.ipynb": cells}))


def test_one_notebook_writes_each_cpp_file(tmp_path):
    with pytest.raises(ValueError, match="k.h is written by a.ipynb and b.ipynb"):
        export.generate(make_book(tmp_path, {"a.ipynb": ["%%cpp k.h\nint a();"], "b.ipynb": ["%%cpp k.h\nint b();"]}))


# Chapter snapshots: the package as the chapters before a notebook left it.

SNAPSHOT_BOOK = {"a.ipynb": ["#| export toy_base\ndef version():\n    return 'a'\n\n\ndef fails():\n"
                             "    raise RuntimeError('from a')"],
                 "b.ipynb": ["#| export toy_base\ndef version():\n    return 'b'", "#| export toy_new\nx = 1"],
                 "c.ipynb": ["#| export toy_last\ny = 2"]}


def package_state() -> tuple[dict, list]:
    return {n: m for n, m in sys.modules.items() if n.startswith("rosellm_edu")}, list(sys.meta_path)


def test_module_sources_before_a_chapter_hold_only_the_earlier_chapters(tmp_path):
    root = make_book(tmp_path, SNAPSHOT_BOOK)
    before_b = chapter.module_sources("b.ipynb", root)
    assert sorted(before_b) == ["toy_base"] and "return 'a'" in before_b["toy_base"]
    final = chapter.module_sources(None, root)
    assert sorted(final) == ["toy_base", "toy_last", "toy_new"] and "return 'b'" in final["toy_base"]
    assert final == {path.stem: text for path, text in export.generate(root).items()}
    with pytest.raises(ValueError, match="z.ipynb"):
        chapter.module_sources("z.ipynb", root)


def test_package_as_of_serves_the_earlier_version_and_refuses_later_modules_then_restores(tmp_path):
    root = make_book(tmp_path, SNAPSHOT_BOOK)
    before = package_state()
    with chapter.package_as_of("b.ipynb", root) as load:
        assert load("toy_base").version() == "a"
        try:
            load("toy_base").fails()
        except RuntimeError:
            shown = traceback.format_exc()
        assert "<rosellm_edu/toy_base.py as of b.ipynb>" in shown and "raise RuntimeError('from a')" in shown
        with pytest.raises(ModuleNotFoundError, match="toy_last is built in chapter c.ipynb, later than this one"):
            load("toy_last")
        with pytest.raises(ModuleNotFoundError, match="toy_new is built in this chapter"):
            load("toy_new")
        assert load("book.fold") is sys.modules["rosellm_edu.book.fold"]  # the tooling is not re-imported
    with chapter.package_as_of("c.ipynb", root) as load:
        assert load("toy_base").version() == "b" and load("toy_new").x == 1
    assert package_state() == before


def test_publish_cell_puts_what_a_cell_defined_into_its_module(tmp_path):
    root = make_book(tmp_path, SNAPSHOT_BOOK)
    with chapter.package_as_of("b.ipynb", root) as load:
        cell = "#| export toy_new\nimport os\nx, y = 1, 2\n\n\nclass C:\n    pass"
        namespace = {"os": "not published", "x": 1, "y": 2, "C": type("C", (), {})}
        module = chapter.publish_cell(cell, namespace)
        assert module is load("toy_new") is sys.modules["rosellm_edu"].toy_new
        assert (module.x, module.y, module.C) == (1, 2, namespace["C"]) and not hasattr(module, "os")

        namespace["x"] = 3
        chapter.publish_cell("#| export toy_new\nx = 3", namespace)
        assert load("toy_new").x == 3

        def version():
            return "b"

        method = "#| export toy_base\n" + ADD + "@add_to_class(C)\ndef m(self):\n    pass\n\n\ndef version():\n" \
                                                "    return 'b'"
        base = chapter.publish_cell(method, {"version": version, "m": print})
        assert base.version() == "b" and not hasattr(base, "m")
        assert base.fails.__module__ == "rosellm_edu.toy_base"  # the rest of the earlier chapter's module is kept
        assert chapter.publish_cell("print('not exported')", {}) is None
    assert "rosellm_edu.toy_new" not in sys.modules


def test_a_redefined_class_replaces_the_old_one_wherever_a_module_imported_it(tmp_path):
    from types import ModuleType

    root = make_book(tmp_path, SNAPSHOT_BOOK)
    with chapter.package_as_of("b.ipynb", root) as load:
        old, new = type("C", (), {}), type("C", (), {})
        chapter.publish_cell("#| export toy_new\nclass C:\n    pass", {"C": old})
        user = sys.modules["rosellm_edu.toy_user"] = ModuleType("rosellm_edu.toy_user")
        user.C, user.other = old, object()
        chapter.publish_cell("#| export toy_new\nclass C:\n    pass", {"C": new})
        assert load("toy_new").C is new and user.C is new and user.other is not new


def test_open_chapter_in_ipython_serves_the_chapter_and_publishes_each_exported_cell(tmp_path):
    root = make_book(tmp_path, SNAPSHOT_BOOK)
    script = textwrap.dedent(f"""
        import sys
        from pathlib import Path

        from IPython.core.interactiveshell import InteractiveShell
        from traitlets.config import Config
        from rosellm_edu.book.chapter import ChapterFinder, open_chapter, publish_ran_cell

        config = Config()
        config.HistoryManager.hist_file = ":memory:"
        shell = InteractiveShell.instance(config=config)
        for _ in range(2):
            open_chapter("b.ipynb", root=Path({str(root)!r}))
        assert sum(isinstance(f, ChapterFinder) for f in sys.meta_path) == 1
        assert shell.events.callbacks["post_run_cell"].count(publish_ran_cell) == 1
        shell.run_cell("from rosellm_edu.toy_base import version\\nprint('before:', version())")
        shell.run_cell("#| export toy_base\\ndef version():\\n    return 'b'")
        shell.run_cell("#| export toy_new\\nx = 1")
        shell.run_cell("#| export toy_new\\nraise ValueError('a failed cell publishes nothing')\\nx = 2")
        shell.run_cell("import rosellm_edu.toy_base, rosellm_edu.toy_new\\n"
                       "print('after:', rosellm_edu.toy_base.version(), rosellm_edu.toy_new.x)")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "before: a" in done.stdout and "after: b 1" in done.stdout


def test_cpp_cells_in_ipython_write_the_exported_file_and_a_cell_run_again_replaces_its_part(tmp_path):
    root = make_book(tmp_path, {"c.ipynb": ["%%cpp k.h\nint a();", "%%cpp k.h\nint b();"]})
    script = textwrap.dedent(f"""
        import os
        from pathlib import Path

        from IPython.core.interactiveshell import InteractiveShell
        from traitlets.config import Config
        from rosellm_edu.book.chapter import open_chapter

        config = Config()
        config.HistoryManager.hist_file = ":memory:"
        shell = InteractiveShell.instance(config=config)
        open_chapter("c.ipynb", root=Path({str(root)!r}))
        for cell_id, text in [("one", "int a();"), ("two", "int b();"), ("one", "int a2();"), ("one", "int a();")]:
            shell.run_cell("%%cpp k.h\\n" + text, cell_id=cell_id)
            print("written:", repr(Path(os.environ["ROSELLM_EDU_CPP_CELLS"], "k.h").read_text()))
        print("refused:", shell.run_cell("%%cpp k.txt\\nx").error_in_exec)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    texts = [ast.literal_eval(line[9:]) for line in done.stdout.splitlines() if line.startswith("written: ")]
    exported = export.generate(root)[root / "rosellm_edu/kernels/csrc/k.h"]
    assert texts == [export.cpp_text("c.ipynb", [export.cpp_part("c.ipynb", 2, "int a();")]),
                     exported, exported.replace("cell 2\nint a();", "a cell not saved as it ran\nint a2();"), exported]
    assert "refused: '%%cpp' takes one file name" in done.stdout


def test_add_to_class_sets_the_method_plain_or_wrapped():
    class Toy:
        pass

    @add_to_class(Toy)
    def f(self):
        return "f"

    @add_to_class(Toy)
    @staticmethod
    def s():
        return "s"

    @add_to_class(Toy)
    @property
    def p(self):
        return "p"

    assert (Toy().f(), Toy.s(), Toy().p) == ("f", "s", "p")
