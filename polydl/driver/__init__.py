"""The driver: runs the pipeline for a resolved target, one backend per target kind."""
