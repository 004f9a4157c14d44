"""The runtime: compile generated C, cache it on disk, load it and call it with numpy arrays."""
