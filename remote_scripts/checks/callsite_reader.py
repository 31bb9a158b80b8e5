"""Reading a checked module's source for the callsites check (remote_scripts/checks/callsites.py):
which names it imports from the named packages, where it calls them, and what it does with declared
receivers, with the hasattr() facts of the branch each use sits in. Pure ast: nothing it reads is
imported."""

from __future__ import annotations

import ast
import dataclasses
from typing import cast

_GUARD_EXCEPTIONS = {
    "ImportError",
    "ModuleNotFoundError",
    "Exception",
    "BaseException",
    "AttributeError",
}


def _in_packages(dotted: str, packages: list[str]) -> bool:
    return any(dotted == p or dotted.startswith(p + ".") for p in packages)


# ---------------------------------------------------------------- reading a module's source
@dataclasses.dataclass
class _Scope:
    kind: str  # module | class | function
    name: str
    aliases: dict = dataclasses.field(default_factory=dict)  # name -> (dotted, module_len, guarded)
    shadowed: set = dataclasses.field(default_factory=set)


def _catches_import_errors(node: ast.Try) -> bool:
    for handler in node.handlers:
        if handler.type is None:
            return True
        types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        for t in types:
            name = (
                t.id if isinstance(t, ast.Name) else t.attr if isinstance(t, ast.Attribute) else ""
            )
            if name in _GUARD_EXCEPTIONS:
                return True
    return False


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _bound_names(target: ast.AST) -> set[str]:
    return {
        n.id for n in ast.walk(target) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
    }


def _hasattr_fact(test: ast.expr) -> tuple[str, str, bool] | None:
    """`hasattr(x, "name")` -> (x, name, True); `not hasattr(...)` -> (x, name, False)."""
    positive = True
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test, positive = test.operand, False
    if (
        isinstance(test, ast.Call)
        and isinstance(test.func, ast.Name)
        and test.func.id == "hasattr"
        and len(test.args) == 2
        and not test.keywords
        and isinstance(test.args[1], ast.Constant)
        and isinstance(test.args[1].value, str)
    ):
        try:
            return ast.unparse(test.args[0]), test.args[1].value, positive
        except Exception:
            return None
    return None


def _hasattr_facts(test: ast.expr) -> tuple[list, list]:
    """What an if-test tells each branch about hasattr(): (facts in the body, facts in the else)."""
    fact = _hasattr_fact(test)
    if fact is not None:
        return [fact], [(fact[0], fact[1], not fact[2])]
    if isinstance(test, ast.BoolOp):
        facts = [_hasattr_fact(v) for v in test.values]
        known = [f for f in facts if f is not None]
        # all conjuncts hold in the body; nothing certain in the else
        if isinstance(test.op, ast.And):
            return known, []
        return [], [(e, n, not p) for e, n, p in known]  # or: all disjuncts fail in the else
    return [], []


