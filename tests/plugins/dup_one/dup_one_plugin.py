"""One of two plugins that claim the same backend name."""


def Backend():
    return lambda query, k, reference=None, ref_includes_query=False: None
