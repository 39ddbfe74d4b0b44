"""The egress proxy's mitmproxy addons: blocklist, audit log, CA publishing, metering.

The per-cell proxy (egress.proxy.start_proxy) and the cluster's sidecar run the same
addons, loaded from this file:

    mitmdump -s .../maka_eval/egress/addon.py \\
        --set confdir=PRIVATE/confdir \\
        --set maka_policy=PRIVATE/policy.json \\
        --set maka_audit_log=PRIVATE/audit/audit.jsonl \\
        --set maka_audit_log_max_bytes=8388608 \\
        --set maka_cert_publish_dir=PUBLIC \\
        --set maka_checkpoint=SHARED/provider-usage.json \\
        --set maka_result_token_file=PRIVATE/result-token \\
        [--set maka_prices=PRIVATE/prices.json] [--set maka_ready_file=PRIVATE/ready.json]
        [--mode upstream:http://GATEWAY:PORT --set maka_upstream_auth_file=PRIVATE/auth]

What they do:
- **Blocklist** (`Guard`): a CONNECT is checked by host (403 with the reason, before any
  connection is made); every request -- plain HTTP, or HTTPS after TLS interception -- by
  its full URL, both as addressed and as its Host header names it. A tunnel that falls
  back to raw TCP (anything that is not HTTP inside CONNECT: a raw protocol, a server
  that speaks first, DNS) is closed before a byte is forwarded. Without a loaded
  policy mitmdump does not start, and no request passes: the proxy fails closed.
- **Audit** (`egress.audit`): every decision, one JSON line, bounded and rotated, 0600
  in a private folder, appended after the event loop's turn (`AuditLog`).
- **CA** (`Lifecycle`): mitmproxy generates the cell's CA in the private confdir; only
  `mitmproxy-ca-cert.pem` is copied into the publish folder (0644) that the subject
  mounts read-only. The key never leaves the confdir.
- **Metering** (`Metering`): web tools are stripped from model requests (the body is
  re-encoded and Content-Length recomputed); usage is read from responses as their chunks
  pass -- each chunk is forwarded unchanged at once, a copy goes to the parser -- and
  the provider-usage checkpoint is written at request start, at admission (2xx status
  and headers) and at settlement (by a writer thread, so no request waits on the disk).
  SIGUSR1, or shutting down, settles the figure.

mitmdump runs this file without registering it as a module (so no dataclasses here),
and calls script addons before its own: `Guard.next_layer` asks mitmproxy's layer
choice itself before replacing a raw tunnel.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Any

from mitmproxy import ctx, exceptions, http, tcp
from mitmproxy.addonmanager import Loader
from mitmproxy.proxy import commands, events, layer, layers
from mitmproxy.proxy.context import Context

from maka_eval.egress.audit import DEFAULT_MAX_BYTES, AuditLog
from maka_eval.egress.policy import EgressPolicy, PolicyError, Verdict
from maka_eval.metering.checkpoint import derive
from maka_eval.metering.meter import Meter
from maka_eval.metering.pricing import Prices, PricesError
from maka_eval.metering.providers import (
    Endpoint,
    ResponseReader,
    detect_endpoint,
    looks_like_json_object,
    strip_web_tools,
)
from maka_eval.metering.settle import SETTLE_HOST

log = logging.getLogger("maka_eval.egress")

CA_CERT_NAME = "mitmproxy-ca-cert.pem"
_FLOW_KEY = "maka_eval.metering"
MAX_TOKEN_BYTES = 4096
VERDICT_CACHE_SIZE = 4096
VERDICT_CACHE_URL_LIMIT = 2048
"""URLs whose blocklist verdict the proxy remembers, and how long such a URL may be."""


def _options_error(message: str) -> Exception:
    """mitmproxy's OptionsError: raised from configure, it stops a starting proxy."""
    return exceptions.OptionsError(message)  # type: ignore[no-untyped-call]  # untyped upstream


