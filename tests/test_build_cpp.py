"""build_cpp compiles a C++ file found first among a notebook's %%cpp cells, then in the package's csrc/."""

import shutil

import pytest

from rosellm_edu.kernels import build
from rosellm_edu.kernels.build import build_cpp

pytestmark = pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler")


def test_a_cells_file_includes_the_packages_header_and_a_compiler_error_names_file_and_line(tmp_path, monkeypatch):
    monkeypatch.setenv("ROSELLM_EDU_CPP_CELLS", str(tmp_path))
    assert build.include_dirs() == [tmp_path, build.CSRC]
    (tmp_path / "lanes.cpp").write_text('#include "vectors.h"\n'   # chapter 09's header, from csrc/
                                        "int64_t lanes() { return sizeof(v16) / sizeof(float); }\n")
    assert build_cpp("rosellm_edu_test_lanes", "lanes.cpp", ["lanes"], "unused").lanes() == 16

    (tmp_path / "broken.cpp").write_text("int64_t broken() {\n  return not_declared;\n}\n")
    with pytest.warns(UserWarning, match="rosellm_edu_test_broken could not be built") as warned:
        assert build_cpp("rosellm_edu_test_broken", "broken.cpp", ["broken"], "the test expects this") is None
    assert f"{tmp_path / 'broken.cpp'}:2:" in str(warned[0].message)
