"""The client's address, as far as the server may believe it.

Behind a reverse proxy every connection comes from the proxy. The proxy
names the client in ``X-Forwarded-For``, but any client can send that header
too. So it is read only when the connection comes from an address in
``trusted_proxies``, and then from the right: each proxy appends the address
it saw, so the first address from the right that is not a trusted proxy is
the client. From anyone else the header is ignored and the connection's
address is the client's. The standard ``Forwarded`` header is never read:
common proxies (nginx's example included) pass a client's ``Forwarded``
through untouched while they append to ``X-Forwarded-For``, so believing it
would let the client choose its address.

The sign-in limits, the request log and any rule by address use
:func:`client_address`.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(value: str) -> tuple[Network, ...]:
    """The networks of a ``trusted_proxies`` setting (comma-separated
    addresses or CIDR networks); ``ValueError`` names a bad entry."""
    found = []
    for entry in (e.strip() for e in value.split(",")):
        if not entry:
            continue
        try:
            found.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            raise ValueError(
                f"{entry!r} is not an IP address or network (e.g. 10.0.0.5 or 10.0.0.0/24)"
            ) from None
    return tuple(found)


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    text = text.strip().strip('"')
    if text.startswith("["):  # [v6]:port
        text = text[1 : text.find("]")] if "]" in text else ""
    elif text.count(":") == 1:  # v4:port
        text = text.split(":", 1)[0]
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _trusted(address: str, networks: Sequence[Network]) -> bool:
    parsed = _address(address)
    return parsed is not None and any(parsed in network for network in networks)


def forwarded_chain(x_forwarded_for: Sequence[str]) -> list[str]:
    """The addresses a request passed through, oldest first, from every
    ``X-Forwarded-For`` line (a proxy may add a line of its own instead of
    appending to the client's)."""
    return [part.strip() for line in x_forwarded_for for part in line.split(",")]


def client_address(
    peer: str | None, x_forwarded_for: Sequence[str], trusted: Sequence[Network]
) -> str:
    """The client's address: ``peer`` (the connection's), unless ``peer``
    is a trusted proxy, in which case the forwarded chain is walked from
    the right past every trusted proxy. An address that does not parse ends
    the walk (a proxy would not have written it): the last trusted hop is
    then the client as far as the server can tell."""
    current = peer or "unknown"
    if not trusted or not _trusted(current, trusted):
        return current
    for hop in reversed(forwarded_chain(x_forwarded_for)):
        parsed = _address(hop)
        if parsed is None:
            return current
        current = str(parsed)
        if not any(parsed in network for network in trusted):
            return current
    return current
