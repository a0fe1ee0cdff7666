class UserError(Exception):
    """Bad input from the user: the CLI prints the message as one line and exits with status 2.
    `field` names the setting it is about (agents, batch_cap, kv_type), where there is one."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class Interrupted(Exception):
    """The caller asked the engine to stop mid-step (a rebuild in progress): it is left unfinished."""


class Stalled(RuntimeError):
    """No agent can run: the KV budget cannot hold the swarm at this setting. A forecast that meets it
    rules the setting out; a live run reports it."""
