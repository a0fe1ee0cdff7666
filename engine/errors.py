class UserError(Exception):
    """Bad input from the user: the CLI prints the message as one line and exits with status 2."""
