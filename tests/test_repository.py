"""The repository explains itself: what the code cites exists, and the modules import one way.

- Every measurement file a module names (benchmarks/results/…, written on one line; a glob or a
  {a,b} brace must match at least one file) is committed.
- Every docs/design.md section a module cites ("docs/design.md §N") is a heading of that document.
- No import cycle among meshplan's modules, counting imports inside functions too (a lazy import is
  allowed for optional or heavy packages — torch, Triton, numpy — never to hide a cycle), and none from
  meshplan/topologies/ into meshplan/executor/ (cluster descriptions are data the executor measures).
"""

import ast
import re
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
SOURCES = sorted((ROOT / "meshplan").rglob("*.py"))
# A results file: a name carrying the GPU it ran on, not a path under $OUT (where a command writes).
RESULT_NAME = re.compile(
    r"(?<![\w$/.-])(?:benchmarks/results/)?([\w*{},.-]*(?:h100|h200)[\w*{},.-]*\.(?:json|toml|txt))"
)


def _expand(name: str) -> list[str]:
    """{a,b} braces expanded, as a shell would."""
    m = re.search(r"\{([^{}]*)\}", name)
    if not m:
        return [name]
    return [alt for part in m.group(1).split(",") for alt in _expand(name[: m.start()] + part + name[m.end() :])]


def _cited_results() -> list[tuple[str, int, str]]:
    out = []
    for path in SOURCES:
        for no, line in enumerate(path.read_text().splitlines(), 1):
            for m in RESULT_NAME.finditer(line):
                if "$OUT" not in line[max(0, m.start() - 6) : m.start()]:
                    out.append((str(path.relative_to(ROOT)), no, m.group(1)))
    return out


def test_every_cited_results_file_exists():
    cited = _cited_results()
    assert len(cited) > 50  # the pattern finds the code's evidence, not nothing
    broken = [
        f"{p.relative_to(ROOT)}:{no}"
        for p in SOURCES
        for no, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(r"benchmarks/results/[\w.{},*-]*-$", line)
    ]
    assert not broken, "a results file's name broken across lines: " + ", ".join(broken)
    missing = [
        f"{where}:{no} {name}" for where, no, name in cited if not all(any(RESULTS.glob(alt)) for alt in _expand(name))
    ]
    assert not missing, "cited but not in benchmarks/results/ (write the whole name on one line):\n" + "\n".join(
        missing
    )


def test_every_cited_design_section_exists():
    design = (ROOT / "docs" / "design.md").read_text()
    sections = set(re.findall(r"^#+ (\d+)\.", design, flags=re.M))
    cites = [
        (str(p.relative_to(ROOT)), s)
        for p in SOURCES + [ROOT / "README.md"]
        for s in re.findall(r"docs/design\.md §(\d+)", p.read_text())
    ]
    assert cites, "the code cites docs/design.md"
    assert not [c for c in cites if c[1] not in sections], cites
    for path in SOURCES:  # the old shorthand, which no clone could resolve
        assert not re.search(r"(?<![/\w])DESIGN\.md", path.read_text()), path


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> nx.DiGraph:
    modules = {_module_name(p): p for p in SOURCES}
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                # `from pkg import submodule` depends on the submodule; `from mod import name` on mod.
                subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules]
                targets = subs if len(subs) == len(node.names) else subs + [base]
            for target in targets:
                if target in modules and target != name:
                    graph.add_edge(name, target)
    return graph


def test_no_import_cycles():
    graph = _import_graph()
    assert graph.number_of_edges() > 100
    cycles = list(nx.simple_cycles(graph))
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c + [c[0]]) for c in cycles)


def test_topologies_do_not_import_the_executor():
    """Clusters and their calibrated profiles are data; the runner that measures them lives under
    executor/ (meshplan.executor.calibrate_run) and imports topologies/, never the other way."""
    graph = _import_graph()
    assert graph.has_edge("meshplan.executor.calibrate_run", "meshplan.topologies.calibrate")
    back = [
        f"{a} -> {b}"
        for a, b in graph.edges
        if a.startswith("meshplan.topologies") and b.startswith("meshplan.executor")
    ]
    assert not back, back


@pytest.mark.parametrize(
    "leaf",
    ["meshplan.models", "meshplan.costmodel.shapes", "meshplan.costmodel.axes.base", "meshplan.kernels.launch"],
)
def test_leaf_modules_stay_leaves(leaf):
    """The shared shapes and types import nothing of meshplan beyond errors, models and options."""
    allowed = {
        "meshplan.errors",
        "meshplan.models",
        "meshplan.layout",
        "meshplan.costmodel.options",
        "meshplan.costmodel.stacks",
        "meshplan.costmodel.shapes",
    }
    assert set(_import_graph().successors(leaf)) <= allowed


def test_readme_setup_installs_the_cpu_build_and_ci_runs_its_test_command():
    """README's two set-up commands install torch's CPU build from PyTorch's CPU wheel index (the public
    index's torch==2.13.0 is the CUDA build on Linux), and .ci/run runs the same install and the same
    test command."""
    readme = (ROOT / "README.md").read_text()
    setup = readme.split("## Set up and run", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```bash\n(.*?)\n```", setup, flags=re.S)
    assert len(commands) == 2, commands
    install = "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
    for command in commands:
        assert command.startswith(install + " && pip install -e "), command
    assert "meshplan recommend" in commands[0] and commands[1].endswith("&& python -m pytest -q")
    ci = (ROOT / ".ci" / "run").read_text().replace("pip install -q ", "pip install ")  # quiet in CI
    assert f"python -m {install}" in ci
    assert "python -m pip install -e '.[test]'" in ci and re.search(r"^python -m pytest -q$", ci, flags=re.M)


def test_readme_names_every_option_its_set_up_command_uses():
    """The set-up command's `recommend --batch` is in the table of recommend's options; the exit status
    of "nothing fits" is documented."""
    readme = (ROOT / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| `meshplan recommend"))
    setup = re.search(r"meshplan recommend (.*)", readme).group(1)
    for flag in re.findall(r"--[\w-]+", setup.split("```")[0]):
        assert flag in row.split("|")[1], flag
    assert "## What the numbers mean" in readme and "3 `recommend` found no mesh" in readme
