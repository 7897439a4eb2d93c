"""The package's import graph, read from the source (imports inside functions included): no cycle, few imports
inside functions (each saying why on its line), and core/ importing nothing above it."""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, NamedTuple, Set

PACKAGE = "fairseq_headprune"
ROOT = Path(__file__).resolve().parent.parent
MAX_LOCAL_IMPORTS = 20
CORE_MAY_IMPORT = ("fairseq_headprune.core", "fairseq_headprune.errors")
# the package's floors, lowest first (docs/development.md's layout): a module imports from its own floor or below
FLOORS = (("errors",), ("options", "stats"), ("core",), ("tasks", "models", "criterions"), ("records",),
          ("fairseq_io",), ("plots",), ("decoding",), ("engines",), ("analysis",), ("prune",), ("studies", "compress"),
          ("report",), ("cli",))


class Import(NamedTuple):
    module: str  # the importing module
    target: str  # the package module it imports
    line: int
    local: bool  # inside a function
    text: str  # the source line


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules() -> Dict[str, Path]:
    return {module_name(p): p for p in sorted((ROOT / PACKAGE).rglob("*.py"))}


def _targets(node, module: str, is_package: bool, modules: Dict[str, Path]) -> List[str]:
    """The package modules an import statement loads: `from a.b import c` names a.b.c when c is a module."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        if node.level:
            base = module.split(".") if is_package else module.split(".")[:-1]
            base = base[:len(base) - node.level + 1]
            prefix = ".".join(base + ([node.module] if node.module else []))
        else:
            prefix = node.module or ""
        names = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in modules else prefix for a in node.names]
    out = []
    for name in names:
        while name not in modules and "." in name:  # `import a.b.c.func`-like forms: the module that holds it
            name = name.rsplit(".", 1)[0]
        if name in modules and name != module:
            out.append(name)
    return out


def module_imports(module: str, source: str, is_package: bool, modules) -> List[Import]:
    """The package modules one module's source imports, at any depth of its syntax tree."""
    lines = source.splitlines()
    found: List[Import] = []

    def walk(node, in_function: bool):
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for target in dict.fromkeys(_targets(child, module, is_package, modules)):
                    found.append(Import(module, target, child.lineno, in_function, lines[child.lineno - 1]))
            walk(child, inside)

    walk(ast.parse(source), False)
    return found


def imports() -> List[Import]:
    """Every import of a package module by a package module."""
    modules = package_modules()
    return [i for module, path in modules.items()
            for i in module_imports(module, path.read_text(), path.name == "__init__.py", modules)]


