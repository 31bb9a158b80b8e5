"""The YAML fast path without the lab (docs/perf.md has its figures). Inventories and playbooks are
scanned and parsed by libyaml's C parser when PyYAML has it, while composing (the alias and depth
bounds), resolving (YAML 1.2 core schema) and constructing (Mapping and Sequence with line/column
per key and item) stay Python.

What is pinned here: the C parser really is used; it gives the same values and the same line/column
maps as the pure-Python loader for every YAML file in the repository and a set of tricky documents;
the bounds still fire on the C path, from the Python composer; and any failure on the C path is
answered by the Python loader, so error messages are word for word those of before."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO

from fleetops.plans import yamlload
from fleetops.plans.yamlsrc import (
    MAX_ALIAS_NODES,
    MAX_DEPTH,
    ConfigError,
    Mapping,
    Sequence,
    load_text,
)

needs_libyaml = pytest.mark.skipif(not yaml.__with_libyaml__, reason="PyYAML built without libyaml")


def _inventory(hosts: int) -> str:
    """An inventory shaped like the one `fab lab.up` writes (hosts/lab.yaml)."""
    lines = [
        (
            "# Written by `fab lab.up`: the local lab (real "
            "sshd on 127.0.0.1). Regenerated on every lab.up."
        ),
        "defaults:",
        "  address: 127.0.0.1",
        "  user: root",
        "  identity_file: /tmp/x/.lab/id_ed25519",
        "  known_hosts: /tmp/x/.lab/known_hosts",
        "  lab: true",
        "  connect_timeout: 5",
        "hosts:",
    ]
    for i in range(1, hosts + 1):
        lines += [
            f"  lab{i:02d}:",
            f"    port: {40000 + i}",
            f"    python: /tmp/x/.lab/nodes/lab{i:02d}/venv/bin/python",
            f"    state_dir: /tmp/x/.lab/nodes/lab{i:02d}/state",
            "    gpus: 2",
            "    groups: [lab]",
        ]
    return "\n".join(lines) + "\n"


TRICKY = {
    "anchors and merge keys": """\
        defaults: &d
          user: root
          port: 22
          groups: [lab, gpu]
        hosts:
          a:
            <<: *d
            address: 10.0.0.1
          b: {<<: *d, address: 10.0.0.2}
          c:
            <<: [*d, {extra: 1}]
          list: &l [1, 2, {k: v}]
          again: *l
        """,
    "flow collections": "a: [1, [2, 3], {x: y, z: [ ]}, {}]\nb: {k: [a, b], 'q k': \"v\", ? e : "
    "f}\nc: [\n  one,\n  two ,\n  {  three: 3 }\n]\n",
    "block scalars": "lit: |\n  line one\n    indented\n  last\n\nfold: >-\n  folded\n  text\n\n"
    "  para\nkeep: |+\n  kept\n\nstrip: |-\n  "
    "stripped\nind: |2\n    two more\nafter: 1\n",
    "quoted strings with escapes": 'a: "tab\\there \\"q\\" \\\\ \\x41 \\u00e9 \\U0001F600 \\n"\n'
    "b: 'it''s \\n raw'\n"
    'c: "multi\n  line\\\n  joined"\nd: \'\'\ne: ""\n',
    "unicode": "naïve: Tök\"en\nключ: значение\n日本: [語, 🙂]\n'🙂': emoji key\n",
    "YAML 1.2 core schema": "port: 022\noct: 0o17\nhex: 0x1f\nneg: -7\nplus: +3\ninf: .inf\n"
    "ninf: -.inf\nnan: .nan\nf: 1.5e3\ng: .5\ntilde: ~\nnul: null\nNUL: "
    "NULL\nempty:\nt: true\nF: False\nno: no\nyes: yes\non: off\ntime: "
    "1:30\ndate: 2026-01-01\nstamp: 2026-01-01T10:00:00Z\nunder: 1_000\n"
    "bin: 0b101\nsix: 0o\n",
    "explicit tags": "s: !!str 022\nb: !!bool true\ni: !!int 7\nf: !!float 1.0\nn: !!null ''\nm: "
    "!!map {a: 1}\nq: !!seq [1]\nv: !<tag:yaml.org,2002:str> 5\nbang: ! 12\n"
    "set: !!set\n  ? a\n  ? b\nomap: !!omap [{a: 1}, {b: 2}]\n",
    "empty values": "a:\nb: \nc: []\nd: {}\ne:\n  -\n  - \n  - ''\nf: ~\n? g\n",
    "comments": "# head\na: 1 # trailing\n# between\nb:   # before a block\n  - x  # item\n  # "
    "inner\n  - y\nc: 'not # a comment'\nd: x#y\n# tail\n",
    ("multi-line plain scalars"): "a: this is\n  one long\n\n  plain scalar\nb:\n  - item that\n"
    "    goes on\nc: ends here\n",
    ("nested blocks and indentation"): "top:\n- a\n- b:\n    c:\n    - d\n    -   e: 1\n        f: "
    "2\n-\n  - deep\n  -\n    - deeper\n",
    "complex keys": "? |\n  block key\n: v\n\"quoted key\": 1\n'single': 2\n3: int key\n? >-\n  "
    "folded\n: w\n? x\n? y\n: z\n",
    "documents markers": "%YAML 1.1\n---\na: 1\n...\n",
    "tag directive": "%TAG !e! tag:yaml.org,2002:\n---\na: !e!int 5\nb: !e!str 6\n",
    "CRLF line ends": "a: 1\r\nb:\r\n  - x\r\n  - y\r\nc: |\r\n  l1\r\n  l2\r\n",
    "byte order mark": "\ufeffa: 1\nb: [2]\n",
    "a scalar document": "just text\n",
    "a list document": "- 1\n- two\n- [3]\n",
    "empty document": "",
    "comment-only document": "# nothing here\n",
    "explicit empty document": "---\n",
    "long lines": "k: " + "x" * 3000 + "\nl: [" + ", ".join(str(i) for i in range(500)) + "]\n",
    "wide characters before values": "日本語: [a, b]\n🙂🙂: {c: d}\nz: [e]\n",
    "128-host inventory": _inventory(128),
}


def _repo_yaml() -> list[Path]:
    found = [
        p
        for folder in ("playbooks", "hosts", "tests")
        for p in sorted((REPO / folder).rglob("*.y*ml"))
    ]
    return [p for p in found if p.suffix in (".yaml", ".yml")]


def _python(text: str, path: str = "t.yaml") -> Any:
    return yaml.load(text, Loader=yamlload.make_loader(path))  # SafeLoader subclass


def _c(text: str, path: str = "t.yaml") -> Any:
    """The C path alone, never falling back: a failure here is a failure of the test."""
    return yaml.load(text, Loader=yamlload.make_loader(path, yamlload.StrictCLoader))


def assert_same(a: Any, b: Any, where: str = "$") -> None:
    """Equal values of equal types, and for Mapping/Sequence equal file, line and column maps,
    recursively."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, float) and math.isnan(a):
        assert math.isnan(b), where
        return
    if isinstance(a, Mapping):
        assert (a.path, a.line, a.column) == (b.path, b.line, b.column), where
        assert a.key_lines == b.key_lines, f"{where}: key_lines"
        assert a.key_cols == b.key_cols, f"{where}: key_cols"
        assert list(a) == list(b), f"{where}: keys"
        for key in a:
            assert_same(a[key], b[key], f"{where}.{key}")
        return
    if isinstance(a, Sequence):
        assert (a.path, a.line, a.column) == (b.path, b.line, b.column), where
        assert a.item_lines == b.item_lines, f"{where}: item_lines"
        assert a.item_cols == b.item_cols, f"{where}: item_cols"
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
        return
    if isinstance(a, (set, list, dict)):  # !!set, !!omap pairs: plain containers, no marks
        assert a == b, where
        return
    assert a == b, where


