"""The package layout: layers import only downwards, no import cycle, lazy imports say why; the suite's
layout, and its `needs_data` rule (tests/conftest.py)."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

pytest_plugins = ["pytester"]

SRC = Path(__file__).resolve().parents[1] / "src" / "c2c"


def test_import_linter_contract_is_kept():
    exe = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    proc = subprocess.run([exe], capture_output=True, text=True, cwd=SRC.parents[1], timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "4 kept, 0 broken" in proc.stdout


@pytest.mark.parametrize("engine", ["transformers", "llama_cpp", "vllm"])
def test_one_contract_per_engine_names_its_one_importer_and_no_contract_ignores_an_import(engine):
    """One protected contract per engine: only its one package (c2c.runtime.<engine>, and c2c.vllm for vLLM's
    plug-in, which sits above the core) may import it; no contract of c2c needs an ignore_imports."""
    import tomllib

    config = tomllib.loads((SRC.parents[1] / "pyproject.toml").read_text())["tool"]["importlinter"]
    assert config["include_external_packages"] is True  # else an external engine is not in the graph
    [contract] = [c for c in config["contracts"] if c["type"] == "protected" and engine in c["protected_modules"]]
    home = "c2c.vllm" if engine == "vllm" else f"c2c.runtime.{engine}"  # vLLM's plug-in sits above the core
    assert contract["allowed_importers"] == [home]
    assert not any("ignore_imports" in c for c in config["contracts"])


def test_the_layers_contract_ignores_no_import():
    """No import runs up the layer stack, not even by exception: vLLM's plug-in (c2c.vllm) sits on top."""
    import tomllib

    config = tomllib.loads((SRC.parents[1] / "pyproject.toml").read_text())["tool"]["importlinter"]
    [layers] = [c for c in config["contracts"] if c["type"] == "layers"]
    assert "ignore_imports" not in layers
    assert any("c2c.vllm" in line.split(" | ") for line in layers["layers"][:2])