def _text_response(status: int, text: str) -> http.Response:
    return http.Response.make(
        status, (text + "\n").encode(), {"Content-Type": "text/plain; charset=utf-8"}
    )


def _atomic_write(path: Path, data: bytes, mode: int) -> None:
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.chmod(temp, mode)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise


def _read_secret(path: str, what: str) -> str:
    try:
        with open(path, "rb") as file:
            raw = file.read(MAX_TOKEN_BYTES + 1)
    except OSError as exc:
        raise _options_error(f"cannot read the {what} {path}: {exc.strerror}") from None
    value = raw.decode("utf-8", "replace").strip()
    if not value or len(raw) > MAX_TOKEN_BYTES:
        raise _options_error(f"the {what} {path} is empty or too large")
    return value


class Settings:
    """The addons' configuration, read from the maka_* options."""

    def __init__(self) -> None:
        self.policy: EgressPolicy | None = None
        self.audit: AuditLog | None = None
        self.meter = Meter(None, None)
        self.prices: Prices | None = None
        self.publish_dir: Path | None = None
        self.ready_file: Path | None = None

    def record(self, **entry: Any) -> None:
        """Append one decision to the audit log (when there is one)."""
        if self.audit is None:
            return
        try:
            self.audit.write(entry)
        except OSError as exc:
            log.error("cannot write the audit log: %s", exc)