def _spy_loaders(monkeypatch: pytest.MonkeyPatch) -> list[type]:
    used: list[type] = []
    real = yaml.load

    def spy(stream: Any, Loader: type) -> Any:  # yaml.load's own argument name
        used.append(Loader)
        return real(stream, Loader=Loader)  # the loader under test

    monkeypatch.setattr(yaml, "load", spy)
    return used


# ---------------------------------------------------------------- the C parser is used


@needs_libyaml
def test_load_text_uses_libyaml_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    used = _spy_loaders(monkeypatch)
    data = load_text(_inventory(4), "hosts/lab.yaml")
    assert data["hosts"]["lab03"]["port"] == 40003
    assert len(used) == 1, "a document that loads is read once, by the C parser"
    assert issubclass(used[0], yaml.CSafeLoader)
    # ...but composed by PyYAML's Python composer with the bounds mixed in, not by CParser's own.
    mro = used[0].__mro__
    assert (
        mro.index(yamlload.BoundedComposer)
        < mro.index(yaml.composer.Composer)
        < mro.index(yaml.CSafeLoader)
    )


def test_without_libyaml_the_python_loader_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    used = _spy_loaders(monkeypatch)
    monkeypatch.setattr(yamlload, "StrictCLoader", None)
    data = load_text("port: 022\n", "t.yaml")
    assert data == {"port": 22} and data.line_of("port") == 1
    assert len(used) == 1 and issubclass(used[0], yamlload.StrictLoader)


