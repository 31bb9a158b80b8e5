"""Building a host's Connection (not opened) and its jump hops: the inventory's jump, ssh_config's
ProxyJump chains with loops refused, every hop with the strict host key check; walking the hops;
closing them."""

from __future__ import annotations

import getpass
import os
import socket
from collections.abc import Iterator
from typing import Any

import paramiko
from fabric import Connection
from paramiko.pkey import PublicBlob  # paramiko exports it at the top too; its stubs do not

from ..plans.inventory import Host, Inventory, UnknownHost, plain_host, split_target
from ..plans.jumphost import jump_of
from .connector import TransportError
from .fabconfig import fabric_config, host_resolution, plain_keys, typed_passphrase
from .hostkeys import StrictClient, known_hosts_files, strict_client
from .keys import agent_key_for, login_key, missing_identity, unopenable
from .tuning import FleetConnection, FleetTransport, JumpTransport

# fabric_connection: the gateway comes from the host's own entry (inventory, ssh_config)
_OWN = object()
MAX_JUMPS = 8  # ProxyJump hops one connection may go through, all chains together


def fabric_connection(
    host: Host,
    inventory: Inventory | None,
    depth: int = 0,
    gateway: Any = _OWN,
    trail: tuple[tuple[str, int, str], ...] = (),
) -> Connection:
    """The Connection for `host` (not opened). `gateway`: the hop it goes through when a ProxyJump
    list names the one before it; `trail`: the endpoints being reached through this one (a loop back
    to one is refused)."""
    if host.example:
        raise TransportError(
            "refused",
            f"{host.name} comes from an example inventory ({host.source}); copy it to "
            "your own hosts/*.yaml to use it",
        )
    config = fabric_config()
    if gateway is _OWN:
        gateway = _own_gateway(host, inventory, depth, trail)
    passphrase = host.identity_passphrase or None
    if not passphrase and host.identity_file:
        passphrase = typed_passphrase(host.identity_file)
    connect_kwargs = _connect_kwargs(host, depth, passphrase)
    settings = _resolution(host)
    if gateway is None and not host.jump:
        gateway = _proxy_command(settings)
    try:
        _key_kwargs(host, settings, connect_kwargs, passphrase)
        hostname = str(settings.get("hostname") or host.address)
        cxn = _Connection(
            hostname,
            user=str(settings["user"]),
            port=int(settings["port"]),
            connect_timeout=host.connect_timeout,
            connect_kwargs=connect_kwargs,
            gateway=gateway,
            config=config,
        )
    # e.g. a Port in ssh_config that is not a number
    except (ValueError, TypeError, KeyError, UnknownHost) as exc:
        raise TransportError(
            "refused", f"{host.name}: cannot use its ssh_config entry: {exc}"
        ) from None
    cxn.ssh_config = settings
    # as ssh -G gave it: Fabric's empty lookup would expand a literal `%h` in it again
    cxn.host = hostname
    cxn.original_host = split_target(host.name)[1] if host.plain else host.address
    if host.plain:
        _ssh_config_keys(cxn)
    cxn.client = strict_client(known_hosts_files(host, cxn))
    cxn.fleetops_name = host.name
    # a refused jump host's own known_hosts, for the error's next step (errors.py)
    cxn.fleetops_host = host
    _strict_gateways(cxn)
    return cxn


def _own_gateway(
    host: Host, inventory: Inventory | None, depth: int, trail: tuple[tuple[str, int, str], ...]
) -> Any:
    """The hop in front of `host`: its inventory jump host's connection, else ssh_config's."""
    if not host.jump or host.plain:
        return _ssh_config_jump(host, inventory, depth, trail)
    if depth > 3:
        raise TransportError("unreachable", f"jump chain too long at {host.name}")
    try:
        # Through the inventory: names, user@name:port, ssh_config aliases; a typo is refused
        # with a "did you mean" instead of becoming a DNS lookup.
        jump = jump_of(host, inventory)
    except UnknownHost as exc:
        raise TransportError("refused", f"{host.name}: its jump host: {exc}") from None
    return fabric_connection(jump, inventory, depth + 1)


