"""What the loop trains: the ``Trainer`` protocol and its backends (in-process engine, ``wai serve`` client,
the Tinker SDK)."""
