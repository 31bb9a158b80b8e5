"""The generic `callsites` verify check: do the calls a module makes into other packages still bind
to the signatures installed in this venv? Stdlib only at import time; the packages being called into
(vLLM, say) are imported when the check runs, the checked modules themselves never are: their source
is read from the file `module_file_in_site` finds and parsed with `ast`.

What is checked, for each module in check["modules"]:

* Calls of callables imported from check["packages"]: `from pkg.x import f`, `from pkg.x import f as
  g`, `import pkg.x as m` then `m.f(...)`, `import pkg` then `pkg.x.f(...)`, module-level aliases
  such as `g = m.f`, relative imports, and imports inside functions. The callee is resolved by
  importing its module and walking the attributes; a class is bound against `inspect.signature(cls)`
  (its constructor; pydantic/std dataclasses expose their fields there, so a required field without
  default that the call does not pass is reported). A name bound locally in a function (a parameter,
  an assignment) shadows the module's import there.
* Every `from pkg... import name` of the named packages must resolve (the module would not load
  otherwise), even when the name is never called.
* Calls and attribute accesses on declared receivers, e.g. `self.executor` inside
  `VllmHiddenStatesGenerator` typed `vllm...MultiprocExecutor`. A receiver's `scope` names an
  enclosing class or function (or a dotted run of them, `Cls.method`); without a scope it applies
  everywhere. `type` is one dotted class path or a list (each type is checked: `self` in a patched
  forward may be any of several models). Methods are bound against the unbound function's signature
  minus its first parameter; staticmethods as they are, classmethods through the bound method.
* Each dotted path in check["attributes"] must resolve (longest importable module prefix, then
  getattr).

Binding uses a fake call: `sig.bind(*[object()] * n_positional, **{kw: object() for kw in
keywords})`, so the error text is Python's own TypeError text. A call site with `*args` or
`**kwargs` cannot be checked strictly: it is bound with `bind_partial` (too many explicit
positionals, unknown keywords and duplicate values are still errors; missing arguments are not,
except keyword-only ones when only `*args` is used) and listed under "partial".

Missing receiver attributes, and how false positives are avoided. Instance attributes (set in
`__init__`, or nn.Module submodules) are not visible on the class, so a name that is not found on
the type with `inspect.getattr_static`/`getattr` is reported missing only if ALL of these hold:
  - no class in the type's MRO assigns it in its source (`x.name = ...`, tuple/for/with targets,
    `setattr(x, "name", ...)`,
    `register_buffer/register_parameter/add_module/register_module("name")`), and it is not a field
    or class-body annotation (dataclass, pydantic, `name: T` declarations);
  - none of the checked modules assigns an attribute of that name on anything (e.g. speculators'
    `base_model._extension = self`, which makes `self._extension` in the patched forward
    legitimate);
  - the checked module does not guard it with `hasattr(<receiver>, "name")`.
This applies both to names called as methods (`self.get_input_embeddings(...)`) and to names only
read (`self.layers`). Assigning to or deleting an attribute of a receiver is never a failure. A
called name found only as an instance attribute (e.g. `self.norm(...)` on an nn.Module) cannot be
bound and is listed under "partial".

Version-compatibility branches: inside `if hasattr(<receiver>, "new"): ... else: ...` (also `not`,
`and`/`or` of such tests, `elif` chains and `a if hasattr(...) else b`), a branch that the installed
type can never take (the else when the class has `new`; the body when neither the class, its source
nor the checked modules give it `new`) is not checked, only listed under "partial" as not reached.
So a patch that keeps `self.get_input_embeddings(...)` as the fallback for old vLLM, behind
`hasattr(self, "embed_input_ids")`, passes on vLLM 0.16, while the unguarded pristine call fails.

Limits: no type inference beyond the declared receivers (a value returned by a vLLM call, or passed
in as a parameter, is not followed); default values and argument types are not compared, only arity
and keyword names; calls reached dynamically (getattr, collective_rpc("method_name"), callbacks) are
not seen; a class whose instances gain attributes in ways the source scan cannot see
(`__dict__.update`, `__getattr__` proxies that do not come from nn.Module) may yield a false "has no
attribute" report, and an attribute set anywhere in the checked modules or the type's MRO source is
accepted even if it is set on a different object; imports inside `try/except ImportError` or `if
TYPE_CHECKING:` that fail to resolve are listed as partial, not as failures.
"""

from __future__ import annotations

import ast
import inspect
import os

from ..core.nodeio import NodeError
from ..core.sitemodules import module_file_in_site
from .callsite_reader import ModuleReader
from .pyintrospect import (
    ResolveError,
    Resolver,
    bind,
    class_has,
    dead_branch,
    exc_text,
    instance_attributes,
    method_signature,
    short,
    signature,
)


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
    checker = _Checker()
    readers = checker.read(
        check.get("modules") or [], packages, _canonical_receivers(check), check.get("files") or {}
    )
    for _path, reader in readers:
        checker.assigned_anywhere |= reader.assigned
    for path, reader in readers:
        checker.imports(path, reader)  # names imported from the packages must exist, called or not
        checker.calls(path, reader)  # calls of imported callables
        for ev in reader.receiver_events:  # calls and attribute reads on declared receivers
            for type_path in ev["receiver"]["types"]:
                checker.receiver_use(path, reader, ev, type_path)
    for dotted in check.get("attributes") or []:  # attributes the playbook lists
        checker.attributes_checked += 1
        try:
            checker.resolver.resolve(dotted)
        except ResolveError as exc:
            checker.fail(None, None, dotted, str(exc))
    return checker.result()


