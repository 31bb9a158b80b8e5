"""The generic `callsites` verify check: do the calls a module makes into other packages still bind to
the signatures installed in this venv? Stdlib only at import time; the packages being called into
(vLLM, say) are imported when the check runs, the checked modules themselves never are: their source is
read from the file `module_file_in_site` finds and parsed with `ast`.

What is checked, for each module in check["modules"]:

* Calls of callables imported from check["packages"]: `from pkg.x import f`, `from pkg.x import f as g`,
  `import pkg.x as m` then `m.f(...)`, `import pkg` then `pkg.x.f(...)`, module-level aliases such as
  `g = m.f`, relative imports, and imports inside functions. The callee is resolved by importing its
  module and walking the attributes; a class is bound against `inspect.signature(cls)` (its
  constructor; pydantic/std dataclasses expose their fields there, so a required field without default
  that the call does not pass is reported). A name bound locally in a function (a parameter, an
  assignment) shadows the module's import there.
* Every `from pkg... import name` of the named packages must resolve (the module would not load
  otherwise), even when the name is never called.
* Calls and attribute accesses on declared receivers, e.g. `self.executor` inside `VllmHiddenStatesGenerator`
  typed `vllm...MultiprocExecutor`. A receiver's `scope` names an enclosing class or function (or a
  dotted run of them, `Cls.method`); without a scope it applies everywhere. `type` is one dotted class
  path or a list (each type is checked: `self` in a patched forward may be any of several models).
  Methods are bound against the unbound function's signature minus its first parameter; staticmethods
  as they are, classmethods through the bound method.
* Each dotted path in check["attributes"] must resolve (longest importable module prefix, then getattr).

Binding uses a fake call: `sig.bind(*[object()] * n_positional, **{kw: object() for kw in keywords})`,
so the error text is Python's own TypeError text. A call site with `*args` or `**kwargs` cannot be
checked strictly: it is bound with `bind_partial` (too many explicit positionals, unknown keywords and
duplicate values are still errors; missing arguments are not, except keyword-only ones when only `*args`
is used) and listed under "partial".

Missing receiver attributes, and how false positives are avoided. Instance attributes (set in
`__init__`, or nn.Module submodules) are not visible on the class, so a name that is not found on the
type with `inspect.getattr_static`/`getattr` is reported missing only if ALL of these hold:
  - no class in the type's MRO assigns it in its source (`x.name = ...`, tuple/for/with targets,
    `setattr(x, "name", ...)`, `register_buffer/register_parameter/add_module/register_module("name")`),
    and it is not a field or class-body annotation (dataclass, pydantic, `name: T` declarations);
  - none of the checked modules assigns an attribute of that name on anything (e.g. speculators'
    `base_model._extension = self`, which makes `self._extension` in the patched forward legitimate);
  - the checked module does not guard it with `hasattr(<receiver>, "name")`.
This applies both to names called as methods (`self.get_input_embeddings(...)`) and to names only
read (`self.layers`). Assigning to or deleting an attribute of a receiver is never a failure. A called
name found only as an instance attribute (e.g. `self.norm(...)` on an nn.Module) cannot be bound and is
listed under "partial".

Version-compatibility branches: inside `if hasattr(<receiver>, "new"): ... else: ...` (also `not`,
`and`/`or` of such tests, `elif` chains and `a if hasattr(...) else b`), a branch that the installed
type can never take (the else when the class has `new`; the body when neither the class, its source nor
the checked modules give it `new`) is not checked, only listed under "partial" as not reached. So a
patch that keeps `self.get_input_embeddings(...)` as the fallback for old vLLM, behind
`hasattr(self, "embed_input_ids")`, passes on vLLM 0.16, while the unguarded pristine call fails.

Limits: no type inference beyond the declared receivers (a value returned by a vLLM call, or passed in
as a parameter, is not followed); default values and argument types are not compared, only arity and
keyword names; calls reached dynamically (getattr, collective_rpc("method_name"), callbacks) are not
seen; a class whose instances gain attributes in ways the source scan cannot see (`__dict__.update`,
`__getattr__` proxies that do not come from nn.Module) may yield a false "has no attribute" report, and
an attribute set anywhere in the checked modules or the type's MRO source is accepted even if it is set
on a different object; imports inside `try/except ImportError` or `if TYPE_CHECKING:` that fail to
resolve are listed as partial, not as failures.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import inspect
import os

from .nodeio import NodeError, module_file_in_site

_MISSING = object()
_GUARD_EXCEPTIONS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException", "AttributeError"}
_REGISTER_CALLS = {"setattr", "register_buffer", "register_parameter", "add_module", "register_module"}


class _ResolveError(Exception):
    """Text meant for the failure entry, e.g. "ModuleNotFoundError: No module named 'vllm.x'"."""


def _exc_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _in_packages(dotted: str, packages: list[str]) -> bool:
    return any(dotted == p or dotted.startswith(p + ".") for p in packages)


# ---------------------------------------------------------------- resolving dotted paths
class _Resolver:
    """Import and getattr, with one cache per check run (vLLM is imported once)."""

    def __init__(self) -> None:
        self.cache: dict[tuple[str, int], tuple[object, str | None]] = {}

    def resolve(self, dotted: str, module_len: int = 1) -> object:
        """The object at `dotted`. The first `module_len` parts are a module that must import (its
        failure is an import error); the rest is walked with getattr, importing submodules as needed
        (a missing one is the getattr AttributeError)."""
        key = (dotted, module_len)
        if key not in self.cache:
            try:
                self.cache[key] = (self._resolve(dotted, module_len), None)
            except _ResolveError as exc:
                self.cache[key] = (None, str(exc))
        obj, error = self.cache[key]
        if error is not None:
            raise _ResolveError(error)
        return obj

    @staticmethod
    def _import(name: str) -> object:
        try:
            return importlib.import_module(name)
        except (Exception, SystemExit) as exc:  # an import can raise anything
            raise _ResolveError(_exc_text(exc)) from None

    def _resolve(self, dotted: str, module_len: int) -> object:
        parts = dotted.split(".")
        module_len = max(1, min(module_len, len(parts)))
        prefix = ".".join(parts[:module_len])
        obj = self._import(prefix)
        for part in parts[module_len:]:
            try:
                obj = getattr(obj, part)
            except AttributeError as exc:
                if not inspect.ismodule(obj):
                    raise _ResolveError(_exc_text(exc)) from None
                try:
                    obj = importlib.import_module(f"{prefix}.{part}")
                except ModuleNotFoundError as mexc:
                    if mexc.name == f"{prefix}.{part}":
                        raise _ResolveError(_exc_text(exc)) from None
                    raise _ResolveError(_exc_text(mexc)) from None
                except (Exception, SystemExit) as iexc:
                    raise _ResolveError(_exc_text(iexc)) from None
            except Exception as exc:  # a lazy module __getattr__ may raise anything
                raise _ResolveError(_exc_text(exc)) from None
            prefix = f"{prefix}.{part}"
        return obj


# ---------------------------------------------------------------- binding
def _signature(obj: object) -> inspect.Signature:
    return inspect.signature(obj)


def _bind(sig: inspect.Signature, call: dict) -> tuple[str | None, str | None]:
    """(TypeError text or None, reason the binding was only partial or None)."""
    args = [object()] * call["n_pos"]
    kwargs = {k: object() for k in call["keywords"]}
    star, dstar = call["star"], call["dstar"]
    try:
        if not star and not dstar:
            sig.bind(*args, **kwargs)
            return None, None
        sig.bind_partial(*args, **kwargs)
    except TypeError as exc:
        return str(exc), None
    if star and not dstar:
        for p in sig.parameters.values():
            if p.kind is p.KEYWORD_ONLY and p.default is p.empty and p.name not in kwargs:
                return f"missing a required argument: {p.name!r}", None
    used = " and ".join(x for x, on in (("*args", star), ("**kwargs", dstar)) if on)
    return None, f"partially checked: the call site uses {used}, so missing arguments are not checked"


def _method_signature(cls: type, name: str) -> tuple[inspect.Signature | None, str | None]:
    """Signature of `instance.name(...)` as seen from the class, or (None, why not)."""
    raw = inspect.getattr_static(cls, name, _MISSING)
    try:
        obj = getattr(cls, name)
    except Exception as exc:  # noqa: BLE001 - a descriptor may raise anything on class access
        return None, f"class access raised {_exc_text(exc)}"
    if isinstance(raw, (property, functools.cached_property)):
        return None, f"{name} is a property; the call on its value is not checked"
    try:
        if isinstance(raw, staticmethod) or inspect.ismethod(obj) or inspect.isclass(raw):
            return _signature(obj), None
        if raw is not _MISSING and hasattr(type(raw), "__set__") and not inspect.isfunction(raw):
            return None, f"{name} is a data descriptor; the call on its value is not checked"
        sig = _signature(obj)
    except (TypeError, ValueError) as exc:
        return None, f"no signature: {exc}"
    descriptor = raw is _MISSING or (hasattr(type(raw), "__get__") and not inspect.isclass(raw))
    params = list(sig.parameters.values())
    if descriptor and params and params[0].kind in (inspect.Parameter.POSITIONAL_ONLY,
                                                    inspect.Parameter.POSITIONAL_OR_KEYWORD):
        sig = sig.replace(parameters=params[1:])
    return sig, None


# ---------------------------------------------------------------- what a class assigns in its source
_SOURCE_CACHE: dict[str, ast.Module | None] = {}


def _parse_file(path: str) -> ast.Module | None:
    if path not in _SOURCE_CACHE:
        try:
            with open(path, "rb") as f:
                _SOURCE_CACHE[path] = ast.parse(f.read(), filename=path)
        except (OSError, SyntaxError, ValueError):
            _SOURCE_CACHE[path] = None
    return _SOURCE_CACHE[path]


def _assigned_names(tree: ast.AST) -> set[str]:
    """Attribute names stored anywhere under `tree`, by assignment or by setattr-like calls."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.attr)
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            fname = func.id if isinstance(func, ast.Name) else \
                func.attr if isinstance(func, ast.Attribute) else ""
            if fname in _REGISTER_CALLS:
                idx = 1 if fname == "setattr" else 0
                if len(node.args) > idx and isinstance(node.args[idx], ast.Constant) and \
                        isinstance(node.args[idx].value, str):
                    names.add(node.args[idx].value)
    return names