class Options:
    """Declares the maka_* options and turns them into Settings."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def load(self, loader: Loader) -> None:
        loader.add_option("maka_policy", str, "", "Egress policy file (EgressPolicy JSON).")
        loader.add_option("maka_audit_log", str, "", "Audit log file (JSON lines, 0600).")
        loader.add_option(
            "maka_audit_log_max_bytes",
            int,
            DEFAULT_MAX_BYTES,
            "Size cap of the audit log; one rotated file (.1) is kept.",
        )
        loader.add_option(
            "maka_cert_publish_dir",
            str,
            "",
            f"Folder that receives {CA_CERT_NAME} only (the subject mounts it read-only).",
        )
        loader.add_option(
            "maka_checkpoint", str, "", "Provider-usage checkpoint file (signed JSON, 0644)."
        )
        loader.add_option(
            "maka_result_token_file", str, "", "File holding the result token (HMAC key)."
        )
        loader.add_option("maka_prices", str, "", "Model prices file (Prices JSON).")
        loader.add_option(
            "maka_ready_file", str, "", "Written (host, port, pid) once the proxy listens."
        )
        loader.add_option(
            "maka_upstream_auth_file",
            str,
            "",
            "File holding user:password for the upstream proxy (sets upstream_auth).",
        )

    def configure(self, updated: set[str]) -> None:
        s = self.settings
        options = ctx.options
        if "maka_policy" in updated:
            if not options.maka_policy:
                raise _options_error("maka_policy: the egress policy file is required")
            try:
                s.policy = EgressPolicy.from_file(options.maka_policy)
            except PolicyError as exc:
                raise _options_error(f"maka_policy: {exc}") from None
        if "maka_audit_log" in updated or "maka_audit_log_max_bytes" in updated:
            if s.audit is not None:
                s.audit.close()
                s.audit = None
            if options.maka_audit_log:
                try:
                    s.audit = AuditLog(
                        Path(options.maka_audit_log),
                        options.maka_audit_log_max_bytes,
                        background=True,
                    )
                except (OSError, ValueError) as exc:
                    raise _options_error(f"maka_audit_log: {exc}") from None
        if "maka_checkpoint" in updated or "maka_result_token_file" in updated:
            path = Path(options.maka_checkpoint) if options.maka_checkpoint else None
            token = None
            if path is not None:
                if not options.maka_result_token_file:
                    raise _options_error(
                        "maka_checkpoint needs maka_result_token_file (its HMAC key)"
                    )
                token = _read_secret(options.maka_result_token_file, "result token file")
            s.meter.close()
            s.meter = Meter(path, token, on_error=log.error, background=True)
        if "maka_prices" in updated:
            s.prices = None
            if options.maka_prices:
                try:
                    s.prices = Prices.from_json(Path(options.maka_prices).read_bytes())
                except (OSError, PricesError) as exc:
                    raise _options_error(f"maka_prices: {exc}") from None
        if "maka_cert_publish_dir" in updated or "confdir" in updated:
            s.publish_dir = None
            if options.maka_cert_publish_dir:
                publish = Path(options.maka_cert_publish_dir).resolve()
                confdir = Path(os.path.expanduser(options.confdir)).resolve()
                if publish == confdir or confdir in publish.parents or publish in confdir.parents:
                    raise _options_error(
                        "maka_cert_publish_dir must be apart from confdir (which holds the CA key)"
                    )
                s.publish_dir = publish
        if "maka_ready_file" in updated:
            s.ready_file = Path(options.maka_ready_file) if options.maka_ready_file else None
        if "maka_upstream_auth_file" in updated and options.maka_upstream_auth_file:
            # Read from a file so the credential never appears on a command line.
            auth = _read_secret(options.maka_upstream_auth_file, "upstream auth file")
            if ":" not in auth:
                raise _options_error("maka_upstream_auth_file must hold user:password")
            ctx.options.update(upstream_auth=auth)  # type: ignore[no-untyped-call]  # untyped upstream


class Guard:
    """The contamination blocklist at the proxy: CONNECT by host, requests by URL."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._verdicts: dict[str, Verdict] = {}
        self._verdicts_of: EgressPolicy | None = None

    def _policy(self) -> EgressPolicy | None:
        return self.settings.policy

    def _check_url(self, policy: EgressPolicy, url: str) -> Verdict:
        """`policy.check_url`, remembered per URL: a verdict depends on the URL and the
        policy alone, and an agent asks the same few URLs (its model's endpoint) over
        and over. Forgotten when the policy changes or VERDICT_CACHE_SIZE are kept; a
        URL longer than VERDICT_CACHE_URL_LIMIT is checked every time (the memory a
        subject can make the proxy hold stays bounded)."""
        if len(url) > VERDICT_CACHE_URL_LIMIT:
            return policy.check_url(url)
        if self._verdicts_of is not policy or len(self._verdicts) >= VERDICT_CACHE_SIZE:
            self._verdicts = {}
            self._verdicts_of = policy
        verdict = self._verdicts.get(url)
        if verdict is None:
            verdict = self._verdicts[url] = policy.check_url(url)
        return verdict

    def http_connect(self, flow: http.HTTPFlow) -> None:
        """A tunnel is refused by host before any connection is made."""
        host, port = flow.request.host, flow.request.port
        policy = self._policy()
        verdict = (
            policy.check_host(host, port)
            if policy is not None
            else Verdict(True, None, "no egress policy is loaded; refused")
        )
        self.settings.record(
            event="connect",
            decision="block" if verdict.blocked else "allow",
            host=host,
            port=port,
            rule=verdict.rule,
            reason=verdict.reason,
        )
        if verdict.blocked:
            flow.response = _text_response(403, f"maka-eval egress: blocked: {verdict.reason}")

    def request(self, flow: http.HTTPFlow) -> None:
        """Every request is checked by its full URL (as addressed and as its Host header
        names it: a tunnel to an allowed host cannot front for a blocked one)."""
        if flow.response is not None:
            return
        policy = self._policy()
        urls = [flow.request.url]
        if flow.request.pretty_url != flow.request.url:
            urls.append(flow.request.pretty_url)
        verdict = Verdict(True, None, "no egress policy is loaded; refused")
        if policy is not None:
            for url in urls:
                verdict = self._check_url(policy, url)
                if verdict.blocked:
                    break
        self.settings.record(
            event="request",
            decision="block" if verdict.blocked else "allow",
            method=flow.request.method,
            url=flow.request.pretty_url,
            rule=verdict.rule,
            reason=verdict.reason,
        )
        if verdict.blocked:
            flow.response = _text_response(403, f"maka-eval egress: blocked: {verdict.reason}")

    def next_layer(self, nextlayer: layer.NextLayer) -> None:
        """A connection that mitmproxy would relay as raw TCP, UDP or DNS -- anything
        that is not HTTP inside a tunnel -- gets a layer that closes it instead: it
        could not be checked. (Killing a TCP flow in its hooks does not stop mitmproxy
        11 from forwarding its first message.)"""
        if nextlayer.layer is None:
            # Script addons are asked before mitmproxy's own layer choice: make it now
            # (it leaves a layer that is already set alone when asked again).
            builtin = ctx.master.addons.get("nextlayer")  # type: ignore[no-untyped-call]
            if builtin is not None:
                builtin.next_layer(nextlayer)
        chosen = nextlayer.layer
        if isinstance(chosen, layers.TCPLayer | layers.UDPLayer | layers.DNSLayer):
            server = nextlayer.context.server
            address = server.address
            self.settings.record(
                event={layers.TCPLayer: "tcp", layers.UDPLayer: "udp"}.get(type(chosen), "dns"),
                decision="kill",
                host=address[0] if address else None,
                port=address[1] if address else None,
                reason=f"not HTTP ({type(chosen).__name__}): a raw tunnel cannot be checked",
            )
            nextlayer.layer = _Refused(nextlayer.context)

    def tcp_message(self, flow: tcp.TCPFlow) -> None:
        """Never reached while next_layer refuses raw tunnels; should a TCP flow exist
        anyway (another addon chose its layer), nothing of it is forwarded."""
        if flow.messages:
            flow.messages[-1].content = b""