class _Checker:
    """The check's state: one resolver, the failures and partial results (each once), the
    counters."""

    def __init__(self) -> None:
        self.resolver = Resolver()
        self.failures: list[dict] = []
        self.partial: list[dict] = []
        self.calls_checked = 0
        self.attributes_checked = 0
        self.imports_checked = 0
        self.assigned_anywhere: set[str] = set()
        self.bad_types: set[tuple[str, str]] = set()

    def fail(self, file: str | None, line: int | None, callee: str, error: str) -> None:
        entry = {"file": file, "line": line, "callee": callee, "error": error}
        if entry not in self.failures:
            self.failures.append(entry)

    def note(self, file: str | None, line: int | None, callee: str, reason: str) -> None:
        entry = {"file": file, "line": line, "callee": callee, "reason": reason}
        if entry not in self.partial:
            self.partial.append(entry)

    def read(
        self, modules: list[str], packages: list[str], receivers: list[dict], files: dict
    ) -> list[tuple[str, ModuleReader]]:
        """Each checked module's source (a candidate's text where `files` names one), parsed, never
        imported; one that cannot be read is a failure."""
        readers: list[tuple[str, ModuleReader]] = []
        for modname in modules:
            try:
                path = files.get(modname) or module_file_in_site(modname)
                with open(path, "rb") as f:
                    tree = ast.parse(f.read(), filename=path)
            except NodeError as exc:
                self.fail(None, None, modname, str(exc))
                continue
            except SyntaxError as exc:
                self.fail(path, exc.lineno, modname, f"SyntaxError: {exc.msg}")
                continue
            except OSError as exc:
                self.fail(None, None, modname, exc_text(exc))
                continue
            reader = ModuleReader(
                modname, os.path.basename(path) == "__init__.py", packages, receivers
            )
            reader.visit(tree)
            readers.append((path, reader))
        return readers

    def _unresolved(self, path: str, use: dict, dotted: str, exc: ResolveError) -> None:
        if use["guarded"]:
            self.note(path, use["line"], dotted, f"guarded import does not resolve: {exc}")
        else:
            self.fail(path, use["line"], dotted, str(exc))

    def _bound(self, path: str, line: int, callee: str, sig: inspect.Signature, use: dict) -> None:
        error, why_partial = bind(sig, use)
        self.calls_checked += 1
        if error:
            self.fail(path, line, callee, error)
        elif why_partial:
            self.note(path, line, callee, why_partial)

    def imports(self, path: str, reader: ModuleReader) -> None:
        for imp in reader.imports:
            self.imports_checked += 1
            try:
                self.resolver.resolve(imp["dotted"], imp["module_len"])
            except ResolveError as exc:
                self._unresolved(path, imp, imp["dotted"], exc)

    def calls(self, path: str, reader: ModuleReader) -> None:
        for call in reader.calls:
            callee = call["dotted"]
            try:
                obj = self.resolver.resolve(callee, call["module_len"])
            except ResolveError as exc:
                self._unresolved(path, call, callee, exc)
                continue
            if not callable(obj):
                self.fail(
                    path, call["line"], callee, f"{type(obj).__name__!r} object is not callable"
                )
                continue
            try:
                sig = signature(obj)
            except (TypeError, ValueError) as exc:
                self.note(path, call["line"], callee, f"no signature to bind against: {exc}")
                continue
            self._bound(path, call["line"], callee, sig, call)

    def _receiver_class(self, path: str, ev: dict, type_path: str) -> type | None:
        """The receiver's declared type; one that does not resolve to a class fails once, at its
        first use."""
        r = ev["receiver"]
        try:
            cls = self.resolver.resolve(type_path)
            if not inspect.isclass(cls):
                raise ResolveError(f"{type_path} is a {type(cls).__name__}, not a class")
            return cls
        except ResolveError as exc:
            if (r["expr"], type_path) not in self.bad_types:
                self.bad_types.add((r["expr"], type_path))
                self.fail(path, ev["line"], type_path, f"type of receiver {r['expr']}: {exc}")
            return None

    def receiver_use(self, path: str, reader: ModuleReader, ev: dict, type_path: str) -> None:
        """One call or attribute read on a declared receiver, against one of its types."""
        cls = self._receiver_class(path, ev, type_path)
        if cls is None:
            return
        r = ev["receiver"]
        name, callee = ev["attr"], f"{type_path}.{ev['attr']}"
        dead = dead_branch(cls, r["expr"], ev["facts"], self.assigned_anywhere)
        if dead:
            self.note(
                path, ev["line"], callee, f"not reached with the installed {short(cls)}: {dead}"
            )
            return
        if not class_has(cls, name):
            if (
                name in instance_attributes(cls)
                or name in self.assigned_anywhere
                or (r["expr"], name) in reader.hasattr_guards
            ):
                if ev["kind"] == "call":
                    self.note(
                        path,
                        ev["line"],
                        callee,
                        f"{r['expr']}.{name} is an instance attribute of {short(cls)}; "
                        f"its signature is not known from the class",
                    )
                else:
                    self.attributes_checked += 1
                return
            self.fail(path, ev["line"], callee, f"{short(cls)} has no attribute {name!r}")
            return
        if ev["kind"] == "load":
            self.attributes_checked += 1
            return
        sig, why_not = method_signature(cls, name)
        if sig is None:
            self.note(path, ev["line"], callee, why_not or "no signature")
            return
        self._bound(path, ev["line"], callee, sig, ev)

    def result(self) -> dict:
        def order(e: dict) -> tuple:
            return (e["file"] is None, e["file"] or "", e["line"] or 0, e["callee"])

        self.failures.sort(key=order)
        self.partial.sort(key=order)
        return {
            "failures": self.failures,
            "calls_checked": self.calls_checked,
            "attributes_checked": self.attributes_checked,
            "imports_checked": self.imports_checked,
            "partial": self.partial,
        }


__all__ = ["check_callsites"]
