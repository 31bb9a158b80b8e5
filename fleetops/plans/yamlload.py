"""The YAML loader: strict YAML 1.2 (core schema), bounded while it composes, and every value built
as a marks.Mapping / marks.Sequence that remembers its file:line:column.

YAML 1.2, not PyYAML's YAML 1.1: only true/false are booleans (`no`, `yes`, `on`, `off` stay text,
so `groups: [lab, no]` is two groups), integers are decimal unless written 0o/0x (`port: 022` is 22,
never octal 18), and `1:30` or `2026-01-01` stay text (no sexagesimal, no dates).

Bounded: nesting deeper than MAX_DEPTH, an alias that refers to a node still being read (a recursive
structure), or aliases that together expand to more than MAX_ALIAS_NODES values (billion laughs) are
refused while the document is composed, before anything is built, at the file:line:column where the
limit was crossed.

Scanning and parsing are libyaml's C code when PyYAML has it (PyYAML's public CSafeLoader;
docs/perf.md has what it saves); composing, the bounds, resolving and constructing stay the Python
code here, and anything libyaml reads otherwise than PyYAML's Python parser, or refuses, is read by
the pure-Python loader, so values, line:column marks and error messages are the same either way."""

from __future__ import annotations

import re
from typing import Any

import yaml
from yaml.events import AliasEvent, CollectionStartEvent

from .marks import ConfigError, Mapping, Sequence

# values aliases may add to a document, all together (5000 hosts x `<<: *d` fit)
MAX_ALIAS_NODES = 1_000_000
MAX_DEPTH = 64  # nested sequences/mappings; real inventories and playbooks use fewer than 10

# YAML 1.2 core schema (https://yaml.org/spec/1.2.2/#1032-tag-resolution), as PyYAML implicit
# resolvers.
_BOOL_12 = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_NULL_12 = re.compile(r"^(?:~|null|Null|NULL|)$")
_INT_12 = re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$")
_FLOAT_12 = re.compile(
    r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
)


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
    """Gives a loader class the YAML 1.2 core schema: its own implicit resolvers (not YAML 1.1's)
    and the constructors that go with them. Both loaders below take it from here, so they cannot
    drift apart."""
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


class LibyamlDisagrees(Exception):
    """Raised on the C path where libyaml reads a document other than PyYAML's Python parser
    would."""


# Where libyaml accepts what PyYAML's Python scanner refuses (found by differential fuzzing, PyYAML
# 6.0 and libyaml 0.2.5): tabs as separators or inside plain scalars, a byte order mark after the
# start, and a comment right after a block scalar's header (`|#`). Such a text is read by the Python
# loader alone.
_LIBYAML_LENIENT = re.compile(r"\t|.\ufeff|[|>][-+0-9]*#", re.S)


def libyaml_may_differ(text: str) -> bool:
    return _LIBYAML_LENIENT.search(text) is not None


StrictCLoader: type | None = None
if yaml.__with_libyaml__:

    @_core_schema
    class _StrictCLoader(yaml.composer.Composer, yaml.CSafeLoader):
        """StrictLoader reading events from libyaml's C scanner and parser (PyYAML's public
        CSafeLoader). Only the events come from C: PyYAML's Python Composer stands before
        CSafeLoader in the MRO, so `BoundedComposer.compose_node` still sees every event (aliases
        and depth stay bounded, at the same marks), and resolving and constructing are
        StrictLoader's code. The two event-level differences from PyYAML's parser are made up for or
        refused here."""

        def __init__(self, stream: str) -> None:
            yaml.CSafeLoader.__init__(self, stream)
            yaml.composer.Composer.__init__(self)
            self._flow_depth = 0

        def compose_scalar_node(self, anchor: Any) -> yaml.ScalarNode:
            event = self.peek_event()
            if not isinstance(event, yaml.ScalarEvent):  # the composer calls this at a scalar only
                return super().compose_scalar_node(anchor)
            if event.tag == "!":
                # PyYAML's parser marks a `!`-tagged scalar plain-implicit; libyaml does not for an
                # empty one (`key: !`), which would make it '' instead of null.
                event.implicit = (True, False)
            if self._flow_depth and not event.style and ("?" in event.value or not event.value):
                # In a flow collection PyYAML ends a plain scalar at `?` (a key indicator), libyaml
                # reads on; and an empty key there (`{? : v}`) is marked a column further on by
                # libyaml.
                raise LibyamlDisagrees(event.value)
            return super().compose_scalar_node(anchor)

        def compose_sequence_node(self, anchor: Any) -> yaml.SequenceNode:
            flow = bool(getattr(self.peek_event(), "flow_style", None))
            self._flow_depth += flow
            try:
                return super().compose_sequence_node(anchor)
            finally:
                self._flow_depth -= flow

        def compose_mapping_node(self, anchor: Any) -> yaml.MappingNode:
            flow = bool(getattr(self.peek_event(), "flow_style", None))
            self._flow_depth += flow
            try:
                return super().compose_mapping_node(anchor)
            finally:
                self._flow_depth -= flow

    StrictCLoader = _StrictCLoader


