"""A plugin whose module fails to import, for the registry tests."""

raise RuntimeError("this plugin is broken on purpose")
