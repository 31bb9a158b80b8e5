"""The project's fabric.yaml, checked before Fabric/Invoke merge it into their config.

Invoke reads a project's fabric.yaml (or .yml, .json) itself and merges it into its defaults: a YAML
error, a document that is not a mapping, or a section whose shape differs from the default's
(`tasks: 3`) ends in Invoke's traceback; fleetops' own section (`fleetops: [1, 2]`, `inventory: 5`)
failed later, deep in the run. Here the file is read first, with the strict loader (file:line:column
on every value), and each such problem is one ConfigError naming the file, the line and what to
write instead."""

from __future__ import annotations

from collections.abc import Mapping as AbcMapping
from pathlib import Path
from typing import Any

import yaml

from .marks import ConfigError, Mapping, did_you_mean
from .yamlsrc import load_file, read_text_capped

# The names Invoke tries for a project's config file, in its order; fabric.py is Python (not read
# here).
PROJECT_FILES = ("fabric.yaml", "fabric.yml", "fabric.json")
# fleetops' section: each setting, the type it takes and what it is for (said in the error).
SETTINGS: dict[str, tuple[type, str]] = {
    "playbook": (
        str,
        "a playbook file or a folder of playbooks, relative to the project (e.g. playbooks/)",
    ),
    "inventory": (str, "the inventory folder or file, relative to the project (e.g. hosts)"),
    "forks": (int, "how many hosts run at once (a whole number, e.g. 16)"),
}
_TYPE_WORDS = {
    str: "text",
    int: "a whole number",
    bool: "true or false",
    dict: "a mapping (key: value lines)",
}


def find_project(start: Path) -> Path | None:
    """The nearest folder at or above `start` that holds fabfile.py (a project), as Fabric looks for
    it."""
    here = start.resolve()
    for candidate in (here, *here.parents):
        if (candidate / "fabfile.py").is_file() or (
            candidate / "fabfile" / "__init__.py"
        ).is_file():
            return candidate
    return None


def project_file(folder: str | Path) -> Path | None:
    """The config file Invoke would load from the project `folder`, if any."""
    for name in PROJECT_FILES:
        candidate = Path(folder) / name
        if candidate.is_file():
            return candidate
    return None


def check_project_file(folder: str | Path, defaults: AbcMapping[str, Any]) -> None:
    """Raise ConfigError for the first problem in the project's fabric.yaml that would stop Invoke
    from merging it into `defaults` (Fabric's config defaults) or fleetops from reading its
    section."""
    path = project_file(folder)
    if path is None:
        return
    data = load_file(path)
    if data is None:
        return  # an empty file: Invoke reads it as nothing
    if not isinstance(data, dict):
        raise ConfigError(
            path,
            getattr(data, "line", 1),
            f"the file must be a mapping (key: value lines, as in "
            f"`fleetops: {{playbook: playbooks/}}`), not {_kind(data)}",
        )
    _check_shapes(path, data, defaults, "")
    _check_section(path, data, data.get("fleetops"))
    # Invoke reads the file with PyYAML's YAML 1.1 rules, where `yes`, `no` and `2026-01-01` are not
    # text: what fleetops will find in its section is checked as Invoke reads it too.
    try:
        as_invoke_reads = yaml.safe_load(read_text_capped(path))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise ConfigError(
            path,
            mark.line + 1 if mark else None,
            f"Fabric reads this file with PyYAML (YAML 1.1), "
            f"which cannot: {exc.problem or exc.context}; quote the value",
        ) from None
    except (yaml.YAMLError, ValueError, TypeError, OverflowError, RecursionError) as exc:
        raise ConfigError(
            path,
            None,
            f"Fabric reads this file with PyYAML (YAML 1.1), which cannot: {exc}; "
            "quote the value it names",
        ) from None
    if isinstance(as_invoke_reads, dict):
        _check_section(path, data, as_invoke_reads.get("fleetops"))
        tasks = as_invoke_reads.get("tasks")
        executor = tasks.get("executor_class") if isinstance(tasks, dict) else None
        # `yes`, `on`, a date: not a class name there
        if executor is not None and not isinstance(executor, str):
            raise ConfigError(
                path,
                _line(data.get("tasks"), "executor_class"),
                f"tasks.executor_class: Fabric "
                "reads it with YAML 1.1 rules, as "
                f"{_kind(executor)}: it must be a dotted class name, "
                "fleetops.fab.executor.FleetExecutor",
            )


