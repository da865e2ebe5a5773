"""docs/architecture.md lists every module of the package, one line each, and none that is gone.
Run: pytest -q tests/unit/test_architecture_doc.py"""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "recsync"
DOC = ROOT / "docs" / "architecture.md"


def _listed() -> set[str]:
    """The modules of the doc's listing (the code block that starts with ``recsync/``): a
    package's line at the left edge (``run/``), then each of its modules indented, with what it
    is on the same line."""
    block = re.search(r"```\n(recsync/ .*?)```", DOC.read_text(), re.S)
    assert block, "docs/architecture.md has no listing that starts with recsync/"
    listed, package = set(), None
    for line in block.group(1).splitlines():
        if m := re.match(r"(\S+/) ", line):
            package = "" if m.group(1) == "recsync/" else m.group(1)
        elif m := re.match(r"  (\S+\.py) +\S", line):
            listed.add(package + m.group(1))
    return listed


def _docstring_only(path: Path) -> bool:
    return all(isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
               for node in ast.parse(path.read_text()).body)


def _modules() -> set[str]:
    return {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")}


def test_every_module_of_the_package_has_its_line_in_architecture_md():
    """A package's line says what an ``__init__.py`` holding only a docstring is."""
    missing = sorted(m for m in _modules() - _listed()
                     if not (m.endswith("__init__.py") and _docstring_only(PACKAGE / m)))
    assert not missing, f"docs/architecture.md does not list {missing}: one line each"


def test_architecture_md_lists_no_module_that_is_gone():
    gone = sorted(_listed() - _modules())
    assert not gone, f"docs/architecture.md lists {gone}, which recsync/ does not have"
