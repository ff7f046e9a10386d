"""What both processes say of a server's URL: whether it sends the user's code unencrypted to another machine (the
language server's ``openaiUrl`` warns, the engine's ``--vllm-url`` refuses without ``--vllm-plain-http``), and the
URL as a log or a message may show it (a password in it redacted). Standard library only."""

from __future__ import annotations

import ipaddress
import urllib.parse


def plain_http_elsewhere(url: str) -> bool:
    """Whether ``url`` sends text unencrypted to another machine (http://, not to a loopback address)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http":
        return False
    host = parts.hostname or ""
    if host == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True


def redacted(url: str) -> str:
    """``url`` with the password in it (``http://user:secret@host``) replaced by ``***``: what a log may show."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))
