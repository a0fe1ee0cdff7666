"""The dashboard's commands: `run` (a live engine), `attach` (a remote one), `replay` (a recording)."""

import argparse

from swarmtune.engine.errors import UserError
from swarmtune.factories import make_engine, preview, remote_source


def _dashboard(source) -> int:
    """The dashboard on a ready source (it owns the source from here and closes it)."""
    try:
        from swarmtune.tui.app import run_app
    except ImportError as e:
        source.close()
        raise UserError(f"the dashboard needs textual ({e}); 'swarmtune record' runs headless") from None
    return run_app(source)


def cmd_run(args: argparse.Namespace) -> int:
    from swarmtune.sources.live import LiveSource

    if not args.clients:
        if args.transcript_path:
            raise UserError("--transcript needs --clients: it writes the conversations your clients send")
        # the screen first, from what the model file and the flags say; the model loads on the source's thread
        return _dashboard(LiveSource.later(lambda: make_engine(args), preview(args)))
    from swarmtune.commands.serve import chat_config, checked_address
    from swarmtune.engine.agents.served import ServedAgents
    from swarmtune.server.hosted import HostedSource
    from swarmtune.server.runner import EngineRunner

    token = checked_address(args)
    engine = make_engine(args)
    assert isinstance(engine.workload, ServedAgents)
    runner = EngineRunner(engine, served=engine.workload, record_path=args.record_path, hide_text=args.hide_text)
    if args.transcript_path:
        from swarmtune.server.transcript import TranscriptWriter

        TranscriptWriter(args.transcript_path).listen(engine.workload)
    return _dashboard(HostedSource(runner, engine.workload, args.host, args.port, token,
                                   allow_hosts=tuple(args.allow_hosts), allow_origins=tuple(args.allow_origins),
                                   chat=chat_config(args)))


def cmd_attach(args: argparse.Namespace) -> int:
    return _dashboard(remote_source(args))


def cmd_replay(args: argparse.Namespace) -> int:
    from swarmtune.engine.record.records import read_recording

    if args.speed <= 0:
        raise UserError(f"--speed must be positive (got {args.speed})")
    from swarmtune.sources.replay import ReplaySource

    rec = read_recording(args.file)  # bad files fail here, before the screen is taken
    if not rec.steps:
        raise UserError(f"{args.file}: the recording has no steps")
    return _dashboard(ReplaySource(rec, args.speed))