def _connect_kwargs(host: Host, depth: int, passphrase: str | None) -> dict:
    """paramiko's connect() arguments: the timeouts, the transport, the inventory's key."""
    connect_kwargs: dict = {
        "banner_timeout": host.connect_timeout,
        "auth_timeout": host.connect_timeout,
        "transport_factory": JumpTransport if depth else FleetTransport,
    }
    if host.identity_file:
        # The inventory's key only (IdentitiesOnly): ssh-agent's copy of it if the agent holds it,
        # else the file.
        connect_kwargs.update(
            pkey=login_key(host.name, host.identity_file, passphrase),
            look_for_keys=False,
            allow_agent=False,
        )
    if passphrase:
        connect_kwargs["passphrase"] = passphrase
    return connect_kwargs


def _key_kwargs(host: Host, settings: dict, connect_kwargs: dict, passphrase: str | None) -> None:
    """The keys a connection offers besides the inventory's: -i and IdentityFile for a -H word
    outside the inventory (ssh -G decided IdentityFile with the -H word's user and port, as `ssh
    -l`/`-p` do), IdentityFile for an inventory host that names no key; a CertificateFile joined to
    the key it certifies."""
    if host.plain:
        keys = plain_keys()
        passphrase = _plain_keys_passphrase(host, keys, passphrase)
        if passphrase:
            connect_kwargs["passphrase"] = passphrase
        found = [*keys, *(settings.get("identityfile") or [])]
        if found:
            connect_kwargs["key_filename"] = found
    elif not host.identity_file and settings.get("identityfile"):
        connect_kwargs["key_filename"] = list(settings["identityfile"])
    certified = _certified_key(host, settings, connect_kwargs.get("passphrase"))
    if certified is not None:
        connect_kwargs["pkey"] = certified


def _certified_key(host: Host, settings: dict, passphrase: str | None) -> paramiko.PKey | None:
    """ssh_config's CertificateFile joined to the identity key it certifies (the inventory's key,
    else IdentityFile), as ssh offers it: None when no certificate file is there or none fits a key
    that opens. A key of its own, so a certificate never sticks to the key cache other hosts
    share."""
    certificates = [c for c in settings.get("certificatefile") or [] if os.path.isfile(c)]
    if not certificates:
        return None
    identities = (
        [host.identity_file]
        if host.identity_file and not host.plain
        else settings.get("identityfile") or []
    )
    for identity in identities:
        path = os.path.expanduser(identity)
        if not os.path.isfile(path):
            continue
        try:
            # from_path's password is a str (paramiko's own signature); types-paramiko says bytes.
            secret = passphrase or typed_passphrase(path)
            key = paramiko.PKey.from_path(path, secret)  # type: ignore[arg-type]
        # not opened: said where it is used
        except (paramiko.SSHException, OSError, ValueError, TypeError):
            continue
        for certificate in certificates:
            try:
                if _certifies(PublicBlob.from_file(certificate), key):
                    key.load_certificate(certificate)
                    return key
            # not a certificate ssh could use either
            except (paramiko.SSHException, OSError, ValueError):
                continue
    return None


def _certifies(blob: PublicBlob, key: paramiko.PKey) -> bool:
    """Whether the certificate is for this key: its key fields, after the type and nonce, are the
    public key's after its type (paramiko only compares the key types)."""
    cert, public = paramiko.Message(blob.key_blob), paramiko.Message(key.asbytes())
    cert.get_text(), cert.get_binary(), public.get_text()
    fields = public.get_remainder()
    return bool(fields) and cert.get_remainder().startswith(fields)


def _plain_keys_passphrase(host: Host, keys: tuple[str, ...], passphrase: str | None) -> str | None:
    """-i keys for a host outside the inventory: each there and opening with what was typed for it
    (raises the TransportError saying why not). paramiko offers its one passphrase to every file,
    and a file that is not encrypted ignores it: the passphrase of an encrypted one, if any."""
    for key in keys:
        typed = passphrase or typed_passphrase(key)
        refused = missing_identity(host.name, key, "fab -i") or unopenable(host.name, key, typed)
        if refused is not None:
            raise refused
    return passphrase or next(filter(None, (typed_passphrase(k) for k in keys)), None)


