"""YAML loading that remembers where every value came from, so errors can say file:line:column.

The loader is strict YAML 1.2 (core schema), not PyYAML's YAML 1.1: only true/false are booleans (`no`, `yes`,
`on`, `off` stay text, so `groups: [lab, no]` is two groups), integers are decimal unless written 0o/0x
(`port: 022` is 22, never octal 18), and `1:30` or `2026-01-01` stay text (no sexagesimal, no dates).

Input is bounded: a file larger than MAX_FILE_BYTES, nesting deeper than MAX_DEPTH, an alias that
refers to a node still being read (a recursive structure), or aliases that together expand to more than
MAX_ALIAS_NODES values (billion laughs) are refused while the document is composed, before anything is built,
with the file:line:column where the limit was crossed.

Scanning and parsing are libyaml's C code when PyYAML has it (a 128-host inventory took ~100 ms of
client CPU in the pure-Python scanner); composing, the bounds, resolving and constructing stay the Python code
above, and anything libyaml reads otherwise than PyYAML's Python parser, or refuses, is read by the pure-Python
loader, so values, line:column marks and error messages are the same either way."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from yaml.events import AliasEvent, CollectionStartEvent

MAX_FILE_BYTES = 4 * 1024 * 1024  # an inventory of thousands of hosts is well below this
MAX_ALIAS_NODES = 1_000_000  # values aliases may add to a document, all together (5000 hosts x `<<: *d` fit)
MAX_DEPTH = 64  # nested sequences/mappings; real inventories and playbooks use fewer than 10


def one_line_text(text: str) -> str:
    """Messages go to a terminal line and to log lines: never a newline in the middle."""
    return " ".join(str(text).split())


class ConfigError(Exception):
    """A problem in a file the operator wrote; always names the file and, when known, line and column,
    as `file:line:column: message` on one line (the form editors and terminals jump to)."""

    def __init__(self, path: str | Path, line: int | None, message: str, column: int | None = None) -> None:
        self.path = str(path)
        self.line = line
        self.column = column
        self.message = one_line_text(message)
        super().__init__(str(self))

    def __str__(self) -> str:
        where = self.path
        if self.line:
            where += f":{self.line}"
            if self.column:
                where += f":{self.column}"
        return f"{where}: {self.message}"


def did_you_mean(word: Any, choices: Iterable[str]) -> str:
    """'; did you mean 'x'?' when one of choices is close to word, else ''."""
    if not isinstance(word, str):
        return ""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


class Mapping(dict):
    """A YAML mapping that knows its own line and column and those of each key."""

    path: str = "?"
    line: int | None = None
    column: int | None = None
    key_lines: dict[Any, int]
    key_cols: dict[Any, int]

    def line_of(self, key: Any) -> int | None:
        return getattr(self, "key_lines", {}).get(key, self.line)

    def column_of(self, key: Any) -> int | None:
        # A key whose line is known but column is not (a merged mapping) gets no column, never a wrong one.
        cols = getattr(self, "key_cols", {})
        return cols[key] if key in cols else (None if key in getattr(self, "key_lines", {}) else self.column)

    def error(self, key: Any, message: str) -> ConfigError:
        return ConfigError(self.path, self.line_of(key), message, self.column_of(key))


class Sequence(list):
    path: str = "?"
    line: int | None = None
    column: int | None = None
    item_lines: list[int]
    item_cols: list[int]

    def line_of(self, index: int) -> int | None:
        return self.item_lines[index] if index < len(self.item_lines) else self.line

    def column_of(self, index: int) -> int | None:
        cols = getattr(self, "item_cols", [])
        return cols[index] if index < len(cols) else self.column


# YAML 1.2 core schema (https://yaml.org/spec/1.2.2/#1032-tag-resolution), as PyYAML implicit resolvers.
_BOOL_12 = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_NULL_12 = re.compile(r"^(?:~|null|Null|NULL|)$")
_INT_12 = re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$")
_FLOAT_12 = re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
                       r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$")


def _construct_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    text = loader.construct_scalar(node)
    if text.startswith("0o"):
        return int(text[2:], 8)
    if text.startswith("0x"):
        return int(text[2:], 16)
    return int(text, 10)  # decimal even with leading zeros: 022 is 22 (YAML 1.2), never octal 18


def _construct_bool(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> bool:
    return loader.construct_scalar(node).lower() == "true"


def _construct_float(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> float:
    text = loader.construct_scalar(node).lower()
    if text.endswith("nan"):
        return float("nan")
    return float(text.replace(".inf", "inf"))


def _core_schema(cls: type) -> type:
    """Gives a loader class the YAML 1.2 core schema: its own implicit resolvers (not YAML 1.1's) and the
    constructors that go with them. Both loaders below take it from here, so they cannot drift apart."""
    cls.yaml_implicit_resolvers = {}  # type: ignore[attr-defined]
    for tag, regexp, first in (
        ("tag:yaml.org,2002:bool", _BOOL_12, "tTfF"),
        ("tag:yaml.org,2002:null", _NULL_12, ["~", "n", "N", ""]),
        ("tag:yaml.org,2002:int", _INT_12, "-+0123456789"),
        ("tag:yaml.org,2002:float", _FLOAT_12, "-+0123456789."),
        ("tag:yaml.org,2002:merge", re.compile(r"^(?:<<)$"), "<"),
    ):
        cls.add_implicit_resolver(tag, regexp, list(first))  # type: ignore[attr-defined]
    cls.add_constructor("tag:yaml.org,2002:int", _construct_int)  # type: ignore[attr-defined]
    cls.add_constructor("tag:yaml.org,2002:bool", _construct_bool)  # type: ignore[attr-defined]
    cls.add_constructor("tag:yaml.org,2002:float", _construct_float)  # type: ignore[attr-defined]
    return cls


@_core_schema
class StrictLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader with the YAML 1.2 core schema's resolvers instead of YAML 1.1's."""


class _LibyamlDisagrees(Exception):
    """Raised on the C path where libyaml reads a document other than PyYAML's Python parser would."""


# Where libyaml accepts what PyYAML's Python scanner refuses (found by differential fuzzing, PyYAML 6.0 and
# libyaml 0.2.5): tabs as separators or inside plain scalars, a byte order mark after the start, and a comment
# right after a block scalar's header (`|#`). Such a text is read by the Python loader alone.
_LIBYAML_LENIENT = re.compile(r"\t|.\ufeff|[|>][-+0-9]*#", re.S)


def _libyaml_may_differ(text: str) -> bool:
    return _LIBYAML_LENIENT.search(text) is not None


StrictCLoader: type | None = None
if yaml.__with_libyaml__:
    from yaml._yaml import CParser

    @_core_schema
    class _StrictCLoader(yaml.composer.Composer, CParser,  # type: ignore[misc]
                         yaml.constructor.SafeConstructor, yaml.resolver.Resolver):
        """StrictLoader reading events from libyaml's C scanner and parser (most of a load's client
        CPU went to the pure-Python scanner). Only the events come from C: PyYAML's Python Composer stands
        before CParser in the MRO, so `_BoundedComposer.compose_node` still sees every event (aliases and
        depth stay bounded, at the same marks), and resolving and constructing are StrictLoader's code.
        The two event-level differences from PyYAML's parser are made up for or refused here."""

        def __init__(self, stream: str) -> None:
            CParser.__init__(self, stream)
            yaml.composer.Composer.__init__(self)
            yaml.constructor.SafeConstructor.__init__(self)
            yaml.resolver.Resolver.__init__(self)
            self._flow_depth = 0

        def compose_scalar_node(self, anchor: Any) -> yaml.ScalarNode:
            event = self.peek_event()
            if event.tag == "!":
                # PyYAML's parser marks a `!`-tagged scalar plain-implicit; libyaml does not for an empty one
                # (`key: !`), which would make it '' instead of null.
                event.implicit = (True, False)
            if self._flow_depth and not event.style and ("?" in event.value or not event.value):
                # In a flow collection PyYAML ends a plain scalar at `?` (a key indicator), libyaml reads on;
                # and an empty key there (`{? : v}`) is marked a column further on by libyaml.
                raise _LibyamlDisagrees(event.value)
            return super().compose_scalar_node(anchor)

        def compose_sequence_node(self, anchor: Any) -> yaml.SequenceNode:
            flow = bool(self.peek_event().flow_style)
            self._flow_depth += flow
            try:
                return super().compose_sequence_node(anchor)
            finally:
                self._flow_depth -= flow

        def compose_mapping_node(self, anchor: Any) -> yaml.MappingNode:
            flow = bool(self.peek_event().flow_style)
            self._flow_depth += flow
            try:
                return super().compose_mapping_node(anchor)
            finally:
                self._flow_depth -= flow

    StrictCLoader = _StrictCLoader


def _where(path: str, mark: Any, message: str) -> ConfigError:
    return ConfigError(path, mark.line + 1 if mark else None, message, mark.column + 1 if mark else None)


def _expanded_size(node: yaml.Node, sizes: dict[int, int]) -> int:
    """How many values `node` becomes once every alias in it is expanded (memoized per node, iterative)."""
    stack: list[tuple[yaml.Node, bool]] = [(node, False)]
    while stack:
        current, children_done = stack.pop()
        if id(current) in sizes:
            continue
        if isinstance(current, yaml.ScalarNode):
            sizes[id(current)] = 1
            continue
        kids = [k for pair in current.value for k in pair] if isinstance(current, yaml.MappingNode) \
            else list(current.value)
        if children_done:
            sizes[id(current)] = min(1 + sum(sizes[id(k)] for k in kids), 1 << 62)
        else:
            stack.append((current, True))
            stack.extend((k, False) for k in kids if id(k) not in sizes)
    return sizes[id(node)]


class _BoundedComposer:
    """Mixed into the Loader: counts what aliases add and how deep collections nest, while composing."""

    yaml_path = "?"

    def compose_node(self, parent: Any, index: Any) -> Any:
        state = self.__dict__.setdefault("_bounds", {"open": set(), "sizes": {}, "added": 0, "depth": 0})
        event = self.peek_event()  # type: ignore[attr-defined]
        if isinstance(event, AliasEvent):
            target = self.anchors.get(event.anchor)  # type: ignore[attr-defined]
            if target is not None:  # an undefined alias: PyYAML's own error, with its mark
                if event.anchor in state["open"]:  # PyYAML registers an anchor before reading its children
                    raise _where(self.yaml_path, event.start_mark,
                                 f"alias *{event.anchor} refers to the node it is part of (a recursive "
                                 "structure); recursive aliases are not allowed")
                state["added"] += _expanded_size(target, state["sizes"])
                if state["added"] > MAX_ALIAS_NODES:
                    raise _where(self.yaml_path, event.start_mark,
                                 f"YAML aliases expand to more than {MAX_ALIAS_NODES} values (at alias "
                                 f"*{event.anchor}); refusing the document (write the values out, or use fewer "
                                 "nested aliases)")
            return super().compose_node(parent, index)  # type: ignore[misc]
        if not isinstance(event, CollectionStartEvent):
            return super().compose_node(parent, index)  # type: ignore[misc]
        if state["depth"] >= MAX_DEPTH:
            raise _where(self.yaml_path, event.start_mark,
                         f"values nested more than {MAX_DEPTH} levels deep; refusing the document")
        state["depth"] += 1
        if event.anchor is not None:
            state["open"].add(event.anchor)
        try:
            return super().compose_node(parent, index)  # type: ignore[misc]
        finally:
            state["depth"] -= 1
            state["open"].discard(event.anchor)


MERGE_TAG = "tag:yaml.org,2002:merge"
_NODE_KINDS = {yaml.ScalarNode: "scalar", yaml.SequenceNode: "sequence", yaml.MappingNode: "mapping"}


def _short_tag(tag: str) -> str:
    return tag.replace("tag:yaml.org,2002:", "!!")


def _kind_of(node: yaml.Node) -> str:
    return f"a {_NODE_KINDS.get(type(node), 'node')}"


def _wrong_kind(path: str, node: yaml.Node, wanted: str) -> ConfigError:
    return ConfigError(path, node.start_mark.line + 1,
                       f"invalid YAML value: {_short_tag(node.tag)} needs a {wanted}, found {_kind_of(node)}",
                       node.start_mark.column + 1)


def _make_loader(path: str, base: type = StrictLoader) -> type[yaml.SafeLoader]:
    class Loader(_BoundedComposer, base):  # type: ignore[valid-type,misc]
        yaml_path = path

        def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
            # A tag that does not fit its value (`!!int x`, `!!pairs {a: 1}`) makes PyYAML's constructors
            # raise plain Python errors without a mark; this names the node's own file:line:column.
            try:
                return super().construct_object(node, deep)
            except (ConfigError, yaml.YAMLError, RecursionError):
                raise
            except (ValueError, TypeError, AttributeError, KeyError, IndexError, OverflowError) as exc:
                raise ConfigError(path, node.start_mark.line + 1,
                                  f"invalid YAML value for {_short_tag(node.tag)}: {exc}",
                                  node.start_mark.column + 1) from None

    def construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> Mapping:
        if not isinstance(node, yaml.MappingNode):
            raise _wrong_kind(path, node, "mapping")
        # YAML's merge rule, done here rather than by PyYAML's flatten_mapping (whose order lets a later merge
        # source win): a mapping's own keys win over merged ones, earlier merge sources over later ones, and
        # only a key written twice by hand is a duplicate. Each source is constructed as a mapping of its own,
        # so its own merges, duplicates and marks are settled first.
        sources: list[Mapping] = []
        own: dict[Any, tuple[yaml.Node, tuple[int, int]]] = {}
        for key_node, value_node in node.value:
            if key_node.tag == MERGE_TAG:
                parts = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
                for part in parts:
                    if not isinstance(part, yaml.MappingNode):
                        raise ConfigError(path, part.start_mark.line + 1,
                                          "invalid YAML: a merge key (<<) takes a mapping or a list of "
                                          f"mappings, not {_kind_of(part)}",
                                          part.start_mark.column + 1)
                    sources.append(loader.construct_object(part, deep=True))
                continue
            if key_node.tag == "tag:yaml.org,2002:value":
                key_node.tag = "tag:yaml.org,2002:str"  # as PyYAML's flatten_mapping does
            key = loader.construct_object(key_node, deep=True)
            where = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            try:
                hash(key)
            except TypeError:
                raise ConfigError(path, *where[:1], "mapping key must be a scalar", where[1]) from None
            if key in own:
                raise ConfigError(path, where[0], f"duplicate key {key!r}", where[1])
            own[key] = (value_node, where)
        result = Mapping()
        result.path, result.line, result.column = path, node.start_mark.line + 1, node.start_mark.column + 1
        result.key_lines, result.key_cols = {}, {}
        for source in sources:  # merged keys first, as they are written first
            for key, value in source.items():
                if key not in own and key not in result:
                    result[key] = value
                    result.key_lines[key] = source.line_of(key)
                    column = source.column_of(key)
                    if column is not None:
                        result.key_cols[key] = column
        for key, (value_node, where) in own.items():
            result[key] = loader.construct_object(value_node, deep=True)
            result.key_lines[key], result.key_cols[key] = where
        return result

    def construct_sequence(loader: yaml.SafeLoader, node: yaml.SequenceNode) -> Sequence:
        if not isinstance(node, yaml.SequenceNode):
            raise _wrong_kind(path, node, "sequence")
        result = Sequence(loader.construct_object(child, deep=True) for child in node.value)
        result.path, result.line, result.column = path, node.start_mark.line + 1, node.start_mark.column + 1
        result.item_lines = [child.start_mark.line + 1 for child in node.value]
        result.item_cols = [child.start_mark.column + 1 for child in node.value]
        return result

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, construct_sequence)
    return Loader