# ---------------------------------------------------------------- same values, same marks


@needs_libyaml
@pytest.mark.parametrize("path", _repo_yaml(), ids=lambda p: str(p.relative_to(REPO)))
def test_repository_yaml_same_on_both_paths(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = path.read_text(encoding="utf-8")
    assert_same(_c(text, str(path)), _python(text, str(path)))
    used = _spy_loaders(monkeypatch)
    loaded = load_text(text, str(path))
    assert [issubclass(L, yaml.CSafeLoader) for L in used] == [True], (
        "the project's own files take the C path"
    )
    assert_same(loaded, _python(text, str(path)))


def test_repository_has_yaml_to_compare() -> None:
    names = {str(p.relative_to(REPO)) for p in _repo_yaml()}
    assert "playbooks/speculators-0.3.0-vllm-0.16.yaml" in names and "hosts/example.yaml" in names


@needs_libyaml
@pytest.mark.parametrize("name", list(TRICKY))
def test_tricky_documents_same_on_both_paths(name: str) -> None:
    text = textwrap.dedent(TRICKY[name]) if name == "anchors and merge keys" else TRICKY[name]
    assert_same(_c(text), _python(text))
    assert_same(load_text(text, "t.yaml"), _python(text))


@needs_libyaml
def test_core_schema_on_the_c_path() -> None:
    data = _c(TRICKY["YAML 1.2 core schema"])
    assert data["port"] == 22 and data["oct"] == 15 and data["hex"] == 31
    assert data["no"] == "no" and data["yes"] == "yes" and data["on"] == "off"
    assert (
        data["time"] == "1:30"
        and data["date"] == "2026-01-01"
        and data["stamp"] == "2026-01-01T10:00:00Z"
    )
    assert (
        data["inf"] == math.inf
        and data["tilde"] is None
        and data["empty"] is None
        and data["F"] is False
    )
    assert (
        data["nul"] is None
        and data["NUL"] is None
        and data["t"] is True
        and math.isnan(data["nan"])
    )
    assert data["under"] == "1_000" and data["bin"] == "0b101"
    assert _c("groups: [lab, no]\n")["groups"] == ["lab", "no"]


@needs_libyaml
def test_merged_keys_keep_their_own_marks_on_the_c_path() -> None:
    data = _c(textwrap.dedent(TRICKY["anchors and merge keys"]))
    a = data["hosts"]["a"]
    assert a == {"user": "root", "port": 22, "groups": ["lab", "gpu"], "address": "10.0.0.1"}
    assert (a.line_of("user"), a.column_of("user")) == (2, 3)  # where the anchored key is written
    assert (a.line_of("address"), a.column_of("address")) == (8, 5)
    assert data["hosts"]["c"]["extra"] == 1 and data["hosts"]["again"] is data["hosts"]["list"]


# ---------------------------------------------------------------- the bounds fire on the C path


def _bound_docs() -> dict[str, str]:
    laughs = ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i, name in enumerate("bcdefghi"):
        prev = "abcdefghi"[i]
        laughs.append(f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 9) + "]")
    return {
        "depth": "a: " + "[" * (MAX_DEPTH + 5) + "]" * (MAX_DEPTH + 5) + "\n",
        "recursive alias": "a: &x\n  b: *x\n",
        "billion laughs": "\n".join(laughs) + "\n",
    }


@needs_libyaml
@pytest.mark.parametrize("kind", ["depth", "recursive alias", "billion laughs"])
def test_bounds_fire_from_the_python_composer_on_the_c_path(kind: str) -> None:
    text = _bound_docs()[kind]
    with pytest.raises(ConfigError) as on_c:
        _c(text, "bound.yaml")
    with pytest.raises(ConfigError) as on_python:
        _python(text, "bound.yaml")
    assert str(on_c.value) == str(on_python.value)
    assert (on_c.value.line, on_c.value.column) != (None, None)
    if kind == "billion laughs":
        assert str(MAX_ALIAS_NODES) in str(on_c.value)
    with pytest.raises(ConfigError) as loaded:
        load_text(text, "bound.yaml")
    assert str(loaded.value) == str(on_python.value)


# ---------------------------------------------------------------- errors are the Python loader's

BROKEN = {
    "mapping in a plain value": "a: b: c\n",
    "bad escape": 'a: "\\q"\n',
    "sequence entry after a key": "a: -\n",
    "unclosed quote": "'a\n",
    "undefined alias": "x: *nope\n",
    "duplicate key": "a: 1\na: 2\n",
    "unhashable key": "? {a: 1}\n: c\n",
    "two documents": "a: 1\n---\nb: 2\n",
    "unclosed flow": "a: [1, 2\n",
    "reserved indicator": "a: @x\n",
    "control character": "a: \x07\n",
    "bad int": "a: !!int x\n",
    "unknown tag": "a: !foo x\n",
}