def _class_nodes(tree: ast.Module, cls: type) -> list[ast.ClassDef]:
    qualname = cls.__qualname__
    exact: list[ast.ClassDef] = []
    by_name: list[ast.ClassDef] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                q = f"{prefix}{child.name}"
                if q == qualname:
                    exact.append(child)
                if child.name == cls.__name__:
                    by_name.append(child)
                walk(child, q + ".")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                walk(child, f"{prefix}{child.name}.<locals>.")
            else:
                walk(child, prefix)

    walk(tree, "")
    return exact or by_name


_INSTANCE_ATTRS: dict[type, set[str]] = {}


def _instance_attributes(cls: type) -> set[str]:
    """Names instances of `cls` may carry that the class object does not show."""
    if cls in _INSTANCE_ATTRS:
        return _INSTANCE_ATTRS[cls]
    names: set[str] = set()
    for klass in cls.__mro__:
        if klass is object or klass.__module__ == "builtins":
            continue
        annotations = getattr(klass, "__dict__", {}).get("__annotations__")
        if isinstance(annotations, dict):
            names.update(annotations)
        try:
            path = inspect.getsourcefile(klass)
        except Exception:  # noqa: BLE001 - builtins and C classes have none
            path = None
        tree = _parse_file(path) if path else None
        if tree is None:
            continue
        for node in _class_nodes(tree, klass):
            names.update(_assigned_names(node))
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    names.add(stmt.target.id)
    if dataclasses.is_dataclass(cls):
        names.update(f.name for f in dataclasses.fields(cls))
    for attr in ("__pydantic_fields__", "model_fields"):
        try:
            fields = inspect.getattr_static(cls, attr, None)
            if isinstance(fields, dict):
                names.update(fields)
        except Exception:  # noqa: BLE001, S112 - best effort
            continue
    _INSTANCE_ATTRS[cls] = names
    return names


