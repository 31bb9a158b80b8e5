"""How an op or a role of the node agent is declared: by the module that implements it, with the
decorators below. The declaration is checked against the wire contract (protocol.py) as the module
is imported, so an op the client does not know, or one whose read-only promise differs from what the
client pipelines on, never serves a request.

Which module implements which op is said once, in the agent's manifest (remote_scripts/ops.py), with
imports the import contracts can see; it imports a module only when a request needs it, so an agent
start costs no more than the ops it serves. Stdlib only, and cheap to import: no dataclasses, no
typing at run time."""

from __future__ import annotations

from .protocol import OPS as OP_NAMES
from .protocol import READ_ONLY_OPS

# typing.TYPE_CHECKING without importing typing: the agent's start-up imports only what it runs
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    Handler = Callable[[dict], dict]


class Op:
    """An op as its module declares it: `writes` is its promise to the client
    (protocol.READ_ONLY_OPS may go ahead of the step before it); `forks(request)` says whether the
    request imports the node's third-party packages, which then happens in a child so the agent
    never holds them."""

    __slots__ = ("name", "handler", "writes", "forks")

    def __init__(
        self, name: str, handler: Handler, writes: bool, forks: Callable[[dict], bool]
    ) -> None:
        self.name, self.handler, self.writes, self.forks = name, handler, writes, forks

    def __repr__(self) -> str:
        return (
            f"Op({self.name!r}, {self.handler.__module__}.{self.handler.__name__}, "
            f"writes={self.writes})"
        )


OPS: dict[str, Op] = {}  # filled as the op modules are imported
ROLES: dict[str, Callable[..., int]] = {}  # `python zip ROLE ARGS...`: the agent's other processes


def never(request: dict) -> bool:
    return False


def always(request: dict) -> bool:
    return True


def node_op(
    name: str, *, writes: bool, forks: Callable[[dict], bool] = never
) -> Callable[[Handler], Handler]:
    """Declare `handler(request) -> answer` as the agent's op `name`."""
    if name not in OP_NAMES:
        raise ValueError(f"op {name!r} is not in protocol.OPS: the client would never send it")
    if writes == (name in READ_ONLY_OPS):
        said = "writes" if writes else "reads only"
        raise ValueError(
            f"op {name!r} {said}, but protocol.READ_ONLY_OPS says otherwise: make them agree"
        )

    def register(handler: Handler) -> Handler:
        known = OPS.get(name)
        if known is not None and known.handler.__module__ != handler.__module__:
            raise ValueError(f"op {name!r} is declared twice: {known!r} and {handler.__module__}")
        OPS[name] = Op(name, handler, writes, forks)
        return handler

    return register


def node_role(name: str) -> Callable[[Callable[..., int]], Callable[..., int]]:
    """Declare `main(*argv_words) -> exit code` as what `python zip NAME ARGS...` runs."""

    def register(main: Callable[..., int]) -> Callable[..., int]:
        ROLES[name] = main
        return main

    return register