def _where(path: str, mark: Any, message: str) -> ConfigError:
    return ConfigError(
        path, mark.line + 1 if mark else None, message, mark.column + 1 if mark else None
    )


def _expanded_size(node: yaml.Node, sizes: dict[int, int]) -> int:
    """How many values `node` becomes once every alias in it is expanded (memoized per node,
    iterative)."""
    stack: list[tuple[yaml.Node, bool]] = [(node, False)]
    while stack:
        current, children_done = stack.pop()
        if id(current) in sizes:
            continue
        if isinstance(current, yaml.ScalarNode):
            sizes[id(current)] = 1
            continue
        kids = (
            [k for pair in current.value for k in pair]
            if isinstance(current, yaml.MappingNode)
            else list(current.value)
        )
        if children_done:
            sizes[id(current)] = min(1 + sum(sizes[id(k)] for k in kids), 1 << 62)
        else:
            stack.append((current, True))
            stack.extend((k, False) for k in kids if id(k) not in sizes)
    return sizes[id(node)]


class BoundedComposer:
    """Mixed into the Loader: counts what aliases add and how deep collections nest, while
    composing."""

    yaml_path = "?"

    def compose_node(self, parent: Any, index: Any) -> Any:
        state = self.__dict__.setdefault(
            "_bounds", {"open": set(), "sizes": {}, "added": 0, "depth": 0}
        )
        event = self.peek_event()  # type: ignore[attr-defined]
        if isinstance(event, AliasEvent):
            self._count_alias(state, event)
            return super().compose_node(parent, index)  # type: ignore[misc]
        if not isinstance(event, CollectionStartEvent):
            return super().compose_node(parent, index)  # type: ignore[misc]
        if state["depth"] >= MAX_DEPTH:
            raise _where(
                self.yaml_path,
                event.start_mark,
                f"values nested more than {MAX_DEPTH} levels deep; refusing the document",
            )
        state["depth"] += 1
        if event.anchor is not None:
            state["open"].add(event.anchor)
        try:
            return super().compose_node(parent, index)  # type: ignore[misc]
        finally:
            state["depth"] -= 1
            state["open"].discard(event.anchor)

    def _count_alias(self, state: dict[str, Any], event: AliasEvent) -> None:
        target = self.anchors.get(event.anchor)  # type: ignore[attr-defined]
        if target is None:  # an undefined alias: PyYAML's own error, with its mark
            return
        if event.anchor in state["open"]:  # PyYAML registers an anchor before reading its children
            raise _where(
                self.yaml_path,
                event.start_mark,
                f"alias *{event.anchor} refers to the node it is part of (a recursive "
                "structure); recursive aliases are not allowed",
            )
        state["added"] += _expanded_size(target, state["sizes"])
        if state["added"] > MAX_ALIAS_NODES:
            raise _where(
                self.yaml_path,
                event.start_mark,
                f"YAML aliases expand to more than {MAX_ALIAS_NODES} values (at alias "
                f"*{event.anchor}); refusing the document (write the values out, or use fewer "
                "nested aliases)",
            )


MERGE_TAG = "tag:yaml.org,2002:merge"
_NODE_KINDS = {
    yaml.ScalarNode: "scalar",
    yaml.SequenceNode: "sequence",
    yaml.MappingNode: "mapping",
}


def _short_tag(tag: str) -> str:
    return tag.replace("tag:yaml.org,2002:", "!!")


def _kind_of(node: yaml.Node) -> str:
    return f"a {_NODE_KINDS.get(type(node), 'node')}"


def _at(path: str, node: yaml.Node, message: str) -> ConfigError:
    return ConfigError(path, node.start_mark.line + 1, message, node.start_mark.column + 1)


class MarkedConstructor:
    """Mixed into the Loader: a tag that does not fit its value (`!!int x`, `!!pairs {a: 1}`) makes
    PyYAML's constructors raise plain Python errors without a mark; this names the node's own
    file:line:column."""

    yaml_path = "?"

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)  # type: ignore[misc]
        except (ConfigError, yaml.YAMLError, RecursionError):
            raise
        except (ValueError, TypeError, AttributeError, KeyError, IndexError, OverflowError) as exc:
            raise _at(
                self.yaml_path, node, f"invalid YAML value for {_short_tag(node.tag)}: {exc}"
            ) from None