def _class_has(cls: type, name: str) -> bool:
    if inspect.getattr_static(cls, name, _MISSING) is not _MISSING:
        return True
    try:
        getattr(cls, name)  # metaclass attributes and dynamic class-level lookups
        return True
    except Exception:  # noqa: BLE001
        return False


def _attr_state(cls: type, name: str, assigned_anywhere: set[str]) -> bool | None:
    """True: the class has it; False: nothing anywhere gives instances this name; None: can't tell."""
    if _class_has(cls, name):
        return True
    if name in _instance_attributes(cls) or name in assigned_anywhere:
        return None
    return False


def _dead_branch(cls: type, expr: str, facts: list, assigned_anywhere: set[str]) -> str | None:
    """Why the branch holding a receiver access is never taken for `cls`, from the hasattr() tests that
    lead to it (version-compatibility code like `if hasattr(self, "new") ... else: self.old()`)."""
    for fexpr, name, present in facts:
        if fexpr != expr:
            continue
        state = _attr_state(cls, name, assigned_anywhere)
        if state is not None and state != present:
            return f"hasattr({expr}, {name!r}) is {state}"
    return None


def _short(cls: type) -> str:
    return getattr(cls, "__name__", repr(cls))


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
            name = t.id if isinstance(t, ast.Name) else t.attr if isinstance(t, ast.Attribute) else ""
            if name in _GUARD_EXCEPTIONS:
                return True
    return False


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _bound_names(target: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _hasattr_fact(test: ast.expr) -> tuple[str, str, bool] | None:
    """`hasattr(x, "name")` -> (x, name, True); `not hasattr(...)` -> (x, name, False)."""
    positive = True
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test, positive = test.operand, False
    if isinstance(test, ast.Call) and isinstance(test.func, ast.Name) and test.func.id == "hasattr" and \
            len(test.args) == 2 and not test.keywords and isinstance(test.args[1], ast.Constant) and \
            isinstance(test.args[1].value, str):
        try:
            return ast.unparse(test.args[0]), test.args[1].value, positive
        except Exception:  # noqa: BLE001
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
        if isinstance(test.op, ast.And):  # all conjuncts hold in the body; nothing certain in the else
            return known, []
        return [], [(e, n, not p) for e, n, p in known]  # or: all disjuncts fail in the else
    return [], []


class _ModuleReader(ast.NodeVisitor):
    def __init__(self, modname: str, is_package: bool, packages: list[str], receivers: list[dict]) -> None:
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
        self.branch_facts: list[tuple[str, str, bool]] = []  # (expr, name, hasattr result) on this branch
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

    def _collect_scope(self, scope: _Scope, body: list[ast.stmt], args: ast.arguments | None = None) -> None:
        """Imports, aliases and (in functions) locally bound names of one scope, without descending into
        nested functions or classes."""
        if args is not None:
            for a in args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg]:
                if a is not None:
                    scope.shadowed.add(a.arg)
        pending_aliases: list[tuple[str, ast.expr]] = []

        def visit(stmts: list[ast.stmt], guarded: bool) -> None:
            for stmt in stmts:
                if isinstance(stmt, ast.Import):
                    for alias in stmt.names:
                        if alias.asname:
                            entry = (alias.name, len(alias.name.split(".")), guarded)
                            bound = alias.asname
                        else:
                            top = alias.name.split(".")[0]
                            entry, bound = (top, 1, guarded), top
                        if _in_packages(entry[0], self.packages):
                            scope.aliases[bound] = entry
                        else:
                            scope.shadowed.add(bound)
                elif isinstance(stmt, ast.ImportFrom):
                    module = self._absolute(stmt)
                    for alias in stmt.names:
                        if alias.name == "*":
                            continue
                        bound = alias.asname or alias.name
                        if module and _in_packages(module, self.packages):
                            dotted = f"{module}.{alias.name}"
                            scope.aliases[bound] = (dotted, len(module.split(".")), guarded)
                            self.imports.append({"line": stmt.lineno, "dotted": dotted,
                                                 "module_len": len(module.split(".")), "guarded": guarded})
                        else:
                            scope.shadowed.add(bound)
                elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    scope.shadowed.add(stmt.name)
                elif isinstance(stmt, ast.Try) or type(stmt).__name__ == "TryStar":
                    visit(stmt.body, guarded or _catches_import_errors(stmt))
                    for h in stmt.handlers:
                        if h.name:
                            scope.shadowed.add(h.name)
                        visit(h.body, guarded)
                    visit(stmt.orelse, guarded)
                    visit(stmt.finalbody, guarded)
                elif isinstance(stmt, ast.If):
                    visit(stmt.body, guarded or _is_type_checking(stmt.test))
                    visit(stmt.orelse, guarded)
                elif isinstance(stmt, (ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith)):
                    if isinstance(stmt, (ast.For, ast.AsyncFor)):
                        scope.shadowed |= _bound_names(stmt.target)
                    if isinstance(stmt, (ast.With, ast.AsyncWith)):
                        for item in stmt.items:
                            if item.optional_vars is not None:
                                scope.shadowed |= _bound_names(item.optional_vars)
                    visit(stmt.body, guarded)
                    visit(getattr(stmt, "orelse", []), guarded)
                elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and \
                        isinstance(stmt.targets[0], ast.Name) and \
                        isinstance(stmt.value, (ast.Name, ast.Attribute)) and scope.kind == "module":
                    pending_aliases.append((stmt.targets[0].id, stmt.value))
                elif isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                    for t in targets:
                        scope.shadowed |= _bound_names(t)
                if isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Expr, ast.Return, ast.If,
                                     ast.While)) and scope.kind == "function":
                    for node in ast.walk(stmt):
                        if isinstance(node, ast.NamedExpr):
                            scope.shadowed |= _bound_names(node.target)

        visit(body, False)
        # module-level aliases (g = f, C = m.Cls), resolved against this scope's imports; twice for chains
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
        except Exception:  # noqa: BLE001
            return []
        if not any(r["expr"] == text for r in self.receivers):
            return []
        names = self._scope_names()
        out = []
        for r in self.receivers:
            if r["expr"] != text:
                continue
            parts = r["scope"]
            if not parts or any(names[i:i + len(parts)] == parts for i in range(len(names) - len(parts) + 1)):
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
        body = node.body if isinstance(node.body, list) else [ast.Expr(node.body)]
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
            del self.branch_facts[len(self.branch_facts) - len(facts):]

    visit_If = _visit_branches
    visit_IfExp = _visit_branches

    def visit_Call(self, node: ast.Call) -> None:
        call = {"line": node.lineno,
                "n_pos": sum(1 for a in node.args if not isinstance(a, ast.Starred)),
                "star": any(isinstance(a, ast.Starred) for a in node.args),
                "keywords": [k.arg for k in node.keywords if k.arg is not None],
                "dstar": any(k.arg is None for k in node.keywords)}
        func = node.func
        if isinstance(func, ast.Name) and func.id == "hasattr" and len(node.args) == 2 and \
                isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
            try:
                self.hasattr_guards.add((ast.unparse(node.args[0]), node.args[1].value))
            except Exception:  # noqa: BLE001
                pass
        target = self._dotted_from(func) if isinstance(func, (ast.Name, ast.Attribute)) else None
        if target is not None and _in_packages(target[0], self.packages):
            self.calls.append({**call, "dotted": target[0], "module_len": target[1], "guarded": target[2]})
        elif isinstance(func, ast.Attribute):
            for r in self._receivers_for(func.value):
                self.receiver_events.append({**call, "receiver": r, "attr": func.attr, "kind": "call",
                                             "facts": list(self.branch_facts)})
                self._handled.add(id(func))
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if isinstance(node.ctx, (ast.Store, ast.Del)):
            self.assigned.add(node.attr)
        elif id(node) not in self._handled:
            for r in self._receivers_for(node.value):
                self.receiver_events.append({"line": node.lineno, "receiver": r, "attr": node.attr,
                                             "kind": "load", "facts": list(self.branch_facts)})
        self.generic_visit(node)