def _too_large(path: str | Path, text: str) -> ConfigError:
    """The size error, at the line where the limit is crossed (an editor jumps there)."""
    line = text.count("\n", 0, MAX_FILE_BYTES) + 1
    return ConfigError(path, line, f"file is larger than {MAX_FILE_BYTES} bytes (the limit for inventories, "
                                   "playbooks and the files they name); refusing to read it: split it up")


def check_size(text: str, path: str | Path) -> str:
    """`text` itself, or ConfigError when its UTF-8 form is larger than MAX_FILE_BYTES."""
    if len(text) > MAX_FILE_BYTES or len(text.encode("utf-8", "surrogatepass")) > MAX_FILE_BYTES:
        raise _too_large(path, text)
    return text


def read_capped(path: str | Path) -> bytes:
    """A file's bytes, reading at most MAX_FILE_BYTES + 1 of them (a huge file or a device is never slurped);
    ConfigError naming file:line when it is larger. OSError passes to the caller."""
    with open(path, "rb") as f:
        data = f.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise _too_large(path, data.decode("utf-8", "replace"))
    return data


def read_text_capped(path: str | Path) -> str:
    """read_capped as UTF-8 text; a decoding error is a ConfigError naming the file."""
    try:
        return read_capped(path).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(path, None, f"cannot read: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def _compose_and_construct(text: str, path: str) -> Any:
    if StrictCLoader is not None and not _libyaml_may_differ(text):
        try:
            return yaml.load(text, Loader=_make_loader(path, StrictCLoader))  # SafeConstructor
        except Exception:  # the pure-Python loader below decides and words the error
            # libyaml words its errors differently from PyYAML's Python scanner and parser, marks some of
            # them elsewhere, and refuses a few documents PyYAML reads (`%YAML 1.3`, a "\ud800" escape);
            # _LibyamlDisagrees lands here too, for events PyYAML's parser would not have produced.
            # The messages an operator sees (and the tests pin) are the Python loader's, so whatever fails
            # here is read again by the pure-Python loader: it raises its own error or, where only
            # libyaml refused, its result stands. Errors are rare; only they pay for the slow path.
            pass
    return yaml.load(text, Loader=_make_loader(path))  # SafeLoader subclass


def load_text(text: str, path: str | Path) -> Any:
    path = str(path)
    check_size(text, path)
    try:
        return _compose_and_construct(text, path)
    except ConfigError:
        raise
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, column = (mark.line + 1, mark.column + 1) if mark else (None, None)
        # PyYAML's str() draws the offending line under the message; one line is what a terminal wants.
        problem = exc.problem or exc.context or "invalid YAML"
        if exc.context and exc.problem and exc.context_mark and exc.context_mark.line != (mark.line if mark else -1):
            problem += f" ({exc.context} at line {exc.context_mark.line + 1})"
        elif exc.context and exc.problem:
            problem = f"{exc.context}: {problem}"
        raise ConfigError(path, line, f"invalid YAML: {problem}", column) from None
    except yaml.YAMLError as exc:
        raise ConfigError(path, None, f"invalid YAML: {exc}") from None
    except (ValueError, TypeError, AttributeError, KeyError, IndexError, OverflowError, RecursionError) as exc:
        # Constructors that finish after their node (PyYAML's two-step ones: sets, omaps) raise plain Python
        # errors outside construct_object; the document is all that can be named for them.
        raise ConfigError(path, None, f"invalid YAML value: {exc}") from None


def load_file(path: str | Path) -> Any:
    path = Path(path)
    try:
        text = read_text_capped(path)
    except FileNotFoundError:
        raise ConfigError(path, None, "file not found") from None
    except OSError as exc:
        raise ConfigError(path, None, f"cannot read: {exc}") from None
    return load_text(text, path)


def expect_mapping(value: Any, path: str, line: int | None, what: str) -> Mapping:
    if not isinstance(value, Mapping):
        column = getattr(value, "column", None) if getattr(value, "line", None) else None
        raise ConfigError(path, getattr(value, "line", None) or line, f"{what} must be a mapping", column)
    return value


def reject_unknown(mapping: Mapping, allowed: Iterable[str], what: str) -> None:
    allowed = list(allowed)
    for key in mapping:
        if key not in allowed:
            raise mapping.error(key, f"unknown key {key!r} in {what}{did_you_mean(key, allowed)} "
                                     f"(allowed: {', '.join(sorted(allowed))})")


def get_str(mapping: Mapping, key: str, *, required: bool = False, default: str | None = None,
            pattern: re.Pattern[str] | None = None, describe: str = "") -> str | None:
    if key not in mapping:
        if required:
            raise ConfigError(mapping.path, mapping.line, f"missing required key {key!r}", mapping.column)
        return default
    value = mapping[key]
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise mapping.error(key, f"{key!r} must be a string")
    value = str(value)
    if pattern is not None and not pattern.fullmatch(value):
        raise mapping.error(key, f"{key!r} value {value!r} is not allowed: {describe or pattern.pattern}")
    return value


def get_int(mapping: Mapping, key: str, *, default: int | None = None, minimum: int = 0,
            maximum: int = 2**31) -> int | None:
    if key not in mapping:
        return default
    value = mapping[key]
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise mapping.error(key, f"{key!r} must be an integer between {minimum} and {maximum}")
    return value


_YAML11_BOOLS = {"yes", "no", "on", "off", "y", "n"}


def get_bool(mapping: Mapping, key: str, *, default: bool = False) -> bool:
    if key not in mapping:
        return default
    value = mapping[key]
    if not isinstance(value, bool):
        hint = " (yes/no/on/off are text in YAML 1.2)" if str(value).lower() in _YAML11_BOOLS else ""
        raise mapping.error(key, f"{key!r} must be true or false, got {value!r}{hint}")
    return value


def get_str_list(mapping: Mapping, key: str, *, pattern: re.Pattern[str] | None = None,
                 describe: str = "") -> list[str]:
    if key not in mapping:
        return []
    value = mapping[key]
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise mapping.error(key, f"{key!r} must be a list of strings")
    if pattern is not None:
        for item in value:
            if not pattern.fullmatch(item):
                raise mapping.error(key, f"{key!r} item {item!r} is not allowed: {describe or pattern.pattern}")
    return list(value)
