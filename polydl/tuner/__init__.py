"""The tuner: measures candidate schedules in child processes, searches the space, stores
what it measured in the tuning database (`polydl.tuning`), and its command-line interface."""