def _cycles(adj: dict[str, list[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in adj:
        if root in index:
            continue
        work = [(root, iter(adj[root]))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(adj[w])))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_no_import_cycle_anywhere_in_the_package():
    g = grimp.build_graph("c2c")
    adj = {m: sorted(g.find_modules_directly_imported_by(m)) for m in g.modules}
    assert len(adj) > 60
    assert _cycles(adj) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": ["b"], "b": ["c"], "c": ["a"], "d": []}) == [["a", "b", "c"]]


def test_in_function_imports_outside_the_cli_say_why():
    """An import inside a function is kept only for lazy loading, marked ``# lazy: reason``.

    (The CLI imports its commands' dependencies inside each command, so that
    ``c2c --help`` stays fast; see c2c.cli.main.)"""
    unmarked = []
    for path in sorted(SRC.rglob("*.py")):
        if "cli" in path.relative_to(SRC).parts:
            continue
        lines = path.read_text().split("\n")
        for node in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for sub in ast.walk(node):
                    if isinstance(sub, (ast.Import, ast.ImportFrom)) and "# lazy:" not in lines[sub.lineno - 1]:
                        unmarked.append(f"{path.relative_to(SRC)}:{sub.lineno}: {lines[sub.lineno - 1].strip()}")
    assert unmarked == []


def test_no_flat_modules_beyond_the_base_layer():
    """Every concept is a package; only the base layer sits at the top of c2c/."""
    flat = sorted(p.stem for p in SRC.glob("*.py"))
    assert flat == ["__init__", "_io", "canon", "config", "context", "errors"]


@pytest.mark.parametrize("engine, home", [("transformers", "runtime/transformers/"),
                                          ("tokenizers", "runtime/transformers/"),
                                          ("peft", "runtime/transformers/lora.py"),
                                          ("llama_cpp", "runtime/llama_cpp.py"),
                                          ("vllm", "vllm/connector.py")])
def test_exactly_one_module_or_package_touches_each_engine(engine, home):
    """transformers (its tokenizers, PEFT) only in c2c.runtime.transformers, llama.cpp only in c2c.runtime.llama_cpp.

    The same rule as the import-linter contracts, read from the source (lazy imports included)."""
    users = set()
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            if any(n == engine or n.startswith(engine + ".") for n in names):
                users.add(str(path.relative_to(SRC)))
    assert users and all(u == home or (home.endswith("/") and u.startswith(home)) for u in users), users


def test_one_public_function_is_called_decide():
    """c2c.decide is the handoff's one decision; the domain rule it applies has a name of its own."""
    found = [str(p.relative_to(SRC)) for p in sorted(SRC.rglob("*.py"))
             for node in ast.parse(p.read_text()).body if isinstance(node, ast.FunctionDef) and node.name == "decide"]
    assert found == ["handoff/decide.py"]
    import c2c.trust

    assert not hasattr(c2c.trust, "decide") and c2c.trust.domain_rule("lab", "ops").transport == "text"


#: the jobs a package may name a module after, whatever package it is (its package says whose job it is):
#: a store backend's ``backend``, a package's own ``config``, ``chunks`` and ``schema``
ROLES = {"backend.py", "config.py", "chunks.py", "schema.py"}


def test_no_two_modules_share_a_name_but_the_cli_commands_and_the_roles_of_a_package():
    """A module's name says what it holds. A name repeats only where it is a job every such package has, named
    once in :data:`ROLES` (``store/redis/config.py`` and ``serve/config.py``: whose config is the package's
    name), or for cli/<group>.py, named after what it drives (``c2c keys`` is cli/keys.py, over trust/keys.py)."""
    by_name: dict[str, list[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        if path.name != "__init__.py":
            by_name.setdefault(path.name, []).append(str(path.relative_to(SRC)))
    shared = {name: paths for name, paths in by_name.items() if len(paths) > 1 and name not in ROLES}
    outside_cli = {name: [p for p in paths if not p.startswith("cli/")] for name, paths in shared.items()}
    assert all(len(paths) == 1 for paths in outside_cli.values()), shared
    assert set(shared) <= {"keys.py", "verify.py"}, shared


def test_no_module_is_over_600_lines():
    """A module that grows past this is doing two jobs: split it by job (line counts are the symptom)."""
    long = {str(p.relative_to(SRC)): n for p in sorted(SRC.rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > 600}
    assert long == {}


def test_the_architecture_page_shows_the_contracts_layers_and_names_real_modules():
    """docs/ARCHITECTURE.md's layer diagram is the import-linter contract's, and every module path it
    names in backticks exists."""
    import re
    import tomllib

    root = SRC.parents[1]
    page = (root / "docs" / "ARCHITECTURE.md").read_text()
    contract = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"][0]
    drawn = page.split("<!-- layers:")[1].split("```")[1].strip().splitlines()
    assert drawn == contract["layers"]
    named = set(re.findall(r"`((?:[a-z_]+/)+[a-z_]+(?:\.py)?/?)`", page))
    missing = [p for p in sorted(named) if not (SRC / p).exists() and not (root / p).exists()]
    assert named and missing == [], missing


# ------------------------------------------------------------ dotted names in docs and docstrings
_DOTTED = None


def _dotted_refs() -> list[tuple[str, str]]:
    """(where, name) of every dotted ``c2c.*`` name in the docs, the README, and the package's docstrings and
    comments; a name counts when its first part after ``c2c.`` is a module of c2c or a name c2c exports (so a
    reply field written ``c2c.attach`` is not one)."""
    import io
    import re
    import tokenize

    global _DOTTED
    if _DOTTED is not None:
        return _DOTTED
    pattern = re.compile(r"(?<![\w\"'/-])c2c(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
    root = SRC.parents[1]
    top = {p.stem for p in SRC.glob("*.py")} | {p.name for p in SRC.iterdir() if (p / "__init__.py").exists()}
    top |= set(_defined(SRC / "__init__.py"))
    texts: list[tuple[str, str]] = [(str(p.relative_to(root)), p.read_text())
                                    for p in [root / "README.md", *sorted((root / "docs").glob("*.md"))]]
    for path in sorted(SRC.rglob("*.py")):
        source = path.read_text()
        parts = [ast.get_docstring(n, clean=False) or "" for n in ast.walk(ast.parse(source))
                 if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
        parts += [t.string for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.COMMENT]
        texts.append((str(path.relative_to(root)), "\n".join(parts)))
    _DOTTED = [(where, m.group(0).rstrip(".")) for where, text in texts for m in pattern.finditer(text)
               if m.group(0).split(".")[1] in top]
    return _DOTTED


def _defined(path: Path) -> dict[str, set[str] | None]:
    """Top-level names of a module (a class: its attributes, methods and nested classes)."""
    names: dict[str, set[str] | None] = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update({(a.asname or a.name).split(".")[0]: None for a in node.names})
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names[node.name] = None
        elif isinstance(node, ast.ClassDef):
            attrs = set()
            for n in node.body:
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    attrs.add(n.name)
                elif isinstance(n, (ast.Assign, ast.AnnAssign)):
                    for t in (n.targets if isinstance(n, ast.Assign) else [n.target]):
                        attrs |= {x.id for x in ast.walk(t) if isinstance(x, ast.Name)}
            names[node.name] = attrs
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                names.update({x.id: None for x in ast.walk(t) if isinstance(x, ast.Name)})
    return names


def _resolves(name: str) -> bool:
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        base = SRC.parent.joinpath(*parts[:i])
        module = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if module.is_file():
            rest = parts[i:]
            if not rest:
                return True
            names = _defined(module)
            if rest[0] not in names:
                return False
            attrs = names[rest[0]]
            return len(rest) == 1 or attrs is None or rest[1] in attrs
    return False


def test_every_dotted_c2c_name_in_docs_and_docstrings_resolves():
    """A renamed module, class or function fails here instead of misleading a reader (docs/ARCHITECTURE.md,
    the README, and every docstring and comment of the package)."""
    refs = _dotted_refs()
    assert any(where == "docs/ARCHITECTURE.md" for where, _ in refs)  # the page is read
    broken = sorted({(where, name) for where, name in refs if not _resolves(name)})
    assert broken == [], broken


def test_tests_mirror_the_package():
    """``tests/`` follows ``src/c2c/`` package by package: each folder of tests is named for a package of c2c
    (``benchmarks``: the scripts of ``benchmarks/``; ``docs``: the README and ``docs/``), and only tests of the package as a whole sit at the top."""
    tests = SRC.parents[1] / "tests"
    packages = {p.name for p in SRC.iterdir() if (p / "__init__.py").exists()}
    folders = {p.name for p in tests.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders - packages == {"benchmarks", "docs"}, folders - packages
    assert {p.name for p in tests.glob("test_*.py")} == {"test_io.py", "test_layout.py", "test_public_api.py"}


# ------------------------------------------------- the needs_data rule: no data, a skip naming C2C_DATA; under CI a failure
MARKED = """
import pytest

@pytest.mark.needs_data
def test_reads_the_data():
    pass

def test_needs_nothing():
    pass
"""


@pytest.fixture
def data_session(pytester, monkeypatch):
    """``data_session(data)`` -> the result of a tiny pytest run, with this suite's conftest and ``C2C_DATA=data``,
    of one ``needs_data`` test and one unmarked."""
    pytester.makeconftest((SRC.parents[1] / "tests" / "conftest.py").read_text())
    pytester.makeini("[pytest]\nmarkers =\n    needs_data: reads the shared data\n")
    pytester.makepyfile(test_marked=MARKED)

    def run(data: Path):
        monkeypatch.setenv("C2C_DATA", str(data))
        return pytester.runpytest("-rs", "-p", "no:cacheprovider")

    return run


def test_a_needs_data_test_skips_naming_c2c_data_where_the_data_is_absent(data_session, monkeypatch, tmp_path):
    monkeypatch.delenv("CI", raising=False)
    result = data_session(tmp_path / "missing")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines([f"SKIPPED * needs the shared benchmark data: set C2C_DATA to its folder*"
                                 f"{tmp_path / 'missing'} is absent"])


def test_under_ci_a_needs_data_test_fails_where_the_data_is_absent(data_session, monkeypatch, tmp_path):
    monkeypatch.setenv("CI", "true")
    result = data_session(tmp_path / "missing")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*set C2C_DATA to its folder*CI=true requires it*"])


@pytest.mark.parametrize("ci", ["true", ""])
def test_a_needs_data_test_runs_where_the_data_is(data_session, monkeypatch, tmp_path, ci):
    monkeypatch.setenv("CI", ci)
    (tmp_path / "data").mkdir()
    data_session(tmp_path / "data").assert_outcomes(passed=2)
