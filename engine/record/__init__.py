"""What a run leaves behind: each step's record, its writer and reader, and the run's header."""