# ---------------------------------------------------------------- the check
def _canonical_receivers(check: dict) -> list[dict]:
    out = []
    for r in check.get("receivers") or []:
        expr = ast.unparse(ast.parse(r["expr"], mode="eval").body)
        types = r["type"] if isinstance(r["type"], list) else [r["type"]]
        scope = r.get("scope")
        out.append({"expr": expr, "scope": scope.split(".") if scope else [], "types": list(types)})
    return out


def check_callsites(check: dict) -> dict:
    packages = list(check.get("packages") or [])
    receivers = _canonical_receivers(check)
    resolver = _Resolver()
    failures: list[dict] = []
    partial: list[dict] = []
    calls_checked = 0
    attributes_checked = 0
    imports_checked = 0

    def fail(file: str | None, line: int | None, callee: str, error: str) -> None:
        entry = {"file": file, "line": line, "callee": callee, "error": error}
        if entry not in failures:
            failures.append(entry)

    def note(file: str | None, line: int | None, callee: str, reason: str) -> None:
        entry = {"file": file, "line": line, "callee": callee, "reason": reason}
        if entry not in partial:
            partial.append(entry)

    readers: list[tuple[str, _ModuleReader]] = []
    for modname in check.get("modules") or []:
        try:
            path = module_file_in_site(modname)
            with open(path, "rb") as f:
                tree = ast.parse(f.read(), filename=path)
        except NodeError as exc:
            fail(None, None, modname, str(exc))
            continue
        except SyntaxError as exc:
            fail(path, exc.lineno, modname, f"SyntaxError: {exc.msg}")
            continue
        except OSError as exc:
            fail(None, None, modname, _exc_text(exc))
            continue
        reader = _ModuleReader(modname, os.path.basename(path) == "__init__.py", packages, receivers)
        reader.visit(tree)
        readers.append((path, reader))
    assigned_anywhere: set[str] = set()
    bad_types: set[tuple[str, str]] = set()
    for _path, reader in readers:
        assigned_anywhere |= reader.assigned

    for path, reader in readers:
        # names imported from the packages must exist, called or not
        for imp in reader.imports:
            imports_checked += 1
            try:
                resolver.resolve(imp["dotted"], imp["module_len"])
            except _ResolveError as exc:
                if imp["guarded"]:
                    note(path, imp["line"], imp["dotted"], f"guarded import does not resolve: {exc}")
                else:
                    fail(path, imp["line"], imp["dotted"], str(exc))

        # calls of imported callables
        for call in reader.calls:
            callee = call["dotted"]
            try:
                obj = resolver.resolve(callee, call["module_len"])
            except _ResolveError as exc:
                if call["guarded"]:
                    note(path, call["line"], callee, f"guarded import does not resolve: {exc}")
                else:
                    fail(path, call["line"], callee, str(exc))
                continue
            if not callable(obj):
                fail(path, call["line"], callee, f"{type(obj).__name__!r} object is not callable")
                continue
            try:
                sig = _signature(obj)
            except (TypeError, ValueError) as exc:
                note(path, call["line"], callee, f"no signature to bind against: {exc}")
                continue
            error, why_partial = _bind(sig, call)
            calls_checked += 1
            if error:
                fail(path, call["line"], callee, error)
            elif why_partial:
                note(path, call["line"], callee, why_partial)

        # calls and attribute reads on declared receivers
        for ev in reader.receiver_events:
            r = ev["receiver"]
            for type_path in r["types"]:
                try:
                    cls = resolver.resolve(type_path)
                    if not inspect.isclass(cls):
                        raise _ResolveError(f"{type_path} is a {type(cls).__name__}, not a class")
                except _ResolveError as exc:
                    if (r["expr"], type_path) not in bad_types:  # once per receiver, at its first use
                        bad_types.add((r["expr"], type_path))
                        fail(path, ev["line"], type_path, f"type of receiver {r['expr']}: {exc}")
                    continue
                name, callee = ev["attr"], f"{type_path}.{ev['attr']}"
                dead = _dead_branch(cls, r["expr"], ev["facts"], assigned_anywhere)
                if dead:
                    note(path, ev["line"], callee, f"not reached with the installed {_short(cls)}: {dead}")
                    continue
                if not _class_has(cls, name):
                    if name in _instance_attributes(cls) or name in assigned_anywhere or \
                            (r["expr"], name) in reader.hasattr_guards:
                        if ev["kind"] == "call":
                            note(path, ev["line"], callee,
                                 f"{r['expr']}.{name} is an instance attribute of {_short(cls)}; "
                                 f"its signature is not known from the class")
                        else:
                            attributes_checked += 1
                        continue
                    fail(path, ev["line"], callee, f"{_short(cls)} has no attribute {name!r}")
                    continue
                if ev["kind"] == "load":
                    attributes_checked += 1
                    continue
                sig, why_not = _method_signature(cls, name)
                if sig is None:
                    note(path, ev["line"], callee, why_not or "no signature")
                    continue
                error, why_partial = _bind(sig, ev)
                calls_checked += 1
                if error:
                    fail(path, ev["line"], callee, error)
                elif why_partial:
                    note(path, ev["line"], callee, why_partial)

    # attributes the playbook lists
    for dotted in check.get("attributes") or []:
        attributes_checked += 1
        try:
            resolver.resolve(dotted)
        except _ResolveError as exc:
            fail(None, None, dotted, str(exc))

    def order(e: dict) -> tuple:
        return (e["file"] is None, e["file"] or "", e["line"] or 0, e["callee"])

    failures.sort(key=order)
    partial.sort(key=order)
    return {"failures": failures, "calls_checked": calls_checked, "attributes_checked": attributes_checked,
            "imports_checked": imports_checked, "partial": partial}


__all__ = ["check_callsites"]
