"""One module per command (or family of commands): each a `cmd_*(args) -> exit status`."""