class _ScopeCollector:
    """One scope's statements for ModuleReader._collect_scope: imports of the named packages become
    aliases, every other name the scope binds is shadowed; nested functions and classes are not
    entered."""

    def __init__(self, reader: ModuleReader, scope: _Scope) -> None:
        self.reader, self.scope = reader, scope
        # module-level `g = f`, resolved afterwards
        self.pending_aliases: list[tuple[str, ast.expr]] = []

    def visit(self, stmts: list[ast.stmt], guarded: bool) -> None:
        for stmt in stmts:
            self._statement(stmt, guarded)
            if (
                isinstance(
                    stmt,
                    (
                        ast.Assign,
                        ast.AnnAssign,
                        ast.AugAssign,
                        ast.Expr,
                        ast.Return,
                        ast.If,
                        ast.While,
                    ),
                )
                and self.scope.kind == "function"
            ):
                for node in ast.walk(stmt):
                    if isinstance(node, ast.NamedExpr):
                        self.scope.shadowed |= _bound_names(node.target)

    def _statement(self, stmt: ast.stmt, guarded: bool) -> None:
        if isinstance(stmt, ast.Import):
            self._import(stmt, guarded)
        elif isinstance(stmt, ast.ImportFrom):
            self._import_from(stmt, guarded)
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            self.scope.shadowed.add(stmt.name)
        elif isinstance(stmt, ast.Try) or type(stmt).__name__ == "TryStar":
            self._try(cast(ast.Try, stmt), guarded)  # TryStar (Python 3.11+) has Try's fields
        elif isinstance(stmt, ast.If):
            self.visit(stmt.body, guarded or _is_type_checking(stmt.test))
            self.visit(stmt.orelse, guarded)
        elif isinstance(stmt, (ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith)):
            self._block(stmt, guarded)
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            self._assign(stmt)

    def _import(self, stmt: ast.Import, guarded: bool) -> None:
        for alias in stmt.names:
            if alias.asname:
                entry = (alias.name, len(alias.name.split(".")), guarded)
                bound = alias.asname
            else:
                top = alias.name.split(".")[0]
                entry, bound = (top, 1, guarded), top
            if _in_packages(entry[0], self.reader.packages):
                self.scope.aliases[bound] = entry
            else:
                self.scope.shadowed.add(bound)

    def _import_from(self, stmt: ast.ImportFrom, guarded: bool) -> None:
        module = self.reader._absolute(stmt)
        for alias in stmt.names:
            if alias.name == "*":
                continue
            bound = alias.asname or alias.name
            if module and _in_packages(module, self.reader.packages):
                dotted = f"{module}.{alias.name}"
                self.scope.aliases[bound] = (dotted, len(module.split(".")), guarded)
                self.reader.imports.append(
                    {
                        "line": stmt.lineno,
                        "dotted": dotted,
                        "module_len": len(module.split(".")),
                        "guarded": guarded,
                    }
                )
            else:
                self.scope.shadowed.add(bound)

    def _try(self, stmt: ast.Try, guarded: bool) -> None:
        self.visit(stmt.body, guarded or _catches_import_errors(stmt))
        for h in stmt.handlers:
            if h.name:
                self.scope.shadowed.add(h.name)
            self.visit(h.body, guarded)
        self.visit(stmt.orelse, guarded)
        self.visit(stmt.finalbody, guarded)

    def _block(
        self, stmt: ast.For | ast.AsyncFor | ast.While | ast.With | ast.AsyncWith, guarded: bool
    ) -> None:
        if isinstance(stmt, (ast.For, ast.AsyncFor)):
            self.scope.shadowed |= _bound_names(stmt.target)
        if isinstance(stmt, (ast.With, ast.AsyncWith)):
            for item in stmt.items:
                if item.optional_vars is not None:
                    self.scope.shadowed |= _bound_names(item.optional_vars)
        self.visit(stmt.body, guarded)
        self.visit(getattr(stmt, "orelse", []), guarded)

    def _assign(self, stmt: ast.Assign | ast.AnnAssign | ast.AugAssign) -> None:
        if (
            isinstance(stmt, ast.Assign)
            and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name)
            and isinstance(stmt.value, (ast.Name, ast.Attribute))
            and self.scope.kind == "module"
        ):
            self.pending_aliases.append((stmt.targets[0].id, stmt.value))
            return
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        for t in targets:
            self.scope.shadowed |= _bound_names(t)


