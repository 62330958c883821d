"""A module that fails while it is imported, as an environment package with a bug or without a system library it
needs does: `--env-id tests.broken_envs:Anything-v0` must end in one line naming it (tests/test_environments.py)."""

raise RuntimeError("this module fails while it is imported")
