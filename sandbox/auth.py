"""Who may call a sandbox: TLS credentials, client tokens, and the rule for exposed addresses.

A server on a loopback address (127.0.0.0/8, ::1, localhost, a unix socket) is reachable
only from its own host and may serve plaintext without tokens. Any other address needs TLS
(the server's certificate and key; with a client CA, mutual TLS) and client tokens, unless
the operator passes `--insecure`. A token travels as `authorization: Bearer TOKEN` call
metadata (what gRPC's `access_token_call_credentials` sends) and is compared in constant
time with digests of the server's tokens; tokens come from a file or an environment
variable, never from the command line, where `ps` shows them.

Health checks need no token: load balancers and orchestrators probe without credentials
(gRPC's client-side health checking sends no call metadata), and the answer says only
SERVING or NOT_SERVING. Reflection and the Sandbox service need one.

Neither TLS nor tokens are implemented here: gRPC's own credentials do the cryptography,
and `ssl` only checks the files at start so a bad one is refused with a clear message.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import ssl
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from sandbox.config import ServerConfig

TOKEN_ENV = "DRTRITON_SANDBOX_TOKEN"
MIN_TOKEN_CHARS = 16
AUTH_HEADER = "authorization"
# Methods anyone may call: health (see the module docstring).
OPEN_METHOD_PREFIXES = ("/grpc.health.v1.Health/",)


class SecurityConfigError(ValueError):
    """The server's or client's TLS or token settings are missing or unusable."""


# -- addresses --------------------------------------------------------------------------


def is_loopback(host: str) -> bool:
    """Reachable only from this host: 127.0.0.0/8, ::1, localhost, a unix socket."""
    if host.startswith(("unix:", "unix-abstract:")):
        return True
    host = host.strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name may resolve anywhere: treat it as exposed


# -- tokens -----------------------------------------------------------------------------


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def parse_tokens(text: str, origin: str) -> list[tuple[str, str]]:
    """(name, token) per line of `TOKEN` or `NAME TOKEN`; blank lines and `#` comments skipped.

    An unnamed token is known by the start of its digest, so logs never show a token.
    """
    entries: list[tuple[str, str]] = []
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        if len(fields) > 2:
            raise SecurityConfigError(f"{origin}, line {number}: expected TOKEN or NAME TOKEN")
        token = fields[-1]
        if len(token) < MIN_TOKEN_CHARS:
            raise SecurityConfigError(
                f"{origin}, line {number}: a token needs at least {MIN_TOKEN_CHARS} characters "
                "(e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')"
            )
        name = fields[0] if len(fields) == 2 else _digest(token).hex()[:12]
        entries.append((name, token))
    return entries


def _read_text(path: str | os.PathLike[str], what: str) -> str:
    try:
        return Path(path).read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise SecurityConfigError(f"cannot read {what} {os.fspath(path)}: {err}") from None


class TokenSet:
    """The tokens a server accepts, kept as digests; `identify` names the holder."""

    def __init__(self, entries: Iterable[tuple[str, str]]) -> None:
        self._digests = [(name, _digest(token)) for name, token in entries]
        if not self._digests:
            raise SecurityConfigError("no client token given")

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> TokenSet:
        return cls(parse_tokens(_read_text(path, "token file"), os.fspath(path)))

    @classmethod
    def from_env(cls, variable: str) -> TokenSet:
        value = os.environ.get(variable, "")
        if not value.strip():
            raise SecurityConfigError(f"environment variable {variable} holds no token")
        return cls(parse_tokens(value, f"${variable}"))

    def __len__(self) -> int:
        return len(self._digests)

    def identify(self, presented: str | None) -> str | None:
        """The name of the token presented, or None. Every digest is compared (constant time)."""
        if not presented:
            return None
        digest = _digest(presented)
        found = None
        for name, known in self._digests:
            if hmac.compare_digest(digest, known) and found is None:
                found = name
        return found


def bearer_token(metadata: Sequence[Any] | None) -> str | None:
    """The token of an `authorization: Bearer TOKEN` entry of call metadata."""
    for key, value in metadata or ():
        if key.lower() != AUTH_HEADER:
            continue
        text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
        scheme, _, token = text.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    return None


# -- the server's side ------------------------------------------------------------------


@dataclass
class ServerSecurity:
    """What a server enforces: its TLS credentials (None: plaintext) and tokens (None: open)."""

    credentials: grpc.ServerCredentials | None = None
    tokens: TokenSet | None = None
    mutual_tls: bool = False
    insecure_exposed: bool = False  # a non-loopback address served without TLS or tokens

    def describe(self) -> str:
        transport = "plaintext"
        if self.credentials is not None:
            transport = "mutual TLS" if self.mutual_tls else "TLS"
        clients = f"{len(self.tokens)} client token(s)" if self.tokens else "no client token"
        return f"{transport}, {clients}"


def _check_tls_files(cert: str, key: str, client_ca: str | None) -> None:
    """Refuse a certificate, key or CA that TLS could not use, before serving."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as err:
        raise SecurityConfigError(f"unusable TLS certificate {cert} or key {key}: {err}") from None
    if client_ca is not None:
        try:
            context.load_verify_locations(cafile=client_ca)
        except (OSError, ssl.SSLError) as err:
            raise SecurityConfigError(f"unusable client CA {client_ca}: {err}") from None