def _ssh_config_keys(cxn: Connection) -> None:
    """ssh_config's IdentityFile and IdentitiesOnly as OpenSSH reads them (Fabric does not): a
    missing IdentityFile is skipped; with IdentitiesOnly yes only the IdentityFile and -i keys are
    offered, each through ssh-agent when the agent holds it, and the agent's other keys and
    ~/.ssh/id_* are not (a key sshd would take under another name must not log in, and many agent
    keys can use up sshd's MaxAuthTries before the right one)."""
    files = cxn.connect_kwargs.get("key_filename") or []
    files = [files] if isinstance(files, str) else list(files)
    # an IdentityFile that is not there is passed over, as OpenSSH does (a -i one was refused
    # before)
    if files:
        cxn.connect_kwargs["key_filename"] = [
            f for f in files if os.path.exists(os.path.expanduser(f))
        ]
    typed = next(
        filter(None, (typed_passphrase(f) for f in cxn.connect_kwargs.get("key_filename") or [])),
        None,
    )
    # --prompt-for-passphrase asked for this IdentityFile
    if typed and not cxn.connect_kwargs.get("passphrase"):
        cxn.connect_kwargs["passphrase"] = typed
    if str(cxn.ssh_config.get("identitiesonly", "")).lower() != "yes":
        return
    cxn.connect_kwargs.update(allow_agent=False, look_for_keys=False)
    if getattr(cxn.connect_kwargs.get("pkey"), "public_blob", None) is not None:
        return  # a key with its CertificateFile: offered as it is
    for path in files:
        key = agent_key_for(os.path.expanduser(path))
        if key is not None:  # offered first, before paramiko opens the files themselves
            cxn.connect_kwargs["pkey"] = key
            return


def _resolution(host: Host) -> dict:
    """The host's settings as `ssh -G` gives them (fabconfig.resolve), User and Port defaulted as
    ssh does."""
    settings = dict(host_resolution(host))
    settings.setdefault("user", getpass.getuser())
    settings.setdefault("port", "22")
    return settings


def _proxy_command(settings: dict) -> str | None:
    """ssh_config's ProxyCommand, when no ProxyJump came before it (ssh keeps the first of the two
    it reads)."""
    if settings.get("proxyjump"):
        return None
    command = str(settings.get("proxycommand") or "").strip()
    return command if command and command.lower() != "none" else None


class _Connection(FleetConnection):
    """A ProxyCommand gateway here is the command as ssh would run it, tokens already expanded from
    the host's resolution: paramiko runs it as it is (Fabric's own reading would expand %p as
    22)."""

    def open_gateway(self) -> Any:
        if isinstance(self.gateway, str):
            return paramiko.ProxyCommand(self.gateway)
        return super().open_gateway()


def _endpoint(word: str) -> tuple[str, int, str]:
    """(HostName, Port, User) that a connection to the -H-style word `user@name:port` would use."""
    settings = _resolution(plain_host(word))
    try:
        real_port = int(settings["port"])
    except ValueError:
        real_port = 22  # reported where the connection is made (a Port that is not a number)
    return str(settings.get("hostname") or word), real_port, str(settings["user"])


def _ssh_config_jump(
    host: Host, inventory: Inventory | None, depth: int, trail: tuple[tuple[str, int, str], ...]
) -> Any:
    """The gateway ssh_config's ProxyJump gives a connection to `host`, built as OpenSSH builds it,
    or None when it names none (Fabric then applies a ProxyCommand, if any). For `ProxyJump h1,h2`:
    h1 is reached directly (or through its own ProxyJump), h2 through h1, the host through h2. Every
    hop gets the strict host key check. Refused, never silently dropped or recursed into: a hop that
    is the host itself or a connection being made through it (a loop: the same HostName, Port and
    User, as OpenSSH's "jumphost loop"), a chain of more than MAX_JUMPS hops, a hop that is not
    user@name:port."""
    settings = _resolution(host)
    raw = str(settings.get("proxyjump") or "").strip()
    if not raw or raw.lower() == "none":
        return None
    here = (
        str(settings.get("hostname") or host.address),
        int(settings["port"]),
        str(settings["user"]),
    )
    trail = (*trail, here)
    words = [w.strip() for w in raw.split(",") if w.strip()]
    if len(trail) + len(words) > MAX_JUMPS + 1:
        raise TransportError(
            "refused",
            f"{host.name}: its ssh_config ProxyJump chain is longer than {MAX_JUMPS} "
            f"hops (at {raw!r}); a loop? Fix ProxyJump in ssh_config",
        )
    previous: Any = _OWN
    for word in words:
        try:
            hop = plain_host(word)
        except UnknownHost as exc:
            raise TransportError(
                "refused", f"{host.name}: its ssh_config ProxyJump {raw!r}: {exc}"
            ) from None
        end = _endpoint(word)
        if end in trail:
            path = " -> ".join(f"{u}@{h}:{p}" for h, p, u in (*trail, end))
            itself = "itself" if end == here else "a host that is reached through it"
            raise TransportError(
                "refused",
                f"{host.name}: ssh_config ProxyJump loop: {path} (the jump host "
                f"{word!r} is {itself}); fix ProxyJump in ssh_config (`ProxyJump none` "
                "in the jump host's own entry ends a chain)",
            )
        previous = fabric_connection(hop, inventory, depth + 1, gateway=previous, trail=trail)
    return previous


