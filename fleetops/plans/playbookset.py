"""A playbook set: a directory of playbooks, one per combination of versions (speculators 0.3.0 on
vLLM 0.16, on vLLM 0.17, ...). Each host gets the one whose `requires` its installed versions
satisfy; a host that no playbook fits is refused with the versions it has and the pins of the
nearest playbook. Pure: the versions come from the node (the run asks for them on the host's
connection), nothing here connects or prints."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

from .playbook import Playbook, load_playbook
from .versions import parse_pin, verdict
from .yamlsrc import ConfigError

SUFFIXES = (".yaml", ".yml")


def satisfied(requirement: str, version: str | None, allow_prereleases: bool = False) -> bool:
    """Whether an installed version (None: not installed) meets one `requires:` entry, by PEP 440:
    the same judgement as the `requires` check's (plans/versions.py)."""
    return verdict(parse_pin(requirement), version, allow_prereleases)[0]


def _fits(book: Playbook, requirement: str, installed: dict[str, str | None]) -> bool:
    return satisfied(requirement, installed.get(package_of(requirement)), book.allow_prereleases)


def package_of(requirement: str) -> str:
    return parse_pin(requirement).package


@dataclass
class PlaybookSet:
    path: Path
    books: list[Playbook]
    # host -> its installed versions of `packages`, asked once per run (every task of the chain uses
    # them)
    installed: dict[str, dict[str, str | None]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def packages(self) -> list[str]:
        return list(dict.fromkeys(package_of(r) for b in self.books for r in b.requires))

    def fitting(self, installed: dict[str, str | None]) -> list[Playbook]:
        return [b for b in self.books if all(_fits(b, r, installed) for r in b.requires)]

    def nearest(self, installed: dict[str, str | None]) -> Playbook:
        """The playbook closest to fitting: the most requirements met, then the nearest pinned
        release."""

        def score(book: Playbook) -> tuple[int, int, str]:
            met = sum(_fits(book, r, installed) for r in book.requires)
            return (
                -met,
                sum(_distance(r, installed.get(package_of(r))) for r in book.requires),
                book.name,
            )

        return min(self.books, key=score)

    def refusal(self, host: str, installed: dict[str, str | None]) -> str:
        have = ", ".join(f"{p} {v or 'not installed'}" for p, v in installed.items())
        near = self.nearest(installed)
        return (
            f"no playbook in {self.path.name}/ fits {host}: it has {have}; the nearest, "
            f"{near.name}, requires {', '.join(near.requires)}. Next: author one for these "
            "versions (docs/runbooks/new-version-landed.md: rebase, then capture), or put "
            f"{host} on versions a playbook supports"
        )


def _release(version: str) -> tuple[int, ...]:
    out = []
    for part in version.split("+")[0].split("."):
        if not part.isdigit():
            break
        out.append(int(part))
    return tuple(out)


def _distance(requirement: str, version: str | None) -> int:
    """How far an installed version is from a requirement's first pinned release (0 when met or not
    pinned)."""
    if version is None:
        return 1 << 20
    if satisfied(requirement, version):
        return 0
    pinned = sorted(parse_pin(requirement).specifier, key=str)
    want = _release(pinned[0].version.rstrip(".*")) if pinned else ()
    have = _release(version)
    n = max(len(want), len(have), 1)
    a, b = want + (0,) * (n - len(want)), have + (0,) * (n - len(have))
    return sum(abs(x - y) * (1000 ** (n - i)) for i, (x, y) in enumerate(zip(a, b)))


def load_set(path: Path) -> PlaybookSet:
    """Every playbook file directly in `path` (a ConfigError names the first that does not load);
    two playbooks of one name, or none at all, are refused."""
    files = sorted(p for p in path.iterdir() if p.suffix in SUFFIXES and p.is_file())
    if not files:
        raise ConfigError(path, None, "a playbook set with no playbook in it (*.yaml)")
    books = [load_playbook(p) for p in files]
    seen: dict[str, Path] = {}
    for book in books:
        if book.name in seen:
            raise ConfigError(
                book.path,
                None,
                f"playbook name {book.name!r} is also {seen[book.name].name}'s: "
                "each playbook of a set needs its own name",
            )
        seen[book.name] = book.path
    return PlaybookSet(path, books)