class _Refused(layer.Layer):
    """Closes the connection at its first event, forwarding nothing."""

    def __init__(self, context: Context) -> None:
        super().__init__(context)
        self._done = False

    def _handle_event(self, event: events.Event) -> layer.CommandGenerator[None]:
        if self._done:
            return
        self._done = True
        if self.context.server.connected:
            yield commands.CloseConnection(self.context.server)
        yield commands.CloseConnection(self.context.client)


class _MeteredFlow:
    """What the proxy keeps of one model request while it is in flight."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.reader: ResponseReader | None = None
        self.admitted = False


class Metering:
    """Web-tool stripping and usage metering of model requests."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def request(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None:
            return  # blocked: never forwarded, never metered
        req = flow.request
        endpoint = detect_endpoint(req.method, req.pretty_host, req.path)
        if endpoint is None:
            return
        body = req.get_content(strict=False) or b""
        if not looks_like_json_object(body):
            return  # not a JSON model request
        stripped = strip_web_tools(body)
        if stripped.body is not None:
            req.content = stripped.body  # re-encoded as sent; Content-Length recomputed
        # Identity responses can be read as they pass (gzip and deflate are undone too).
        req.headers["accept-encoding"] = "identity"
        flow.metadata[_FLOW_KEY] = _MeteredFlow(endpoint)
        self.settings.record(
            event="model-request",
            decision="meter",
            provider=endpoint.provider,
            api=endpoint.api.value,
            url=req.pretty_url,
            stripped=list(stripped.removed),
        )
        self.settings.meter.started(flow.id)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        response = flow.response
        assert response is not None
        state: _MeteredFlow | None = flow.metadata.get(_FLOW_KEY)
        if state is None or not 200 <= response.status_code < 300:
            response.stream = True  # passed on as it arrives, never buffered
            return
        # Admission: the provider accepted the request; the work is billed from here.
        state.admitted = True
        self.settings.meter.admitted(flow.id)
        reader = ResponseReader(
            state.endpoint.api,
            response.headers.get("content-type", ""),
            response.headers.get("content-encoding", ""),
        )
        state.reader = reader

        def tee(chunk: bytes) -> bytes:
            # Forwarded unchanged at once; the parser gets a copy and never holds it back.
            if chunk:
                try:
                    reader.feed(chunk)
                except Exception as exc:  # pragma: no cover - metering never breaks a stream
                    reader.readable = False
                    log.error("cannot read usage from %s: %s", flow.request.pretty_url, exc)
            return chunk

        response.stream = tee

    def response(self, flow: http.HTTPFlow) -> None:
        # mitmproxy sends a streamed response's end only after this hook: the usage is
        # read and the checkpoint committed on the next turn of the loop instead.
        try:
            asyncio.get_running_loop().call_soon(self._settle, flow, "complete")
        except RuntimeError:
            self._settle(flow, "complete")

    def error(self, flow: http.HTTPFlow) -> None:
        self._settle(flow, f"failed: {flow.error.msg if flow.error else 'unknown error'}")

    def _settle(self, flow: http.HTTPFlow, how: str) -> None:
        state: _MeteredFlow | None = flow.metadata.pop(_FLOW_KEY, None)
        if state is None:
            return
        usage, final, model = None, False, None
        if state.reader is not None:
            reading = state.reader.reading()
            usage, final, model = reading.usage, reading.final, reading.model
        self.settings.meter.finished(flow.id, usage, final, model)
        self.settings.record(
            event="model-response",
            decision="settled",
            provider=state.endpoint.provider,
            model=model,
            status=flow.response.status_code if flow.response is not None else None,
            admitted=state.admitted,
            outcome=how,
            usage=usage.to_json() if usage is not None else None,
            usageFinal=final,
        )


