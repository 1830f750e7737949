"""Who may call the service, and how a refusal looks (one sentence, OpenAI's error shape, a 4xx)."""

from __future__ import annotations

import hmac
import ipaddress
from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import JSONResponse


@dataclass(frozen=True)
class AccessSettings:
    api_key: str | None = None          # None: no key needed (allowed on loopback only, see `check_binding`)
    cors_origins: tuple[str, ...] = ()  # empty: no CORS headers at all


class Refusal(Exception):
    """A request the service will not do; answered with `status` and `message`, the service goes on."""

    def __init__(self, status: int, message: str, code: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


def error_response(status: int, message: str, code: str = "invalid_request_error",
                   headers: dict[str, str] | None = None) -> JSONResponse:
    """OpenAI's error body, so its clients raise their usual exceptions with our sentence."""
    return JSONResponse(status_code=status, content={"error": {"message": message, "type": code, "code": status}},
                        headers=headers)


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_binding(host: str, api_key: str | None) -> str | None:
    """What is wrong with serving on `host` (a sentence), or None. Anywhere but loopback needs a key."""
    if api_key is None and not is_loopback(host):
        return (f"serving on {host} (not loopback) needs an API key: pass --api-key KEY "
                "or set ASR_SERVE_API_KEY")
    if api_key is not None and len(api_key) < 8:
        return "the API key must be at least 8 characters long"
    return None


def key_matches(expected: str | None, given: str | None) -> bool:
    """Constant-time comparison (the time taken says nothing about how much of the key was right)."""
    if expected is None:
        return True
    return given is not None and hmac.compare_digest(expected.encode(), given.encode())


def bearer(request_headers, query_key: str | None = None) -> str | None:
    """The key a client sent: `Authorization: Bearer KEY` (what the openai package sends), or `api_key` in
    the query (browsers cannot set headers on a WebSocket)."""
    value = request_headers.get("authorization", "")
    if value.lower().startswith("bearer "):
        return value[7:].strip()
    return query_key


KEY_REFUSAL = "missing or wrong API key (send it as 'Authorization: Bearer KEY')"


def require_key(settings: AccessSettings, request: Request) -> None:
    if not key_matches(settings.api_key, bearer(request.headers, request.query_params.get("api_key"))):
        raise Refusal(401, KEY_REFUSAL, "authentication_error")
