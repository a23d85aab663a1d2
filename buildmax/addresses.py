"""The client's address, as far as the server may believe it.

Behind a reverse proxy every connection comes from the proxy. The proxy
names the client in ``X-Forwarded-For`` (or the standard ``Forwarded``
header), but any client can send those headers too. So they are read only
when the connection comes from an address in ``trusted_proxies``, and then
from the right: each proxy appends the address it saw, so the first address
from the right that is not a trusted proxy is the client. From anyone else
the headers are ignored and the connection's address is the client's.

The sign-in limits, the request log and any rule by address use
:func:`client_address`.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

#: One ``for=`` parameter of a ``Forwarded`` element (RFC 7239), quoted or not.
_FORWARDED_FOR = re.compile(r'(?i)(?:^|;)\s*for\s*=\s*("[^"]*"|[^;,\s]*)')


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


def forwarded_chain(forwarded: str, x_forwarded_for: str) -> list[str]:
    """The addresses a request passed through, oldest first, from
    ``Forwarded`` (preferred) or ``X-Forwarded-For``."""
    if forwarded.strip():
        chain = []
        for element in forwarded.split(","):
            match = _FORWARDED_FOR.search(element)
            chain.append(match.group(1).strip('"') if match else "")
        return chain
    return [part.strip() for part in x_forwarded_for.split(",")] if x_forwarded_for else []


def client_address(
    peer: str | None,
    forwarded: str,
    x_forwarded_for: str,
    trusted: Sequence[Network],
) -> str:
    """The client's address: ``peer`` (the connection's), unless ``peer``
    is a trusted proxy, in which case the forwarded chain is walked from
    the right past every trusted proxy. An address that does not parse ends
    the walk (a proxy would not have written it): the last trusted hop is
    then the client as far as the server can tell."""
    current = peer or "unknown"
    if not trusted or not _trusted(current, trusted):
        return current
    for hop in reversed(forwarded_chain(forwarded, x_forwarded_for)):
        parsed = _address(hop)
        if parsed is None:
            return current
        current = str(parsed)
        if not any(parsed in network for network in trusted):
            return current
    return current
