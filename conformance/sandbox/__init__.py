"""The port's side of every check: a port run in this process (``portside.InProcess``) or in a
process of its own (``isolated.Isolated``, the process being ``child``), what crosses between them
(``wire``: arrays as files (``.npy`` or packs of raw bytes), never unpickled; ``portable``: what the port returns checked
before it is written), the processes a port starts found and killed (``reap``), the heap of a
process that is the port's alone (``heap``), and the plugin's given ports as factories run there
(``remote``).

Its contract with the checks above it (conformance.verify, the plugin, the zoo) is
``handed``: a ``Case`` in, a ``finding`` out for each thing the port did wrong, in any report that
keeps a ``failures`` list. It imports no check, no command, neither the error model nor
hypothesis (the port's process imports it): tests/test_imports.py holds it.
"""