class Lifecycle:
    """Publishes the CA certificate, announces readiness, settles metering."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def running(self) -> None:
        s = self.settings
        if s.publish_dir is not None:
            source = Path(os.path.expanduser(ctx.options.confdir)) / CA_CERT_NAME
            s.publish_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
            target = s.publish_dir / CA_CERT_NAME
            fd, temp = tempfile.mkstemp(prefix=".ca.", dir=s.publish_dir)
            os.close(fd)
            shutil.copyfile(source, temp)
            os.chmod(temp, 0o644)
            os.replace(temp, target)
        s.meter.write()  # the empty checkpoint: nothing requested yet
        with contextlib.suppress(NotImplementedError, RuntimeError):
            asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, self.settle)
        servers = ctx.master.addons.get("proxyserver")  # type: ignore[no-untyped-call]
        addresses = list(servers.listen_addrs()) if servers is not None else []
        s.record(event="start", decision="listening", listen=[list(a[:2]) for a in addresses])
        if s.ready_file is not None and addresses:
            host, port = addresses[0][0], addresses[0][1]
            ready = {"host": host, "port": port, "pid": os.getpid()}
            _atomic_write(s.ready_file, json.dumps(ready).encode(), 0o600)

    def settle(self) -> None:
        """The subject is done: no later request belongs to this figure."""
        s = self.settings
        checkpoint = s.meter.settle()
        figure = derive(checkpoint, s.prices)
        s.record(
            event="settle",
            decision="settled",
            summary=figure.describe(),
            usage=figure.usage.to_json(),
            costUsd=figure.cost_usd,
            complete=figure.complete,
        )

    def done(self) -> None:
        self.settle()
        self.settings.meter.close()  # the settled checkpoint is on disk before exit
        if self.settings.audit is not None:
            self.settings.audit.close()


class Settlement:
    """Answers a settle request (metering.settle: a relay that cannot signal the proxy,
    in a Pod) itself, once the settled checkpoint is written. Before the blocklist: it
    never leaves the proxy."""

    def __init__(self, lifecycle: Lifecycle) -> None:
        self.lifecycle = lifecycle

    def request(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None or flow.request.host != SETTLE_HOST:
            return
        self.lifecycle.settle()
        if self.lifecycle.settings.meter.flush(5.0):
            flow.response = _text_response(200, "settled")
        else:
            flow.response = _text_response(503, "the checkpoint could not be written in time")


def make_addons() -> list[Any]:
    """The addons, in the order mitmproxy must call them (the blocklist first)."""
    settings = Settings()
    lifecycle = Lifecycle(settings)
    return [
        Options(settings),
        Settlement(lifecycle),
        Guard(settings),
        Metering(settings),
        lifecycle,
    ]


addons = make_addons()