def cycles(edges: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def graph(found: List[Import]) -> Dict[str, Set[str]]:
    edges: Dict[str, Set[str]] = {}
    for i in found:
        edges.setdefault(i.module, set()).add(i.target)
    return edges


def test_the_reader_sees_every_kind_of_import():
    """The graph holds the forms the package uses: absolute, `from package import module`, relative, inside
    functions and methods; and the cycle finder finds a cycle."""
    edges = graph(imports())
    assert "fairseq_headprune.core.heads" in edges["fairseq_headprune.core.surgery"]
    assert "fairseq_headprune.criterions.head_importance" in edges["fairseq_headprune"]  # from package import module
    source = ("from fairseq_headprune.core import heads\n"
              "class A:\n    def f(self):\n        from .shape import kept_count  # why\n"
              "def g():\n    import fairseq_headprune.errors\n    from fairseq_headprune.records import log, rows\n")
    found = module_imports("fairseq_headprune.core.surgery", source, False, package_modules())
    assert [(i.target, i.line, i.local) for i in found] == [
        ("fairseq_headprune.core.heads", 1, False), ("fairseq_headprune.core.shape", 4, True),
        ("fairseq_headprune.errors", 6, True), ("fairseq_headprune.records.log", 7, True),
        ("fairseq_headprune.records.rows", 7, True)]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_among_the_modules():
    """Counted with the imports inside functions: an import hidden in a function to dodge a cycle is a cycle."""
    found = cycles(graph(imports()))
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_few_imports_inside_functions_each_with_its_reason():
    """An import inside a function is for an optional heavy dependency, said on its line; never for a cycle."""
    local = [i for i in imports() if i.local]
    listing = "\n".join(f"  {i.module}:{i.line}: {i.text.strip()}" for i in local)
    assert len({(i.module, i.line) for i in local}) <= MAX_LOCAL_IMPORTS, f"too many imports in functions:\n{listing}"
    unexplained = [i for i in local if "#" not in i.text]
    assert not unexplained, "imports in functions without their reason on the line:\n" + "\n".join(
        f"  {i.module}:{i.line}: {i.text.strip()}" for i in unexplained)


def floor_of(module: str) -> int:
    """The floor of a package module (its subpackage or top-level module); the package's __init__ is above all."""
    parts = module.split(".")
    if len(parts) == 1:
        return len(FLOORS)
    return next(i for i, names in enumerate(FLOORS) if parts[1] in names)


def test_every_import_points_down_the_floors():
    """No module imports from a floor above its own, inside a function or not (the layout docs/development.md
    draws); studies and compress share a floor."""
    up = [i for i in imports() if floor_of(i.target) > floor_of(i.module)]
    assert not up, "imports from a higher floor: " + ", ".join(f"{i.module}:{i.line} -> {i.target}" for i in up)


def test_core_imports_nothing_above_it():
    """core/ is tensors and fairseq modules: it reads no files and knows no study, stage or command."""
    above = [i for i in imports() if i.module.startswith("fairseq_headprune.core.")
             and not i.target.startswith(CORE_MAY_IMPORT)]
    assert not above, "core imports from above it: " + ", ".join(f"{i.module}:{i.line} -> {i.target}" for i in above)


def top_level_functions() -> Dict[str, List[str]]:
    """{function or class name: the modules that define it at their top level}."""
    defined: Dict[str, List[str]] = {}
    for module, path in package_modules().items():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.setdefault(node.name, []).append(module)
    return defined


def test_names_that_meant_two_things_mean_one():
    """Functions that once shared a name while doing different things (the type list in the order given and the
    type set in the model's; the speed/BLEU frontier and the shapes' Fisher frontier; the keep-one rows) and the
    shape of a model: each name is defined once."""
    defined = top_level_functions()
    for name in ("parse_type_list", "parse_type_set", "pareto_frontier", "fisher_frontier", "best_per_layer",
                 "ModelShape", "Shape", "select_linear", "remove_units", "remove_layers", "crude_model"):
        assert len(defined.get(name, [])) == 1, f"{name} is defined in {defined.get(name)}"
    assert "parse_types" not in defined


ORCHESTRATOR = ROOT / PACKAGE / "compress" / "pipeline.py"
MAX_ORCHESTRATOR_LINES, MAX_FUNCTION_LINES = 500, 60


def long_functions(folder: Path, limit: int) -> List[str]:
    """Every function (methods and nested ones included) of the modules under `folder` longer than `limit` lines,
    as path:line name (lines), measured from its `def` to its last line."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > limit:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({length} lines)")
    return found


def test_compress_reads_as_its_stages():
    """The orchestrator stays thin (the stages are modules of compress/stages/)."""
    lines = len(ORCHESTRATOR.read_text().splitlines())
    assert lines < MAX_ORCHESTRATOR_LINES, f"{ORCHESTRATOR.relative_to(ROOT)} has {lines} lines"


def stage_modules() -> Set[str]:
    """The modules of compress/stages/ that declare a stage (`STAGE = Stage(...)`)."""
    return {module for module, path in package_modules().items()
            if module.startswith(f"{PACKAGE}.compress.stages.") and "\nSTAGE = Stage(" in path.read_text()}


def test_no_stage_reads_another_stages_internals():
    """A stage reads the typed results of the stages before it (compress.stages.results), never another stage's
    module: what two stages share lives in a module of its own (shrink_recipe, recovery, points, heldout, common)."""
    stages = stage_modules()
    assert len(stages) == 7, sorted(stages)
    crossing = [f"{i.module}:{i.line} -> {i.target}" for i in imports() if i.module in stages and i.target in stages]
    assert not crossing, "a stage importing another: " + ", ".join(crossing)


def test_no_function_longer_than_a_screen():
    """No function of the package (methods and nested ones included) is longer than a screen."""
    long = long_functions(ROOT / PACKAGE, MAX_FUNCTION_LINES)
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n  " + "\n  ".join(long)


MAX_MODULE_LINES = 700


def test_the_pipeline_and_the_studies_stand_apart():
    """studies/ and compress/ share a floor but neither imports the other: both call the pruning library (prune/),
    which imports neither."""
    def sub(module):
        return (module.split(".") + [""])[1]
    crossing = [i for i in imports() if {sub(i.module), sub(i.target)} == {"studies", "compress"}]
    assert not crossing, "studies <-> compress: " + ", ".join(f"{i.module}:{i.line} -> {i.target}" for i in crossing)


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_uses(module: str, source: str, modules) -> List[str]:
    """The private names one module takes from another: `from package.module import _name`, and `alias._name`
    where alias is a package module it imported."""
    tree = ast.parse(source)
    found, aliases = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE):
            found += [f"{module}:{node.lineno} {node.module}.{a.name}" for a in node.names if is_private(a.name)]
            aliases |= {a.asname or a.name for a in node.names if f"{node.module}.{a.name}" in modules}
        elif isinstance(node, ast.Import):
            aliases |= {a.asname for a in node.names if a.asname and a.name in modules}
    found += [f"{module}:{node.lineno} {node.value.id}.{node.attr}" for node in ast.walk(tree)
              if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
              and is_private(node.attr)]
    return found


def private_imports() -> List[str]:
    """Every private name a package module takes from another."""
    modules = package_modules()
    return [use for module, path in modules.items() for use in private_uses(module, path.read_text(), modules)]


def test_the_private_name_reader_sees_both_forms():
    source = "from fairseq_headprune.core import heads\nfrom fairseq_headprune.core.heads import _x\nheads._y(1)\n"
    assert private_uses("m", source, package_modules()) == ["m:2 fairseq_headprune.core.heads._x", "m:3 heads._y"]


def test_no_private_name_crosses_a_module():
    """A name that starts with `_` is its module's own: another module that needs it needs it public."""
    found = private_imports()
    assert not found, "private names imported across modules:\n  " + "\n  ".join(found)


def test_no_module_longer_than_a_concept():
    """One module per concept: none over MAX_MODULE_LINES lines."""
    long = [f"{path.relative_to(ROOT)} ({n})" for path in sorted((ROOT / PACKAGE).rglob("*.py"))
            if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES]
    assert not long, f"modules over {MAX_MODULE_LINES} lines: " + ", ".join(long)