def _python_only(monkeypatch: pytest.MonkeyPatch, text: str) -> str:
    with monkeypatch.context() as m:
        m.setattr(yamlload, "StrictCLoader", None)
        with pytest.raises(ConfigError) as exc:
            load_text(text, "broken.yaml")
    return str(exc.value)


@needs_libyaml
@pytest.mark.parametrize("name", list(BROKEN))
def test_errors_are_word_for_word_the_python_loaders(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = BROKEN[name]
    expected = _python_only(monkeypatch, text)
    used = _spy_loaders(monkeypatch)
    with pytest.raises(ConfigError) as exc:
        load_text(text, "broken.yaml")
    assert str(exc.value) == expected
    assert "\n" not in str(exc.value)
    assert [issubclass(L, yaml.CSafeLoader) for L in used] == [True, False], "C first, then Python"


@needs_libyaml
@pytest.mark.parametrize(
    "text, value",
    [
        (
            "%YAML 1.3\n---\na: 1\n",
            {"a": 1},
        ),  # libyaml refuses a YAML version PyYAML's parser reads
        ('a: "\\ud800"\n', {"a": "\ud800"}),  # libyaml refuses a lone surrogate escape
    ],
)
def test_a_document_only_libyaml_refuses_loads_as_before(text: str, value: Any) -> None:
    with pytest.raises(yaml.YAMLError):
        _c(text)
    loaded = load_text(text, "t.yaml")
    assert loaded == value
    assert_same(loaded, _python(text))


# ---------------------------------------------------------------- where libyaml reads more than
# PyYAML

# Found by differential fuzzing (PyYAML 6.0, libyaml 0.2.5): documents PyYAML's Python scanner
# refuses, or reads with other marks, that libyaml would accept. The text ones never reach the C
# parser; the event ones are noticed by the C loader's composer and read again by the Python loader;
# `key: !` is made up for.
LENIENT_TEXT = {
    "tab in a plain scalar": "a: x\ty\n",
    "tab as a separator": "d:\t1\n",
    "tab indentation": "a:\n\t- b\n",
    "tab in quotes (fine for both, read by Python all the same)": "c: 'tab\there'\n",
    "byte order mark after the start": "a: 1\n\ufeffb: 2\n",
    "comment right after a block scalar header": "lit: |#\n  x\n",
}
LENIENT_EVENTS = {
    "question mark in a flow plain scalar": "m: {a?: 1}\n",
    "question mark after an equals sign in flow": "b: {k: v, =? e : f}\n",
    "question mark in a `!`-tagged flow plain scalar": "b: [! a?b]\n",
    "empty explicit key in flow": "b: {? : f}\n",
    "empty explicit key in a flow sequence": "[? ]\n",
    "empty values in a flow mapping (a set)": "s: !!set {a, b}\n",
}


@needs_libyaml
@pytest.mark.parametrize("name", list(LENIENT_TEXT))
def test_texts_libyaml_is_lenient_about_go_to_python(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = LENIENT_TEXT[name]
    expected = _python_only_outcome(monkeypatch, text)
    used = _spy_loaders(monkeypatch)
    assert_outcome(_outcome(text), expected)
    assert [issubclass(L, yaml.CSafeLoader) for L in used] == [False]


@needs_libyaml
@pytest.mark.parametrize("name", list(LENIENT_EVENTS))
def test_events_libyaml_reads_otherwise_go_to_python(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = LENIENT_EVENTS[name]
    expected = _python_only_outcome(monkeypatch, text)
    used = _spy_loaders(monkeypatch)
    assert_outcome(_outcome(text), expected)
    assert [issubclass(L, yaml.CSafeLoader) for L in used] == [True, False]


@needs_libyaml
@pytest.mark.parametrize("text", ["f: !\n", "f: ! \ng: ! 12\n", "- !\n- x\n"])
def test_an_empty_non_specific_tag_is_null_on_both_paths(text: str) -> None:
    assert_same(_c(text), _python(text))
    assert None in (list(_c(text).values()) if isinstance(_c(text), dict) else _c(text))


def _outcome(text: str) -> Any:
    try:
        return load_text(text, "t.yaml")
    except ConfigError as exc:
        return exc


def _python_only_outcome(monkeypatch: pytest.MonkeyPatch, text: str) -> Any:
    with monkeypatch.context() as m:
        m.setattr(yamlload, "StrictCLoader", None)
        return _outcome(text)


def assert_outcome(got: Any, expected: Any) -> None:
    if isinstance(expected, ConfigError):
        assert isinstance(got, ConfigError) and str(got) == str(expected)
    else:
        assert_same(got, expected)
