"""The project's own tests: the config, checkpoint formats and layouts, the docs, the benchmark,
the zoo's meta-tests, provenance, the import graph, the stage table, capture of the examples
and third-party models, and the plugin itself. Not shipped: the suite users run on their ports
is ``conformance.tests`` (``pytest --pyargs conformance.tests --port ...``)."""
