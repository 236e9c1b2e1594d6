"""A plugin that tries to take the core backend name "custom"."""


def Backend():
    raise AssertionError("a plugin must never replace a core backend")