def each_hop(cxn: Connection) -> Iterator[Connection]:
    """The connection, then each jump host it goes through, nearest first (a ProxyCommand gateway
    ends it)."""
    hop: object = cxn
    while isinstance(hop, Connection):
        yield hop
        hop = hop.gateway


def transport_of(hop: Connection) -> paramiko.Transport | None:
    return hop.client.get_transport() if hop.client is not None else None


def _strict_gateways(cxn: Connection) -> None:
    """A ProxyJump from ssh_config (a host outside the inventory) makes Fabric build the jump
    Connections itself, with its auto-add client: give each hop the strict client, its known_hosts
    from its own entry."""
    for hop in list(each_hop(cxn))[1:]:
        if not isinstance(hop.client, StrictClient):  # not one of ours
            hop.client = strict_client(known_hosts_files(plain_host(hop.original_host), hop))


# paramiko's transport thread wakes every 0.1 s on a quiet connection to look for our own close, a
# keepalive or a rekey. A fleet run holds every host's connection open while the others work, and at
# N=128 those wakeups cost ~0.5 ms of client CPU per host per second held. Once connected, once a
# second is enough: data, a peer's close or a reset still wake recv at once; only our own close is
# noticed up to a second later, by a daemon thread that has nothing left to do.
IDLE_CHECK_SECONDS = 1.0


def slow_idle_checks(cxn: Connection) -> None:
    for hop in each_hop(cxn):
        transport = transport_of(hop)
        if transport is not None and transport.sock is not None:
            transport.sock.settimeout(IDLE_CHECK_SECONDS)


def close_quietly(cxn: Connection) -> None:
    """Close each hop's SFTP session while the connection still carries its goodbye, then hang up,
    then let Fabric release the rest. Closing never raises: the node may already be gone, and a
    close that fails must not turn a finished run into a traceback (SFTP's close after the hang-up
    raised EOFError, found by CI).

    Hanging up is a shutdown() of each hop's socket: paramiko's close() only closes the descriptor,
    and while its transport thread sits in recv() the kernel keeps the connection open until that
    recv times out (up to IDLE_CHECK_SECONDS, during which the node's session lives on). shutdown()
    ends the recv and sends the FIN at once."""
    hops = list(each_hop(cxn))
    for hop in hops:
        # Fabric's close() closes it again: a no-op by then
        sftp = getattr(hop, "fleetops_sftp", None)
        if sftp is not None:
            try:
                sftp.close()
            except (OSError, EOFError, paramiko.SSHException):
                pass  # the connection is gone already: nothing left to say goodbye on
    # A hop reached through a jump host rides a channel of that host's connection: closed first,
    # nearest first, while the connection under it still carries its goodbye. Left to its own
    # thread after the jump host's socket is gone, its last close wrote on that dead connection and
    # the thread's exception reached the terminal as a traceback (found by CI).
    for hop in hops:
        transport = transport_of(hop)
        if transport is not None and not isinstance(transport.sock, socket.socket):
            try:
                transport.close()
            except (OSError, EOFError, paramiko.SSHException):
                pass  # the jump host's connection is gone already
    for hop in hops:
        sock = getattr(transport_of(hop), "sock", None)
        if isinstance(sock, socket.socket):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already gone
    try:
        cxn.close()
    except (OSError, EOFError, paramiko.SSHException):
        try:  # Fabric's close() stopped at its SFTP session: release the SSH client still
            cxn.client.close()
        except (OSError, EOFError, paramiko.SSHException, AttributeError):
            pass
