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
import inspect
import os

from ..core.nodeio import NodeError, module_file_in_site
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
    receivers = _canonical_receivers(check)
    resolver = Resolver()
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

    readers: list[tuple[str, ModuleReader]] = []
    for modname in check.get("modules") or []:
        try:
            path = (check.get("files") or {}).get(modname) or module_file_in_site(modname)
            with open(path, "rb") as f:
                tree = ast.parse(f.read(), filename=path)
        except NodeError as exc:
            fail(None, None, modname, str(exc))
            continue
        except SyntaxError as exc:
            fail(path, exc.lineno, modname, f"SyntaxError: {exc.msg}")
            continue
        except OSError as exc:
            fail(None, None, modname, exc_text(exc))
            continue
        reader = ModuleReader(modname, os.path.basename(path) == "__init__.py", packages, receivers)
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
            except ResolveError as exc:
                if imp["guarded"]:
                    note(path, imp["line"], imp["dotted"], f"guarded import does not resolve: {exc}")
                else:
                    fail(path, imp["line"], imp["dotted"], str(exc))

        # calls of imported callables
        for call in reader.calls:
            callee = call["dotted"]
            try:
                obj = resolver.resolve(callee, call["module_len"])
            except ResolveError as exc:
                if call["guarded"]:
                    note(path, call["line"], callee, f"guarded import does not resolve: {exc}")
                else:
                    fail(path, call["line"], callee, str(exc))
                continue
            if not callable(obj):
                fail(path, call["line"], callee, f"{type(obj).__name__!r} object is not callable")
                continue
            try:
                sig = signature(obj)
            except (TypeError, ValueError) as exc:
                note(path, call["line"], callee, f"no signature to bind against: {exc}")
                continue
            error, why_partial = bind(sig, call)
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
                        raise ResolveError(f"{type_path} is a {type(cls).__name__}, not a class")
                except ResolveError as exc:
                    if (r["expr"], type_path) not in bad_types:  # once per receiver, at its first use
                        bad_types.add((r["expr"], type_path))
                        fail(path, ev["line"], type_path, f"type of receiver {r['expr']}: {exc}")
                    continue
                name, callee = ev["attr"], f"{type_path}.{ev['attr']}"
                dead = dead_branch(cls, r["expr"], ev["facts"], assigned_anywhere)
                if dead:
                    note(path, ev["line"], callee, f"not reached with the installed {short(cls)}: {dead}")
                    continue
                if not class_has(cls, name):
                    if name in instance_attributes(cls) or name in assigned_anywhere or \
                            (r["expr"], name) in reader.hasattr_guards:
                        if ev["kind"] == "call":
                            note(path, ev["line"], callee,
                                 f"{r['expr']}.{name} is an instance attribute of {short(cls)}; "
                                 f"its signature is not known from the class")
                        else:
                            attributes_checked += 1
                        continue
                    fail(path, ev["line"], callee, f"{short(cls)} has no attribute {name!r}")
                    continue
                if ev["kind"] == "load":
                    attributes_checked += 1
                    continue
                sig, why_not = method_signature(cls, name)
                if sig is None:
                    note(path, ev["line"], callee, why_not or "no signature")
                    continue
                error, why_partial = bind(sig, ev)
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
        except ResolveError as exc:
            fail(None, None, dotted, str(exc))

    def order(e: dict) -> tuple:
        return (e["file"] is None, e["file"] or "", e["line"] or 0, e["callee"])

    failures.sort(key=order)
    partial.sort(key=order)
    return {"failures": failures, "calls_checked": calls_checked, "attributes_checked": attributes_checked,
            "imports_checked": imports_checked, "partial": partial}


__all__ = ["check_callsites"]
