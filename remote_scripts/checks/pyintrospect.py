"""What the installed packages really offer, for the callsites check
(remote_scripts/checks/callsites.py): dotted paths resolved by importing, signatures bound with a
fake call, and the attributes a class assigns in its source (so an instance attribute is not
reported missing). Stdlib only; the inspected packages are imported only when a check runs."""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import inspect
from collections.abc import Callable

_MISSING = object()
_REGISTER_CALLS = {
    "setattr",
    "register_buffer",
    "register_parameter",
    "add_module",
    "register_module",
}


class ResolveError(Exception):
    """Text meant for the failure entry, e.g. "ModuleNotFoundError: No module named 'vllm.x'"."""


def exc_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


# ---------------------------------------------------------------- resolving dotted paths
class Resolver:
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
            except ResolveError as exc:
                self.cache[key] = (None, str(exc))
        obj, error = self.cache[key]
        if error is not None:
            raise ResolveError(error)
        return obj

    @staticmethod
    def _import(name: str) -> object:
        try:
            return importlib.import_module(name)
        except (Exception, SystemExit) as exc:  # an import can raise anything
            raise ResolveError(exc_text(exc)) from None

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
                    raise ResolveError(exc_text(exc)) from None
                try:
                    obj = importlib.import_module(f"{prefix}.{part}")
                except ModuleNotFoundError as mexc:
                    if mexc.name == f"{prefix}.{part}":
                        raise ResolveError(exc_text(exc)) from None
                    raise ResolveError(exc_text(mexc)) from None
                except (Exception, SystemExit) as iexc:
                    raise ResolveError(exc_text(iexc)) from None
            except Exception as exc:  # a lazy module __getattr__ may raise anything
                raise ResolveError(exc_text(exc)) from None
            prefix = f"{prefix}.{part}"
        return obj


# ---------------------------------------------------------------- binding
def signature(obj: Callable[..., object]) -> inspect.Signature:
    return inspect.signature(obj)


def bind(sig: inspect.Signature, call: dict) -> tuple[str | None, str | None]:
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
    return (
        None,
        f"partially checked: the call site uses {used}, so missing arguments are not checked",
    )


def method_signature(cls: type, name: str) -> tuple[inspect.Signature | None, str | None]:
    """Signature of `instance.name(...)` as seen from the class, or (None, why not)."""
    raw = inspect.getattr_static(cls, name, _MISSING)
    try:
        obj = getattr(cls, name)
    except Exception as exc:  # a descriptor may raise anything on class access
        return None, f"class access raised {exc_text(exc)}"
    if isinstance(raw, (property, functools.cached_property)):
        return None, f"{name} is a property; the call on its value is not checked"
    try:
        if isinstance(raw, staticmethod) or inspect.ismethod(obj) or inspect.isclass(raw):
            return signature(obj), None
        if raw is not _MISSING and hasattr(type(raw), "__set__") and not inspect.isfunction(raw):
            return None, f"{name} is a data descriptor; the call on its value is not checked"
        sig = signature(obj)
    except (TypeError, ValueError) as exc:
        return None, f"no signature: {exc}"
    descriptor = raw is _MISSING or (hasattr(type(raw), "__get__") and not inspect.isclass(raw))
    params = list(sig.parameters.values())
    if (
        descriptor
        and params
        and params[0].kind
        in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ):
        sig = sig.replace(parameters=params[1:])
    return sig, None


# ---------------------------------------------------------------- what a class assigns in its
# source
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
            fname = (
                func.id
                if isinstance(func, ast.Name)
                else func.attr
                if isinstance(func, ast.Attribute)
                else ""
            )
            if fname in _REGISTER_CALLS:
                idx = 1 if fname == "setattr" else 0
                arg = node.args[idx] if len(node.args) > idx else None
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    names.add(arg.value)
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


def instance_attributes(cls: type) -> set[str]:
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
        names.update(_source_attributes(klass))
    names.update(_field_names(cls))
    _INSTANCE_ATTRS[cls] = names
    return names


def _source_attributes(klass: type) -> set[str]:
    """The names the class's own source assigns on instances or annotates in its body."""
    try:
        path = inspect.getsourcefile(klass)
    except Exception:  # builtins and C classes have none
        path = None
    tree = _parse_file(path) if path else None
    if tree is None:
        return set()
    names: set[str] = set()
    for node in _class_nodes(tree, klass):
        names.update(_assigned_names(node))
        for stmt in node.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                names.add(stmt.target.id)
    return names


def _field_names(cls: type) -> set[str]:
    """A dataclass's fields, and a pydantic model's."""
    names: set[str] = set()
    if dataclasses.is_dataclass(cls):
        names.update(f.name for f in dataclasses.fields(cls))
    for attr in ("__pydantic_fields__", "model_fields"):
        try:
            fields = inspect.getattr_static(cls, attr, None)
            if isinstance(fields, dict):
                names.update(fields)
        except Exception:  # best effort
            continue
    return names


def class_has(cls: type, name: str) -> bool:
    if inspect.getattr_static(cls, name, _MISSING) is not _MISSING:
        return True
    try:
        getattr(cls, name)  # metaclass attributes and dynamic class-level lookups
        return True
    except Exception:
        return False


def _attr_state(cls: type, name: str, assigned_anywhere: set[str]) -> bool | None:
    """True: the class has it; False: nothing anywhere gives instances this name; None: can't
    tell."""
    if class_has(cls, name):
        return True
    if name in instance_attributes(cls) or name in assigned_anywhere:
        return None
    return False


def dead_branch(cls: type, expr: str, facts: list, assigned_anywhere: set[str]) -> str | None:
    """Why the branch holding a receiver access is never taken for `cls`, from the hasattr() tests
    that lead to it (version-compatibility code like `if hasattr(self, "new") ... else:
    self.old()`)."""
    for fexpr, name, present in facts:
        if fexpr != expr:
            continue
        state = _attr_state(cls, name, assigned_anywhere)
        if state is not None and state != present:
            return f"hasattr({expr}, {name!r}) is {state}"
    return None


def short(cls: type) -> str:
    return getattr(cls, "__name__", repr(cls))