class ModuleReader(ast.NodeVisitor):
    def __init__(
        self, modname: str, is_package: bool, packages: list[str], receivers: list[dict]
    ) -> None:
        self.modname = modname
        self.package = modname if is_package else modname.rpartition(".")[0]
        self.packages = packages
        self.receivers = receivers  # dicts with expr (canonical), scope parts, types
        self.stack: list[_Scope] = []
        self.calls: list[dict] = []  # calls of imported package callables
        self.imports: list[dict] = []  # from-imports of package names (must resolve)
        self.receiver_events: list[dict] = []
        self.assigned: set[str] = set()  # attribute names stored on anything in this module
        self.hasattr_guards: set[tuple[str, str]] = set()
        # (expr, name, hasattr result) on this branch
        self.branch_facts: list[tuple[str, str, bool]] = []
        self._handled: set[int] = set()

    # -------------------------------------------------- imports and aliases of one scope
    def _absolute(self, node: ast.ImportFrom) -> str | None:
        if not node.level:
            return node.module
        base = self.package.split(".") if self.package else []
        if node.level - 1 > len(base):
            return None
        base = base[: len(base) - (node.level - 1)]
        return ".".join(base + ([node.module] if node.module else []))

    def _collect_scope(
        self, scope: _Scope, body: list[ast.stmt], args: ast.arguments | None = None
    ) -> None:
        """Imports, aliases and (in functions) locally bound names of one scope, without descending
        into nested functions or classes."""
        if args is not None:
            for a in args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg]:
                if a is not None:
                    scope.shadowed.add(a.arg)
        collector = _ScopeCollector(self, scope)
        collector.visit(body, False)
        pending_aliases = collector.pending_aliases
        # module-level aliases (g = f, C = m.Cls), resolved against this scope's imports; twice for
        # chains
        for _ in range(2):
            for name, value in pending_aliases:
                target = self._dotted_from(value, [scope])
                if target is not None:
                    scope.aliases[name] = target
        for name, _value in pending_aliases:
            if name not in scope.aliases:
                scope.shadowed.add(name)
        if scope.kind == "function":
            scope.shadowed -= set(scope.aliases)

    # -------------------------------------------------- name resolution
    def _lookup(self, name: str, stack: list[_Scope]) -> tuple | None:
        for i in range(len(stack) - 1, -1, -1):
            scope = stack[i]
            if scope.kind == "class" and i != len(stack) - 1:
                continue
            if name in scope.aliases:
                return scope.aliases[name]
            if name in scope.shadowed:
                return None
        return None

    def _dotted_from(self, node: ast.expr, stack: list[_Scope] | None = None) -> tuple | None:
        attrs: list[str] = []
        while isinstance(node, ast.Attribute):
            attrs.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        found = self._lookup(node.id, self.stack if stack is None else stack)
        if found is None:
            return None
        dotted, module_len, guarded = found
        return (".".join([dotted] + attrs[::-1]), module_len, guarded)

    def _scope_names(self) -> list[str]:
        return [s.name for s in self.stack if s.kind != "module"]

    def _receivers_for(self, node: ast.expr) -> list[dict]:
        try:
            text = ast.unparse(node)
        except Exception:
            return []
        if not any(r["expr"] == text for r in self.receivers):
            return []
        names = self._scope_names()
        out = []
        for r in self.receivers:
            if r["expr"] != text:
                continue
            parts = r["scope"]
            if not parts or any(
                names[i : i + len(parts)] == parts for i in range(len(names) - len(parts) + 1)
            ):
                out.append(r)
        return out

    # -------------------------------------------------- visiting
    def visit_Module(self, node: ast.Module) -> None:
        scope = _Scope("module", self.modname)
        self.stack.append(scope)
        self._collect_scope(scope, node.body)
        self.generic_visit(node)
        self.stack.pop()

    def _visit_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        for d in getattr(node, "decorator_list", []):
            self.visit(d)
        for default in node.args.defaults + [d for d in node.args.kw_defaults if d is not None]:
            self.visit(default)
        scope = _Scope("function", getattr(node, "name", "<lambda>"))
        body: list[ast.stmt] = node.body if isinstance(node.body, list) else [ast.Expr(node.body)]
        self._collect_scope(scope, body, node.args)
        self.stack.append(scope)
        for stmt in body:
            self.visit(stmt)
        self.stack.pop()

    visit_FunctionDef = _visit_function
    visit_AsyncFunctionDef = _visit_function
    visit_Lambda = _visit_function

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for expr in node.decorator_list + node.bases + [k.value for k in node.keywords]:
            self.visit(expr)
        scope = _Scope("class", node.name)
        self._collect_scope(scope, node.body)
        self.stack.append(scope)
        for stmt in node.body:
            self.visit(stmt)
        self.stack.pop()

    def _visit_branches(self, node: ast.If | ast.IfExp) -> None:
        self.visit(node.test)
        body_facts, else_facts = _hasattr_facts(node.test)
        for branch, facts in ((node.body, body_facts), (node.orelse, else_facts)):
            self.branch_facts.extend(facts)
            for child in branch if isinstance(branch, list) else [branch]:
                self.visit(child)
            del self.branch_facts[len(self.branch_facts) - len(facts) :]

    visit_If = _visit_branches
    visit_IfExp = _visit_branches

    def visit_Call(self, node: ast.Call) -> None:
        call = _call_shape(node)
        func = node.func
        guard = _hasattr_guard(node)
        if guard is not None:
            self.hasattr_guards.add(guard)
        target = self._dotted_from(func) if isinstance(func, (ast.Name, ast.Attribute)) else None
        if target is not None and _in_packages(target[0], self.packages):
            self.calls.append(
                {**call, "dotted": target[0], "module_len": target[1], "guarded": target[2]}
            )
        elif isinstance(func, ast.Attribute):
            for r in self._receivers_for(func.value):
                self.receiver_events.append(
                    {
                        **call,
                        "receiver": r,
                        "attr": func.attr,
                        "kind": "call",
                        "facts": list(self.branch_facts),
                    }
                )
                self._handled.add(id(func))
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if isinstance(node.ctx, (ast.Store, ast.Del)):
            self.assigned.add(node.attr)
        elif id(node) not in self._handled:
            for r in self._receivers_for(node.value):
                self.receiver_events.append(
                    {
                        "line": node.lineno,
                        "receiver": r,
                        "attr": node.attr,
                        "kind": "load",
                        "facts": list(self.branch_facts),
                    }
                )
        self.generic_visit(node)


def _call_shape(node: ast.Call) -> dict:
    """How a call passes its arguments: positional count, keywords, and whether it unpacks."""
    return {
        "line": node.lineno,
        "n_pos": sum(1 for a in node.args if not isinstance(a, ast.Starred)),
        "star": any(isinstance(a, ast.Starred) for a in node.args),
        "keywords": [k.arg for k in node.keywords if k.arg is not None],
        "dstar": any(k.arg is None for k in node.keywords),
    }


def _hasattr_guard(node: ast.Call) -> tuple[str, str] | None:
    """(object's source, name) of a `hasattr(obj, "name")` call; None for any other call."""
    func = node.func
    if not (isinstance(func, ast.Name) and func.id == "hasattr" and len(node.args) == 2):
        return None
    name = node.args[1]
    if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
        return None
    try:
        return ast.unparse(node.args[0]), name.value
    except Exception:
        return None
