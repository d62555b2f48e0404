"""The distribution's name (issue 42): ``fastsim`` on PyPI is another project
(NREL's vehicle simulator), so this one is ``fastsim-llm``; the import name stays ``fastsim``."""

import re
import tomllib
from pathlib import Path

from fastsim._cli import DISTRIBUTION

ROOT = Path(__file__).resolve().parents[1]
#: A pip command that would install PyPI's `fastsim` (with or without extras).
WRONG = re.compile(r"""pip install\s+(-U\s+|--upgrade\s+)?["']?fastsim(\[[^\]]*\])?["']?(\s|$|`)""")


def test_distribution_name():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["name"] == DISTRIBUTION == "fastsim-llm"
    assert meta["scripts"]["fastsim"] == "fastsim._cli:main"


def test_install_hints_name_the_distribution():
    files = [p for pattern in ("*.py", "*.md", "*.toml", "*.cfg", "*.txt")
             for p in ROOT.rglob(pattern) if ".git" not in p.parts and ".venv" not in p.parts]
    wrong = []
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        if rel == "tests/test_packaging.py":
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if WRONG.search(line):
                wrong.append(f"{rel}:{n}: {line.strip()}")
    assert not wrong, "install hints must name fastsim-llm:\n" + "\n".join(wrong)
    assert WRONG.search("pip install 'fastsim[gpu]'") and WRONG.search('pip install "fastsim[dask]"')
    assert not WRONG.search("pip install 'fastsim-llm[gpu]'") and not WRONG.search("pip install -e .")
