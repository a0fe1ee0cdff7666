"""`swarmtune serve`: the engine headless behind an HTTP API."""

import argparse
import os
import signal
import sys
import time
from typing import TYPE_CHECKING

from swarmtune.engine.errors import UserError
from swarmtune.factories import make_engine

if TYPE_CHECKING:
    from swarmtune.server.bridge import ChatConfig


def _check_can_listen(host: str, port: int) -> None:
    """Fail before the model loads, in one line, if the address is taken or not ours."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise UserError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as e:
            raise UserError(f"cannot listen on {host}:{port}: {e.strerror}") from None


def checked_address(args: argparse.Namespace) -> str | None:
    """The token, once the address is one we may and can listen on (before the model loads)."""
    from swarmtune.server.server import is_loopback

    token = args.token or os.environ.get("SWARMTUNE_TOKEN") or None
    if not is_loopback(args.host) and not token:
        raise UserError(f"binding {args.host} (not loopback) needs a token: --token T or SWARMTUNE_TOKEN")
    if not 0 <= args.port <= 65535:
        raise UserError(f"--port must be between 0 and 65535 (got {args.port})")
    _check_can_listen(args.host, args.port)
    return token


def chat_config(args: argparse.Namespace) -> "ChatConfig":
    """How chats are rendered and read: --on-overflow, --reasoning-format, --chat-template-file (read now: a
    file that cannot be read fails here, in one line, before the model loads)."""
    from swarmtune.server.bridge import ChatConfig

    template = None
    if args.chat_template_file:
        try:
            with open(args.chat_template_file, encoding="utf-8") as f:
                template = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise UserError(f"--chat-template-file {args.chat_template_file}: {getattr(e, 'strerror', None) or e}"
                            ) from None
        from swarmtune.engine.conversation.chat_template import ChatTemplate

        ChatTemplate(template)  # a template that does not parse fails here, in one line
    return ChatConfig(trim_front=args.on_overflow == "trim-front", reasoning=args.reasoning_format != "none",
                      template=template)


def stop_on_engine_death(runner, server) -> None:
    """A dead engine ends the server: its cause in one line, then a non-zero exit (cmd_serve) for a
    supervisor to restart it; every client waiting was told already (EngineRunner)."""
    def died(message: str) -> None:
        print(f"error: {message}", file=sys.stderr, flush=True)
        server.should_exit = True

    runner.on_death = died


def cmd_serve(args: argparse.Namespace) -> int:
    import threading

    import uvicorn

    from swarmtune.engine.agents.served import ServedAgents
    from swarmtune.server.runner import EngineRunner
    from swarmtune.server.server import ApiServer, make_app

    token = checked_address(args)
    chat = chat_config(args)
    if args.transcript_path and not args.clients:
        raise UserError("--transcript needs --clients: it writes the conversations your clients send")
    engine = make_engine(args)
    served = engine.workload if isinstance(engine.workload, ServedAgents) else None
    runner = EngineRunner(engine, served=served, record_path=args.record_path, hide_text=args.hide_text)
    app = make_app(runner, token, served, allow_hosts=tuple(args.allow_hosts),
                   allow_origins=tuple(args.allow_origins), chat=chat)
    transcript = None
    if args.transcript_path:
        from swarmtune.server.transcript import TranscriptWriter

        assert served is not None  # --clients, checked above
        transcript = TranscriptWriter(args.transcript_path)
        transcript.listen(served)  # after the metrics' listener, which make_app installed
    server = ApiServer(uvicorn.Config(app, host=args.host, port=args.port, log_level="warning",
                                      timeout_graceful_shutdown=3), served)

    def announce() -> None:
        while not server.started and not server.should_exit:
            time.sleep(0.05)
        if server.started:
            host, port = server.servers[0].sockets[0].getsockname()[:2]
            print(f"serving http://{host}:{port} (auth: {'bearer token' if token else 'none, loopback only'})",
                  file=sys.stderr, flush=True)
            if served is not None:
                print(f"point your agents at http://{host}:{port}/v1 (OpenAI-compatible; any API key"
                      f"{' but the token' if token else ''})", file=sys.stderr, flush=True)

    threading.Thread(target=announce, daemon=True).start()
    stop_on_engine_death(runner, server)
    # uvicorn shuts down gracefully on SIGINT/SIGTERM, then re-raises the signal to the handler it
    # found installed: make that one a no-op, so a clean stop exits 0 rather than dying by the signal
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: None)
    server.run()  # uvicorn stops cleanly on SIGINT and SIGTERM; the lifespan stops the engine
    if transcript is not None:
        transcript.close()
    if not server.started:
        runner.stop()
        raise UserError(f"could not listen on {args.host}:{args.port}")
    return 1 if runner.error else 0  # the engine died (said above, in one line): a supervisor restarts it