def load_server_security(host: str, config: ServerConfig) -> ServerSecurity:
    """Read the TLS files and tokens `config` names and apply the exposure rule for `host`.

    Raises SecurityConfigError (with the flags that fix it) when `host` is not loopback and
    TLS or tokens are missing without `insecure`, or when a file is missing or unusable.
    """
    if bool(config.tls_cert) != bool(config.tls_key):
        raise SecurityConfigError("--tls-cert and --tls-key go together")
    if config.tls_client_ca and not config.tls_cert:
        raise SecurityConfigError("--tls-client-ca (mutual TLS) needs --tls-cert and --tls-key")
    if config.token_file and config.token_env:
        raise SecurityConfigError("give --token-file or --token-env, not both")
    security = ServerSecurity()
    if config.tls_cert and config.tls_key:
        _check_tls_files(config.tls_cert, config.tls_key, config.tls_client_ca)
        key = Path(config.tls_key).read_bytes()
        chain = Path(config.tls_cert).read_bytes()
        client_ca = Path(config.tls_client_ca).read_bytes() if config.tls_client_ca else None
        security.credentials = grpc.ssl_server_credentials(
            [(key, chain)], root_certificates=client_ca, require_client_auth=client_ca is not None
        )
        security.mutual_tls = client_ca is not None
    if config.token_file:
        security.tokens = TokenSet.from_file(config.token_file)
    elif config.token_env:
        security.tokens = TokenSet.from_env(config.token_env)
    exposed = not is_loopback(host) and (security.credentials is None or security.tokens is None)
    if exposed and not config.insecure:
        lacking = [
            what
            for what, have in (
                ("TLS (--tls-cert and --tls-key)", security.credentials is not None),
                ("client tokens (--token-file or --token-env)", security.tokens is not None),
            )
            if not have
        ]
        raise SecurityConfigError(
            f"refusing to serve on {host}, which is not a loopback address, without "
            f"{' and '.join(lacking)}; pass --insecure to serve it anyway"
        )
    security.insecure_exposed = exposed
    return security


def tls_subject(auth_context: dict[str, list[bytes]] | None) -> str | None:
    """The subject of a verified client certificate (mutual TLS), if the peer showed one."""
    for key in ("x509_subject", "x509_common_name"):
        values = (auth_context or {}).get(key)
        if values:
            return values[0].decode(errors="replace")
    return None


def peer_host(peer: str) -> str:
    """The address of `ipv4:1.2.3.4:5678` or `ipv6:[::1]:5678` without the port."""
    scheme, _, rest = peer.partition(":")
    if scheme == "ipv4":
        return rest.rpartition(":")[0] or rest
    if scheme == "ipv6":
        return rest.rpartition(":")[0].strip("[]") or rest
    return peer