def _merge_parts(loader: Any, value_node: yaml.Node) -> list[Mapping]:
    """The mappings one `<<` key merges in, each constructed as a mapping of its own (its own
    merges, duplicates and marks settled first), in the order written."""
    sources: list[Mapping] = []
    for part in value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]:
        if not isinstance(part, yaml.MappingNode):
            raise _at(
                loader.yaml_path,
                part,
                "invalid YAML: a merge key (<<) takes a mapping or a list of "
                f"mappings, not {_kind_of(part)}",
            )
        sources.append(loader.construct_object(part, deep=True))
    return sources


def _add_own(
    loader: Any,
    own: dict[Any, tuple[yaml.Node, tuple[int, int]]],
    key_node: yaml.Node,
    value_node: yaml.Node,
) -> None:
    """A key written in the mapping itself: own[key] = (its value's node, (line, column) of the
    key)."""
    if key_node.tag == "tag:yaml.org,2002:value":
        key_node.tag = "tag:yaml.org,2002:str"  # as PyYAML's flatten_mapping does
    key = loader.construct_object(key_node, deep=True)
    line, column = key_node.start_mark.line + 1, key_node.start_mark.column + 1
    try:
        hash(key)
    except TypeError:
        raise ConfigError(loader.yaml_path, line, "mapping key must be a scalar", column) from None
    if key in own:
        raise ConfigError(loader.yaml_path, line, f"duplicate key {key!r}", column)
    own[key] = (value_node, (line, column))


def construct_mapping(loader: Any, node: yaml.MappingNode) -> Mapping:
    """YAML's merge rule, done here rather than by PyYAML's flatten_mapping (whose order lets a
    later merge source win): a mapping's own keys win over merged ones, earlier merge sources over
    later ones, and only a key written twice by hand is a duplicate."""
    if not isinstance(node, yaml.MappingNode):
        raise _at(
            loader.yaml_path,
            node,
            f"invalid YAML value: {_short_tag(node.tag)} needs a mapping, found {_kind_of(node)}",
        )
    sources: list[Mapping] = []
    own: dict[Any, tuple[yaml.Node, tuple[int, int]]] = {}
    # in document order: the first problem written is the one named
    for key_node, value_node in node.value:
        if key_node.tag == MERGE_TAG:
            sources += _merge_parts(loader, value_node)
        else:
            _add_own(loader, own, key_node, value_node)
    result = Mapping()
    result.path, result.line, result.column = (
        loader.yaml_path,
        node.start_mark.line + 1,
        node.start_mark.column + 1,
    )
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


def construct_sequence(loader: Any, node: yaml.SequenceNode) -> Sequence:
    if not isinstance(node, yaml.SequenceNode):
        raise _at(
            loader.yaml_path,
            node,
            f"invalid YAML value: {_short_tag(node.tag)} needs a sequence, found {_kind_of(node)}",
        )
    result = Sequence(loader.construct_object(child, deep=True) for child in node.value)
    result.path, result.line, result.column = (
        loader.yaml_path,
        node.start_mark.line + 1,
        node.start_mark.column + 1,
    )
    result.item_lines = [child.start_mark.line + 1 for child in node.value]
    result.item_cols = [child.start_mark.column + 1 for child in node.value]
    return result


def make_loader(path: str, base: type = StrictLoader) -> type[yaml.SafeLoader]:
    """A loader class for one file: `base` (StrictLoader, or StrictCLoader for libyaml's events)
    with the bounds, the marks and the marked mapping and sequence constructors."""

    # `base` is a class chosen at run time (StrictLoader or StrictCLoader): mypy cannot take a
    # variable as a base.
    class Loader(BoundedComposer, MarkedConstructor, base):  # type: ignore[misc]
        yaml_path = path

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, construct_sequence)
    return Loader


def compose_and_construct(text: str, path: str) -> Any:
    """The document's value: libyaml's events where they can be trusted, else (and after any failure
    there) PyYAML's pure-Python loader, whose values, marks and messages are the reference."""
    if StrictCLoader is not None and not libyaml_may_differ(text):
        try:
            return yaml.load(text, Loader=make_loader(path, StrictCLoader))  # SafeConstructor
        except Exception:  # the pure-Python loader below decides and words the error
            # libyaml words its errors differently from PyYAML's Python scanner and parser, marks
            # some of them elsewhere, and refuses a few documents PyYAML reads (`%YAML 1.3`, a
            # "\ud800" escape); LibyamlDisagrees lands here too, for events PyYAML's parser would
            # not have produced. The messages an operator sees (and the tests pin) are the Python
            # loader's, so whatever fails here is read again by the pure-Python loader: it raises
            # its own error or, where only libyaml refused, its result stands. Errors are rare; only
            # they pay for the slow path.
            pass
    return yaml.load(text, Loader=make_loader(path))  # SafeLoader subclass