def _check_section(path: Path, data: dict[str, Any], section: Any) -> None:
    if section is None:
        return
    if not isinstance(section, dict):
        raise ConfigError(
            path,
            _line(data, "fleetops"),
            f"`fleetops:` must be a mapping of settings "
            f"({', '.join(SETTINGS)}), not {_kind(section)}; e.g. `fleetops: {{inventory: hosts}}`",
        )
    for key, value in section.items():
        if key not in SETTINGS:
            raise ConfigError(
                path,
                _line(section, key),
                f"fleetops.{key}: no such setting (known: "
                f"{', '.join(SETTINGS)}){did_you_mean(key, SETTINGS)}",
            )
        want, what = SETTINGS[key]
        marked = data["fleetops"]
        if value is None:
            continue  # unset: the default
        if not isinstance(value, want) or isinstance(value, bool):
            typed = marked.get(key) if isinstance(marked, dict) else None
            # sound in YAML 1.2, not as Fabric reads it
            if isinstance(typed, want) and not isinstance(typed, bool):
                raise ConfigError(
                    path,
                    _line(marked, key),
                    f"fleetops.{key}: Fabric reads {typed!r} with YAML 1.1 "
                    f'rules, as {_kind(value)}: quote it (`{key}: "{typed}"`)',
                )
            raise ConfigError(
                path,
                _line(marked, key),
                f"fleetops.{key} must be {_TYPE_WORDS[want]}, not {_kind(value)}: {what}",
            )


def _check_shapes(
    path: Path, data: dict[str, Any], defaults: AbcMapping[str, Any], prefix: str
) -> None:
    """Invoke merges a mapping only into a mapping and a value only into a value (else
    AmbiguousMergeError): each key of the file whose default is one and whose value is the other is
    named."""
    for key, value in data.items():
        if key not in defaults or key == "fleetops" and not prefix:
            continue
        default = defaults[key]
        name = f"{prefix}{key}"
        if isinstance(default, AbcMapping):
            if value is None:
                raise ConfigError(
                    path,
                    _line(data, key),
                    f"`{name}:` is empty: give it settings "
                    f"({', '.join(sorted(map(str, default))[:6])}) or remove the line",
                )
            if not isinstance(value, dict):
                raise ConfigError(
                    path,
                    _line(data, key),
                    f"`{name}:` must be a mapping of settings "
                    f"({', '.join(sorted(map(str, default))[:6])}), not {_kind(value)}",
                )
            _check_shapes(path, value, default, f"{name}.")
        elif isinstance(value, dict):
            raise ConfigError(path, _line(data, key), f"`{name}` takes one value, not a mapping")
    if prefix == "tasks.":
        executor = data.get("executor_class")
        if executor is not None and not (isinstance(executor, str) and executor.strip()):
            raise ConfigError(
                path,
                _line(data, "executor_class"),
                "tasks.executor_class must be a dotted "
                "class name: fleetops.fab.executor.FleetExecutor",
            )


def _line(mapping: Any, key: Any) -> int | None:
    return mapping.line_of(key) if isinstance(mapping, Mapping) else None


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return f"{str(value).lower()} (true/false)"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return f"a list ({_short(value)})"
    if isinstance(value, str):
        return f"the text {_short(value)}"
    if not isinstance(value, (int, float)):
        return f"a {type(value).__name__} ({_short(str(value))})"
    if isinstance(value, (int, float)):
        return f"the number {value!r}"
    return type(value).__name__


def _short(value: Any) -> str:
    text = repr(value) if not isinstance(value, list) else "[" + ", ".join(map(repr, value)) + "]"
    return text if len(text) <= 40 else text[:37] + "..."