def client_identity(context: grpc.aio.ServicerContext, tokens: TokenSet | None) -> str:
    """Who is calling: `token:NAME`, else `cert:SUBJECT` (mutual TLS), else `peer:ADDRESS`."""
    if tokens is not None:
        name = tokens.identify(bearer_token(context.invocation_metadata()))
        if name is not None:
            return f"token:{name}"
    subject = tls_subject(context.auth_context())
    if subject is not None:
        return f"cert:{subject}"
    return f"peer:{peer_host(context.peer())}"


DeniedHook = Callable[[str, grpc.aio.ServicerContext], None]


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Answers UNAUTHENTICATED to every call without an accepted token (health aside)."""

    def __init__(self, tokens: TokenSet, on_denied: DeniedHook | None = None) -> None:
        self._tokens = tokens
        self._on_denied = on_denied

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Any],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.startswith(OPEN_METHOD_PREFIXES):
            return handler
        presented = bearer_token(handler_call_details.invocation_metadata)
        if self._tokens.identify(presented) is not None:
            return handler
        reason = "no client token" if presented is None else "the client token is not accepted"
        return _refusal(handler, method, reason, self._on_denied)


def _refusal(
    handler: grpc.RpcMethodHandler, method: str, reason: str, on_denied: DeniedHook | None
) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that only answers UNAUTHENTICATED."""
    details = (
        f"{reason}: send 'authorization: Bearer TOKEN' (SandboxClient(token=...) or ${TOKEN_ENV})"
    )

    async def refuse(_request: Any, context: grpc.aio.ServicerContext) -> None:
        if on_denied is not None:
            on_denied(method, context)
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, details)

    shapes = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }
    make = shapes[(handler.request_streaming, handler.response_streaming)]
    return make(
        refuse,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


# -- the client's side ------------------------------------------------------------------


@dataclass(frozen=True)
class ClientTls:
    """TLS towards a sandbox: the CA that signed its certificate (None: the system's roots),
    a certificate and key of the client's own for mutual TLS, and the name the server's
    certificate must carry when it differs from the target's host."""

    ca_file: str | os.PathLike[str] | None = None
    cert_file: str | os.PathLike[str] | None = None
    key_file: str | os.PathLike[str] | None = None
    server_name: str | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        if (self.cert_file is None) != (self.key_file is None):
            raise SecurityConfigError("a client certificate and its key go together")

        def read(path: str | os.PathLike[str] | None, what: str) -> bytes | None:
            if path is None:
                return None
            try:
                return Path(path).read_bytes()
            except OSError as err:
                raise SecurityConfigError(f"cannot read {what} {os.fspath(path)}: {err}") from None

        return grpc.ssl_channel_credentials(
            root_certificates=read(self.ca_file, "CA file"),
            private_key=read(self.key_file, "client key"),
            certificate_chain=read(self.cert_file, "client certificate"),
        )

    def channel_options(self) -> list[tuple[str, Any]]:
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []


def client_token(
    token: str | None = None, token_file: str | os.PathLike[str] | None = None
) -> str | None:
    """The token a client sends: `token`, else the first in `token_file`, else $DRTRITON_SANDBOX_TOKEN."""
    if token is not None and token_file is not None:
        raise SecurityConfigError("give a token or a token file, not both")
    if token is not None:
        return token.strip() or None
    if token_file is not None:
        text = _read_text(token_file, "token file")
        for line in text.splitlines():
            fields = line.split()
            if fields and not fields[0].startswith("#"):
                return fields[-1]
        raise SecurityConfigError(f"token file {os.fspath(token_file)} holds no token")
    return os.environ.get(TOKEN_ENV, "").strip() or None


def token_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """Call metadata carrying `token` (none without one)."""
    return ((AUTH_HEADER, f"Bearer {token}"),) if token else ()
